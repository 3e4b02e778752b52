"""Rung `decode`: split-KV attention of one query token per sequence over a paged KV cache.

Decode reads the whole KV cache once per generated token and does 2 * Hq / Hkv flops per byte:
it is bandwidth-bound, so the design is about streaming K and V at full HBM bandwidth.

Problem (vLLM's paged layout): q (B, Hq, D); k_cache (num_pages, page_size, Hkv, D), v_cache
(num_pages, page_size, Hkv, D); block_table (B, max_pages) int32: key t of sequence b lives in
page block_table[b, t // page_size], slot t % page_size; seqlens_k (B,) int32.

Two kernels:

- `PagedDecodeSplit`: grid (num_splits, Hq / heads_per_cta, B). A CTA owns `heads_per_cta`
  query heads of one KV group (GQA: the heads sharing a KV head, packed so each K/V row is read
  once for all of them) and the keys of one split, a run of `pages_per_split` whole pages.
  Each thread reads 16 bytes (8 elements, one 128-bit load) of `rows_per_thread` K rows and as
  many V rows per step, so each warp has 2 * rows_per_thread * 512 bytes in flight; a row of
  D = 8 * L elements is read by L consecutive lanes (`thread_layout`), which reduce their partial
  q.k with shuffles. Each row group (the L lanes of one row) keeps its own online softmax (base
  2, scale folded into q); at the end the row groups of a warp merge by shuffles, the warps
  through shared memory (`smem_acc_layout`), and the CTA writes its partial out (normalized,
  fp32) and natural-log LSE; a split with no key writes out 0 and LSE -inf.
- `PagedDecodeCombine`: grid (ceil(Hq / heads per CTA), B). out = sum_s w_s O_s / sum_s w_s with
  w_s = exp(LSE_s - max LSE), in fp32; all splits -inf (no key) gives out 0. Optionally it also
  writes the combined natural-log LSE, and takes per-head sinks (`features`): a sink joins as
  one more split with LSE = sink and out 0 (so out = sum_s w_s O_s / (sum_s w_s + w_sink)).

Index checks on the device (`check_pages`, on for `paged_decode`): each split kernel clamps a
sequence's length into [0, block_table width * page_size] and every page index it reads into
[0, num_pages), so a bad table never makes a read leave the caches, and records what it
clamped in an int32 error buffer (`ERROR_SLOTS`: a flag and one example per kind, written with
plain stores, only when something is wrong) that `paged.raise_paged_decode_errors` reads. The
dense route of `dense_decode` builds its own tables and compiles without the checks.

This SIMT split kernel serves page sizes that are not multiples of 16 and head dims the
tensor-core kernel does not take. Otherwise `DecodeRung` runs `decode_mma.PagedDecodeMma` (the
group's heads as the rows of an mma.sync tile, zero-padded to 16; one head per KV head too),
whose partial results the same combine merges. `use_mma` is the rule; docs/attention.md has the
instruction counts and the measurements behind it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import cutlass
import cutlass.cute as cute

from cute_kernels.layouts import Layout
from cute_kernels.runtime import to_cute
from cute_kernels.runtime.arch import sm_count
from cute_kernels.runtime.plan_cache import WarmCache, memo

from .decode_checks import checked_length, checked_page
from .sm80_blocks import assume_aligned_rows
from .problem_checks import softcap_scalars
from .softmax import LN_2, LOG2_E

__all__ = ["DecodeConfig", "DecodeLayouts", "PagedDecodeSplit", "PagedDecodeCombine", "RUNG", "HEAD_DIMS",
           "num_splits_for", "heads_per_cta_for"]

HEAD_DIMS = (64, 128, 256)
_DTYPES = ("float16", "bfloat16")
_CUTLASS = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
_VEC = 8  # elements of one 128-bit access
MAX_HEADS_PER_CTA = 8


@dataclass(frozen=True)
class DecodeConfig:
    """The static shape of one compiled split kernel.

    head_dim: D of q, K and V (64, 128 or 256: a row is D / 8 lanes, dividing a warp);
    dtype: "float16" | "bfloat16"; page_size: keys per cache page (a compile-time constant so
    t // page_size is a shift); heads_per_cta: query heads of one KV group per CTA (1 to 8;
    registers grow with it); num_warps: warps per CTA; rows_per_thread: K (and V) rows each
    thread loads per step, the bytes in flight; check_pages: the device-side index checks
    (module docstring).
    """

    head_dim: int = 128
    dtype: str = "bfloat16"
    page_size: int = 16
    heads_per_cta: int = 8
    num_warps: int = 4
    rows_per_thread: int = 4
    check_pages: bool = True

    def validate(self) -> "DecodeConfig":
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"DecodeConfig.head_dim must be one of {HEAD_DIMS}, got {self.head_dim!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"DecodeConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"DecodeConfig.page_size must be a positive int, got {self.page_size!r}")
        if not isinstance(self.heads_per_cta, int) or not 1 <= self.heads_per_cta <= MAX_HEADS_PER_CTA:
            raise ValueError(f"DecodeConfig.heads_per_cta must be in [1, {MAX_HEADS_PER_CTA}], "
                             f"got {self.heads_per_cta!r}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"DecodeConfig.num_warps must be 1, 2, 4 or 8, got {self.num_warps!r}")
        if self.rows_per_thread not in (1, 2, 4, 8):
            raise ValueError(f"DecodeConfig.rows_per_thread must be 1, 2, 4 or 8, got {self.rows_per_thread!r}")
        return self

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    @property
    def lanes_per_row(self) -> int:
        return self.head_dim // _VEC

    @property
    def rows_per_warp(self) -> int:
        """Rows one warp-wide load covers."""
        return 32 // self.lanes_per_row

    @property
    def rows_per_step(self) -> int:
        """Keys one CTA step covers."""
        return self.rows_per_warp * self.num_warps * self.rows_per_thread


@dataclass(frozen=True)
class DecodeLayouts:
    """Every layout `PagedDecodeSplit` runs, as `cute_kernels.layouts` objects.

    thread_layout: (chunk, row in warp, warp) -> thread index: lane chunk c of a row reads
    elements [8c, 8c + 8); step_row_layout: (row in warp, warp, u) -> the key's offset within a
    step (load u of every warp covers the next num_warps * rows_per_warp keys, so the warps of a
    CTA read adjacent rows together); smem_acc_layout: (D, head, warp) -> fp32 offset of each
    warp's merged accumulator; smem_stats_layout: (head, warp) -> offset of its max and sum.
    """

    config: DecodeConfig
    thread_layout: Layout = field(init=False)
    step_row_layout: Layout = field(init=False)
    smem_acc_layout: Layout = field(init=False)
    smem_stats_layout: Layout = field(init=False)

    def __post_init__(self):
        c = self.config.validate()
        lanes, rows, w, h = c.lanes_per_row, c.rows_per_warp, c.num_warps, c.heads_per_cta
        set_ = object.__setattr__
        set_(self, "thread_layout", Layout((lanes, rows, w), (1, lanes, 32)))
        set_(self, "step_row_layout", Layout((rows, w, c.rows_per_thread), (1, rows, rows * w)))
        set_(self, "smem_acc_layout", Layout((c.head_dim, h, w), (1, c.head_dim, c.head_dim * h)))
        set_(self, "smem_stats_layout", Layout((h, w), (1, h)))


@cute.jit
def _combine_pair(m: cutlass.Float32, l: cutlass.Float32, m_o: cutlass.Float32, l_o: cutlass.Float32):
    """(new max, weight of self, weight of other, new sum) merging two base-2 softmax states;
    states that saw no key (max -inf) get weight 0 without forming -inf - -inf."""
    m_new = cute.arch.fmax(m, m_o)
    safe = cutlass.Float32(0.0) if m_new == -cutlass.Float32.inf else m_new
    a = cute.math.exp2(m - safe, fastmath=True)
    b = cute.math.exp2(m_o - safe, fastmath=True)
    return m_new, a, b, l * a + l_o * b


class PagedDecodeSplit:
    """Partial out (splits, B, Hq, D) fp32 and LSE (splits, B, Hq) fp32 per KV split (module
    docstring)."""

    def __init__(self, config: DecodeConfig):
        self.config = config.validate()
        self.layouts = DecodeLayouts(self.config)
        self.dtype = _CUTLASS[config.dtype]

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mKc: cute.Tensor, mVc: cute.Tensor, mBlockTable: cute.Tensor,
                 mSeqlensK: cute.Tensor, mOpart: cute.Tensor, mLSEpart: cute.Tensor, softmax_scale: cutlass.Float32,
                 qhead_per_kvhead: cutlass.Int32, pages_per_split: cutlass.Int32, num_splits: cutlass.Int32, stream,
                 mErr: cute.Tensor | None = None):
        """mErr: the (ERROR_SLOTS,) int32 error buffer (with `check_pages`)."""
        c = self.config
        mQ, mKc, mVc = [assume_aligned_rows(t) for t in (mQ, mKc, mVc)]
        mOpart = assume_aligned_rows(mOpart)
        smem_acc = to_cute(self.layouts.smem_acc_layout)
        smem_stats = to_cute(self.layouts.smem_stats_layout)

        @cute.struct
        class SharedStorage:
            acc: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, cute.cosize(smem_acc)], 16]
            row_max: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, cute.cosize(smem_stats)], 16]
            row_sum: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, cute.cosize(smem_stats)], 16]

        grid = (num_splits, mQ.shape[1] // c.heads_per_cta, mQ.shape[0])
        self.kernel(mQ, mKc, mVc, mBlockTable, mSeqlensK, mOpart, mLSEpart, softmax_scale * LOG2_E,
                    qhead_per_kvhead, pages_per_split, SharedStorage, mErr if c.check_pages else None).launch(
            grid=grid, block=[c.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mKc: cute.Tensor, mVc: cute.Tensor, mBlockTable: cute.Tensor,
               mSeqlensK: cute.Tensor, mOpart: cute.Tensor, mLSEpart: cute.Tensor, scale_log2: cutlass.Float32,
               qhead_per_kvhead: cutlass.Int32, pages_per_split: cutlass.Int32, SharedStorage: cutlass.Constexpr,
               mErr: cute.Tensor | None):
        c = self.config
        lay = self.layouts
        nh, nu = c.heads_per_cta, c.rows_per_thread
        tidx, _, _ = cute.arch.thread_idx()
        split, head_block, batch = cute.arch.block_idx()
        chunk, row_in_warp, warp_id = cute.idx2crd(tidx, to_cute(lay.thread_layout).shape)
        head0 = head_block * nh
        kv_head = head0 // qhead_per_kvhead
        seqlen = checked_length(mSeqlensK, batch, mBlockTable.shape[1] * c.page_size, mErr)
        key_begin = split * pages_per_split * c.page_size
        key_end = cutlass.min(key_begin + pages_per_split * c.page_size, seqlen)

        # q chunk of each head, fp32, pre-scaled so scores come out in base-2 units.
        q = cute.make_rmem_tensor((nh, _VEC), cutlass.Float32)
        for h in cutlass.range_constexpr(nh):
            r_q = cute.make_rmem_tensor((_VEC,), self.dtype)
            cute.autovec_copy(cute.local_tile(mQ[batch, head0 + h, None], (_VEC,), (chunk,)), r_q)
            q_f = r_q.load().to(cutlass.Float32)
            for e in cutlass.range_constexpr(_VEC):
                q[h, e] = q_f[e] * scale_log2

        acc = cute.make_rmem_tensor((nh, _VEC), cutlass.Float32)
        acc.fill(0.0)
        row_max = cute.make_rmem_tensor((nh,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum = cute.make_rmem_tensor((nh,), cutlass.Float32)
        row_sum.fill(0.0)

        step_row = to_cute(lay.step_row_layout)
        steps = cute.ceil_div(cutlass.max(key_end - key_begin, 0), c.rows_per_step)
        for step in cutlass.range(steps, unroll=1):
            # ---- loads: every K and V row of the step issued before any use ----
            # Row-major: each row's 8 elements contiguous, the destination of one 128-bit load.
            r_k = cute.make_rmem_tensor(cute.make_layout((nu, _VEC), stride=(_VEC, 1)), self.dtype)
            r_v = cute.make_rmem_tensor(cute.make_layout((nu, _VEC), stride=(_VEC, 1)), self.dtype)
            keys = cute.make_rmem_tensor((nu,), cutlass.Int32)
            for u in cutlass.range_constexpr(nu):
                key = key_begin + step * c.rows_per_step + step_row((row_in_warp, warp_id, u))
                keys[u] = key
                if key < key_end:
                    page = checked_page(mBlockTable, batch, key // c.page_size, mKc.shape[0], mErr)
                    slot = key % c.page_size
                    cute.autovec_copy(cute.local_tile(mKc[page, slot, kv_head, None], (_VEC,), (chunk,)),
                                      r_k[u, None])
                    cute.autovec_copy(cute.local_tile(mVc[page, slot, kv_head, None], (_VEC,), (chunk,)),
                                      r_v[u, None])
                else:
                    r_k[u, None].fill(0)
                    r_v[u, None].fill(0)
            # ---- scores: q . k per (row, head), reduced over the row's lanes ----
            s = cute.make_rmem_tensor((nu, nh), cutlass.Float32)
            for u in cutlass.range_constexpr(nu):
                k_f = r_k[u, None].load().to(cutlass.Float32)
                for h in cutlass.range_constexpr(nh):
                    part = q[h, 0] * k_f[0]
                    for e in cutlass.range_constexpr(1, _VEC):
                        part = part + q[h, e] * k_f[e]
                    for sh in cutlass.range_constexpr(int(math.log2(c.lanes_per_row))):
                        part = part + cute.arch.shuffle_sync_bfly(part, offset=c.lanes_per_row >> (sh + 1))
                    s[u, h] = part if keys[u] < key_end else -cutlass.Float32.inf
            # ---- online softmax and acc += p v, per head ----
            for h in cutlass.range_constexpr(nh):
                step_max = s[0, h]
                for u in cutlass.range_constexpr(1, nu):
                    step_max = cute.arch.fmax(step_max, s[u, h])
                new_max = cute.arch.fmax(row_max[h], step_max)
                safe = cutlass.Float32(0.0) if new_max == -cutlass.Float32.inf else new_max
                rescale = cute.math.exp2(row_max[h] - safe, fastmath=True)
                row_max[h] = new_max
                total = row_sum[h] * rescale
                for e in cutlass.range_constexpr(_VEC):
                    acc[h, e] = acc[h, e] * rescale
                for u in cutlass.range_constexpr(nu):
                    p = cute.math.exp2(s[u, h] - safe, fastmath=True)
                    total = total + p
                    v_f = r_v[u, None].load().to(cutlass.Float32)
                    for e in cutlass.range_constexpr(_VEC):
                        acc[h, e] = acc[h, e] + p * v_f[e]
                row_sum[h] = total

        self.merge_and_store(acc, row_max, row_sum, mOpart, mLSEpart, split, batch, head0, chunk, row_in_warp,
                             warp_id, tidx, SharedStorage)

    @cute.jit
    def merge_and_store(self, acc: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, mOpart: cute.Tensor,
                        mLSEpart: cute.Tensor, split: cutlass.Int32, batch: cutlass.Int32, head0: cutlass.Int32,
                        chunk: cutlass.Int32, row_in_warp: cutlass.Int32, warp_id: cutlass.Int32,
                        tidx: cutlass.Int32, SharedStorage: cutlass.Constexpr):
        """Merge the row groups of each warp (shuffles), then the warps (shared memory), and
        write this split's normalized out and natural-log LSE."""
        c = self.config
        lay = self.layouts
        nh = c.heads_per_cta
        # Row groups of a warp sit lanes_per_row lanes apart: butterfly over those lane bits.
        for sh in cutlass.range_constexpr(int(math.log2(c.rows_per_warp))):
            offset = c.lanes_per_row << sh
            for h in cutlass.range_constexpr(nh):
                m_o = cute.arch.shuffle_sync_bfly(row_max[h], offset=offset)
                l_o = cute.arch.shuffle_sync_bfly(row_sum[h], offset=offset)
                m_new, a, b, l_new = _combine_pair(row_max[h], row_sum[h], m_o, l_o)
                for e in cutlass.range_constexpr(_VEC):
                    acc_o = cute.arch.shuffle_sync_bfly(acc[h, e], offset=offset)
                    acc[h, e] = acc[h, e] * a + acc_o * b
                row_max[h], row_sum[h] = m_new, l_new

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        s_acc = storage.acc.get_tensor(to_cute(lay.smem_acc_layout))
        s_max = storage.row_max.get_tensor(to_cute(lay.smem_stats_layout))
        s_sum = storage.row_sum.get_tensor(to_cute(lay.smem_stats_layout))
        if row_in_warp == 0:
            for h in cutlass.range_constexpr(nh):
                for e in cutlass.range_constexpr(_VEC):
                    s_acc[chunk * _VEC + e, h, warp_id] = acc[h, e]
                if chunk == 0:
                    s_max[h, warp_id] = row_max[h]
                    s_sum[h, warp_id] = row_sum[h]
        cute.arch.barrier()

        # Thread (chunk, head) of the first heads * lanes_per_row threads merges the warps.
        for idx in cutlass.range_constexpr(0, nh * c.lanes_per_row, c.threads):
            if tidx + idx < nh * c.lanes_per_row:
                self.merge_warps(s_acc, s_max, s_sum, mOpart, mLSEpart, split, batch, head0, tidx + idx)

    @cute.jit
    def merge_warps(self, s_acc: cute.Tensor, s_max: cute.Tensor, s_sum: cute.Tensor, mOpart: cute.Tensor,
                    mLSEpart: cute.Tensor, split: cutlass.Int32, batch: cutlass.Int32, head0: cutlass.Int32,
                    item: cutlass.Int32):
        """Chunk `item % lanes_per_row` of head `item // lanes_per_row`: the warps' states merged,
        normalized, stored (and the head's LSE, by chunk 0)."""
        c = self.config
        h = item // c.lanes_per_row
        ch = item % c.lanes_per_row
        m = s_max[h, 0]
        l = s_sum[h, 0]
        out = cute.make_rmem_tensor((_VEC,), cutlass.Float32)
        for e in cutlass.range_constexpr(_VEC):
            out[e] = s_acc[ch * _VEC + e, h, 0]
        for w in cutlass.range_constexpr(1, c.num_warps):
            m_new, a, b, l_new = _combine_pair(m, l, s_max[h, w], s_sum[h, w])
            for e in cutlass.range_constexpr(_VEC):
                out[e] = out[e] * a + s_acc[ch * _VEC + e, h, w] * b
            m, l = m_new, l_new
        inv = cutlass.Float32(0.0) if l == 0.0 else cute.arch.rcp_approx(l)
        for e in cutlass.range_constexpr(_VEC):
            out[e] = out[e] * inv
        cute.autovec_copy(out, cute.local_tile(mOpart[split, batch, head0 + h, None], (_VEC,), (ch,)))
        if ch == 0:
            safe = cutlass.Float32(0.0) if m == -cutlass.Float32.inf else m
            mLSEpart[split, batch, head0 + h] = (
                -cutlass.Float32.inf if l == 0.0 else (safe + cute.math.log2(l, fastmath=True)) * LN_2)


class PagedDecodeCombine:
    """out (B, Hq, D) in the input dtype from the splits' partial (out, LSE) (module docstring)."""

    threads = 128

    def __init__(self, head_dim: int, dtype: str):
        self.head_dim = head_dim
        self.dtype = _CUTLASS[dtype]
        self.lanes = head_dim // _VEC
        self.heads_per_cta = self.threads // self.lanes

    @cute.jit
    def __call__(self, mOpart: cute.Tensor, mLSEpart: cute.Tensor, mO: cute.Tensor, stream,
                 mLSE: cute.Tensor | None = None, mSinks: cute.Tensor | None = None):
        """mLSE (B, Hq) fp32: the combined LSE (written when given); mSinks (Hq,) fp32 sinks."""
        mOpart, mO = assume_aligned_rows(mOpart), assume_aligned_rows(mO)
        grid = (cute.ceil_div(mO.shape[1], self.heads_per_cta), mO.shape[0], 1)
        self.kernel(mOpart, mLSEpart, mO, mLSE, mSinks).launch(grid=grid, block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mOpart: cute.Tensor, mLSEpart: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
               mSinks: cute.Tensor | None):
        tidx, _, _ = cute.arch.thread_idx()
        head_block, batch, _ = cute.arch.block_idx()
        head = head_block * self.heads_per_cta + tidx // self.lanes
        chunk = tidx % self.lanes
        num_splits = mLSEpart.shape[0]
        if head < mO.shape[1] and tidx < self.heads_per_cta * self.lanes:
            lse_max = -cutlass.Float32.inf
            for s in cutlass.range(num_splits, unroll=1):
                lse_max = cute.arch.fmax(lse_max, mLSEpart[s, batch, head])
            sink = cutlass.Float32(0.0)
            if cutlass.const_expr(mSinks is not None):
                sink = mSinks[head]
                lse_max = cute.arch.fmax(lse_max, sink)
            safe = cutlass.Float32(0.0) if lse_max == -cutlass.Float32.inf else lse_max
            acc = cute.make_rmem_tensor((_VEC,), cutlass.Float32)
            acc.fill(0.0)
            total = cutlass.Float32(0.0)
            if cutlass.const_expr(mSinks is not None):
                # NaN sinks reach total (fmax above drops them from the max, not from here).
                total = cute.math.exp2((sink - safe) * LOG2_E, fastmath=True)
            part = cute.make_rmem_tensor((_VEC,), cutlass.Float32)
            for s in cutlass.range(num_splits, unroll=1):
                w = cute.math.exp2((mLSEpart[s, batch, head] - safe) * LOG2_E, fastmath=True)
                total = total + w
                cute.autovec_copy(cute.local_tile(mOpart[s, batch, head, None], (_VEC,), (chunk,)), part)
                for e in cutlass.range_constexpr(_VEC):
                    acc[e] = acc[e] + w * part[e]
            inv = cutlass.Float32(0.0) if total == 0.0 else cute.arch.rcp_approx(total)
            for e in cutlass.range_constexpr(_VEC):
                acc[e] = acc[e] * inv
            out = cute.make_rmem_tensor((_VEC,), self.dtype)
            out.store(acc.load().to(self.dtype))
            cute.autovec_copy(out, cute.local_tile(mO[batch, head, None], (_VEC,), (chunk,)))
            if cutlass.const_expr(mLSE is not None):
                if chunk == 0:
                    mLSE[batch, head] = (-cutlass.Float32.inf if total == 0.0
                                         else safe + cute.math.log2(total, fastmath=True) * LN_2)


# ---- host side: split count, compile-only variants, the rung ---------------------------------------


def heads_per_cta_for(qhead_per_kvhead: int) -> int:
    """The largest divisor of the GQA group size that is at most `MAX_HEADS_PER_CTA`: every
    CTA's heads then share one KV head, and each K/V row is read by ceil(group / it) CTAs."""
    return max(h for h in range(1, MAX_HEADS_PER_CTA + 1) if qhead_per_kvhead % h == 0)


def num_splits_for(batch: int, head_blocks: int, max_pages: int, page_size: int, sm_count: int,
                   *, min_keys_per_split: int = 256, waves: int = 4) -> tuple[int, int]:
    """(num_splits, pages_per_split): enough CTAs for `waves` CTAs per SM when the batch and
    heads alone are too few, each split at least `min_keys_per_split` keys (a whole number of
    pages) so the combine stays small. Post-conditions: num_splits * pages_per_split >= max_pages,
    every split starts below max_pages * page_size, num_splits >= 1."""
    if max_pages <= 0:
        return 1, 1
    base = max(batch * head_blocks, 1)
    want = max(1, -(-waves * sm_count // base))
    min_pages = max(1, -(-min_keys_per_split // page_size))
    splits = max(1, min(want, -(-max_pages // min_pages)))
    pages_per_split = -(-max_pages // splits)
    return -(-max_pages // pages_per_split), pages_per_split


def config_for(head_dim: int, dtype: str, page_size: int, qhead_per_kvhead: int,
               check_pages: bool = True) -> DecodeConfig:
    """The split kernel's config: heads_per_cta from the group; 8 rows per thread (more bytes
    in flight) while the registers allow it (<= 2 heads), else 4. Every such config compiles
    without spills (tests/attention/test_paged_decode_api.py)."""
    heads = heads_per_cta_for(qhead_per_kvhead)
    return DecodeConfig(head_dim=head_dim, dtype=dtype, page_size=page_size, heads_per_cta=heads,
                        rows_per_thread=8 if heads <= 2 else 4, check_pages=check_pages).validate()


def build_variant(head_dim: int = 128, dtype: str = "bfloat16", page_size: int = 16, heads_per_cta: int = 8,
                  **tile):
    """A CompileJob for the split kernel over fake tensors with symbolic sizes."""
    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    config = DecodeConfig(head_dim=head_dim, dtype=dtype, page_size=page_size, heads_per_cta=heads_per_cta,
                          **tile).validate()
    t = _CUTLASS[dtype]
    q = fake_tensor(t, 3, leading_dim=2, assumed_align=16)
    kc, vc = (fake_tensor(t, 4, leading_dim=3, assumed_align=16) for _ in range(2))
    table = fake_tensor(cutlass.Int32, 2, leading_dim=1, assumed_align=4)
    seqlens = fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4)
    o_part = fake_tensor(cutlass.Float32, 4, leading_dim=3, assumed_align=16)
    lse_part = fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4)
    args = (q, kc, vc, table, seqlens, o_part, lse_part, cutlass.Float32(1.0 / math.sqrt(head_dim)),
            cutlass.Int32(heads_per_cta), cutlass.Int32(1), cutlass.Int32(1), fake_stream(),
            fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4) if config.check_pages else None)
    return CompileJob(PagedDecodeSplit(config), args, ("attention.decode.split", config))


def build_combine_variant(head_dim: int = 128, dtype: str = "bfloat16", lse: bool = False, sinks: bool = False):
    """A CompileJob for the combine; `lse` / `sinks`: with the combined-LSE output / the sinks."""
    from cute_kernels.runtime import CompileJob, fake_stream

    return CompileJob(PagedDecodeCombine(head_dim, dtype), combine_fake_args(dtype, lse, sinks, fake_stream()),
                      ("attention.decode.combine", head_dim, dtype, lse, sinks))


def combine_fake_args(dtype: str, lse: bool, sinks: bool, stream) -> tuple:
    """The combine's arguments as fake tensors (as `decode_mma.fake_args`), `stream` in its place."""
    from cute_kernels.runtime import fake_tensor

    o_part = fake_tensor(cutlass.Float32, 4, leading_dim=3, assumed_align=16)
    lse_part = fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4)
    out = fake_tensor(_CUTLASS[dtype], 3, leading_dim=2, assumed_align=16)
    return (o_part, lse_part, out, stream,
            fake_tensor(cutlass.Float32, 2, leading_dim=1, assumed_align=4) if lse else None,
            fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=4) if sinks else None)


VARIANT_CONFIGS = {
    "d128_bf16_page16_g8": {"head_dim": 128, "dtype": "bfloat16", "page_size": 16, "heads_per_cta": 8},
    "d128_bf16_page64_g4": {"head_dim": 128, "dtype": "bfloat16", "page_size": 64, "heads_per_cta": 4},
    "d64_fp16_page256_g1": {"head_dim": 64, "dtype": "float16", "page_size": 256, "heads_per_cta": 1,
                            "rows_per_thread": 8},
    "d256_bf16_page16_g2": {"head_dim": 256, "dtype": "bfloat16", "page_size": 16, "heads_per_cta": 2,
                            "rows_per_thread": 8},
}


def _register() -> None:
    from cute_kernels.runtime import register_variant

    # K and V stream through 128-bit global loads: LDG.E.128 in the SASS is the design.
    register_variant("attention.decode", build_variant, configs=VARIANT_CONFIGS, requires={"LDG.E.128", "SHFL.BFLY"})
    register_variant("attention.decode_combine", build_combine_variant,
                     configs={"d128_bf16": {"head_dim": 128, "dtype": "bfloat16"},
                              "d128_bf16_lse_sinks": {"head_dim": 128, "dtype": "bfloat16", "lse": True, "sinks": True}},
                     requires={"LDG.E.128"})


_register()


class DecodeRung:
    """The `decode` rung: `paged_decode`'s kernels (interface in `cute_kernels.attention.registry`),
    and the dense route of `dense_decode`: "auto" picks it for dense problems with a few queries
    over a long cache (`supports`), `dispatch.explain` gives its `route_reason`."""

    name = "decode"
    min_capability = (8, 0)
    # `launch_plan`'s launch reads the key count and the cache strides of each call.
    launch_reads_seqlen_k = True
    # Score features (`features.FEATURES`) the dense route takes (softcap on the tensor-core split
    # kernel, sinks in the combine).
    features = ("softcap", "sinks")

    @property
    def dtypes(self):
        import torch

        return (torch.float16, torch.bfloat16)

    def supports_paged(self, problem) -> str | None:
        """None when the split kernel can run this `paged.PagedProblem`, else the reason."""
        if problem.dtype not in self.dtypes:
            return f"dtype {problem.dtype} not supported (float16, bfloat16)"
        group = problem.heads_q // problem.heads_kv
        if use_mma(problem.head_dim, problem.page_size, group) is None and problem.head_dim not in HEAD_DIMS:
            return (f"head dim {problem.head_dim} not supported (with a page size multiple of 16: a multiple of 16 "
                    f"up to 256; else {', '.join(map(str, HEAD_DIMS))})")
        if problem.head_dim_v != problem.head_dim:
            return f"value head dim {problem.head_dim_v} differs from the query/key head dim {problem.head_dim}"
        if not (math.isfinite(problem.scale) and problem.scale > 0):
            return f"scale {problem.scale} must be finite and > 0"
        if problem.batch > 65535:
            return f"batch {problem.batch} must be at most 65535 (grid z)"
        if problem.heads_q > 65535:
            return f"{problem.heads_q} query heads: at most 65535 (grid y)"
        if problem.max_pages * problem.page_size >= 2**30:
            return "the block table addresses 2**30 keys or more (32-bit key indices, with room for the last split)"
        if getattr(problem, "softcap", None) is not None and use_mma(problem.head_dim, problem.page_size, group) is None:
            return "softcap not implemented on the SIMT split kernel (page sizes that are not multiples of 16)"
        return None

    def supports(self, q, k, v, problem) -> str | None:
        """None when the dense route (`dense_decode`: few queries over a long cache) takes this
        dense problem, else why not."""
        from .dense_decode import supports_dense

        return supports_dense(q, k, v, problem)

    def route_reason(self, problem) -> str:
        """Why "auto" picks this rung for a dense problem it supports (`dispatch.explain`)."""
        from .dense_decode import route_reason

        return route_reason(problem)

    def __call__(self, q, k, v, out, lse, problem, sinks=None):
        """The dense route (`dense_decode.run`): out (B, Hq, Sq, D), lse (B, Hq, Sq)."""
        from .dense_decode import run

        return run(self, q, k, v, out, lse, problem, sinks)

    def launch_plan(self, problem):
        """The dense route's TVM-FFI launch (`dense_decode.launch_plan`), or None without TVM-FFI."""
        from .dense_decode import launch_plan

        return launch_plan(self, problem)

    def paged(self, q, k_cache, v_cache, block_table, seqlens_k, out, problem, *, num_splits: int | None = None,
              lse=None, sinks=None, errors=None):
        """Write out (B, Hq, D) on torch's current stream: the split kernel, then the combine.
        lse: an optional (B, Hq) fp32 result for the combined log-sum-exp; sinks: (Hq,) fp32
        sink logits when the problem has them (they join in the combine); errors: the
        (ERROR_SLOTS,) int32 buffer of the device-side index checks, or None to compile
        without them (tables the caller built itself)."""
        import torch

        from cute_kernels.runtime import compile_kernel, current_stream, from_torch

        p = problem
        group = p.heads_q // p.heads_kv
        mma = use_mma(p.head_dim, p.page_size, group)
        config, waves = split_config(p, errors is not None)
        head_blocks = p.heads_q // config.heads_per_cta
        if num_splits is None:
            num_splits, pages_per_split = num_splits_for(p.batch, head_blocks, p.max_pages, p.page_size,
                                                         sm_count(q.device), waves=waves)
        else:
            pages_per_split = -(-max(p.max_pages, 1) // num_splits)
        o_part = torch.empty((num_splits, p.batch, p.heads_q, p.head_dim), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((num_splits, p.batch, p.heads_q), dtype=torch.float32, device=q.device)
        stream = current_stream()

        split = _split_kernel(config)
        scale, score_scale = softcap_scalars(p)
        args = (from_torch(q, leading_dim=2), from_torch(k_cache, leading_dim=3), from_torch(v_cache, leading_dim=3),
                from_torch(block_table, assumed_align=4, leading_dim=1),
                from_torch(seqlens_k, assumed_align=4, leading_dim=0),
                from_torch(o_part, leading_dim=3), from_torch(lse_part, assumed_align=4, leading_dim=2),
                cutlass.Float32(scale), cutlass.Int32(group), cutlass.Int32(pages_per_split),
                cutlass.Int32(num_splits), stream)
        if mma is not None:
            args = (*args, cutlass.Float32(score_scale) if p.softcap is not None else None)
        if errors is not None:
            args = (*args, from_torch(errors, assumed_align=4, leading_dim=0))
        compile_kernel(split, *args, key=(split.key, config))(*args)

        combine = _combine_kernel(p.head_dim, config.dtype)
        wrap = lambda t: None if t is None else from_torch(t, assumed_align=4, leading_dim=t.dim() - 1)  # noqa: E731
        args = (from_torch(o_part, leading_dim=3), from_torch(lse_part, assumed_align=4, leading_dim=2),
                from_torch(out, leading_dim=2), stream, wrap(lse), wrap(sinks))
        key = ("attention.decode.combine", p.head_dim, config.dtype, lse is not None, sinks is not None)
        compile_kernel(combine, *args, key=key)(*args)
        return out


    def dense_functions(self, problem):
        """(split, combine, config, waves): the TVM-FFI builds of the tensor-core split kernel
        (no page checks: the dense route builds its tables itself) and of the combine (with
        the LSE, and the sinks when the problem has them) for a dense `problem` the rung
        `supports`; compiled on first use, then kept per config. Each takes torch tensors and
        reads torch's current stream (`dense_decode.launch_plan` calls them)."""
        from cute_kernels.runtime import TVM_FFI_OPTION, compile_kernel, fake_stream

        from .dense_decode import PAGE
        from .decode_mma import fake_args

        p = problem
        sinks = p.sinks
        config, waves = split_config(p, False, page_size=PAGE)
        found = _TVM_FFI.get((config, sinks))
        if found is None:
            stream = fake_stream(tvm_ffi_env_stream=True)
            split = compile_kernel(_split_kernel(config), *fake_args(config, stream),
                                   key=("attention.decode.mma_split", "tvm_ffi", config), options=TVM_FFI_OPTION)
            combine = compile_kernel(_combine_kernel(p.head_dim, config.dtype),
                                     *combine_fake_args(config.dtype, True, sinks, stream),
                                     key=("attention.decode.combine", "tvm_ffi", p.head_dim, config.dtype, sinks),
                                     options=TVM_FFI_OPTION)
            found = (split, combine, config, waves)
            _TVM_FFI[(config, sinks)] = found
        return found


def split_config(problem, check_pages: bool, page_size: int | None = None):
    """(config, waves): the split kernel for a problem's head dim, dtype, page size and group:
    the tensor-core kernel where it applies (`use_mma`; 1-warp CTAs, so 16 waves of them per
    SM), else the SIMT one (4 waves). `page_size`: the problem's unless given (the dense route's
    problems are not paged)."""
    p = problem
    page = p.page_size if page_size is None else page_size
    group = p.heads_q // p.heads_kv
    dtype = str(p.dtype).removeprefix("torch.")
    mma = use_mma(p.head_dim, page, group)
    if mma is not None:
        from .decode_mma import DecodeMmaConfig

        softcap = getattr(p, "softcap", None) is not None
        return DecodeMmaConfig(head_dim=p.head_dim, dtype=dtype, page_size=page, heads_per_cta=mma, softcap=softcap,
                               check_pages=check_pages).validate(), 16
    return config_for(p.head_dim, dtype, page, group, check_pages=check_pages), 4


# The warm path's caches (`runtime.plan_cache`): one kernel object per config, and the dense
# route's TVM-FFI builds per (split config, sinks).
_SPLIT = WarmCache("attention.decode.split_kernels")
_COMBINE = WarmCache("attention.decode.combine_kernels")
_TVM_FFI = WarmCache("attention.decode.tvm_ffi")


def _split_kernel(config):
    """The split kernel for a `DecodeConfig` (SIMT) or a `decode_mma.DecodeMmaConfig`."""
    return memo(_SPLIT, config, _make_split, config)


def _make_split(config):
    if isinstance(config, DecodeConfig):
        kernel, key = PagedDecodeSplit(config), "attention.decode.split"
    else:
        from .decode_mma import PagedDecodeMma

        kernel, key = PagedDecodeMma(config), "attention.decode.mma_split"
    kernel.key = key
    return kernel


def use_mma(head_dim: int, page_size: int, qhead_per_kvhead: int) -> int | None:
    """heads_per_cta for the tensor-core split kernel (`decode_mma`), or None for the SIMT one.

    The tensor-core kernel needs a page size multiple of 16 (a K/V block inside one page) and a
    head dim multiple of 16 up to 256. It serves every group size, one head per KV head
    included: its issue cost per byte is lower than the SIMT kernel's even with 15 of its 16
    rows padding (measured on the H200, B 64, Hq = Hkv = 8, D 128, context 8192: 517 µs
    against 740 µs, i.e. about 97% against 68% of HBM bandwidth; docs/attention.md).
    """
    from .decode_mma import MAX_HEADS_PER_CTA as MMA_HEADS
    from .decode_mma import block_n_for

    if qhead_per_kvhead < 1 or page_size < 16 or block_n_for(page_size, head_dim) is None:
        return None
    if head_dim % 16 or not 16 <= head_dim <= 256:
        return None
    return max(h for h in range(1, MMA_HEADS + 1) if qhead_per_kvhead % h == 0)


def _combine_kernel(head_dim: int, dtype: str) -> PagedDecodeCombine:
    return memo(_COMBINE, (head_dim, dtype), PagedDecodeCombine, head_dim, dtype)


RUNG = DecodeRung()
