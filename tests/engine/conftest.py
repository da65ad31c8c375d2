"""The batched-loop tests' two engines as fixtures for every test under tests/engine: `rnd` (the seeded random
pair) and `toy` (the bundled toy pair, fp32 on the CPU), each built once per session in batch_support. A test module
that defines its own `toy` (test_fastloop_cuda.py: the pair on CUDA) overrides this one for its own tests."""

from batch_support import rnd, toy  # noqa: F401 (fixtures: defined once, in batch_support)
