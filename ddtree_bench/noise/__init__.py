"""Noise you can see: the machine's state around each measurement, and verdicts that respect the spread.

* `probe` — load average, CPU frequency and (where `nvidia-smi` exists) GPU clocks and
  utilisation, sampled before and after each sweep point; the heavy-load rule.
* `verdict` — which configuration is fastest, only when its interval clears the runner-up's;
  otherwise which are indistinguishable and how many repeats would separate them.

The intervals themselves are `ddtree_bench.stats`; this package reads no result files.
"""
