"""The run specification: `RunSpec`, everything a user configures for one run, validated in one place.

`RunSpec` is what `ddtree-bench run` (and every sweep point) executes. Defaults come from
`defaults.py`; `validate()` raises `UsageError` with a message that names the flag. Tree-budget
checks and budget-range parsing (`16..1024`, `16,48,100`) live here too.
This module knows nothing of models, HTTP or files of results.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError

BACKENDS = ("inprocess", "standalone", "sglang", "vllm", "openai", "llamacpp")  # openai: any OpenAI-compatible server; llamacpp: llama-server
DTYPES = ("float32", "bfloat16", "float16")
_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


@dataclass
class RunSpec:
    """Everything that defines one run of one configuration over one suite."""

    backend: str = D.BACKEND
    url: str | None = None
    model: str = D.MODEL
    draft: str | None = None
    method: str = D.METHOD
    budget: int = D.BUDGET
    suite: str = D.SUITE
    limit: int | None = None
    subset: str | None = None               # zlab-paper | zlab-current | first (None = the suite's rule)
    max_new_tokens: int = D.MAX_NEW_TOKENS
    temperature: float = D.TEMPERATURE
    top_p: float = 1.0
    seed: int = D.SEED
    dtype: str = D.DTYPE
    device: str = D.DEVICE
    cuda_graphs: bool = False               # in-process engine: the fixed-shape CUDA-graph loop
    concurrency: int = D.CONCURRENCY
    request_rate: float | None = None
    warmup: int = D.WARMUP_REQUESTS
    endpoint: str = "chat"                  # chat | completions (HTTP backends)
    stream: bool = True                     # HTTP backends: SSE streams (False: one JSON body per request, no ITL)
    timeout_s: float = D.REQUEST_TIMEOUT_S
    stop_ids: list[int] | None = None       # None = the model's generation_config eos ids
    api_key: str | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> "RunSpec":
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown --backend {self.backend!r}; expected one of {', '.join(BACKENDS)}")
        if self.method not in D.METHODS:
            raise UsageError(f"unknown --method {self.method!r}; expected one of {', '.join(D.METHODS)}")
        budget_int = isinstance(self.budget, int) and not isinstance(self.budget, bool)
        if self.method == "ddtree" and budget_int and self.budget < 1:  # a tree of no nodes drafts nothing: AR with extra work
            raise UsageError(f"--budget must be >= 1 for --method ddtree, got {self.budget}",
                             hint="a DDTree budget counts the tree's nodes (root excluded); for no drafting use --method ar")
        check_budget(self.budget)
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise UsageError(f"--max-new-tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.limit is not None and self.limit <= 0:
            raise UsageError(f"--limit must be a positive integer, got {self.limit!r}")
        if not (0.0 <= self.temperature < float("inf")):
            raise UsageError(f"--temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise UsageError(f"--top-p must be in (0, 1], got {self.top_p!r}")
        if self.dtype not in DTYPES:
            raise UsageError(f"unknown --dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if not _DEVICE_RE.match(self.device):
            raise UsageError(f"unknown --device {self.device!r}; expected cpu, cuda or cuda:N")
        if self.concurrency < 1:
            raise UsageError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and not (self.request_rate > 0):
            raise UsageError(f"--request-rate must be > 0, got {self.request_rate}")
        if self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")
        if self.endpoint not in ("chat", "completions"):
            raise UsageError(f"unknown --endpoint {self.endpoint!r}; expected chat or completions")
        if not (self.timeout_s > 0):
            raise UsageError(f"--timeout must be > 0 seconds, got {self.timeout_s!r}")
        if self.backend != "inprocess" and not self.url:
            raise UsageError(f"--backend {self.backend} needs --url (the server's base URL)")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature < D.GREEDY_EPS

    def public_dict(self) -> dict[str, Any]:
        """The spec as saved in run.json: every field after defaults, secrets removed."""
        d = dataclasses.asdict(self)
        d["api_key"] = "***" if self.api_key else None
        return d


def method_label(method: Any, budget: Any = None) -> str:
    """'ar', 'dflash', 'ddtree B=32': a configuration as every console line, table and message names it (a DDTree
    budget unknown or empty: just 'ddtree')."""
    return f"{method} B={budget}" if method == "ddtree" and budget not in (None, "") else str(method)


def check_budget(b: Any, what: str = "--budget") -> int:
    """A tree budget: an integer in [0, defaults.MAX_BUDGET] (UsageError naming `what` otherwise)."""
    if not isinstance(b, int) or isinstance(b, bool) or b < 0:
        raise UsageError(f"{what} must be an integer >= 0, got {b!r}")
    if b > D.MAX_BUDGET:
        raise UsageError(f"{what} is above the largest tree budget, {D.MAX_BUDGET}", hint="see defaults.MAX_BUDGET for why")
    return b


def parse_budgets(text: str) -> list[int]:
    """'16..1024' = powers of two from 16 to 1024 inclusive; '16,48,100' = that list; '64' = [64].

    Both ends of a range must be powers of two with lo <= hi <= MAX_BUDGET; list items are integers in
    [0, MAX_BUDGET] and none may be empty ('16,,32'). Raises UsageError otherwise.
    """
    text = str(text).strip()
    if ".." in text:
        lo_s, _, hi_s = text.partition("..")
        try:
            lo, hi = int(lo_s), int(hi_s)
        except ValueError:
            raise UsageError(f"bad budget range {text!r}: expected LO..HI with integers, e.g. 16..1024") from None
        if lo <= 0 or hi <= 0 or lo & (lo - 1) or hi & (hi - 1):
            raise UsageError(f"bad budget range {text!r}: both ends must be powers of two (e.g. 16..1024)")
        if lo > hi:
            raise UsageError(f"bad budget range {text!r}: {lo} > {hi}")
        if hi > D.MAX_BUDGET:
            raise UsageError(f"bad budget range {text!r}: {hi} is above the largest tree budget, {D.MAX_BUDGET}",
                             hint="see defaults.MAX_BUDGET for why")
        out, b = [], lo
        while b <= hi:
            out.append(b)
            b *= 2
        return out
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise UsageError(f"bad budgets {text!r}: empty item (two commas, or a comma at an end)")
        try:
            b = int(part)
        except ValueError:
            raise UsageError(f"bad budget {part!r} in {text!r}: expected integers >= 0") from None
        check_budget(b, f"budget {b} in {text!r}")
        out.append(b)
    if not out:
        raise UsageError(f"no budgets in {text!r}")
    return out
