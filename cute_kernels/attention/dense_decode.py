"""Decode from the dense entry: `scaled_dot_product_attention` / `attention_forward` with a few
queries over a long cache, run on the `decode` rung's split-KV kernels (`decode_mma` and the
combine) instead of a flash rung, whose grid of query tiles leaves most of the GPU idle there.

The dense cache is read in place as a paged one. With token stride ts, head stride hs and
batch stride bs (k is (B, Hkv, Sk, D), any strides with the head dim contiguous), pages of
`PAGE` keys are viewed with page stride g = gcd(bs, PAGE * ts): key j of batch b is page
(b bs + (j // PAGE) PAGE ts) / g, slot j % PAGE, and the page view is an `as_strided` tensor
(pages, PAGE, Hkv, D) with strides (g, ts, hs, 1) over the same storage. The kernels read only
the keys below each sequence's length, so the last page of the last batch may lie past the
view's declared page count (which torch requires to end inside the storage) without a read
outside the tensor; the block table is built here and never validated on the device.

Queries: query row i of batch b is sequence b * Sq + i of the paged problem, its key count
Sk (no mask), Sk - Sq + 1 + i (bottom-right causal) or i + 1 (top-left), clipped to [0, Sk];
for Sq > 1 q is copied to (B Sq, Hq, D) and out / lse come back through a small copy. Block
table and lengths depend only on the sizes and strides, so they are built once per signature
(`_TABLES`). The combine writes the log-sum-exp the backward needs and takes the sinks; the
split kernel takes the soft cap.

`supports_dense` is the rung's `supports` for dense problems (the limits `DENSE_MAX_QUERIES`,
`DENSE_MIN_KEYS` and the layout conditions); `route_reason` is what `dispatch.explain` says
when "auto" picks it.
"""

from __future__ import annotations

import math

__all__ = ["DENSE_MAX_QUERIES", "DENSE_MIN_KEYS", "PAGE", "supports_dense", "route_reason", "run"]

# Few queries: per batch and head, at most this many query rows ...
DENSE_MAX_QUERIES = 8
# ... over at least this many keys (below it one flash tile per head covers the cache).
DENSE_MIN_KEYS = 512
# Keys per page of the dense cache's paged view (a multiple of 16: the tensor-core kernel).
PAGE = 64
# Block tables and lengths per signature, at most this many (then the cache starts afresh).
_MAX_TABLES = 256
_TABLES: dict = {}


def _layout_reason(name: str, t) -> str | None:
    if t.data_ptr() % 16:
        return f"{name}'s data pointer is not 16-byte aligned (128-bit loads)"
    if any(s % 8 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
        return f"{name}'s strides {tuple(t.stride())} are not multiples of 8 elements outside the head dim"
    return None


def supports_dense(q, k, v, problem) -> str | None:
    """None when the split-KV decode kernels take this dense `api.AttentionProblem` (few
    queries over a long cache, no window, the tensor-core kernel's head dims), else why not."""
    from .decode import use_mma
    from .problem_checks import common_reason

    p = problem
    if p.seqlen_q > DENSE_MAX_QUERIES:
        return f"{p.seqlen_q} queries per head: the split-KV decode path takes at most {DENSE_MAX_QUERIES}"
    if p.seqlen_k < DENSE_MIN_KEYS:
        return f"{p.seqlen_k} keys: the split-KV decode path starts at {DENSE_MIN_KEYS} (a flash tile covers fewer)"
    if p.windowed:
        return "sliding windows are not implemented on the split-KV decode path"
    if p.seqused_k:
        return "seqused_k is not implemented on the split-KV decode path"
    import torch

    why = common_reason(p, (torch.float16, torch.bfloat16))
    if why is not None:
        return why
    if use_mma(p.head_dim, PAGE, p.heads_q // p.heads_kv) is None:
        return f"head dim {p.head_dim} not taken by the tensor-core decode kernel"
    for name, t in (("q", q), ("k", k), ("v", v)):
        why = _layout_reason(name, t)
        if why is not None:
            return why
    if k.stride() != v.stride():
        return f"k and v have different strides {tuple(k.stride())} and {tuple(v.stride())} (one block table)"
    if max(k.numel(), v.numel()) >= 2**31 or p.batch * p.seqlen_q > 65535:
        return "the cache or the batch is too large for the decode kernels' 32-bit indices and grid"
    return None


def route_reason(problem) -> str:
    p = problem
    return (f"{p.seqlen_q} {'query' if p.seqlen_q == 1 else 'queries'} per head over {p.seqlen_k} keys: split-KV "
            f"decode (the cache split across the GPU, each KV head's {p.heads_q // p.heads_kv} query heads in one "
            "tile), where a flash rung would run one mostly empty query tile per head")


def _tables(k, problem):
    """(block_table (B Sq, pages) int32, seqlens (B Sq,) int32, page stride g, pages declared)
    for this signature (module docstring), built once."""
    p = problem
    b_stride, h_stride, t_stride = k.stride(0), k.stride(1), k.stride(2)
    key = (k.device, p.batch, p.seqlen_q, p.seqlen_k, p.causal, b_stride, h_stride, t_stride, k.shape[1],
           k.shape[-1])
    found = _TABLES.get(key)
    if found is not None:
        return found
    import torch

    g = math.gcd(b_stride if p.batch > 1 else PAGE * t_stride, PAGE * t_stride)
    pages = -(-p.seqlen_k // PAGE)
    j = torch.arange(pages, dtype=torch.int64)
    rows = (torch.arange(p.batch, dtype=torch.int64)[:, None] * b_stride + j[None, :] * PAGE * t_stride) // g
    table = rows.repeat_interleave(p.seqlen_q, dim=0).to(torch.int32)
    i = torch.arange(p.seqlen_q, dtype=torch.int64)
    if p.causal == "bottom_right":
        lens = p.seqlen_k - p.seqlen_q + 1 + i
    elif p.causal == "top_left":
        lens = i + 1
    else:
        lens = torch.full((p.seqlen_q,), p.seqlen_k, dtype=torch.int64)
    lens = lens.clamp(0, p.seqlen_k).repeat(p.batch).to(torch.int32)
    # Pages whose whole (PAGE, Hkv, D) box ends inside the tensor (torch checks the view's extent).
    extent = (p.batch - 1) * b_stride + (k.shape[1] - 1) * h_stride + (p.seqlen_k - 1) * t_stride + k.shape[-1]
    box = (PAGE - 1) * t_stride + (k.shape[1] - 1) * h_stride + k.shape[-1]
    declared = (extent - box) // g + 1  # >= 1: Sk >= DENSE_MIN_KEYS > PAGE
    found = (table.to(k.device), lens.to(k.device), g, declared)
    if len(_TABLES) >= _MAX_TABLES:
        _TABLES.clear()
    _TABLES[key] = found
    return found


def _paged_view(t, g: int, declared: int):
    """`t` (B, Hkv, Sk, D) as the (pages, PAGE, Hkv, D) cache the kernels read (module docstring)."""
    import torch

    return torch.as_strided(t, (declared, PAGE, t.shape[1], t.shape[-1]), (g, t.stride(2), t.stride(1), 1),
                            t.storage_offset())


def run(rung, q, k, v, out, lse, problem, sinks=None):
    """out (B, Hq, Sq, D) and lse (B, Hq, Sq) of the dense problem through `rung.paged`
    (the `decode` rung), on torch's current stream."""
    import torch

    from .paged import PagedProblem

    p = problem
    if q.requires_grad or k.requires_grad or v.requires_grad:
        q, k, v = q.detach(), k.detach(), v.detach()
    table, lens, g, declared = _tables(k, p)
    k_cache, v_cache = _paged_view(k, g, declared), _paged_view(v, g, declared)
    rows = p.batch * p.seqlen_q
    paged = PagedProblem(rows, p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v, declared, PAGE, table.shape[1],
                         p.dtype, p.scale, p.softcap, p.sinks)
    if sinks is not None:
        sinks = sinks.detach().to(torch.float32).contiguous()
    if p.seqlen_q == 1:
        rung.paged(q[:, :, 0], k_cache, v_cache, table, lens, out[:, :, 0], paged, lse=lse[:, :, 0], sinks=sinks)
        return out, lse
    q_rows = q.permute(0, 2, 1, 3).reshape(rows, p.heads_q, p.head_dim)
    o_rows = torch.empty((rows, p.heads_q, p.head_dim_v), dtype=q.dtype, device=q.device)
    l_rows = torch.empty((rows, p.heads_q), dtype=torch.float32, device=q.device)
    rung.paged(q_rows, k_cache, v_cache, table, lens, o_rows, paged, lse=l_rows, sinks=sinks)
    out.copy_(o_rows.view(p.batch, p.seqlen_q, p.heads_q, -1).permute(0, 2, 1, 3))
    lse.copy_(l_rows.view(p.batch, p.seqlen_q, p.heads_q).permute(0, 2, 1))
    return out, lse
