"""A stand-in nvidia-smi for CPU tests of noise/gpu_clocks.py: a real executable that checks it was asked for the
sampler's fields and loop, then streams one line every 20 ms (SM clock 1000, 1001, ...; every other line with the
power cap reason) until a signal stops it, even with its reader gone; asked for noise/probe.py's snapshot, it prints one
idle GPU; on any other arguments it prints an error line and exits 2."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from ddtree_bench.noise.gpu_clocks import FIELDS

_SCRIPT = textwrap.dedent('''\
    import sys, time
    args = sys.argv[1:]
    if args == ["--query-gpu=index,clocks.sm,clocks.mem,utilization.gpu,temperature.gpu", "--format=csv,noheader,nounits"]:
        print("0, 1980, 2619, 0, 40")   # noise/probe.py's one-shot snapshot: one idle GPU
        sys.exit(0)
    if args[:4] != ["--query-gpu=%s", "--format=csv,noheader,nounits", "-lms", "%d"] or args[4:] != %r:
        print("unexpected arguments", args, flush=True)
        sys.exit(2)
    k = 0
    while True:   # a reader gone does not stop it (as when a forked worker still holds the pipe): only a signal does
        try:
            print(f"{1000 + k}, 1980, 600, 700, 50, 0x{4 if k %% 2 else 0:016x}", flush=True)
        except (BrokenPipeError, ValueError):
            pass
        k += 1
        time.sleep(0.02)
''')


def fake_nvidia_smi(folder: Path, interval_ms: int = 20, id_args: list[str] | None = None) -> str:
    """Write the stand-in into `folder`; it accepts exactly the sampler's arguments for interval_ms and id_args."""
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\n" + _SCRIPT % (",".join(FIELDS), interval_ms, id_args or []))
    os.chmod(exe, 0o755)
    return str(exe)
