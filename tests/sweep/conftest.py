"""`serial` for every test under tests/sweep: the shared grid swept serially once per session (sweep_support),
the result the parallel and Ray executors must reproduce."""

from sweep_support import serial  # noqa: F401 (fixture: defined once, in sweep_support)
