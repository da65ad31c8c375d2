"""text_file.parse_text_file through its two callers, results.read_json and
yaml_mapping.read_yaml_mapping: each bad file gives the one error line it gave before the two shared
the helper (binary bytes, syntax error, nesting too deep, unreadable, missing), a YAML key given twice is
refused, and good files parse."""

from __future__ import annotations

import pytest

from ddtree_bench.errors import UsageError
from ddtree_bench.results import read_json
from ddtree_bench.text_file import parse_text_file
from ddtree_bench.yaml_mapping import read_yaml_mapping


def _error(fn, *args) -> str:
    with pytest.raises(UsageError) as e:
        fn(*args)
    return str(e.value)


def test_json_errors_start_with_the_path(tmp_path):
    f = tmp_path / "x.json"
    f.write_bytes(b'{"a": "\xff"}')
    assert _error(read_json, f) == f"{f}: not UTF-8 text (a binary file?) at byte 7"
    f.write_text('{"a": ')
    assert _error(read_json, f).startswith(f"{f}: malformed JSON (Expecting value: line 1 column 7")
    f.write_text("[" * 100_000)
    assert _error(read_json, f) == f"{f}: JSON nested too deeply"
    assert _error(read_json, tmp_path) == f"{tmp_path}: cannot read (Is a directory)"
    assert _error(read_json, tmp_path / "nope.json") == f"{tmp_path / 'nope.json'} does not exist"
    f.write_text('{"a": [1, 2]}')
    assert read_json(f) == {"a": [1, 2]}


def test_yaml_errors_start_with_the_label(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_bytes(b"budgets: [16]\nname: \xfe\n")
    assert _error(read_yaml_mapping, f, "--config g.yaml", "a mapping") == \
        "--config g.yaml: not UTF-8 text (a binary file?) at byte 20"
    f.write_text("budgets: [16\n")
    msg = _error(read_yaml_mapping, f, "--config g.yaml", "a mapping")
    assert msg.startswith("--config g.yaml: malformed YAML (") and "\n" not in msg   # the parser's first line only
    f.write_text("- a\n")
    assert _error(read_yaml_mapping, f, "L", "a mapping of keys") == "L: expected a mapping of keys"
    assert _error(read_yaml_mapping, tmp_path / "none.yaml", "L", "x") == "L does not exist"
    f.write_text("")
    assert read_yaml_mapping(f, "L", "x") == {}
    f.write_text("budgets: [16, 32]\n")
    assert read_yaml_mapping(f, "L", "x") == {"budgets": [16, 32]}
    f.write_text("limit: 1\nbudgets: [16]\nlimit: 2\n")   # YAML would keep limit: 2 and say nothing
    assert _error(read_yaml_mapping, f, "L", "x") == "L: malformed YAML (key 'limit' given twice at line 3, column 1)"
    f.write_text("correctness:\n  max_errors: 0\n  max_errors: 1\n")
    assert "key 'max_errors' given twice at line 3" in _error(read_yaml_mapping, f, "L", "x")
    f.write_text("base: &b {limit: 1, suites: [gsm8k]}\ngrid:\n  <<: *b\n  limit: 2\n")   # a merge key may be overridden
    assert read_yaml_mapping(f, "L", "x")["grid"] == {"limit": 2, "suites": ["gsm8k"]}


def test_nesting_too_deep_and_a_custom_detail(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("deep")

    def deep(text):
        raise RecursionError

    assert _error(parse_text_file, f, "T", "FMT", deep, ValueError) == "T: FMT nested too deeply"

    def bad(text):
        raise ValueError(f"line one of {text}\nline two")

    assert _error(parse_text_file, f, "T", "FMT", bad, ValueError, lambda e: str(e).splitlines()[0]) == \
        "T: malformed FMT (line one of deep)"
