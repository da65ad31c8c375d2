"""Tree-build time vs budget on the CPU (heap and vectorised builders), one thread, for the toy's
vocabulary (272) and Qwen3's (151936). Prints one JSON document. Run: python benchmarks/cpu_build_tree.py"""

import datetime
import json
import platform

import torch

from ddtree_bench.perf.bench import build_times

torch.set_num_threads(1)
out = {V: build_times(V, 15, [16, 32, 64, 128, 256, 512, 1024], torch.device("cpu"), reps=3) for V in (272, 151936)}
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": platform.platform(),
                  "threads": 1, "torch": torch.__version__, "build_tree_ms": out}))
