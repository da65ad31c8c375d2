"""Every default that more than one place needs, written once.

CLI flags, YAML grid specs, the server and the engine read their defaults from here; nothing
else repeats these numbers.
"""

from __future__ import annotations

MODEL = "toy"                 # the bundled trained pair (ddtree_bench/models/toy)
METHOD = "ddtree"             # ar | dflash | ddtree
METHODS = ("ar", "dflash", "ddtree")
BUDGET = 64                   # DDTree tree budget: nodes, not counting the root
MAX_BUDGET = 16384            # the largest budget a flag or grid accepts. A tree of B nodes is verified in one
                              # forward of B + 1 query tokens whose ancestor mask is (B + 1)^2 entries (256 Mi at
                              # 16384) and the whole tree must fit the model's context beside the prompt; the
                              # papers' sweeps stop at 1024. Larger values are typos (16..2^40 never ends).
SWEEP_BUDGETS = "16..1024"    # powers of two, inclusive
SUITE = "gsm8k"
MAX_NEW_TOKENS = 256          # the papers use 2048; 256 keeps the CPU toy runs quick
TEMPERATURE = 0.0
SEED = 0
DTYPE = "float32"             # the reference is fp32-exact; pass bfloat16 for speed on GPU
DEVICE = "cpu"
BACKEND = "inprocess"         # inprocess | standalone | sglang | vllm
CONCURRENCY = 1
WARMUP_REQUESTS = 1
REQUEST_TIMEOUT_S = 600.0
HOST = "127.0.0.1"
PORT = 8000
GREEDY_EPS = 1e-5             # temperature below this is greedy (both engines and the papers)
NEAR_TIE_GAP = 1.0            # logit gap below which a greedy divergence counts as a near-tie
                              # (~2.4x the largest bf16 gap perturbation measured: docs/ci-gate.md §4)
SERVER_NEAR_TIE_GAP = 2.0     # the same for baselines recorded from a server's logprobs (bf16 on both sides:
                              # 2.4 x (run's + baseline's own bf16 perturbation, 2 x 0.418); docs/explain.md)
SERVER_TOP_LOGPROBS = 2       # baseline record from a server: top_logprobs asked per token (the gap needs two)
EXPLAIN_MATCH_RMS = 0.03      # explain: per-depth curves this close (RMS over depths) reproduce each other
EXPLAIN_AMBIGUOUS_RATIO = 1.5 # explain: a runner-up within this factor of the best variant's distance is as likely

# `ddtree-bench sweep` with no arguments (the embedded default sweep; must finish < 10 min on 2 CPU cores)
SWEEP_METHODS = ("ar", "dflash", "ddtree")
SWEEP_SUITE = "gsm8k"
SWEEP_LIMIT = 16              # prompts per point (default sweep: 1 min 39 s on 2 quiet CPU cores, 4 min 14 s on busy ones)
SWEEP_MAX_NEW_TOKENS = 64     # per prompt, per point
SWEEP_REPEATS = 1
EXTERNAL_DTYPE = "bfloat16"   # sweep default for SGLang / vLLM points (they serve on GPUs)
EXTERNAL_DEVICE = "cuda"
# Server lifecycle during sweeps (sweep/server.py); the profiles may override the startup timeout
SERVER_STARTUP_TIMEOUT_S = 600.0   # large models on SGLang/vLLM take minutes to load and capture graphs
SERVER_POLL_INTERVAL_S = 0.5
SERVER_HEALTH_TIMEOUT_S = 5.0      # per readiness request (vLLM binds its port before it can answer)
SERVER_STOP_GRACE_S = 10.0         # SIGTERM, then SIGKILL to the whole process group
SERVER_DEATH_SETTLE_S = 5.0        # after a point whose requests failed: how long a dying server gets to exit before it counts as alive
SERVER_PORT_CLASH_RETRIES = 2     # a server whose start failed on a port taken meanwhile is started again on fresh ports
SERVER_PORTS = (12000, 21999)      # where free_port draws: below Linux's ephemeral ports (32768-60999) and SGLang's own 22000-29999
CROSSCHECK_REL_TOL = 0.05          # client-side vs server-counter acceptance length: flag beyond 5%
# `ddtree-bench serve` and the OpenAI-compatible HTTP client (backends/standalone.py, backends/client.py)
SERVE_MAX_QUEUE = 128              # requests waiting for the engine before new ones get 503
SERVE_MAX_BATCH = 1                # `serve --max-batch`: requests batched at once (1 = the batch-1 engine; docs/batching.md)
SERVE_MAX_BODY_BYTES = 8 * 1024 * 1024  # larger request bodies get 413
SERVE_SHUTDOWN_GRACE_S = 10.0      # on SIGTERM in-flight requests get this long to finish, then are cut
SERVE_COMPLETIONS_MAX_TOKENS = 16  # /v1/completions without max_tokens (OpenAI's, SGLang's and vLLM's default)
SERVE_READ_TIMEOUT_S = 60.0        # a request head (from connect or the last response) and its body must each arrive
                                   # within this, a stalled stream write too; also the idle keep-alive limit
SERVE_MAX_JSON_DEPTH = 64          # request bodies nesting deeper get 400 (vLLM's bodies nest 4 levels)
SERVE_CPU_WORKERS = 2              # threads that decode, validate and tokenize request bodies off the event loop
NULL_CHUNK_TOKENS = 4              # the null engine's tokens per streamed chunk (a "round")
HTTP_PROBE_TIMEOUT_S = 10.0        # client: reaching the server before the first request
# `ddtree-bench bench-engine` (perf/bench.py)
CACHE_DIR = "~/.cache/ddtree-bench"      # the project's cache (compiled Triton kernels: <it>/triton); $DDTREE_BENCH_CACHE_DIR or $XDG_CACHE_HOME override
BENCH_PREFIX_LEN = 1024            # prefix tokens before the measured rounds (the reference point)
BENCH_ROUNDS = 20                  # measured rounds per method and budget, after a warmup generation
BENCH_VERIFY_TOKENS = "1,16,64,128,256,512,1024"  # query-token counts of the verify-cost curve
BENCH_CURVE_LOGIT_SCALE = 3.0      # the verify curve's trees: random draft logits x this (3: wide, depth <= ~4; 12: deep, to 15)
BENCH_E2E_PROMPTS = 4              # suite prompts for the end-to-end tok/s runs
BENCH_E2E_MAX_NEW_TOKENS = 128
BENCH_PROFILE_TOP = 12             # kernels listed per verify size in bench-engine --profile
# Confidence intervals on speed figures (stats.py) and sweep repeats (sweep/order.py, noise/)
CI_LEVEL = 0.95                    # two-sided confidence level of every interval
CI_RESAMPLES = 2000                # percentile-bootstrap resamples
CI_SEED = 0                        # the bootstrap's numpy PCG64 seed (intervals reproduce bit for bit)
CI_MAX_REPEATS_ESTIMATE = 100      # "repeats to separate" beyond this is reported as "more than 100"
SWEEP_ORDERS = ("interleaved", "as-listed", "rounds")
SWEEP_ORDER = "interleaved"        # with --repeats N: rounds of every point, shuffled per round (per server group)
HEAVY_LOAD_PER_CORE = 1.0          # fallback without /proc/stat: 1-min load average / CPU cores before a point above this = heavy
ENV_PROBE_TIMEOUT_S = 5.0          # nvidia-smi query of GPU clocks and utilisation
GPU_CLOCK_SAMPLE_MS = 100          # noise/gpu_clocks.py: nvidia-smi samples SM clock, power and throttle reasons this often while GPU work is timed
GPU_CAPPED_NOTE_SHARE = 0.5        # the report notes a point whose GPU samples were at the power cap at least this often
HEAVY_OTHER_CORES_SHARE = 0.5      # other processes busy on more than this share of the cores during a point = heavy load
# Scale-out: points in parallel (sweep/executors.py, sweep/ray_executor.py) and the plan (sweep/plan.py)
SWEEP_EXECUTORS = ("local", "ray")
SWEEP_EXECUTOR = "local"           # local: on this host (--workers N processes); ray: one Ray task per server group
SWEEP_WORKERS = 1                  # 1 = the serial loop in the driver process
SWEEP_GPUS_PER_POINT = 1           # GPUs pinned to each worker (CUDA_VISIBLE_DEVICES) / asked of Ray (num_gpus)
SWEEP_RAY_CPUS_PER_POINT = 1       # num_cpus each Ray task asks for
SWEEP_WORKER_STOP_GRACE_S = 20.0   # Ctrl-C / SIGTERM: workers get this long to stop their servers, then SIGKILL
RAY_CONNECT_TIMEOUT_S = 5.0        # --executor ray: a cluster address must answer (TCP + HTTP/2 preface) within this
RAY_INSTALL_HINT = 'install the extra: pip install -e ".[ray]" in the ddtree-bench checkout (or pip install "ray>=2.40")'
# Plan estimates when the sweep directory has no measured point yet (seconds; stated, not measured here):
# an in-process toy point of the default sweep took ~11 s on 2 quiet CPU cores (1 min 39 s / 9 points);
# an 8B model's server start in SGLang or vLLM takes 1-4 min.
PLAN_POINT_S = {"inprocess": 11.0, "standalone": 11.0, "sglang": 60.0, "vllm": 60.0, "openai": 60.0}
PLAN_SERVER_START_S = {"inprocess": 0.0, "standalone": 10.0, "sglang": 150.0, "vllm": 150.0, "openai": 60.0}
