"""`baseline import` on a synthetic DDTree-authors `.pt` built with the documented structure
(ddtree-algorithm.md §7.2-7.3): responses[i][method] SimpleNamespaces with the prompt inside
`output_ids`, no ids, order sharded over ranks, MT-Bench-style items giving two consecutive
responses whose turn-2 prompt carries the *last* method's answer."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch

from baseline_support import cli
from ddtree_bench.baselines.file import read_baseline
from ddtree_bench.tokenizer import ChatTokenizer
from ddtree_bench.toy.tokenizer import IM_END, write_tokenizer

ITEMS = [
    {"id": "q0", "turns": ["What is 2 + 2?"]},
    {"id": "q1", "turns": ["Name a prime number."]},
    {"id": "q2", "turns": ["Write a haiku about rain."]},
    {"id": "mt0", "turns": ["Plan a trip to Rome.", "Now make it shorter."]},
    {"id": "mt1", "turns": ["Explain recursion.", "Give an example in Python."]},
]
METHODS = ("baseline", "dflash", "ddtree_tb64")  # the last one run feeds turn 2, as in the authors' SDPA runs
WORLD = 2


def _ns(prompt_ids, out_ids, accept):
    return SimpleNamespace(output_ids=torch.tensor([prompt_ids + out_ids], dtype=torch.long), num_input_tokens=len(prompt_ids),
                           num_output_tokens=len(out_ids), acceptance_lengths=accept, time_per_output_token=0.01)


def _answer(rng, n):
    return [rng.randrange(97, 123) for _ in range(n)] + [IM_END]


def build_pt(path, tok, items=ITEMS, args=None, junk_at=3):
    """Responses per item (one per turn, consecutive), ranks concatenated: rank r runs items r, r+W, ..."""
    rng = random.Random(0)
    per_item = []
    for item in items:
        responses, messages = [], []
        for turn, text in enumerate(item["turns"]):
            messages = messages + [{"role": "user", "content": text}]
            prompt = tok.apply_chat_template(messages)
            ar = _answer(rng, 6 + turn)
            outs = {"baseline": ar, "dflash": ar, "ddtree_tb64": ar[:-2] + [ord("!"), IM_END]}  # ddtree differs: a near tie
            accepts = {"baseline": [1] * len(ar), "dflash": [3, 2, 3], "ddtree_tb64": [4, 4]}
            responses.append({m: _ns(prompt, outs[m], accepts[m]) for m in METHODS})
            messages = messages + [{"role": "assistant", "content": tok.decode(outs[METHODS[-1]])}]
        per_item.append(responses)
    ordered = [r for rank in range(WORLD) for i in range(rank, len(items), WORLD) for r in per_item[i]]
    if junk_at is not None:
        junk_prompt = tok.apply_chat_template([{"role": "user", "content": "not in the suite"}])
        ordered.insert(junk_at, {m: _ns(junk_prompt, [100, IM_END], [1, 1]) for m in METHODS})
    args = args or {"model_name_or_path": "Qwen/Qwen3-8B", "draft_name_or_path": "z-lab/Qwen3-8B-DFlash-b16",
                    "max_new_tokens": 2048, "temperature": 0.0, "dataset": "mt-bench", "tree_budget": "64"}
    torch.save({"responses": ordered, "block_size": 16, "target_attn_implementation": "sdpa", "args": args}, path)
    return ordered


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("imp")
    write_tokenizer(d / "tok")
    tok = ChatTokenizer(d / "tok")
    suite = d / "suite.jsonl"
    suite.write_text("".join(json.dumps(x) + "\n" for x in ITEMS))
    pt = d / "run.pt"
    responses = build_pt(pt, tok)
    return d, tok, suite, pt, responses


def test_refuses_a_pickle_without_trust(setup, capsys):
    d, _, suite, pt, _ = setup
    out = d / "refused.jsonl"
    code, _, err = cli(["baseline", "import", pt, "--tokenizer", d / "tok", "--suite", suite, "--out", out], capsys)
    assert code == 2 and "runs code" in err and "--trust-pickle" in err
    assert not out.exists()


def test_import_matches_sharded_and_two_turn_responses(setup, capsys):
    d, tok, suite, pt, responses = setup
    out = d / "imported.jsonl"
    code, stdout, err = cli(["baseline", "import", pt, "--trust-pickle", "--tokenizer", d / "tok", "--suite", suite,
                             "--accept-from", "ddtree_tb64", "--out", out, "-q"], capsys)
    assert code == 0, err
    assert "1 responses match no prompt" in err  # the junk response, reported not guessed
    # (it sits between mt1's two turns, so mt1 turn 2 is found by re-rendering, not by adjacency)
    b = read_baseline(out)
    # every (item, turn) found, in suite order, despite the rank-interleaved order of the file
    assert [e.key for e in b.entries] == [("q0", 0), ("q1", 0), ("q2", 0), ("mt0", 0), ("mt0", 1), ("mt1", 0), ("mt1", 1)]
    assert b.header["unmatched_responses"] == [3] and b.header["num_matched"] == 7
    for e in b.entries:
        src = responses[e.extra["source_index"]]["baseline"]
        ids = src.output_ids[0].tolist()
        assert e.prompt_ids == ids[: src.num_input_tokens] and e.output_ids == ids[src.num_input_tokens:]
        assert e.logit_gap is None and e.finish_reason == "stop"
        assert e.accept_lengths == [4, 4]  # carried from --accept-from
        assert e.output_text == tok.decode(e.output_ids)
    # turn 2 was matched through the authors' rule: its context is the last method's answer
    t1 = b.by_key()[("mt0", 1)]
    assert t1.extra["matched_by"] == "ids" and t1.extra["context_method"] == "ddtree_tb64"
    h = b.header
    assert h["source"] == "import" and h["model"] == "Qwen/Qwen3-8B" and h["max_new_tokens"] == 2048
    assert h["accept_method"] == "ddtree" and h["budget"] == 64 and h["method"] == "ar"
    assert h["tau_by_method"]["ddtree_tb64"] == pytest.approx(4.0) and h["tau_by_method"]["baseline"] == pytest.approx(1.0)


def test_method_choice_and_text_fallback(setup):
    from ddtree_bench.baselines.import_pt import import_responses
    from ddtree_bench.suites.prompts import load_suite

    _, tok, suite, pt, _ = setup
    obj = torch.load(pt, weights_only=False)
    prompts = load_suite(str(suite)).prompts
    chosen = import_responses(obj, tok, prompts, method="ddtree_tb64")
    assert all(e.output_ids[-2] == ord("!") for e in chosen.entries)  # the ddtree outputs, not their AR
    assert chosen.entries[0].accept_lengths == [4, 4]  # --accept-from defaults to --method
    # a response whose prompt is tokenised byte by byte (the specials spelled out) matches by decoded text only
    first = obj["responses"][0]
    n_in = first["baseline"].num_input_tokens
    prompt = first["baseline"].output_ids[0, :n_in].tolist()
    text = tok.decode(prompt, skip_special_tokens=False)
    byte_ids = list(text.encode("utf-8"))
    assert byte_ids != prompt and tok.decode(byte_ids, skip_special_tokens=False) == text
    gen = first["baseline"].output_ids[0, n_in:].tolist()
    obj["responses"][0] = {m: _ns(byte_ids, gen, [1] * len(gen)) for m in METHODS}
    r = import_responses(obj, tok, prompts)
    by_index = {e.extra["source_index"]: e for e in r.entries}
    assert by_index[0].extra["matched_by"] == "text" and by_index[0].output_ids == gen
    assert r.matched_by == {"ids": 6, "text": 1}


def test_missing_method_and_bad_file_exit_2(setup, tmp_path, capsys):
    d, _, suite, pt, _ = setup
    out = tmp_path / "x.jsonl"
    code, _, err = cli(["baseline", "import", pt, "--trust-pickle", "--tokenizer", d / "tok", "--suite", suite,
                        "--method", "ddtree_tb512", "--out", out], capsys)
    assert code == 2 and "has no method 'ddtree_tb512'" in err and not out.exists()
    bad = tmp_path / "bad.pt"
    torch.save({"something": 1}, bad)
    code, _, err = cli(["baseline", "import", bad, "--trust-pickle", "--tokenizer", d / "tok", "--suite", suite, "--out", out], capsys)
    assert code == 2 and "not a DDTree benchmark file" in err
    code, _, err = cli(["baseline", "import", pt, "--trust-pickle", "--tokenizer", d / "tok", "--suite", "smoke", "--out", out], capsys)
    assert code == 2 and "none of the" in err and not out.exists()


@pytest.mark.parametrize("field,value,says", [
    ("acceptance_lengths", [float("nan")], "acceptance_lengths must be a list of integers >= 1"),
    ("acceptance_lengths", ["x"], "acceptance_lengths must be a list of integers >= 1"),
    ("acceptance_lengths", [0, -3, 100], "acceptance_lengths must be a list of integers >= 1"),
    ("output_ids", [97, 99999], "token id 99999 is outside the tokenizer's vocabulary"),
    ("output_ids", [97, -5], "output_ids must be a tensor or list of token ids (integers >= 0)"),
])
def test_a_pt_with_bad_values_is_exit_2_and_writes_nothing(setup, tmp_path, capsys, field, value, says):
    """Values the baseline reader would refuse later (or that crashed the import) are refused at import."""
    d, tok, suite, _, responses = setup
    bad = [dict(r) for r in responses]
    ns = bad[0]["baseline"]
    prompt = ns.output_ids[0, : ns.num_input_tokens].tolist()
    if field == "output_ids":
        bad[0]["baseline"] = SimpleNamespace(**{**vars(ns), "output_ids": prompt + value, "num_input_tokens": len(prompt)})
    else:
        bad[0]["baseline"] = SimpleNamespace(**{**vars(ns), field: value})
    pt = tmp_path / "bad.pt"
    torch.save({"responses": bad, "block_size": 16, "args": {"max_new_tokens": 2048, "dataset": "mt-bench"}}, pt)
    out = tmp_path / "x.jsonl"
    code, _, err = cli(["baseline", "import", pt, "--trust-pickle", "--tokenizer", d / "tok", "--suite", suite,
                        "--out", out], capsys)
    assert code == 2 and says in err and "internal error" not in err, err
    assert not out.exists()


def test_acceptance_lengths_as_a_tensor_are_kept(setup, tmp_path, capsys):
    d, tok, suite, _, responses = setup
    as_tensor = [{m: SimpleNamespace(**{**vars(ns), "acceptance_lengths": torch.tensor(ns.acceptance_lengths)})
                  for m, ns in r.items()} for r in responses]
    pt = tmp_path / "t.pt"
    torch.save({"responses": as_tensor, "block_size": 16, "args": {"max_new_tokens": 2048, "dataset": "mt-bench"}}, pt)
    out = tmp_path / "t.jsonl"
    code, _, err = cli(["baseline", "import", pt, "--trust-pickle", "--tokenizer", d / "tok", "--suite", suite,
                        "--method", "dflash", "--out", out], capsys)
    assert code == 0, err
    assert all(e.accept_lengths == [3, 2, 3] for e in read_baseline(out).entries)


def test_gaps_from_model_rescore_equals_the_engines_own_gaps(setup, capsys):
    """--gaps-from-model re-scores teacher-forced; on the model's own greedy output that must give the
    gaps the engine reported while decoding (up to fp32 reduction order)."""
    from ddtree_bench.baselines.record import rescore_gaps
    from ddtree_bench.pair import load_pair

    d, tok, suite, pt, _ = setup
    pair = load_pair("random", None, "ar")
    prompt = pair.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}])
    g = pair.engine.generate(prompt, method="ar", max_new_tokens=12, return_logit_gaps=True)
    assert rescore_gaps(pair.engine, prompt, g.output_ids) == pytest.approx(g.logit_gaps, abs=1e-4)

    out = d / "with-gaps.jsonl"
    code, stdout, err = cli(["baseline", "import", pt, "--trust-pickle", "--tokenizer", "random", "--suite", suite,
                             "--gaps-from-model", "random", "--out", out, "-q"], capsys)
    assert code == 0, err
    assert "re-scored" in stdout
    b = read_baseline(out)
    assert b.has_gaps and b.header["logit_gap_source"]["model"] == "random"
    e = b.entries[0]
    assert e.logit_gap == pytest.approx(rescore_gaps(pair.engine, e.prompt_ids, e.output_ids), abs=1e-5)


def test_suite_and_sample_count_default_to_the_files_args(setup, tmp_path, capsys):
    """The authors' args name the dataset and max_samples; with the bundled mt-bench suite (zlab-paper
    subset, the paper's rule) the import needs neither --suite nor --limit."""
    from ddtree_bench.suites.prompts import load_suite

    d, tok, _, _, _ = setup
    loaded = load_suite("mt-bench", 4)
    prompts, info = loaded.prompts, loaded.info
    assert info.subset_rule == "zlab-paper" and all(len(p.turns) == 2 for p in prompts)
    pt = tmp_path / "mt.pt"
    build_pt(pt, tok, [{"id": p.prompt_id, "turns": p.turns} for p in prompts],
             args={"dataset": "mt-bench", "max_samples": 4, "max_new_tokens": 2048, "temperature": 0.0}, junk_at=None)
    out = tmp_path / "mt.jsonl"
    code, _, err = cli(["baseline", "import", pt, "--trust-pickle", "--tokenizer", d / "tok", "--out", out, "-q"], capsys)
    assert code == 0, err
    b = read_baseline(out)
    assert b.header["suite"] == "mt-bench" and b.header["subset_rule"] == "zlab-paper"
    assert [e.key for e in b.entries] == [(p.prompt_id, t) for p in prompts for t in (0, 1)]
    for bad in (True, 0, -1, "4"):   # the file's own value is named, not a --limit the user never passed
        build_pt(pt, tok, [{"id": p.prompt_id, "turns": p.turns} for p in prompts],
                 args={"dataset": "mt-bench", "max_samples": bad}, junk_at=None)
        code, _, err = cli(["baseline", "import", pt, "--trust-pickle", "--tokenizer", d / "tok", "--out", tmp_path / "x.jsonl"], capsys)
        assert code == 2 and "args.max_samples must be a positive integer" in err and "--limit N" in err, (bad, err)
