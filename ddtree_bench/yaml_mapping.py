"""Reading a YAML file whose top level is a mapping (sweep grids, gate rules), with one clear error line.

Missing file, non-UTF-8 bytes, malformed YAML, nesting too deep or another top level raise
`UsageError` that starts with the caller's label. Knows YAML; nothing of what the keys mean
(each caller checks its own keys).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError


def read_yaml_mapping(path: str | Path, label: str, expect: str) -> dict[str, Any]:
    """A YAML file whose top level is a mapping ({} when empty). Missing file, malformed YAML or
    another top level raise UsageError starting with `label` (e.g. "--config grid.yaml")."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{label} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{label}: not UTF-8 text (a binary file?) at byte {e.start}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{label}: malformed YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise UsageError(f"{label}: YAML nested too deeply") from None
    except OSError as e:
        raise UsageError(f"{label}: cannot read ({e.strerror or e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{label}: expected {expect}")
    return data
