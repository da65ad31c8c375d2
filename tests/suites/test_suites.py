"""Suites: exact user-turn templates, z-lab subset rules (golden ids), limits, YAML and JSONL errors.

Expected template strings are transcribed from the shared docs (dflash-drafter.md §3,
ddtree-algorithm.md §6.1), not produced by the code under test. Golden ids were computed once and
cross-checked against HF `datasets` (`test_zlab_paper_matches_hf_datasets_shuffle`) and
`random.shuffle` (`test_zlab_current_matches_random_shuffle`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ddtree_bench.errors import UsageError
from ddtree_bench.suites import catalog
from ddtree_bench.suites.prompts import load_suite
from ddtree_bench.suites.sources import DATA_DIR
from ddtree_bench.suites.subsets import select_indices

BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_PREFIX = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
LCB_PREAMBLE = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
                "generate a correct Python program that matches the specification and passes all tests. You will NOT "
                "return anything except for the program")
PAPER_SUITES = ["gsm8k", "math500", "aime24", "aime25", "humaneval", "mbpp", "livecodebench", "swe-bench", "mt-bench", "alpaca"]
PAPER_COUNTS = {"gsm8k": 128, "math500": 128, "aime24": 30, "aime25": 30, "humaneval": 164, "mbpp": 128,
                "livecodebench": 128, "swe-bench": 128, "mt-bench": 80, "alpaca": 128}
OFFLINE = {"gsm8k", "humaneval", "mt-bench", "sharegpt", "chat-mix"}


def _bundled(name: str) -> list[dict]:
    with open(DATA_DIR / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _ids(suite: str, limit: int | None = None, subset: str | None = None) -> list[str]:
    return [p.prompt_id for p in load_suite(suite, limit, subset=subset).prompts]


# ----------------------------------------------------------------------------- templates


def test_gsm8k_template_on_bundled_item():
    item = _bundled("gsm8k_test.jsonl")[0]
    assert item["question"].startswith("Janet")
    loaded = load_suite("gsm8k", 1, subset="first")
    prompts, info = loaded.prompts, loaded.info
    assert prompts[0].turns == [item["question"] + BOXED]
    assert catalog.user_turns("gsm8k", {"question": "What is 2+2?"}) == ["What is 2+2?" + BOXED]
    assert info.template == "{{ question }}" + BOXED


def test_humaneval_template_on_bundled_item():
    item = _bundled("humaneval.jsonl")[0]
    prompts = load_suite("humaneval", 1, subset="first").prompts
    assert prompts[0].prompt_id == "HumanEval/0"
    assert prompts[0].turns == [HUMANEVAL_PREFIX + item["prompt"] + "\n```"]


def test_mt_bench_carries_both_turns_verbatim():
    items = _bundled("mt_bench_questions.jsonl")
    loaded = load_suite("mt-bench")
    prompts, info = loaded.prompts, loaded.info
    assert len(prompts) == 80 and info.num_prompts == 80
    assert all(len(p.turns) == 2 for p in prompts)
    assert prompts[0].prompt_id == "81" and prompts[0].turns == items[0]["turns"]
    assert prompts[0].meta["category"] == "writing"


def test_sharegpt_uses_first_human_turn():
    item = _bundled("sharegpt_sample500.jsonl")[0]
    prompts = load_suite("sharegpt", 1, subset="first").prompts
    assert prompts[0].prompt_id == item["id"]
    assert prompts[0].turns == [item["conversations"][0]["value"]]


@pytest.mark.parametrize("suite", ["math500", "aime24", "aime25"])
def test_math_templates(suite):
    assert catalog.user_turns(suite, {"problem": "Find x."}) == ["Find x." + BOXED]


def test_mbpp_prompt_verbatim():
    assert catalog.user_turns("mbpp", {"prompt": "Write a function to add two numbers.", "task_id": 2}) == \
        ["Write a function to add two numbers."]


def test_swe_bench_template():
    assert catalog.user_turns("swe-bench", {"problem_statement": "It crashes."}) == \
        ["Problem Statement:\nIt crashes.\nPlease fix the issue described above."]


def test_alpaca_optional_input():
    assert catalog.user_turns("alpaca", {"instruction": "Give three tips.", "input": ""}) == ["Give three tips."]
    assert catalog.user_turns("alpaca", {"instruction": "Summarize.", "input": "Some text."}) == \
        ["Summarize.\n\nInput:\nSome text."]


def test_livecodebench_starter_code_and_stdin_blocks():
    with_starter = catalog.user_turns("livecodebench", {"question_content": "Q?", "starter_code": "class Solution:\n    pass"})
    assert with_starter == [LCB_PREAMBLE + "\n\n### Question:\nQ?\n\n### Format: Use the following code structure:\n"
                            "```python\nclass Solution:\n    pass\n```\n\n### Answer: (use the provided format with backticks)"]
    no_starter = catalog.user_turns("livecodebench", {"question_content": "Q?", "starter_code": ""})
    assert no_starter == [LCB_PREAMBLE + "\n\n### Question:\nQ?\n\n### Format: Write your code in the following format:\n"
                          "```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with backticks)"]


def test_missing_field_and_mix_template_are_usage_errors():
    with pytest.raises(UsageError, match="question"):
        catalog.user_turns("gsm8k", {"problem": "x"})
    with pytest.raises(UsageError, match="mix"):
        catalog.user_turns("chat-mix", {"question": "x"})


# ----------------------------------------------------------------------------- suite table


def test_paper_suites_defaults():
    for name in PAPER_SUITES:
        spec = catalog.get_spec(name)
        assert spec.n == PAPER_COUNTS[name], name
        assert spec.subset == "zlab-paper", name
        assert catalog.is_offline(spec) == (name in OFFLINE), name
    names = set(catalog.suite_names())
    assert {*PAPER_SUITES, "sharegpt", "chat-mix", "smoke"} <= names


def test_hf_sources_named():
    expect = {"math500": ("HuggingFaceH4/MATH-500", None, "test"), "aime24": ("HuggingFaceH4/aime_2024", None, "train"),
              "aime25": ("MathArena/aime_2025", None, "train"), "mbpp": ("google-research-datasets/mbpp", "sanitized", "test"),
              "swe-bench": ("princeton-nlp/SWE-bench_Lite", None, "test"), "alpaca": ("tatsu-lab/alpaca", None, "train"),
              "livecodebench": ("livecodebench/code_generation_lite", None, "test")}
    for name, (hf, config, split) in expect.items():
        src = catalog.get_spec(name).source
        assert (src.hf, src.config, src.split) == (hf, config, split), name
    assert catalog.get_spec("livecodebench").source.data_files == [f"test{s}.jsonl" for s in ["", "2", "3", "4", "5", "6"]]


def test_offline_suites_load_fully():
    for name, n in [("gsm8k", 128), ("humaneval", 164), ("mt-bench", 80), ("sharegpt", 128), ("chat-mix", 80)]:
        loaded = load_suite(name)
        prompts, info = loaded.prompts, loaded.info
        assert len(prompts) == n == info.num_prompts, name
        assert len({p.prompt_id for p in prompts}) == n, name
        assert info.subset_rule == "zlab-paper" and info.default_n == n and info.template


def test_package_ships_the_suite_files():
    pkg = catalog.PACKAGE_DIR / "suite_specs"
    assert pkg.is_dir()
    top = catalog.PACKAGE_DIR.parent / "suites"
    if top.is_dir():
        assert sorted(p.name for p in pkg.glob("*.yaml")) == sorted(p.name for p in top.glob("*.yaml"))


# ----------------------------------------------------------------------------- subset rules


def test_zlab_paper_golden_ids():
    assert _ids("gsm8k", 8) == ["264", "725", "996", "586", "1010", "12", "904", "130"]
    assert _ids("humaneval", 5) == ["HumanEval/139", "HumanEval/123", "HumanEval/105", "HumanEval/10", "HumanEval/148"]
    assert _ids("mt-bench", 6) == ["131", "86", "100", "147", "134", "90"]
    assert _ids("sharegpt", 3) == ["YlSddAS_0", "bGpwbP4_0", "eqHK2kt_0"]


def test_zlab_current_golden_ids():
    assert _ids("gsm8k", 8, "zlab-current") == ["1101", "120", "474", "991", "192", "1020", "350", "480"]
    assert _ids("humaneval", 5, "zlab-current") == ["HumanEval/146", "HumanEval/67", "HumanEval/68", "HumanEval/94", "HumanEval/54"]
    assert _ids("mt-bench", 6, "zlab-current") == ["137", "125", "123", "131", "105", "112"]
    info = load_suite("gsm8k", 2, subset="zlab-current").info
    assert info.subset_rule == "zlab-current"


def test_zlab_paper_matches_hf_datasets_shuffle():
    datasets = pytest.importorskip("datasets")
    rows = _bundled("gsm8k_test.jsonl")
    ds = datasets.Dataset.from_list([{"i": i, "question": r["question"]} for i, r in enumerate(rows)])
    hf = ds.shuffle(seed=0).select(range(128))
    assert [r["i"] for r in hf] == select_indices(len(rows), 128, "zlab-paper")
    assert [p.turns[0] for p in load_suite("gsm8k").prompts] == [r["question"] + BOXED for r in hf]
    mt = datasets.Dataset.from_list(_bundled("mt_bench_questions.jsonl"))
    assert [str(r["question_id"]) for r in mt.shuffle(seed=0).select(range(10))] == _ids("mt-bench", 10)


def test_zlab_current_matches_random_shuffle():
    rows = _bundled("gsm8k_test.jsonl")
    state = random.getstate()
    try:
        items = [dict(r, i=i) for i, r in enumerate(rows)]
        random.seed(0)  # z-lab: random.seed(0) ... if len > max_samples: random.shuffle(dataset); dataset[:n]
        random.shuffle(items)
    finally:
        random.setstate(state)
    assert [it["i"] for it in items[:128]] == select_indices(len(rows), 128, "zlab-current")


def test_rules_select_different_subsets_and_no_shuffle_when_small():
    assert set(_ids("gsm8k")) != set(_ids("gsm8k", subset="zlab-current"))
    # n >= dataset size: neither z-lab script shuffles, so every item in source order
    assert _ids("humaneval") == [f"HumanEval/{i}" for i in range(164)]
    assert _ids("humaneval", 500, "zlab-current") == [f"HumanEval/{i}" for i in range(164)]
    assert select_indices(5, 5, "zlab-paper") == [0, 1, 2, 3, 4]


def test_limit_is_a_prefix_of_the_default_selection():
    full = _ids("gsm8k")
    assert len(full) == 128
    assert _ids("gsm8k", 10) == full[:10]
    assert _ids("gsm8k", 300)[:128] == full
    assert len(_ids("smoke", 10)) == 3
    with pytest.raises(UsageError, match="--limit"):
        load_suite("gsm8k", 0)
    with pytest.raises(UsageError, match="subset"):
        load_suite("gsm8k", 3, subset="random")


def test_chat_mix_is_balanced_round_robin():
    loaded = load_suite("chat-mix", 8)
    prompts, info = loaded.prompts, loaded.info
    cats = [p.meta["category"] for p in prompts]
    assert cats == ["multi_turn", "math_reasoning", "coding", "chat"] * 2
    assert [p.prompt_id for p in prompts[:4]] == ["mt-bench/131", "gsm8k/264", "humaneval/HumanEval/139", "sharegpt/YlSddAS_0"]
    assert len(prompts[0].turns) == 2 and prompts[1].turns[0].endswith(BOXED)
    assert info.num_available == 80


# ----------------------------------------------------------------------------- errors


def test_unknown_suite():
    with pytest.raises(UsageError, match="unknown suite 'nope'"):
        load_suite("nope")


@pytest.fixture
def suite_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(catalog.ENV_DIRS, str(tmp_path))
    return tmp_path


def _write(d: Path, name: str, text: str) -> Path:
    p = d / name
    p.write_text(text, encoding="utf-8")
    return p


GOOD = 'source: {file: items.jsonl}\nn: 2\nsubset: first\nid_field: key\nturns: ["Q: {{ q }}"]\n'


def test_user_suite_dir_and_relative_file(suite_dir):
    _write(suite_dir, "items.jsonl", '{"key": "a", "q": "one"}\n{"key": "b", "q": "two"}\n{"key": "c", "q": "three"}\n')
    _write(suite_dir, "mine.yaml", GOOD)
    loaded = load_suite("mine")
    prompts, info = loaded.prompts, loaded.info
    assert [(p.prompt_id, p.turns) for p in prompts] == [("a", ["Q: one"]), ("b", ["Q: two"])]
    assert info.subset_rule == "first" and info.num_available == 3 and info.spec_file.endswith("mine.yaml")
    assert "mine" in catalog.suite_names()
    # a user directory comes first, so it can override a built-in name
    _write(suite_dir, "gsm8k.yaml", GOOD.replace("Q: ", "Mine: "))
    assert load_suite("gsm8k").prompts[0].turns == ["Mine: one"]
    # a YAML path works as --suite too
    assert load_suite(str(suite_dir / "mine.yaml"), 1).prompts[0].prompt_id == "a"


@pytest.mark.parametrize("text, match", [
    (GOOD + "temperature: 0\n", r"bad\.yaml: unknown key 'temperature'"),
    (GOOD.replace("source: {file: items.jsonl}", "source: {file: items.jsonl, revision: x}"), r"bad\.yaml: unknown key 'source\.revision'"),
    ("source: {file: items.jsonl\nturns: [x]\n", r"bad\.yaml:\d+: malformed YAML"),
    ("source: {file: items.jsonl}\nn: 1\nturns: [x]\nn: 3\n", r"bad\.yaml:4: malformed YAML \(key 'n' given twice\)"),
    (GOOD + "name: other\n", "must match"),
    (GOOD.replace("subset: first", "subset: shuffle"), "unknown subset rule 'shuffle'"),
    (GOOD + "turns_from: turns\n", "exactly one of 'turns'"),
    (GOOD.replace("{{ q }}", "{{ q "), "template syntax error"),
    (GOOD.replace("n: 2", "n: -1"), "'n' must be a positive integer"),
    ("source: {hf: org/ds}\nturns: [x]\n", "split"),
    ("- just\n- a list\n", "YAML mapping"),
    ("mix: [{suite: gsm8k, n: 2, weight: 1}]\n", r"unknown key 'mix\[0\]\.weight'"),
])
def test_bad_suite_yaml_is_a_usage_error_naming_the_file(suite_dir, text, match):
    _write(suite_dir, "bad.yaml", text)
    with pytest.raises(UsageError, match=match) as e:
        load_suite("bad")
    assert "bad.yaml" in str(e.value)


@pytest.mark.parametrize("text, match", [
    (GOOD.replace("Q: {{ q }}", "{% for x in range(10**9) %}a{% endfor %}"), r"template failed on item 0 .*OverflowError"),
    ("mix: [{suite: smoke, n: 2}]\n", "the built-in smoke suite has no definition"),
])
def test_template_runtime_errors_and_a_mix_of_smoke_are_usage_errors(suite_dir, text, match):
    _write(suite_dir, "items.jsonl", '{"key": "a", "q": "one"}\n{"key": "b", "q": "two"}\n')
    _write(suite_dir, "bad.yaml", text)
    with pytest.raises(UsageError, match=match):
        load_suite("bad")


def test_unknown_key_exits_2_from_the_cli(suite_dir, capsys):
    from ddtree_bench.cli import main

    _write(suite_dir, "bad.yaml", GOOD + "temprature: 0\n")
    with pytest.raises(SystemExit) as e:
        main(["suites"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "bad.yaml: unknown key 'temprature'" in err and "Traceback" not in err


def test_render_errors_name_the_item(suite_dir):
    _write(suite_dir, "items.jsonl", '{"key": "a", "q": "one"}\n{"key": "b"}\n')
    _write(suite_dir, "mine.yaml", GOOD)
    with pytest.raises(UsageError, match=r"item 1 \(b\).*'q' is undefined"):
        load_suite("mine")


# ----------------------------------------------------------------------------- custom JSONL


@pytest.mark.parametrize("lines, match", [
    ('{"id": "a", "turns": ["hi"]}\n{"id": "b", "turns": ["x"\n', r"x\.jsonl:2: malformed JSON"),
    ('{"id": "a", "turns": ["hi"]}\n\n{"id": "b", "turns": []}\n', r"x\.jsonl:3: \"turns\" must be"),
    ('{"id": "a", "turns": ["hi"]}\n{"id": "a", "turns": ["x"]}\n', r"x\.jsonl:2: duplicate id 'a'"),
    ('["a"]\n', r"x\.jsonl:1: expected an object"),
    ('{"id": "a", "turns": ["hi"], "max_new_tokens": 0}\n', r"x\.jsonl:1: \"max_new_tokens\""),
    ('\n', "has no prompts"),
    ('{"id": "a", "turns": ["hi"]}\n{"id": "b", "turns": ["ok", "x\\ud800y"]}\n', r"x\.jsonl:2: turn 1 holds a lone surrogate"),
])
def test_custom_jsonl_errors_name_the_line(tmp_path, lines, match):
    p = _write(tmp_path, "x.jsonl", lines)
    with pytest.raises(UsageError, match=match):
        load_suite(str(p))


def test_a_byte_order_mark_opening_a_suite_is_dropped(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "turns": ["hi"]}).encode() + b"\n")
    assert [x.prompt_id for x in load_suite(str(p)).prompts] == ["a"]


def test_custom_jsonl_suite(tmp_path):
    p = _write(tmp_path, "c.jsonl", "".join(json.dumps({"id": f"p{i}", "turns": [f"t{i}", "again"], "tag": i}) + "\n" for i in range(5))
               + json.dumps({"question_id": 99, "turns": ["spec-bench style"]}) + "\n")
    loaded = load_suite(str(p))
    prompts, info = loaded.prompts, loaded.info
    assert [x.prompt_id for x in prompts] == ["p0", "p1", "p2", "p3", "p4", "99"]
    assert prompts[0].turns == ["t0", "again"] and prompts[0].meta["tag"] == 0
    assert info.subset_rule is None and info.num_available == 6
    assert [x.prompt_id for x in load_suite(str(p), 2).prompts] == ["p0", "p1"]
    picked = load_suite(str(p), 2, subset="zlab-paper").prompts
    assert [x.prompt_id for x in picked] == [f"p{i}" if i < 5 else "99" for i in select_indices(6, 2, "zlab-paper")]
    with pytest.raises(UsageError, match="does not exist"):
        load_suite(str(tmp_path / "missing.jsonl"))


def test_an_id_field_in_none_of_the_items_is_a_misspelling(suite_dir):
    """Items lacking id_field use their index (documented); a field no item has is a typo: exit 2 naming the fields."""
    _write(suite_dir, "items.jsonl", '{"key": "a", "q": "one"}\n{"key": "b", "q": "two"}\n')
    _write(suite_dir, "typo.yaml", GOOD.replace("id_field: key", "id_field: kye"))
    with pytest.raises(UsageError, match=r"id_field 'kye' is in none of its 2 items \(their fields: key, q\)"):
        load_suite("typo")
    _write(suite_dir, "some.jsonl", '{"key": "a", "q": "one"}\n{"q": "two"}\n')   # one item lacks it: its index
    _write(suite_dir, "some.yaml", GOOD.replace("items.jsonl", "some.jsonl"))
    assert [p.prompt_id for p in load_suite("some").prompts] == ["a", "1"]
