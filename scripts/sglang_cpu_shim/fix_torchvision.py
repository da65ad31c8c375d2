"""Make PyPI's torchvision 0.28 (a CUDA build) importable beside the CPU torch of the SGLang venv.

SGLang imports `torchvision.transforms` at start-up. Beside a CPU torch, torchvision's C++ ops do not load
(`torchvision.extension._has_ops()` is False), and `torchvision/_meta_registrations.py` then fails at import
("operator torchvision::nms does not exist") because it registers fake kernels for `nms` and `qnms`
unconditionally, while every other registration in that file is already conditional on `_has_ops()`. This
script makes those two conditional too, in the interpreter that runs it (the SGLang venv's), and is
idempotent. The transforms SGLang uses are pure Python; the C++ ops stay absent and unused.
Run by scripts/install-sglang-cpu.sh; exit 1 with a reason if the file is not what it expects.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MARK = "# ddtree-bench: registered only when torchvision's C++ ops loaded"
OPS = ("nms", "qnms")


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("fix_torchvision: torchvision is not installed in this interpreter", file=sys.stderr)
        return 1
    path = Path(spec.origin).parent / "_meta_registrations.py"
    text = path.read_text(encoding="utf-8")
    if MARK in text:
        return 0
    for op in OPS:
        old = f'@torch.library.register_fake("torchvision::{op}")\n'
        if text.count(old) != 1:
            print(f"fix_torchvision: {path} has no single fake registration of torchvision::{op}", file=sys.stderr)
            return 1
        new = (f'{MARK}\n@(torch.library.register_fake("torchvision::{op}") if torchvision.extension._has_ops() '
               f'else (lambda fn: fn))\n')
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
