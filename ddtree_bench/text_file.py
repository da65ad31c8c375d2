"""Reading a UTF-8 text file and parsing it (JSON, YAML, ...), with one clear error line.

Non-UTF-8 bytes, the parser's own syntax error, nesting too deep for the parser, or a read that
fails raise `UsageError` starting with the caller's label. Knows nothing of any format: the caller
passes the parser, its syntax-error type and the format's name. Whether the file exists is the
caller's check (its message differs by caller).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ddtree_bench.errors import UsageError


def parse_text_file(path: Path, label: str, fmt: str, parse: Callable[[str], Any],
                    syntax_error: type[Exception] | tuple[type[Exception], ...],
                    detail: Callable[[Exception], str] = str) -> Any:
    """`parse(text of path)`. Errors become UsageError: "LABEL: not UTF-8 text ...", "LABEL: malformed
    FMT (detail(e))", "LABEL: FMT nested too deeply", "LABEL: cannot read (...)"."""
    try:
        return parse(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{label}: not UTF-8 text (a binary file?) at byte {e.start}") from None
    except syntax_error as e:
        raise UsageError(f"{label}: malformed {fmt} ({detail(e)})") from None
    except RecursionError:
        raise UsageError(f"{label}: {fmt} nested too deeply") from None
    except OSError as e:
        raise UsageError(f"{label}: cannot read ({e.strerror or e})") from None
