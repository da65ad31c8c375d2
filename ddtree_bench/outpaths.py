"""Output paths checked before any work, and files written so that no reader sees half of one.

Every command that writes (`run`/`sweep --out DIR`, `gate --junit/--markdown FILE`, `report --out`,
`baseline record/import --out`, `bench-engine --out`, `toy train --out`) calls `check_output_file`
or `check_output_dir` before it loads a model or reads a suite, so a bad path is exit 2 with one
line, not an internal error after minutes of work. The check does not guess at file systems: it
walks up to the nearest existing ancestor (which must be a directory: `afile/sub` fails here) and
creates and removes one temporary file there, so `/proc/x`, read-only mounts and permissions all
fail the same honest way. Nothing is left behind: missing parent directories are created only when
the file itself is written.

`atomic_write_text` / `atomic_write_bytes`: a temporary file in the target's directory (unique per
process and call, so two writers never share one) and `os.replace`. Knows nothing of results.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from ddtree_bench.errors import UsageError


def _nearest_existing(path: Path) -> Path:
    p = path
    while not os.path.lexists(p):
        if p.parent == p:
            break
        p = p.parent
    return p


def _probe_writable(directory: Path, flag: str, target: Path) -> None:
    """Create and remove one temporary file in `directory` (the only honest writability test)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".ddtree-bench-probe-", dir=directory)
    except OSError as e:
        raise UsageError(f"{flag} {target}: cannot write in {directory} ({e.strerror or e})") from None
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass


def _check_parents(path: Path, flag: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    base = _nearest_existing(parent)
    if not base.is_dir():
        raise UsageError(f"{flag} {path}: {base} is a file, not a directory")
    _probe_writable(base, flag, path)


def check_output_file(path: str | Path, flag: str = "--out") -> Path:
    """A file the command will write: not a directory, its directory creatable and writable."""
    path = Path(path)
    if str(path) in ("", "."):
        raise UsageError(f"{flag}: expected a file path")
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; expected a file path")
    _check_parents(path, flag)
    if path.exists() and not path.is_file():
        raise UsageError(f"{flag} {path} exists and is not a regular file")
    return path


def check_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """A directory the command will create or fill: not a file, creatable, writable."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a directory")
    if path.is_dir():
        _probe_writable(path, flag, path)
    else:
        _check_parents(path, flag)
    return path


def make_dirs(path: Path, flag: str = "--out") -> None:
    """mkdir -p, with an OSError turned into a one-line UsageError."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag}: cannot create {path} ({e.strerror or e})") from None


def unique_sibling(path: Path, tag: str) -> Path:
    """A hidden sibling name no other process or call will pick: .NAME.TAG-PID-RANDOM."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write via a unique temporary file in the same directory, then rename (never half a file)."""
    path = Path(path)
    tmp = unique_sibling(path, "tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))
