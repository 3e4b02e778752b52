"""The `decode` rung's tensor-core split kernel: the query heads of a GQA group as the M rows of
`sm80_flash`'s mma.sync forward, over one KV split of a paged cache.

At one query token per sequence, the SIMT split kernel (`decode.PagedDecodeSplit`) spends about
2 FMAs and a share of a shuffle reduction per K/V element per query head: with 4 or more heads
per KV head its instruction issue, not HBM, sets the pace (docs/attention.md). Here the G heads
of a group (zero-padded to 16) are Q's rows of `FlashAttentionSm80`'s loop, so S = Q K^T and
O += P V^T run on HMMA and each K/V byte costs a small fraction of an instruction:

    CTA (split, head block, batch), 1 warp:
    prologue   cp.async the group's q rows (rows >= heads zeroed) and the split's last K block
    per block  wait K; cp.async V        S = Q K^T (ldmatrix + mma.sync m16n8k16)
               wait V; cp.async next K   mask the split's end, online softmax, O += P V^T
    epilogue   O /= l -> fp32 partial out rows < heads; natural-log LSE per head

A K/V block of `block_n` keys lies inside one page or spans whole pages (`block_n_for`): one
block_table read per page, and each page's rows are one strided tile of
k_cache[page, :, kv_head, :]. One warp per CTA keeps the shared memory small (Q 16 x D, one K and one V block), so many
CTAs (and their cp.async copies) share an SM. The combine is `decode.PagedDecodeCombine`.
With `softcap` the scores are soft-capped as in `sm80_flash` (`softmax.apply_softcap`); sinks
join in the combine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from cute_kernels.runtime import to_cute

from .decode_checks import checked_length, checked_page
from .fragments import accumulator_as_a, mn_view
from .mask import apply_mask
from .sm80_blocks import assume_aligned_rows, gemm_rs, gemm_ss, load_rows, smem_operand
from .softmax import LOG2_E, OnlineSoftmax, apply_softcap

__all__ = ["DecodeMmaConfig", "PagedDecodeMma", "block_n_for", "MAX_HEADS_PER_CTA"]

_CUTLASS = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
MAX_HEADS_PER_CTA = 16  # the MMA's M


def block_n_for(page_size: int, head_dim: int = 128) -> int | None:
    """Keys per K/V block, or None unless page_size is a multiple of 16.

    The widest block the registers hold without spilling: 64 keys up to D = 64, 32 up to
    D = 128, 16 above (a warp holds the K fragments of a whole block for the S GEMM). That
    width is used when it is a whole number of pages, or when pages are a whole number of such
    blocks; otherwise the widest of 32, 16 dividing the page size. Post-condition: the result
    divides page_size or is a multiple of it, so a block is within one page or is whole pages.
    """
    if not isinstance(page_size, int) or page_size < 16 or page_size % 16:
        return None
    cap = 64 if head_dim <= 64 else 32 if head_dim <= 128 else 16
    if page_size % cap == 0 or cap % page_size == 0:
        return cap
    return next(n for n in (32, 16) if n < cap and page_size % n == 0)


@dataclass(frozen=True)
class DecodeMmaConfig:
    """head_dim: a multiple of 16 up to 256; dtype: "float16" | "bfloat16"; page_size: keys per
    page (a multiple of 16: a K/V block is within one page or whole pages); heads_per_cta: query
    heads of one KV group per CTA (1 to 16, the rows of the 16-row MMA tile that hold data);
    softcap: soft-capped scores (the score scale a runtime argument); check_pages: the
    device-side index checks (`decode`'s docstring)."""

    head_dim: int = 128
    dtype: str = "bfloat16"
    page_size: int = 16
    heads_per_cta: int = 8
    softcap: bool = False
    check_pages: bool = True

    def validate(self) -> "DecodeMmaConfig":
        if block_n_for(self.page_size, self.head_dim) is None:
            raise ValueError(f"DecodeMmaConfig.page_size must be a positive multiple of 16, got {self.page_size!r}")
        if not isinstance(self.heads_per_cta, int) or not 1 <= self.heads_per_cta <= MAX_HEADS_PER_CTA:
            raise ValueError(f"DecodeMmaConfig.heads_per_cta must be in [1, {MAX_HEADS_PER_CTA}], "
                             f"got {self.heads_per_cta!r}")
        self.tile.validate()
        return self

    @property
    def block_n(self) -> int:
        return block_n_for(self.page_size, self.head_dim)

    @property
    def pages_per_block(self) -> int:
        """Pages one K/V block spans (1 when a block lies within a page)."""
        return max(1, self.block_n // self.page_size)

    @property
    def tile(self):
        """The `sm80_flash` tile this kernel runs: 16 query rows, one warp, block_n keys."""
        from .sm80_flash import FlashSm80Config

        return FlashSm80Config(head_dim=self.head_dim, dtype=self.dtype, causal=False, block_m=16,
                               block_n=self.block_n, num_warps=1)


class PagedDecodeMma:
    """Partial out (splits, B, Hq, D) fp32 and LSE (splits, B, Hq) fp32, as `decode.PagedDecodeSplit`
    writes them, computed on tensor cores (module docstring)."""

    def __init__(self, config: DecodeMmaConfig):
        from .sm80_flash import FlashSm80Layouts

        self.config = config.validate()
        self.layouts = FlashSm80Layouts(config.tile)
        self.dtype = _CUTLASS[config.dtype]

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mKc: cute.Tensor, mVc: cute.Tensor, mBlockTable: cute.Tensor,
                 mSeqlensK: cute.Tensor, mOpart: cute.Tensor, mLSEpart: cute.Tensor, softmax_scale: cutlass.Float32,
                 qhead_per_kvhead: cutlass.Int32, pages_per_split: cutlass.Int32, num_splits: cutlass.Int32, stream,
                 score_scale: cutlass.Float32 | None = None, mErr: cute.Tensor | None = None):
        """softmax_scale and score_scale: `problem_checks.softcap_scalars` (with `softcap`: the
        cap and scale / cap); mErr: the error buffer (with `check_pages`)."""
        c = self.config
        t = c.tile
        mQ, mKc, mVc = [assume_aligned_rows(x) for x in (mQ, mKc, mVc)]
        lay = self.layouts
        smem_q_layout = to_cute(lay.smem_q_layout)
        smem_kv_layout = to_cute(lay.smem_kv_layout)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_q_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_kv_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_kv_layout)], 1024]

        g2s_atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype,
                                       num_bits_per_copy=128)
        gmem_load = cute.make_tiled_copy_tv(g2s_atom, to_cute(lay.copy_thread_layout), to_cute(lay.copy_value_layout))
        tiled_mma = cute.make_tiled_mma(warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16)), (1, 1, 1),
                                        permutation_mnk=(16, 16, 16))
        grid = (num_splits, mQ.shape[1] // c.heads_per_cta, mQ.shape[0])
        self.kernel(mQ, mKc, mVc, mBlockTable, mSeqlensK, mOpart, mLSEpart, softmax_scale * LOG2_E,
                    qhead_per_kvhead, pages_per_split, gmem_load, tiled_mma, SharedStorage, score_scale,
                    mErr if c.check_pages else None).launch(
            # minctasm 1: without it ptxas aims at more resident 1-warp CTAs and spills a register.
            grid=grid, block=[t.threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mKc: cute.Tensor, mVc: cute.Tensor, mBlockTable: cute.Tensor,
               mSeqlensK: cute.Tensor, mOpart: cute.Tensor, mLSEpart: cute.Tensor, scale_log2: cutlass.Float32,
               qhead_per_kvhead: cutlass.Int32, pages_per_split: cutlass.Int32, gmem_load: cute.TiledCopy,
               tiled_mma: cute.TiledMma, SharedStorage: cutlass.Constexpr, score_scale: cutlass.Float32 | None,
               mErr: cute.Tensor | None):
        c = self.config
        t = c.tile
        tidx, _, _ = cute.arch.thread_idx()
        split, head_block, batch = cute.arch.block_idx()
        head0 = head_block * c.heads_per_cta
        kv_head = head0 // qhead_per_kvhead
        key_begin = split * pages_per_split * c.page_size
        seqlen = checked_length(mSeqlensK, batch, mBlockTable.shape[1] * c.page_size, mErr)
        key_end = cutlass.min(key_begin + pages_per_split * c.page_size, seqlen)
        # The split is a sequence of n_keys keys starting at key_begin (a multiple of block_n).
        n_keys = cutlass.max(key_end - key_begin, 0)
        n_block_max = cute.ceil_div(n_keys, t.block_n)
        n_unmasked_end = n_keys // t.block_n

        # ---- partition ----
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(to_cute(self.layouts.smem_q_layout))
        sK = storage.sK.get_tensor(to_cute(self.layouts.smem_kv_layout))
        sV = storage.sV.get_tensor(to_cute(self.layouts.smem_kv_layout))
        sVt = cute.make_tensor(sV.iterator, to_cute(self.layouts.smem_vt_layout))

        gQ = cute.local_tile(cute.domain_offset((head0, 0), mQ[batch, None, None]), (16, t.head_dim), (0, 0))
        thr_load = gmem_load.get_slice(tidx)
        tQgQ, tQsQ = thr_load.partition_S(gQ), thr_load.partition_D(sQ)
        tKsK, tVsV = thr_load.partition_D(sK), thr_load.partition_D(sV)
        tQcQ = thr_load.partition_S(cute.make_identity_tensor((16, t.head_dim)))
        tKVcKV = thr_load.partition_S(cute.make_identity_tensor((t.block_n, t.head_dim)))

        thr_mma = tiled_mma.get_slice(tidx)
        acc_o = cute.make_rmem_tensor(thr_mma.partition_shape_C((16, t.head_dim)), cutlass.Float32)
        acc_o.fill(0.0)
        frags = (
            smem_operand(tiled_mma, sQ, "A", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sK, "B", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sVt, "B", self.dtype, tidx, transpose=True),
        )
        t_coord_s = mn_view(thr_mma.partition_C(cute.make_identity_tensor((16, t.block_n))))
        softmax = OnlineSoftmax(cute.size(t_coord_s.shape[0]), scale_log2)
        # The last page holding a key of the split: block table reads never go past it.
        last_page = cutlass.max(key_end - 1, 0) // c.page_size
        kv = (mKc, mVc, mBlockTable, batch, kv_head, key_begin, last_page, score_scale, mErr)

        # ---- prologue: the group's q rows and the split's last K block ----
        if n_block_max > 0:
            load_rows(gmem_load, tQgQ, tQsQ, tQcQ, c.heads_per_cta)
            self.load_kv(gmem_load, thr_load, kv, 0, n_block_max - 1, tKsK, tKVcKV,
                         n_keys - (n_block_max - 1) * t.block_n, True)
        cute.arch.cp_async_commit_group()

        # ---- main loop: the split's partial last block, then the full ones, descending ----
        for i in cutlass.range(n_block_max - n_unmasked_end, unroll=1):
            self.compute_block(n_block_max - 1 - i, True, n_keys, kv, gmem_load, thr_load, tKsK, tVsV, tKVcKV,
                               tiled_mma, thr_mma, frags, acc_o, t_coord_s, softmax)
        for i in cutlass.range(n_unmasked_end, unroll=1):
            self.compute_block(n_unmasked_end - 1 - i, False, n_keys, kv, gmem_load, thr_load, tKsK, tVsV, tKVcKV,
                               tiled_mma, thr_mma, frags, acc_o, t_coord_s, softmax)

        # ---- epilogue: normalized fp32 partial out and LSE of the rows that are heads ----
        lse = cute.make_rmem_tensor((softmax.num_rows,), cutlass.Float32)
        softmax.finalize(mn_view(acc_o), lse)
        cute.arch.cp_async_wait_group(0)  # nothing may land in smem after the CTA exits
        gO = cute.local_tile(cute.domain_offset((head0, 0), mOpart[split, batch, None, None]), (16, t.head_dim),
                             (0, 0))
        t_o = mn_view(thr_mma.partition_C(gO))
        t_coord_o = mn_view(thr_mma.partition_C(cute.make_identity_tensor((16, t.head_dim))))
        acc_o_mn = mn_view(acc_o)
        for r in cutlass.range_constexpr(cute.size(acc_o_mn.shape[0])):
            if t_coord_o[r, 0][0] < c.heads_per_cta:
                for col in cutlass.range_constexpr(cute.size(acc_o_mn.shape[1])):
                    t_o[r, col] = acc_o_mn[r, col]
        gLSE = cute.domain_offset((head0,), mLSEpart[split, batch, None])
        if tidx % 4 == 0:
            for r in cutlass.range_constexpr(cute.size(lse)):
                row = t_coord_s[r, 0][0]
                if row < c.heads_per_cta:
                    gLSE[row] = lse[r]

    @cute.jit
    def load_kv(self, gmem_load: cute.TiledCopy, thr_load, kv, which: cutlass.Constexpr, n_block: cutlass.Int32,
                dst: cute.Tensor, coord: cute.Tensor, rows_left: cutlass.Int32, masked: cutlass.Constexpr):
        """cp.async K (which=0) or V (1) block n_block of the split into this thread's smem
        partition `dst`; masked: rows at or past rows_left are zeroed instead (`load_rows`).

        A block within one page is one strided (block_n, D) tile of cache[page, :, kv_head, :].
        A block of several pages copies each page's (page_size, D) tile into its rows: the copy
        tiling steps rows_per_pass rows at a time on both sides, so row mode j of a page's
        partition is row mode p * (page_size / rows_per_pass) + j of the block's."""
        c = self.config
        t = c.tile
        mKc, mVc, mBlockTable, batch, kv_head, key_begin, last_page, _, mErr = kv
        cache = mKc if cutlass.const_expr(which == 0) else mVc
        key0 = key_begin + n_block * t.block_n
        if cutlass.const_expr(c.pages_per_block == 1):
            page = checked_page(mBlockTable, batch, key0 // c.page_size, cache.shape[0], mErr)
            tile = cute.local_tile(cache[page, None, kv_head, None], (t.block_n, t.head_dim),
                                   ((key0 % c.page_size) // t.block_n, 0))
            if cutlass.const_expr(masked):
                load_rows(gmem_load, thr_load.partition_S(tile), dst, coord, rows_left)
            else:
                cute.copy(gmem_load, thr_load.partition_S(tile), dst)
        else:
            for p in cutlass.range_constexpr(c.pages_per_block):
                # Pages past the split's keys are never copied; clamping keeps the read in the table.
                page = checked_page(mBlockTable, batch, cutlass.min(key0 // c.page_size + p, last_page),
                                    cache.shape[0], mErr)
                src = thr_load.partition_S(cute.local_tile(cache[page, None, kv_head, None],
                                                           (c.page_size, t.head_dim), (0, 0)))
                rows = cute.size(src.shape[1])
                for j in cutlass.range_constexpr(rows):
                    i = p * rows + j
                    if cutlass.const_expr(masked):
                        if coord[0, i, 0][0] < rows_left:
                            cute.copy(gmem_load, src[None, j, None], dst[None, i, None])
                        else:
                            dst[None, i, None].fill(0)
                    else:
                        cute.copy(gmem_load, src[None, j, None], dst[None, i, None])

    @cute.jit
    def compute_block(self, n_block: cutlass.Int32, masked: cutlass.Constexpr, n_keys: cutlass.Int32, kv,
                      gmem_load: cute.TiledCopy, thr_load, tKsK: cute.Tensor, tVsV: cute.Tensor,
                      tKVcKV: cute.Tensor, tiled_mma: cute.TiledMma, thr_mma, frags, acc_o: cute.Tensor,
                      t_coord_s: cute.Tensor, softmax: OnlineSoftmax):
        """One K/V block, as `sm80_flash.FlashAttentionSm80.compute_block` with paged sources."""
        t = self.config.tile
        q_frag, k_frag, vt_frag = frags
        acc_s = cute.make_rmem_tensor(thr_mma.partition_shape_C((16, t.block_n)), cutlass.Float32)
        acc_s.fill(0.0)

        # K[n] landed, and the warp is done reading V of the previous block: refill V.
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        self.load_kv(gmem_load, thr_load, kv, 1, n_block, tVsV, tKVcKV, n_keys - n_block * t.block_n, masked)
        cute.arch.cp_async_commit_group()

        gemm_ss(tiled_mma, acc_s, q_frag, k_frag)  # S = Q K^T

        # V[n] landed, and the warp is done reading K[n]: prefetch K[n - 1].
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        if n_block > 0:
            self.load_kv(gmem_load, thr_load, kv, 0, n_block - 1, tKsK, tKVcKV, t.block_n, False)
        cute.arch.cp_async_commit_group()

        acc_s_mn = mn_view(acc_s)
        if cutlass.const_expr(self.config.softcap):
            apply_softcap(acc_s, kv[7])
        if cutlass.const_expr(masked):
            apply_mask(acc_s_mn, t_coord_s, 0, n_block * t.block_n, n_keys, 0, False)
        softmax.step(acc_s_mn, mn_view(acc_o))

        r_p = cute.make_fragment_like(acc_s, self.dtype)
        r_p.store(acc_s.load().to(self.dtype))
        gemm_rs(tiled_mma, acc_o, accumulator_as_a(r_p), vt_frag)


def build_variant(head_dim: int = 128, dtype: str = "bfloat16", page_size: int = 16, heads_per_cta: int = 8,
                  softcap: bool = False, check_pages: bool = True):
    """A CompileJob for the tensor-core split kernel over fake tensors with symbolic sizes."""
    from cute_kernels.runtime import CompileJob, fake_stream

    config = DecodeMmaConfig(head_dim=head_dim, dtype=dtype, page_size=page_size,
                             heads_per_cta=heads_per_cta, softcap=softcap, check_pages=check_pages).validate()
    return CompileJob(PagedDecodeMma(config), fake_args(config, fake_stream()), ("attention.decode.mma_split", config))


def fake_args(config: DecodeMmaConfig, stream) -> tuple:
    """The split kernel's arguments as fake tensors with symbolic sizes (what `from_torch`
    fixes: dtype, rank, unit-stride mode, alignment) and placeholder scalars, `stream` in its
    place: for a CompileJob, and for the TVM-FFI build (`decode.DecodeRung.dense_functions`)."""
    from cute_kernels.runtime import fake_tensor

    t = _CUTLASS[config.dtype]
    q = fake_tensor(t, 3, leading_dim=2, assumed_align=16)
    kc, vc = (fake_tensor(t, 4, leading_dim=3, assumed_align=16) for _ in range(2))
    table = fake_tensor(cutlass.Int32, 2, leading_dim=1, assumed_align=4)
    seqlens = fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4)
    o_part = fake_tensor(cutlass.Float32, 4, leading_dim=3, assumed_align=16)
    lse_part = fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4)
    return (q, kc, vc, table, seqlens, o_part, lse_part, cutlass.Float32(1.0 / math.sqrt(config.head_dim)),
            cutlass.Int32(config.heads_per_cta), cutlass.Int32(1), cutlass.Int32(1), stream,
            cutlass.Float32(0.1) if config.softcap else None,
            fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4) if config.check_pages else None)


VARIANT_CONFIGS = {
    "d128_bf16_page16_g8": {"head_dim": 128, "dtype": "bfloat16", "page_size": 16, "heads_per_cta": 8},
    "d128_bf16_page256_g16": {"head_dim": 128, "dtype": "bfloat16", "page_size": 256, "heads_per_cta": 16},
    "d64_fp16_page64_g4": {"head_dim": 64, "dtype": "float16", "page_size": 64, "heads_per_cta": 4},
    # The dense route's page size (`dense_decode`), soft-capped.
    "d128_bf16_page64_g4_softcap": {"head_dim": 128, "dtype": "bfloat16", "page_size": 64, "heads_per_cta": 4,
                                    "softcap": True, "check_pages": False},
}


def _register() -> None:
    from cute_kernels.runtime import register_variant

    register_variant("attention.decode_mma", build_variant, configs=VARIANT_CONFIGS,
                     requires={"HMMA", "LDSM", "LDGSTS"})


_register()
