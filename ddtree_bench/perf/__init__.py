"""GPU speed work around the reference engine: random weights of real model shapes (shapes.py),
timers (timing.py) and the `bench-engine` measurements (bench.py). The engine's fast path itself
lives in engine/gpu/ (loop.py and what it runs). The cost model (costmodel.py) predicts tok/s per
tree budget from measured stage costs and an acceptance curve."""
