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

__all__ = ["DENSE_MAX_QUERIES", "DENSE_MIN_KEYS", "MAX_CACHE_ELEMENTS", "PAGE", "supports_dense", "key_count_admitted",
           "route_reason", "launch_plan", "run"]

# Few queries: per batch and head, at most this many query rows ...
DENSE_MAX_QUERIES = 8
# ... over at least this many keys (below it one flash tile per head covers the cache).
DENSE_MIN_KEYS = 512
# K and V of fewer elements than this: the kernels' 32-bit indices.
MAX_CACHE_ELEMENTS = 2**31
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
    if max(k.numel(), v.numel()) >= MAX_CACHE_ELEMENTS or p.batch * p.seqlen_q > 65535:
        return "the cache or the batch is too large for the decode kernels' 32-bit indices and grid"
    return None


def key_count_admitted(k, v) -> bool:
    """The part of `supports_dense` that depends on the key count (for contiguous K and V, whose
    strides' divisibility the head dim fixes): at least `DENSE_MIN_KEYS` keys, fewer than
    `MAX_CACHE_ELEMENTS` elements. What a plan serving any key count re-checks per call."""
    return k.shape[-2] >= DENSE_MIN_KEYS and max(k.numel(), v.numel()) < MAX_CACHE_ELEMENTS


def route_reason(problem) -> str:
    p = problem
    return (f"{p.seqlen_q} {'query' if p.seqlen_q == 1 else 'queries'} per head over {p.seqlen_k} keys: split-KV "
            f"decode (the cache split across the GPU, each KV head's {p.heads_q // p.heads_kv} query heads in one "
            "tile), where a flash rung would run one mostly empty query tile per head")


def _tables(k, batch: int, seqlen_q: int, seqlen_k: int, causal):
    """(block_table (B Sq, pages) int32, seqlens (B Sq,) int32, page stride g, pages declared)
    for this signature (module docstring), built on the device by a few small kernels: no copy
    from the host, so no wait on the stream, and nothing a CUDA graph capture refuses. Kept
    per signature (a decode step's new key count makes a new one), made outside any CUDA graph
    pool (`runtime.lasting`). While a graph is being captured they are built afresh and not
    kept: the graph then owns them, and never reads a table the cache may free later."""
    import torch

    b_stride, h_stride, t_stride = k.stride(0), k.stride(1), k.stride(2)
    if k.is_cuda and torch.cuda.is_current_stream_capturing():
        return _build_tables(k, batch, seqlen_q, seqlen_k, causal)
    key = (k.device, batch, seqlen_q, seqlen_k, causal, b_stride, h_stride, t_stride, k.shape[1], k.shape[-1])
    found = _TABLES.get(key)
    if found is not None:
        return found
    from cute_kernels.runtime.lasting import lasting

    found = lasting(k.device, _build_tables, k, batch, seqlen_q, seqlen_k, causal)
    if len(_TABLES) >= _MAX_TABLES:
        _TABLES.clear()
    _TABLES[key] = found
    return found


def _build_tables(k, batch: int, seqlen_q: int, seqlen_k: int, causal):
    import torch

    def arange(n: int):
        return torch.arange(n, dtype=torch.int32, device=k.device)

    b_stride, h_stride, t_stride = k.stride(0), k.stride(1), k.stride(2)
    g = math.gcd(b_stride if batch > 1 else PAGE * t_stride, PAGE * t_stride)
    pages = -(-seqlen_k // PAGE)
    # Every row is below `declared` (< MAX_CACHE_ELEMENTS, `supports_dense`), so int32 holds it.
    table = arange(pages) * (PAGE * t_stride // g)
    if batch > 1:
        table = table + (arange(batch) * (b_stride // g))[:, None]
    else:
        table = table[None, :]
    if seqlen_q > 1:
        table = table.repeat_interleave(seqlen_q, dim=0)
    if seqlen_q == 1 and causal != "top_left":
        lens = torch.full((batch,), seqlen_k, dtype=torch.int32, device=k.device)
    else:
        i = arange(seqlen_q)
        if causal == "bottom_right":
            lens = i + (seqlen_k - seqlen_q + 1)
        elif causal == "top_left":
            lens = i + 1
        else:
            lens = torch.full((seqlen_q,), seqlen_k, dtype=torch.int32, device=k.device)
        lens = lens.clamp(0, seqlen_k).repeat(batch)
    # Pages whose whole (PAGE, Hkv, D) box ends inside the tensor (torch checks the view's extent).
    extent = (batch - 1) * b_stride + (k.shape[1] - 1) * h_stride + (seqlen_k - 1) * t_stride + k.shape[-1]
    box = (PAGE - 1) * t_stride + (k.shape[1] - 1) * h_stride + k.shape[-1]
    declared = (extent - box) // g + 1  # >= 1: Sk >= DENSE_MIN_KEYS > PAGE
    return table, lens, g, declared


def _paged_view(t, g: int, declared: int):
    """`t` (B, Hkv, Sk, D) as the (pages, PAGE, Hkv, D) cache the kernels read (module docstring)."""
    import torch

    return torch.as_strided(t, (declared, PAGE, t.shape[1], t.shape[-1]), (g, t.stride(2), t.stride(1), 1),
                            t.storage_offset())


def launch_plan(rung, problem):
    """`launch(q, k, v, out, lse, sinks=None)` for dense problems like `problem` (the `decode`
    rung's TVM-FFI builds, `DecodeRung.dense_functions`), or None without TVM-FFI.

    The launch reads the key count, the cache's strides and the device from its tensors on
    every call, so it serves every problem that differs from `problem` only there (a decode
    loop's growing cache: `ops.eager_attention`'s family plans) as long as the rung supports it.
    Tensors must not require grad; out (B, Hq, Sq, Dv) and lse (B, Hq, Sq) as
    `api.attention_forward` allocates them; sinks (Hq,) contiguous fp32 when the problem has them."""
    from cute_kernels.runtime import tvm_ffi_available

    if not tvm_ffi_available():
        return None
    import torch

    from cute_kernels.runtime.arch import sm_count

    from .decode import num_splits_for
    from .problem_checks import softcap_scalars

    split, combine, config, waves = rung.dense_functions(problem)
    p = problem
    heads_q, dv, group, causal = p.heads_q, p.head_dim_v, p.heads_q // p.heads_kv, p.causal
    head_blocks = heads_q // config.heads_per_cta
    scale, score_scale = softcap_scalars(p)
    if p.softcap is None:
        score_scale = None  # the build without the soft cap takes no score scale
    empty, fp32 = torch.empty, torch.float32

    def launch(q, k, v, out, lse, sinks=None):
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[2], k.shape[2]
        table, lens, g, declared = _tables(k, batch, seqlen_q, seqlen_k, causal)
        k_cache, v_cache = _paged_view(k, g, declared), _paged_view(v, g, declared)
        rows, device = batch * seqlen_q, q.device
        splits, per_split = num_splits_for(rows, head_blocks, table.shape[1], PAGE, sm_count(device), waves=waves)
        o_part = empty((splits, rows, heads_q, dv), dtype=fp32, device=device)
        l_part = empty((splits, rows, heads_q), dtype=fp32, device=device)

        def rows_call(q_rows, o_rows, l_rows):
            split(q_rows, k_cache, v_cache, table, lens, o_part, l_part, scale, group, per_split, splits,
                  score_scale, None)
            combine(o_part, l_part, o_rows, l_rows, sinks)

        _by_rows(q, out, lse, rows_call)

    return launch


def _by_rows(q, out, lse, rows_call):
    """`rows_call(q_rows (B Sq, Hq, D), o_rows (B Sq, Hq, Dv), l_rows (B Sq, Hq))`, the paged
    problem's rows, for the dense q (B, Hq, Sq, D), out and lse (B, Hq, Sq): views of them for
    one query per head, else q copied in and the results copied back."""
    import torch

    batch, heads_q, seqlen_q = q.shape[0], q.shape[1], q.shape[2]
    if seqlen_q == 1:
        rows_call(q[:, :, 0], out[:, :, 0], lse[:, :, 0])
        return
    rows = batch * seqlen_q
    q_rows = q.permute(0, 2, 1, 3).reshape(rows, heads_q, q.shape[-1])
    o_rows = torch.empty((rows, heads_q, out.shape[-1]), dtype=out.dtype, device=out.device)
    l_rows = torch.empty((rows, heads_q), dtype=torch.float32, device=out.device)
    rows_call(q_rows, o_rows, l_rows)
    out.copy_(o_rows.view(batch, seqlen_q, heads_q, -1).permute(0, 2, 1, 3))
    lse.copy_(l_rows.view(batch, seqlen_q, heads_q).permute(0, 2, 1))


def run(rung, q, k, v, out, lse, problem, sinks=None):
    """out (B, Hq, Sq, D) and lse (B, Hq, Sq) of the dense problem through the `decode` rung's
    kernels, on torch's current stream: the TVM-FFI launch (`launch_plan`) where it exists,
    else `rung.paged` with the tensors wrapped per call."""
    import torch

    from .paged import PagedProblem

    p = problem
    if q.requires_grad or k.requires_grad or v.requires_grad:
        q, k, v = q.detach(), k.detach(), v.detach()
    if sinks is not None:
        sinks = sinks.detach().to(torch.float32).contiguous()
    launch = launch_plan(rung, p)
    if launch is not None:
        launch(q, k, v, out, lse, sinks)
        return out, lse
    table, lens, g, declared = _tables(k, p.batch, p.seqlen_q, p.seqlen_k, p.causal)
    k_cache, v_cache = _paged_view(k, g, declared), _paged_view(v, g, declared)
    paged = PagedProblem(p.batch * p.seqlen_q, p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v, declared, PAGE,
                         table.shape[1], p.dtype, p.scale, p.softcap, p.sinks)
    _by_rows(q, out, lse, lambda q_rows, o_rows, l_rows: rung.paged(q_rows, k_cache, v_cache, table, lens, o_rows,
                                                                     paged, lse=l_rows, sinks=sinks))
    return out, lse
