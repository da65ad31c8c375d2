"""What every Triton kernel module here shares: the (optional) Triton import, power-of-two padding,
and the exact score keys; importing it points Triton's cache at the project's (cache_dir.py).

`_desc` maps an fp32 score to the int64 key tree_vector._desc_key computes (higher score -> smaller
key, -0.0 == +0.0), so a kernel's order is the PyTorch builder's order bit for bit. Triton is
optional (CPU installs of PyTorch lack it): `triton` and `tl` are None then, and every kernel
module defines its kernels only `if triton is not None`. `is_h100_sxm` names the one card besides the H200 that
some defaults were measured on, `is_tuned_hopper` either of the two (the launch defaults both cards won with).
Knows nothing of trees or models.
"""

from __future__ import annotations

from functools import lru_cache

from ddtree_bench.engine.gpu.kernels.cache_dir import use_project_cache

use_project_cache()   # compiled kernels persist under the project's cache dir (cache_dir.py), set before Triton loads

try:  # Triton ships with CUDA builds of PyTorch; CPU installs may lack it
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the install
    triton = None
    tl = None

I64_MAX = 9223372036854775807   # the padding key: sorts after every real key
H100_SXM_NAME = ("H100", "HBM3")   # a CUDA device name holding both is an H100 SXM (80 GB HBM3)
H200_NAME = "H200"   # a CUDA device name holding it (and not "GH200", the Grace Hopper superchip) is an H200


def is_h100_sxm(device) -> bool:
    """Whether `device` is an H100 SXM (sm_90, its name holding H100_SXM_NAME): the card its own GEMM table and the
    cuBLASLt default (kernels/gemm.py, ops.py) were measured on besides the H200."""
    return _is_h100_sxm(str(device))


def _sm90_name(device: str) -> str:
    """The CUDA device name of an sm_90 `device`, else ""."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev) != (9, 0):
        return ""
    return torch.cuda.get_device_name(dev)


@lru_cache(maxsize=None)
def _is_h100_sxm(device: str) -> bool:
    name = _sm90_name(device)
    return bool(name) and all(part in name for part in H100_SXM_NAME)


def is_tuned_hopper(device) -> bool:
    """Whether `device` is an H100 SXM or an H200 (sm_90, its name holding H200_NAME and not "GH200"): the two cards
    where the few-row PDL default (kernels/pdl.py) and the tree kernel's narrow tiles (kernels/tree_attention.py)
    were measured to win; other sm_90 cards keep the plain launches."""
    return _is_h100_sxm(str(device)) or _is_h200(str(device))


@lru_cache(maxsize=None)
def _is_h200(device: str) -> bool:
    name = _sm90_name(device)
    return H200_NAME in name and "GH200" not in name


def _pow2(n: int) -> int:
    """The smallest power of two >= max(1, n)."""
    return 1 << max(0, (max(1, n) - 1).bit_length())


if triton is not None:

    @triton.jit
    def _desc(x):
        """fp32 -> int64 key, higher score -> smaller key, -0.0 == +0.0 (tree._desc_key)."""
        i = x.to(tl.int32, bitcast=True)
        i = tl.where(i == -2147483648, 0, i)
        ordinal = tl.where(i >= 0, i, i ^ 2147483647)
        return 2147483647 - ordinal.to(tl.int64)

    @triton.jit
    def _undesc(k):
        ordinal = (2147483647 - k).to(tl.int32)
        i = tl.where(ordinal >= 0, ordinal, ordinal ^ 2147483647)
        return i.to(tl.float32, bitcast=True)

    @triton.jit
    def _max_combine(a, b):
        return tl.maximum(a, b)
