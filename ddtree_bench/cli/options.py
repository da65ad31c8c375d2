"""Command-line options shared by several commands, declared once (flag name, help, default).

Defaults come from `ddtree_bench.defaults`; nothing here repeats a number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


Backend = Annotated[str, typer.Option("--backend", help="inprocess | standalone | sglang | vllm | llamacpp (llama.cpp's llama-server, docs/llama-cpp.md) | openai (any OpenAI-compatible server: standard fields only, docs/openai-compat.md).")]
Stream = Annotated[bool, typer.Option("--stream/--no-stream", help="HTTP backends: stream each response (SSE; per-chunk times) or ask for one JSON body (no TTFT/ITL).")]
Url = Annotated[Optional[str], typer.Option("--url", help="Base URL of a running server (backends other than inprocess).")]
ApiKey = Annotated[Optional[str], typer.Option("--api-key", help="Bearer token for the server.", envvar="DDTREE_BENCH_API_KEY")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds one HTTP request may take, stream included, before it is recorded as an error.")]
Model = Annotated[str, typer.Option("--model", help="'toy' or 'toy-hybrid' (bundled pairs), 'random' (a seeded random tiny pair in memory: plumbing and speed, no acceptance), or a Hugging Face model directory.")]
Draft = Annotated[Optional[str], typer.Option("--draft", help="DFlash drafter directory (default: the model's bundled drafter for 'toy').")]
Method = Annotated[str, typer.Option("--method", help="ar | dflash | ddtree.")]
Budget = Annotated[int, typer.Option("--budget", help="DDTree tree budget: number of tree nodes, root excluded.")]
Suite = Annotated[str, typer.Option("--suite", help="Suite name (see `ddtree-bench suites`) or a JSONL file of {\"id\", \"turns\"}.")]
Limit = Annotated[Optional[int], typer.Option("--limit", help="Number of prompts (default: the suite's sample count).")]
Subset = Annotated[Optional[str], typer.Option("--subset", help="Subset rule: zlab-paper (HF shuffle(seed=0), the DDTree paper's) | zlab-current (random.seed(0) shuffle, z-lab's current script) | first (file order). Default: the suite's.")]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", help="Maximum generated tokens per turn.")]
Temperature = Annotated[float, typer.Option("--temperature", help="0 = greedy.")]
Seed = Annotated[int, typer.Option("--seed", help="Sampling seed: prompt i's turn t is sent seed + 16 i + t (the same request gets the same seed in every run and on every backend).")]
Dtype = Annotated[str, typer.Option("--dtype", help="float32 | bfloat16 | float16.")]
Device = Annotated[str, typer.Option("--device", help="cpu | cuda | cuda:N.")]
Concurrency = Annotated[int, typer.Option("--concurrency", help="Closed-loop: requests in flight at once.")]
RequestRate = Annotated[Optional[float], typer.Option("--request-rate", help="Open-loop Poisson arrivals per second (overrides --concurrency as the load shape).")]
CudaGraphs = Annotated[bool, typer.Option("--cuda-graphs", help="Engine fast path: fixed shapes, CUDA graphs, one host sync a round (same tokens; see docs/gpu-performance.md).")]
Out = Annotated[Optional[Path], typer.Option("--out", help="Results directory (default: results/<run-id>).")]
