"""Nothing the package ships, and no committed baseline or suite, names a path of the machine it was made on.

Training records, recorded baselines and copied data once carried absolute paths of the machines that wrote
them (a checkout under /work, an output under /root): they say nothing to a user and leak a workplace's
layout. This reads every text file under the package, baselines/ and suites/ and fails on such a path.
Knows nothing of what the files mean.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("ddtree_bench", "baselines", "suites")
TEXT = {".json", ".jsonl", ".md", ".yaml", ".yml", ".txt", ".csv", ".py", ".toml"}
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home)/[\w.+-]")


def test_no_shipped_text_file_names_a_machine_path():
    offenders = []
    for top in SCANNED:
        for p in (ROOT / top).rglob("*"):
            if p.suffix not in TEXT or not p.is_file() or "__pycache__" in p.parts:
                continue
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if MACHINE_PATH.search(line):
                    offenders.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not offenders, "machine paths in shipped files:\n" + "\n".join(offenders[:20])


def test_the_pattern_catches_what_it_is_for():
    assert MACHINE_PATH.search('"/work/main/ddtree_bench/__main__.py"')
    assert MACHINE_PATH.search("--out /root/out/toy")
    assert not MACHINE_PATH.search("docs/work/notes.md and /tmp/pair")
