"""tests/engine/gpu/conftest.py's DDTREE_TESTS_INSTAFAIL: a failing test's id and first error line reach stderr while
the run goes on (a device call's time limit can cut off pytest's summary), and nothing is printed without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def _run(tmp_path: Path, flag: str | None) -> subprocess.CompletedProcess:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text("def test_bad():\n    assert 1 == 2, 'shape 16x64: off by one'\n\n"
                                        "def test_good():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "DDTREE_TESTS_INSTAFAIL"}
    if flag is not None:
        env["DDTREE_TESTS_INSTAFAIL"] = flag
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_failure_is_told_on_stderr_as_it_happens(tmp_path):
    r = _run(tmp_path, "1")
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("FAILED")]
    assert lines == ["FAILED test_x.py::test_bad (call): AssertionError: shape 16x64: off by one"], r.stderr


def test_without_the_flag_stderr_stays_quiet(tmp_path):
    r = _run(tmp_path, None)
    assert r.returncode == 1 and "FAILED test_x.py" not in r.stderr
