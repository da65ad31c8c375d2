"""Reading a YAML file whose top level is a mapping (sweep grids, gate rules), with one clear error line.

Missing file, non-UTF-8 bytes, malformed YAML, nesting too deep or another top level raise
`UsageError` that starts with the caller's label. Knows YAML; nothing of what the keys mean
(each caller checks its own keys).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.text_file import parse_text_file


def read_yaml_mapping(path: str | Path, label: str, expect: str) -> dict[str, Any]:
    """A YAML file whose top level is a mapping ({} when empty). Missing file, malformed YAML or
    another top level raise UsageError starting with `label` (e.g. "--config grid.yaml")."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{label} does not exist")
    data = parse_text_file(path, label, "YAML", yaml.safe_load, yaml.YAMLError, lambda e: str(e).splitlines()[0])
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{label}: expected {expect}")
    return data
