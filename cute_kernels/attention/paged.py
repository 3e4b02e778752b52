"""`paged_decode`: one query token per sequence attending to its keys in a paged KV cache.

Layout (vLLM's): q (B, Hq, D); k_cache (num_pages, page_size, Hkv, D), v_cache (num_pages,
page_size, Hkv, Dv); block_table (B, max_pages) int32, seqlens_k (B,) int32. Key t of sequence
b is k_cache[block_table[b, t // page_size], t % page_size]; the sequence has seqlens_k[b]
keys (no causal mask: the query is the newest token and sees every cached key). Query head h
reads key/value head h // (Hq / Hkv). out = softmax(q k^T * scale) v per (b, h); a sequence
with no key gives out 0.

The kernels are the `decode` rung (`decode.py`): split-KV, then a combine. Shapes, dtypes,
strides and devices are checked on the host before the launch. The indices (seqlens_k and the
block-table entries the sequences use) are checked on the device by default, with no host
sync, so the default call runs at the unchecked speed and can be captured in a CUDA graph: the
split kernel clamps every length and page index it reads into range (a bad table can make the
answer wrong, never a read leave the caches) and records what it clamped in a per-device error
buffer. The error surfaces as a `PagedDecodeIndexError` (a ValueError) naming the first bad
entry it saw from

    raise_paged_decode_errors(device=None)    # reads the buffer (one small device-to-host copy)

which a serving loop calls where it synchronizes anyway (after a step, at the end of a graph
replay) and which resets the buffer; `paged_decode_errors(device)` returns the pending message
(or None) without raising. check_indices="host" (or True) also validates the indices on the
host before the launch, raising before anything runs (one device-to-host copy per call), as
earlier versions did by default; check_indices=False is the same as the default ("device").
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["PagedProblem", "paged_decode", "check_paged_inputs", "PagedDecodeIndexError", "raise_paged_decode_errors",
           "paged_decode_errors"]

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


class PagedDecodeIndexError(ValueError):
    """A `paged_decode` launch read a block-table entry or a length out of range (clamped on
    the device, so its output is wrong for that sequence; module docstring)."""


# device -> the (ERROR_SLOTS,) int32 buffer the split kernels record clamped indices in.
_ERRORS: dict = {}


def error_buffer(device):
    """The device's error buffer (zeroed once, when first asked for, outside any CUDA graph
    pool: `runtime.lasting`)."""
    buf = _ERRORS.get(device)
    if buf is None:
        import torch

        from cute_kernels.runtime.lasting import lasting

        from .decode_checks import ERROR_SLOTS

        buf = _ERRORS[device] = lasting(device, torch.zeros, ERROR_SLOTS, dtype=torch.int32, device=device)
    return buf


def paged_decode_errors(device=None, *, reset: bool = True) -> str | None:
    """The pending device-side index error of `device` (default: the current CUDA device) as a
    message, or None; reads the error buffer (a device-to-host copy, so it waits for the launches
    before it) and, with `reset`, clears it."""
    import torch

    from .decode_checks import BAD_LENGTH, BAD_PAGE

    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    buf = _ERRORS.get(device)
    if buf is None:
        return None
    values = buf.tolist()
    if not (values[BAD_PAGE] or values[BAD_LENGTH]):
        return None
    if reset:
        buf.zero_()
    parts = []
    if values[BAD_PAGE]:
        b, j, page = values[BAD_PAGE + 1: BAD_PAGE + 4]
        parts.append(f"block_table[{b}, {j}] = {page} is not a page of the cache but sequence {b} uses it")
    if values[BAD_LENGTH]:
        b, n = values[BAD_LENGTH + 1: BAD_LENGTH + 3]
        parts.append(f"seqlens_k[{b}] = {n} is negative or past the block table's keys")
    return (f"{_WHO}: {'; '.join(parts)} (seen on the device by a launch since the last check; the index was "
            "clamped, so that sequence's output is wrong, and nothing was read outside the caches)")


def raise_paged_decode_errors(device=None) -> None:
    """Raise `PagedDecodeIndexError` if a `paged_decode` launch on `device` met an index out of
    range since the last check (module docstring); clears the record."""
    message = paged_decode_errors(device)
    if message is not None:
        raise PagedDecodeIndexError(message)


def check_paged_inputs(q, k_cache, v_cache, block_table, seqlens_k, *, scale, check_indices=False
                       ) -> PagedProblem:
    """Validate the inputs (module docstring); return the problem. Raises TypeError or
    ValueError naming the offending argument; check_indices truthy: the indices too, on the
    host."""
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
                 num_splits: int | None = None, check_indices="device", out=None):
    """out (B, Hq, Dv) in q's dtype (module docstring). kernel: "auto" or "decode";
    num_splits: KV splits per sequence (default: enough CTAs to fill the GPU); check_indices:
    "device" (default; also False): on the device, no host sync, errors from
    `raise_paged_decode_errors`; "host" (also True): before the launch as well; out: an
    optional preallocated contiguous result, overwritten entirely."""
    import torch

    if not isinstance(kernel, str):
        raise TypeError(f"{_WHO}: kernel must be 'auto' or 'decode', got {type(kernel).__name__}")
    if kernel not in ("auto", "decode"):
        raise ValueError(f"{_WHO}: unknown kernel {kernel!r}; available: ['auto', 'decode']")
    if num_splits is not None and (not isinstance(num_splits, int) or isinstance(num_splits, bool)
                                   or not 1 <= num_splits <= 65535):
        raise ValueError(f"{_WHO}: num_splits must be an int in [1, 65535] or None, got {num_splits!r}")
    if check_indices not in (True, False, "host", "device"):
        raise ValueError(f"{_WHO}: check_indices must be 'device', 'host', True or False, got {check_indices!r}")
    problem = check_paged_inputs(q, k_cache, v_cache, block_table, seqlens_k, scale=scale,
                                 check_indices=check_indices in (True, "host"))
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
    return rung.paged(q, k_cache, v_cache, block_table, seqlens_k, out, problem, num_splits=num_splits,
                      errors=error_buffer(q.device))
