"""Reading a YAML file whose top level is a mapping (sweep grids, gate rules), with one clear error line.

Missing file, non-UTF-8 bytes, malformed YAML, a key given twice in one mapping (YAML keeps the last
silently), nesting too deep or another top level raise `UsageError` that starts with the caller's
label. Knows YAML; nothing of what the keys mean (each caller checks its own keys).
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
    data = parse_text_file(path, label, "YAML", lambda text: yaml.load(text, Loader=unique_keys_loader()), yaml.YAMLError,
                           _yaml_error)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{label}: expected {expect}")
    return data


def unique_keys_loader():
    """yaml.SafeLoader that refuses a key given twice in one mapping (a ConstructorError naming key and line)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *anchor`, which the keys after it may override
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def _yaml_error(e: Exception) -> str:
    """'PROBLEM at line L, column C' of a YAML error (its first line where it has no position)."""
    problem, mark = getattr(e, "problem", None), getattr(e, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(e).splitlines()[0]
