"""ddtree-bench: is a DDTree speculative-decoding deployment correct, and how fast is it?

The package is a CLI (`ddtree-bench`, see `cli/`) over a reference in-process engine (`engine/`),
HTTP backends for SGLang / vLLM / our own server (`backends/`), benchmark suites, metrics, greedy
baselines, a CI gate and HTML reports. `--help` imports none of the heavy modules.
"""

__version__ = "0.1.0"
