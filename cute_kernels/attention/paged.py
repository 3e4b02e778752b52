"""`paged_decode`: one query token per sequence attending to its keys in a paged KV cache.

Layout (vLLM's): q (B, Hq, D); k_cache (num_pages, page_size, Hkv, D), v_cache (num_pages,
page_size, Hkv, Dv); block_table (B, max_pages) int32, seqlens_k (B,) int32. Key t of sequence
b is k_cache[block_table[b, t // page_size], t % page_size]; the sequence has seqlens_k[b]
keys (no causal mask: the query is the newest token and sees every cached key). Query head h
reads key/value head h // (Hq / Hkv). out = softmax(q k^T * scale) v per (b, h); a sequence
with no key gives out 0.

The kernels are the `decode` rung (`decode.py`): split-KV, then a combine. Everything is checked
before the launch; with check_indices=True (the default) that includes seqlens_k and the block
table entries the sequences use (one device-to-host copy: out-of-range pages would be read out
of bounds). A serving loop that validated its tables once (or captures CUDA graphs) passes
check_indices=False.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["PagedProblem", "paged_decode", "check_paged_inputs"]

_WHO = "paged_decode"


@dataclass(frozen=True)
class PagedProblem:
    """The sizes and options of one paged decode."""

    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    num_pages: int
    page_size: int
    max_pages: int
    dtype: object
    scale: float
    # Score features (`features`): the soft cap (None: none) and whether sinks are given.
    softcap: float | None = None
    sinks: bool = False

    def describe(self) -> str:
        return (f"B={self.batch} Hq={self.heads_q} Hkv={self.heads_kv} D={self.head_dim} Dv={self.head_dim_v} "
                f"pages {self.num_pages} x {self.page_size}, table width {self.max_pages}, {self.dtype}, "
                f"scale {self.scale:g}")


def _tensor(t, name: str, ndim: int, what: str):
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{_WHO}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{_WHO}: {name} must be {ndim}-D {what}, got shape {tuple(t.shape)}")


def _check_indices(block_table, seqlens_k, num_pages: int, page_size: int) -> None:
    """seqlens_k within the table's reach and every page a sequence uses in [0, num_pages)."""
    import torch

    lens = seqlens_k.to(torch.int64)
    reach = block_table.shape[1] * page_size
    used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] * page_size < lens[:, None]
    pages = block_table.to(torch.int64)
    bad_page = used & ((pages < 0) | (pages >= num_pages))
    summary = torch.stack([lens.min() if lens.numel() else lens.new_zeros(()),
                           lens.max() if lens.numel() else lens.new_zeros(()),
                           bad_page.any().to(torch.int64)]).tolist()
    lo, hi, any_bad = summary
    if lo < 0:
        raise ValueError(f"{_WHO}: seqlens_k has a negative length {lo}")
    if hi > reach:
        raise ValueError(f"{_WHO}: seqlens_k has a length {hi} but block_table has room for "
                         f"{block_table.shape[1]} pages x {page_size} = {reach} keys")
    if any_bad:
        b, j = (int(x) for x in bad_page.nonzero()[0].tolist())
        raise ValueError(f"{_WHO}: block_table[{b}, {j}] = {int(block_table[b, j])} is not a page of the cache "
                         f"(0 to {num_pages - 1}) but sequence {b} uses it")


def check_paged_inputs(q, k_cache, v_cache, block_table, seqlens_k, *, scale, check_indices: bool = True
                       ) -> PagedProblem:
    """Validate the inputs (module docstring); return the problem. Raises TypeError or
    ValueError naming the offending argument."""
    import torch

    _tensor(q, "q", 3, "(batch, heads, head_dim)")
    _tensor(k_cache, "k_cache", 4, "(num_pages, page_size, kv_heads, head_dim)")
    _tensor(v_cache, "v_cache", 4, "(num_pages, page_size, kv_heads, head_dim)")
    _tensor(block_table, "block_table", 2, "(batch, max_pages)")
    _tensor(seqlens_k, "seqlens_k", 1, "(batch,)")
    if not (q.dtype == k_cache.dtype == v_cache.dtype) or not q.dtype.is_floating_point:
        raise TypeError(f"{_WHO}: q, k_cache, v_cache must share a floating dtype, got {q.dtype}, "
                        f"{k_cache.dtype}, {v_cache.dtype}")
    for name, t in (("block_table", block_table), ("seqlens_k", seqlens_k)):
        if t.dtype != torch.int32:
            raise TypeError(f"{_WHO}: {name} must be int32, got {t.dtype}")
    b, hq, d = q.shape
    pages, page_size, hk, dk = k_cache.shape
    if tuple(v_cache.shape[:3]) != (pages, page_size, hk):
        raise ValueError(f"{_WHO}: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ "
                         "in pages, page size or heads")
    if dk != d:
        raise ValueError(f"{_WHO}: q head dim {d} differs from k_cache head dim {dk}")
    if block_table.shape[0] != b or seqlens_k.shape[0] != b:
        raise ValueError(f"{_WHO}: q has batch {b} but block_table has {block_table.shape[0]} rows and "
                         f"seqlens_k {seqlens_k.shape[0]} entries")
    if hk == 0 or hq % hk:
        raise ValueError(f"{_WHO}: query heads ({hq}) must be a multiple of key/value heads ({hk})")
    if page_size == 0:
        raise ValueError(f"{_WHO}: the caches have page size 0")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{_WHO}: {name} must have a contiguous head dim (stride 1), got strides {t.stride()}")
        if t.data_ptr() % 16 or any(s % 8 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
            raise ValueError(f"{_WHO}: {name} must be 16-byte aligned with strides multiple of 8 elements outside "
                             f"the head dim (128-bit loads), got strides {t.stride()}; call .contiguous()")
    for name, t in (("block_table", block_table), ("seqlens_k", seqlens_k)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{_WHO}: {name} must be contiguous in its last dim")
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    elif not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"{_WHO}: scale must be a real number or None, got {type(scale).__name__}")
    devices = {t.device for t in (q, k_cache, v_cache, block_table, seqlens_k)}
    if len(devices) > 1:
        raise ValueError(f"{_WHO}: inputs are on different devices {sorted(map(str, devices))}")
    if check_indices and b:
        _check_indices(block_table, seqlens_k, pages, page_size)
    if q.device.type != "cuda":
        raise ValueError(f"{_WHO}: tensors are on '{q.device}'; the decode kernels run on CUDA devices only")
    return PagedProblem(b, hq, hk, d, v_cache.shape[-1], pages, page_size, block_table.shape[1], q.dtype,
                        float(scale))


def paged_decode(q, k_cache, v_cache, block_table, seqlens_k, *, scale=None, kernel: str = "auto",
                 num_splits: int | None = None, check_indices: bool = True, out=None):
    """out (B, Hq, Dv) in q's dtype (module docstring). kernel: "auto" or "decode";
    num_splits: KV splits per sequence (default: enough CTAs to fill the GPU); out: an optional
    preallocated contiguous result, overwritten entirely."""
    import torch

    if not isinstance(kernel, str):
        raise TypeError(f"{_WHO}: kernel must be 'auto' or 'decode', got {type(kernel).__name__}")
    if kernel not in ("auto", "decode"):
        raise ValueError(f"{_WHO}: unknown kernel {kernel!r}; available: ['auto', 'decode']")
    if num_splits is not None and (not isinstance(num_splits, int) or isinstance(num_splits, bool)
                                   or not 1 <= num_splits <= 65535):
        raise ValueError(f"{_WHO}: num_splits must be an int in [1, 65535] or None, got {num_splits!r}")
    problem = check_paged_inputs(q, k_cache, v_cache, block_table, seqlens_k, scale=scale,
                                 check_indices=check_indices)
    shape = (problem.batch, problem.heads_q, problem.head_dim_v)
    if out is None:
        out = torch.empty(shape, dtype=q.dtype, device=q.device)
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != q.dtype
          or out.device != q.device or not out.is_contiguous() or out.data_ptr() % 16):
        raise ValueError(f"{_WHO}: out must be a contiguous, 16-byte aligned {shape} {q.dtype} tensor on {q.device}")
    if out.numel() == 0:
        return out
    if problem.max_pages == 0:  # no sequence has a key
        return out.zero_()
    from .dispatch import device_capability
    from .registry import KERNELS

    have = tuple(device_capability(q.device))
    if have < (8, 0):
        raise ValueError(f"{_WHO}: the decode kernel needs compute capability 8.0, device has {have[0]}.{have[1]}")

    rung = KERNELS["decode"]
    why = rung.supports_paged(problem)
    if why is not None:
        raise ValueError(f"{_WHO}: the decode kernel cannot run this problem ({problem.describe()}): {why}")
    return rung.paged(q, k_cache, v_cache, block_table, seqlens_k, out, problem, num_splits=num_splits)
