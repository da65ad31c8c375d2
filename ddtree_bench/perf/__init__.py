"""GPU speed work around the reference engine: random weights of real model shapes (shapes.py),
timers (timing.py) and the `bench-engine` measurements (bench.py). The engine's fast path itself
lives in engine/gpu/ (loop.py and what it runs); the cost model in costmodel.py."""
