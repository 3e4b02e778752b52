"""Rung `sm80_flash`: FlashAttention-2's forward pass with Ampere's warp-level tensor cores.

One CTA of `num_warps` warps owns a block of `block_m` query rows of one (batch, head); each
warp owns 16 * (block_m / 16 / num_warps) of those rows, so softmax statistics never leave the
warp. The CTA walks the K/V blocks its rows can see (`block_info`: [n_block_min,
n_block_max)), masked blocks first (with a sliding window's left bound, `local`, every block):

    prologue   cp.async Q and the first K block to shared memory (rows past the ends zeroed)
    per block  wait K; cp.async V            S = Q K^T      (ldmatrix + mma.sync m16n8k16)
               wait V; cp.async next K       mask, online softmax (fp32, base 2, `softmax`)
                                             O += P V^T     (P: bf16/fp16 registers as A)
    epilogue   O /= l; O -> smem (Q's buffer) -> 128-bit stores; LSE (natural log) per row

K and V have one shared-memory buffer each, and each one's load overlaps the other's use: the
V copy runs under the S GEMM, the next K copy under softmax and the P V GEMM. Shared memory is
swizzled (`Swizzle(B, 3, 3)` over 16-byte chunks, from `cute_kernels.layouts.smem_atoms`) so
both the row-wise cp.async writes and the column-wise ldmatrix reads are conflict-free; V is
read transposed (`ldmatrix.trans`) through a transposed view of the same buffer.

Masks (`mask`): the sequence end; with `causal` the upper diagonal j <= i + causal_offset
(causality or a window's right bound); with `local` the lower one j >= i + offset_lo. Rows
that see no key give out 0 and lse -inf. The packed (varlen) launch reads each sequence's
offsets on the device (`seqlen_info`) and aligns both diagonals per sequence.

Score features (`features`): with `softcap` each S block becomes tanh(S * scale / c) before the
mask (`softmax.apply_softcap`; the softmax then runs with scale_log2 = c log2 e); with `sinks`
the head's sink logit joins every row's denominator in the epilogue; the varlen launch takes
`seqused_k` (B,) int32, the number of keys each sequence uses (its Sk, alignment included).

Layouts are computed with `cute_kernels.layouts` in `FlashSm80Layouts` (printable from the
workbench) and converted with `runtime.to_cute` while tracing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from cute_kernels.layouts import Layout
from cute_kernels.runtime import compile_kernel, to_cute, tvm_ffi_available
from cute_kernels.runtime.plan_cache import WarmCache, memo

from . import block_info, seqlen_info
from .features import feature_reason
from .forward_host import compile_tvm_ffi
from .problem_checks import (bottom_right_flag, common_reason, config_of, launch_scalars, softcap_scalars,
                             varlen_window_scalars, window_scalars)
from .sm80_blocks import (assume_aligned_rows, copy_layouts, gemm_rs, gemm_ss, load_rows, smem_atom_width,
                          smem_operand, smem_tile_layout, store_tile, transposed)
from .fragments import accumulator_as_a, mn_view
from .mask import apply_mask
from .softmax import LOG2_E, OnlineSoftmax, apply_softcap

__all__ = ["FlashSm80Config", "FlashSm80Layouts", "FlashAttentionSm80", "config_for", "HEAD_DIMS"]

# Head dims with a tuned tile; any multiple of 16 up to 256 is accepted.
HEAD_DIMS = (64, 96, 128, 192, 256)
_DTYPES = ("float16", "bfloat16")
_CUTLASS = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


@dataclass(frozen=True)
class FlashSm80Config:
    """The static shape of one compiled `sm80_flash` kernel.

    head_dim: D of Q, K and V (a multiple of 16, at most 256); dtype: "float16" | "bfloat16";
    causal: whether the causal diagonal is tested (its alignment is a runtime offset);
    local: whether a sliding window's lower bound is tested (its offset is a runtime value too);
    then every visited block is masked. block_m x block_n: the Q rows of a CTA x the K/V rows of
    one step; num_warps: warps per CTA, splitting the Q rows (each warp needs a multiple of 16 rows).
    softcap: scores are soft-capped (runtime cap); sinks: a per-head sink logit joins each row's
    denominator; seqused_k: (varlen) each sequence's key count comes from a seqused_k tensor.
    """

    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    local: bool = False
    softcap: bool = False
    sinks: bool = False
    seqused_k: bool = False

    def validate(self) -> "FlashSm80Config":
        d = self.head_dim
        if not isinstance(d, int) or d < 16 or d > 256 or d % 16:
            raise ValueError(f"FlashSm80Config.head_dim must be a multiple of 16 in [16, 256], got {d!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"FlashSm80Config.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        for name in ("causal", "local", "softcap", "sinks", "seqused_k"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FlashSm80Config.{name} must be a bool, got {getattr(self, name)!r}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"FlashSm80Config.num_warps must be 1, 2, 4 or 8, got {self.num_warps!r}")
        if self.block_m % (16 * self.num_warps):
            raise ValueError(
                f"FlashSm80Config.block_m = {self.block_m} must be a multiple of 16 * num_warps = {16 * self.num_warps}"
            )
        if self.block_n % 16 or self.block_n < 16:
            raise ValueError(f"FlashSm80Config.block_n must be a positive multiple of 16, got {self.block_n}")
        rows_per_copy = self.threads // (self.smem_atom_width // 8)
        for name in ("block_m", "block_n"):
            if getattr(self, name) % rows_per_copy:
                raise ValueError(
                    f"FlashSm80Config.{name} = {getattr(self, name)} must be a multiple of {rows_per_copy}, "
                    f"the rows {self.threads} threads copy per pass"
                )
        if self.smem_bytes > 227 * 1024:
            raise ValueError(f"FlashSm80Config needs {self.smem_bytes} bytes of shared memory, over sm_90's 227 KiB")
        return self

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    @property
    def smem_atom_width(self) -> int:
        """Elements per swizzle row: the widest of 64/32/16 (128/64/32 bytes) dividing head_dim."""
        return smem_atom_width(self.head_dim)

    @property
    def smem_bytes(self) -> int:
        return 2 * self.head_dim * (self.block_m + 2 * self.block_n)


def config_for(head_dim: int, dtype: str, causal: bool, local: bool = False, **features) -> FlashSm80Config:
    """The tile for a head dim, chosen so the SASS has no spills (checked by the variants):
    128 x 64 with 4 warps up to D = 64; at D = 128 the tiles below; 128 x 64 with 8 warps (16 Q
    rows per warp) for the other head dims up to 128 and for multiples of 32 above (at D = 256:
    1.05x SDPA's FA2 backend on an H200, against 1.01x for 64 x 64 with 4 warps); 64 x 64 with 4
    warps for the other head dims above 128 (whose 32-byte swizzle rows would need 128 K/V rows
    per copy pass with 8 warps).
    Per thread, the fp32 accumulators take (rows per warp) * (D + block_n) / 32 registers.

    At D = 128 fewer warps with more rows each are faster (each warp reads all of K and V from
    shared memory, so 4 warps halve that traffic against 8), as far as the registers allow:
    128 x 32 with 4 warps without a mask and 64 x 64 with 4 warps with one (128 x 32 spills
    80-108 bytes once a diagonal is tested; 128 x 64 with 4 warps spills 156-180 bytes). Against
    SDPA's FA2 backend on an H200 (B4 H16 S4096 and B4 H32 S2048, bf16): 0.95x / 0.98x and
    causal 0.94x / 0.95x, where 128 x 64 with 8 warps measured 0.85x / 0.87x and 0.89x / 0.87x.
    `features` (softcap, sinks, seqused_k: bools) keep the tile, except that a soft cap at D = 128
    takes the masked tile and up to D = 64 eight warps (its tanh's registers)."""
    if head_dim == 128:
        tight = causal or local or features.get("softcap", False)
        block_m, block_n, num_warps = (64, 64, 4) if tight else (128, 32, 4)
        return FlashSm80Config(head_dim=head_dim, dtype=dtype, causal=causal, block_m=block_m, block_n=block_n,
                               num_warps=num_warps, local=local, **features).validate()
    if head_dim <= 64:
        # A soft cap's tanh spills 32 rows per warp (8 bytes at D = 64): 16 rows per warp then.
        block_m, num_warps = 128, 8 if features.get("softcap", False) else 4
    elif head_dim <= 128 or head_dim % 32 == 0:
        block_m, num_warps = 128, 8
    else:
        block_m, num_warps = 64, 4
    # ... with at least the K/V rows one copy pass moves (128 at D = 80 or 112 with 8 warps,
    # whose 32-byte swizzle rows take 2 threads each).
    block_n = max(64, 32 * num_warps // (smem_atom_width(head_dim) // 8))
    return FlashSm80Config(head_dim=head_dim, dtype=dtype, causal=causal, block_m=block_m, block_n=block_n,
                           num_warps=num_warps, local=local, **features).validate()


@dataclass(frozen=True)
class FlashSm80Layouts:
    """Every layout `FlashAttentionSm80` runs, as `cute_kernels.layouts` objects.

    smem_q_layout (block_m, D), smem_kv_layout (block_n, D): the swizzled atom tiled row-major
    over the tile; smem_vt_layout (D, block_n): the same V buffer read transposed;
    copy_thread_layout: thread -> (row, 16-byte chunk) of a gmem <-> smem pass, each thread
    moving copy_value_layout (1 x 8 elements, one 128-bit access); tiled_mma: the warp MMA atom
    tiled num_warps x 1 (picture with `.tiled_mma.picture()`).
    """

    config: FlashSm80Config
    smem_q_layout: object = field(init=False)
    smem_kv_layout: object = field(init=False)
    smem_vt_layout: object = field(init=False)
    copy_thread_layout: Layout = field(init=False)
    copy_value_layout: Layout = field(init=False)
    tiled_mma: object = field(init=False)

    def __post_init__(self):
        from cute_kernels.layouts.atoms import atom
        from cute_kernels.layouts.tiled import make_tiled_mma

        c = self.config.validate()
        kv = smem_tile_layout(c.block_n, c.head_dim)
        thr, val = copy_layouts(c.threads, c.head_dim)
        set_ = object.__setattr__
        set_(self, "smem_q_layout", smem_tile_layout(c.block_m, c.head_dim))
        set_(self, "smem_kv_layout", kv)
        set_(self, "smem_vt_layout", transposed(kv, c.block_n, c.head_dim))
        set_(self, "copy_thread_layout", thr)
        set_(self, "copy_value_layout", val)
        name = "SM80_16x8x16_F32F16F16F32_TN" if c.dtype == "float16" else "SM80_16x8x16_F32BF16BF16F32_TN"
        set_(self, "tiled_mma", make_tiled_mma(atom(name), (c.num_warps, 1, 1), (16 * c.num_warps, 16, 16)))


class FlashAttentionSm80:
    """out, lse = attention(q, k, v) for q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D), out like q,
    lse (B, Hq, Sq) fp32; head h reads K/V head h // qhead_per_kvhead."""

    def __init__(self, config: FlashSm80Config):
        self.config = config.validate()
        self.layouts = FlashSm80Layouts(self.config)
        self.dtype = _CUTLASS[config.dtype]

    # ---- host side -----------------------------------------------------------------------------

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32, offset_lo: cutlass.Int32,
                 qhead_per_kvhead: cutlass.Int32, stream, mCuSeqlensQ: cute.Tensor | None = None,
                 mCuSeqlensK: cute.Tensor | None = None, num_sequences: cutlass.Int32 | None = None,
                 max_seqlen_q: cutlass.Int32 | None = None, bottom_right: cutlass.Int32 | None = None,
                 score_scale: cutlass.Float32 | None = None, mSinks: cute.Tensor | None = None,
                 mSeqUsedK: cute.Tensor | None = None):
        """Launch over (q tiles, heads, batch). Row i sees keys j <= i + causal_offset (when
        `causal`) and j >= i + offset_lo (when `local`). Varlen (the cu_seqlens given): q/k/v/o
        are the packed (T, H, D) tensors viewed (1, H, T, D), lse (H, T) viewed (1, H, T); the
        grid is (q tiles of max_seqlen_q, heads, num_sequences), and both offsets are then
        relative to each sequence's base, bottom_right * (Sk_b - Sq_b) (bottom_right: 0 or 1),
        i.e. causal_offset = window_right and offset_lo = -window_left. Features: softmax_scale
        and score_scale are `problem_checks.softcap_scalars` (with `softcap`); mSinks (Hq,) fp32
        (with `sinks`); mSeqUsedK (B,) int32 (varlen, with `seqused_k`)."""
        c = self.config
        # The host checked every non-unit stride is a multiple of 8 elements (16 bytes), so each
        # row of every tile starts 16-byte aligned: tell the compiler, or no 128-bit access.
        mQ, mK, mV, mO = [assume_aligned_rows(t) for t in (mQ, mK, mV, mO)]
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
        store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        thr, val = to_cute(lay.copy_thread_layout), to_cute(lay.copy_value_layout)
        gmem_load = cute.make_tiled_copy_tv(g2s_atom, thr, val)
        gmem_store = cute.make_tiled_copy_tv(store_atom, thr, val)
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16)),
            (c.num_warps, 1, 1),
            permutation_mnk=(16 * c.num_warps, 16, 16),
        )
        if cutlass.const_expr(mCuSeqlensQ is None):
            grid = (cute.ceil_div(mQ.shape[2], c.block_m), mQ.shape[1], mQ.shape[0])
        else:
            grid = (cute.ceil_div(max_seqlen_q, c.block_m), mQ.shape[1], num_sequences)
        self.kernel(mQ, mK, mV, mO, mLSE, softmax_scale * LOG2_E, causal_offset, offset_lo, qhead_per_kvhead,
                    gmem_load, gmem_store, tiled_mma, SharedStorage, mCuSeqlensQ, mCuSeqlensK, bottom_right,
                    score_scale, mSinks, mSeqUsedK).launch(grid=grid, block=[c.threads, 1, 1], stream=stream)

    # ---- device side ---------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               scale_log2: cutlass.Float32, causal_offset: cutlass.Int32, offset_lo: cutlass.Int32,
               qhead_per_kvhead: cutlass.Int32, gmem_load: cute.TiledCopy, gmem_store: cute.TiledCopy,
               tiled_mma: cute.TiledMma, SharedStorage: cutlass.Constexpr, mCuSeqlensQ: cute.Tensor | None,
               mCuSeqlensK: cute.Tensor | None, bottom_right: cutlass.Int32 | None,
               score_scale: cutlass.Float32 | None, mSinks: cute.Tensor | None, mSeqUsedK: cute.Tensor | None):
        c = self.config
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        kv_head = head // qhead_per_kvhead
        # This CTA's (Sq, D) / (Sk, D) / (Sq,) views of its (sequence, head).
        if cutlass.const_expr(mCuSeqlensQ is None):
            seqlen_q, seqlen_k = mQ.shape[2], mK.shape[2]
            mQ_s, mO_s, mLSE_s = mQ[batch, head, None, None], mO[batch, head, None, None], mLSE[batch, head, None]
            mK_s, mV_s = mK[batch, kv_head, None, None], mV[batch, kv_head, None, None]
        else:
            info = seqlen_info.varlen_seqlens(mCuSeqlensQ, mCuSeqlensK, batch)
            seqlen_q, seqlen_k = info.seqlen_q, info.seqlen_k
            if cutlass.const_expr(self.config.seqused_k):
                seqlen_k = mSeqUsedK[batch]  # the host checked it is within the sequence's rows
            base = bottom_right * (seqlen_k - seqlen_q)
            causal_offset, offset_lo = causal_offset + base, offset_lo + base
            mQ_s = cute.domain_offset((info.offset_q, 0), mQ[0, head, None, None])
            mO_s = cute.domain_offset((info.offset_q, 0), mO[0, head, None, None])
            mLSE_s = cute.domain_offset((info.offset_q,), mLSE[0, head, None])
            mK_s = cute.domain_offset((info.offset_k, 0), mK[0, kv_head, None, None])
            mV_s = cute.domain_offset((info.offset_k, 0), mV[0, kv_head, None, None])
        n_block_max, n_unmasked_end = block_info.n_block_range(
            m_block, seqlen_q, seqlen_k, causal_offset, block_m=c.block_m, block_n=c.block_n, causal=c.causal,
            minimum=cutlass.min, maximum=cutlass.max)
        if cutlass.const_expr(mCuSeqlensQ is not None):
            # The grid covers the longest sequence: a tile past this one's end visits no block.
            live = cutlass.min(cutlass.max(seqlen_q - m_block * c.block_m, 0), 1)
            n_block_max, n_unmasked_end = n_block_max * live, n_unmasked_end * live
        # Visited: [n_block_min, n_block_max), all masked with a left window bound.
        n_block_min = block_info.n_block_min(m_block, offset_lo, block_m=c.block_m, block_n=c.block_n,
                                             local=c.local, maximum=cutlass.max)
        n_masked = n_block_max - n_unmasked_end
        if cutlass.const_expr(c.local):
            n_masked = cutlass.max(n_block_max - n_block_min, 0)

        # ---- partition ----
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(to_cute(self.layouts.smem_q_layout))
        sK = storage.sK.get_tensor(to_cute(self.layouts.smem_kv_layout))
        sV = storage.sV.get_tensor(to_cute(self.layouts.smem_kv_layout))
        sVt = cute.make_tensor(sV.iterator, to_cute(self.layouts.smem_vt_layout))

        gQ = cute.local_tile(mQ_s, (c.block_m, c.head_dim), (m_block, 0))
        gK = cute.local_tile(mK_s, (c.block_n, c.head_dim), (None, 0))
        gV = cute.local_tile(mV_s, (c.block_n, c.head_dim), (None, 0))

        thr_load = gmem_load.get_slice(tidx)
        tQgQ, tQsQ = thr_load.partition_S(gQ), thr_load.partition_D(sQ)
        tKgK, tKsK = thr_load.partition_S(gK), thr_load.partition_D(sK)
        tVgV, tVsV = thr_load.partition_S(gV), thr_load.partition_D(sV)
        tQcQ = thr_load.partition_S(cute.make_identity_tensor((c.block_m, c.head_dim)))
        tKVcKV = thr_load.partition_S(cute.make_identity_tensor((c.block_n, c.head_dim)))

        thr_mma = tiled_mma.get_slice(tidx)
        acc_o = cute.make_rmem_tensor(thr_mma.partition_shape_C((c.block_m, c.head_dim)), cutlass.Float32)
        acc_o.fill(0.0)
        # (ldmatrix copy, smem partition, register view, fragment) of Q, K (for S) and V^T (for O).
        frags = (
            smem_operand(tiled_mma, sQ, "A", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sK, "B", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sVt, "B", self.dtype, tidx, transpose=True),
        )

        # Tile-local (row, col) of each score this thread holds, for the mask and the LSE rows.
        t_coord_s = mn_view(thr_mma.partition_C(cute.make_identity_tensor((c.block_m, c.block_n))))
        softmax = OnlineSoftmax(cute.size(t_coord_s.shape[0]), scale_log2)

        # ---- prologue: Q and the first (highest) K block ----
        if n_block_max > n_block_min:
            load_rows(gmem_load, tQgQ, tQsQ, tQcQ, seqlen_q - m_block * c.block_m)
            load_rows(gmem_load, tKgK[None, None, None, n_block_max - 1], tKsK, tKVcKV,
                      seqlen_k - (n_block_max - 1) * c.block_n)
        cute.arch.cp_async_commit_group()

        # ---- main loop: masked blocks (descending), then the unmasked ones ----
        offsets = (causal_offset, offset_lo, n_block_min)
        for i in cutlass.range(n_masked, unroll=1):
            self.compute_block(n_block_max - 1 - i, True, m_block, seqlen_k, offsets, gmem_load,
                               tKgK, tKsK, tVgV, tVsV, tKVcKV, tiled_mma, thr_mma, frags,
                               acc_o, t_coord_s, softmax, score_scale)
        if cutlass.const_expr(not c.local):
            for i in cutlass.range(n_unmasked_end, unroll=1):
                self.compute_block(n_unmasked_end - 1 - i, False, m_block, seqlen_k, offsets, gmem_load,
                                   tKgK, tKsK, tVgV, tVsV, tKVcKV, tiled_mma, thr_mma, frags,
                                   acc_o, t_coord_s, softmax, score_scale)

        # ---- epilogue ----
        lse = cute.make_rmem_tensor((softmax.num_rows,), cutlass.Float32)
        sink_log2 = None
        if cutlass.const_expr(c.sinks):
            sink_log2 = mSinks[head] * LOG2_E
        softmax.finalize(mn_view(acc_o), lse, sink_log2)
        self.store_lse(mLSE_s, lse, t_coord_s, m_block * c.block_m, seqlen_q, tidx)
        # Q's buffer stages O: every warp is past its last S GEMM (store_tile synchronizes first).
        gO = cute.local_tile(mO_s, (c.block_m, c.head_dim), (m_block, 0))
        store_tile(acc_o, self.dtype, sQ, gmem_store, tiled_mma, gO, (c.block_m, c.head_dim),
                   seqlen_q - m_block * c.block_m, tidx)

    @cute.jit
    def compute_block(self, n_block: cutlass.Int32, masked: cutlass.Constexpr, m_block: cutlass.Int32,
                      seqlen_k: cutlass.Int32, offsets, gmem_load: cute.TiledCopy,
                      tKgK: cute.Tensor, tKsK: cute.Tensor, tVgV: cute.Tensor, tVsV: cute.Tensor,
                      tKVcKV: cute.Tensor, tiled_mma: cute.TiledMma, thr_mma, frags, acc_o: cute.Tensor,
                      t_coord_s: cute.Tensor, softmax: OnlineSoftmax, score_scale: cutlass.Float32 | None):
        """One K/V block: S = Q K^T, mask, online softmax, O += P V^T, with the copies overlapped.
        offsets: (causal_offset, offset_lo, n_block_min), the mask's diagonals and the last block."""
        c = self.config
        causal_offset, offset_lo, n_block_min = offsets
        q_frag, k_frag, vt_frag = frags
        acc_s = cute.make_rmem_tensor(thr_mma.partition_shape_C((c.block_m, c.block_n)), cutlass.Float32)
        acc_s.fill(0.0)

        # K[n] landed, and every warp is done reading V of the previous block: refill V.
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        if cutlass.const_expr(masked):
            load_rows(gmem_load, tVgV[None, None, None, n_block], tVsV, tKVcKV, seqlen_k - n_block * c.block_n)
        else:
            cute.copy(gmem_load, tVgV[None, None, None, n_block], tVsV)
        cute.arch.cp_async_commit_group()

        gemm_ss(tiled_mma, acc_s, q_frag, k_frag)  # S = Q K^T

        # V[n] landed, and every warp is done reading K[n]: prefetch K[n - 1] under softmax and P V.
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        if n_block > n_block_min:
            load_rows(gmem_load, tKgK[None, None, None, n_block - 1], tKsK, tKVcKV,
                      seqlen_k - (n_block - 1) * c.block_n)
        cute.arch.cp_async_commit_group()

        acc_s_mn = mn_view(acc_s)
        if cutlass.const_expr(c.softcap):
            apply_softcap(acc_s, score_scale)
        if cutlass.const_expr(masked):
            apply_mask(acc_s_mn, t_coord_s, m_block * c.block_m, n_block * c.block_n, seqlen_k, causal_offset,
                       c.causal, offset_lo, c.local)
        softmax.step(acc_s_mn, mn_view(acc_o))

        # O += P V^T, P converted to the input type in registers and used as the A operand.
        r_p = cute.make_fragment_like(acc_s, self.dtype)
        r_p.store(acc_s.load().to(self.dtype))
        gemm_rs(tiled_mma, acc_o, accumulator_as_a(r_p), vt_frag)

    @cute.jit
    def store_lse(self, gLSE: cute.Tensor, lse: cute.Tensor, t_coord_s: cute.Tensor, row_base: cutlass.Int32,
                  seqlen_q: cutlass.Int32, tidx: cutlass.Int32):
        """lse[r] of this thread's rows to gLSE (seqlen_q,); one thread of each quad writes."""
        if tidx % 4 == 0:
            for r in cutlass.range_constexpr(cute.size(lse)):
                row = row_base + t_coord_s[r, 0][0]
                if row < seqlen_q:
                    gLSE[row] = lse[r]


# ---- compile-only variants ------------------------------------------------------------------------


def build_variant(head_dim: int = 128, dtype: str = "bfloat16", causal: bool = False, local: bool = False, **tile):
    """A CompileJob for `sm80_flash` over fake (B, H, S, D) tensors with symbolic sizes; `tile`
    (block_m, block_n, num_warps) overrides the tuned tile of `config_for`."""
    from dataclasses import replace

    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    features = {name: tile.pop(name) for name in ("softcap", "sinks", "seqused_k") if name in tile}
    config = replace(config_for(head_dim, dtype, causal, local, **features), **tile).validate()
    t = _CUTLASS[dtype]
    # Strides without divisibility, as `from_torch` gives them: the kernel asserts it itself.
    qkvo = [fake_tensor(t, 4, leading_dim=3, assumed_align=16) for _ in range(4)]
    lse = fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4)
    args = (*qkvo, lse, cutlass.Float32(1.0 / math.sqrt(head_dim)), cutlass.Int32(0), cutlass.Int32(0),
            cutlass.Int32(1), fake_stream(), None, None, None, None, None, *_fake_features(config))
    return CompileJob(FlashAttentionSm80(config), args, ("attention.sm80_flash", config))


def _fake_features(config) -> tuple:
    """The feature arguments of a build: the score scale, fake (Hq,) fp32 sinks and (B,) int32
    seqused_k where the config has them, else None."""
    from cute_kernels.runtime import fake_tensor

    sinks = fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=4) if config.sinks else None
    used = fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4) if config.seqused_k else None
    return cutlass.Float32(1.0), sinks, used


def build_varlen_variant(head_dim: int = 128, dtype: str = "bfloat16", causal: bool = False, local: bool = False,
                         **tile):
    """A CompileJob for the packed (varlen) `sm80_flash` launch: (1, H, T, D) views with symbolic
    sizes and strides, int32 cu_seqlens, the sequence count, max_seqlen_q and the alignment flag."""
    from dataclasses import replace

    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    features = {name: tile.pop(name) for name in ("softcap", "sinks", "seqused_k") if name in tile}
    config = replace(config_for(head_dim, dtype, causal, local, **features), **tile).validate()
    t = _CUTLASS[dtype]
    qkvo = [fake_tensor(t, 4, leading_dim=3, assumed_align=16) for _ in range(4)]
    lse = fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4)
    cu = [fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4) for _ in range(2)]
    args = (*qkvo, lse, cutlass.Float32(1.0 / math.sqrt(head_dim)), cutlass.Int32(0), cutlass.Int32(0),
            cutlass.Int32(1), fake_stream(), *cu, cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1),
            *_fake_features(config))
    return CompileJob(FlashAttentionSm80(config), args, ("attention.sm80_flash.varlen", config))


VARIANT_CONFIGS = {
    f"d{d}_{dt}{'_causal' if causal else ''}{'_local' if local else ''}": {
        "head_dim": d, "dtype": dt, "causal": causal, "local": local}
    for d, dt, causal, local in (
        (64, "float16", True, False), (128, "bfloat16", False, False), (128, "bfloat16", True, False),
        (256, "bfloat16", True, False), (128, "bfloat16", True, True), (256, "bfloat16", True, True),
    )
}
# Score features: soft-capped scores and sinks.
VARIANT_CONFIGS["d128_bfloat16_causal_softcap_sinks"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                         "softcap": True, "sinks": True}
VARIANT_CONFIGS["d128_float16_softcap"] = {"head_dim": 128, "dtype": "float16", "softcap": True}
VARIANT_CONFIGS["d256_bfloat16_softcap_sinks"] = {"head_dim": 256, "dtype": "bfloat16", "softcap": True,
                                                  "sinks": True}


def _register() -> None:
    from cute_kernels.runtime import register_variant

    register_variant("attention.sm80_flash", build_variant, configs=VARIANT_CONFIGS,
                     requires={"HMMA", "LDSM", "LDGSTS"})
    register_variant("attention.sm80_flash_varlen", build_varlen_variant,
                     configs={"d128_bfloat16_causal": {"head_dim": 128, "dtype": "bfloat16", "causal": True},
                              "d128_bfloat16_causal_local": {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                             "local": True},
                              "d128_bfloat16_causal_softcap_sinks_seqused": {
                                  "head_dim": 128, "dtype": "bfloat16", "causal": True, "softcap": True,
                                  "sinks": True, "seqused_k": True}},
                     requires={"HMMA", "LDSM", "LDGSTS"})


_register()


# ---- the rung --------------------------------------------------------------------------------------


class Sm80FlashRung:
    """The `sm80_flash` rung of the attention ladder (interface in `cute_kernels.attention.registry`)."""

    name = "sm80_flash"
    min_capability = (8, 0)
    # Score features (`features.FEATURES`) the forward kernel implements (seqused_k: varlen only).
    features = ("softcap", "sinks", "seqused_k")

    @property
    def dtypes(self):
        import torch

        return (torch.float16, torch.bfloat16)

    def supports(self, q, k, v, problem) -> str | None:
        why = common_reason(problem, self.dtypes) or feature_reason(problem, self.features)
        if why is not None:
            return why
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.data_ptr() % 16:
                return f"{name}'s data pointer is not 16-byte aligned (128-bit loads); call .contiguous() on it"
            # A size-1 mode's stride never multiplies a nonzero index, so only the others matter.
            bad = [s for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1 and s % 8]
            if bad:
                return (f"{name}'s strides {tuple(t.stride())} are not multiples of 8 elements (16 bytes) outside "
                        "the head dim; call .contiguous() on it")
        return None

    def launch_plan(self, problem):
        """`launch(q, k, v, out, lse, sinks=None)`: the TVM-FFI forward of `problem`'s config with
        its scalars bound (compiled on first use), or None without TVM-FFI. It reads torch's
        current stream at each call and takes tensors that do not require grad, sinks a
        contiguous (Hq,) fp32 tensor when the problem has them; `problem` must be supported
        (dense: no seqused_k)."""
        if not tvm_ffi_available() or problem.seqused_k:
            return None
        config = _config_for_problem(problem)
        fn = _COMPILED.get(config)
        if fn is None:
            fn = _compile_tvm_ffi(config)
        _, offset, group = launch_scalars(problem)
        scale, score_scale = softcap_scalars(problem)
        offset_lo, _ = window_scalars(problem)
        # The varlen parameters (cu_seqlens, counts, alignment, seqused_k) are part of the
        # signature, None here.
        return lambda q, k, v, out, lse, sinks=None: fn(q, k, v, out, lse, scale, offset, offset_lo, group,
                                                        None, None, None, None, None, score_scale, sinks, None)

    def supports_backward(self, problem) -> str | None:
        from .sm80_flash_bwd_launch import supports_backward

        return supports_backward(problem)

    def backward(self, dout, q, k, v, out, lse, problem):
        """(dq, dk, dv); see `sm80_flash_bwd_launch.backward`."""
        from .sm80_flash_bwd_launch import backward

        return backward(dout, q, k, v, out, lse, problem)

    def varlen_backward(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                        max_seqlen_k: int, problem, seqused_k=None):
        """(dq, dk, dv) of the packed forward (`varlen`): dout, out (Tq, Hq, D), lse (Hq, Tq) as
        `varlen` wrote them; see `sm80_flash_bwd_launch.varlen_backward`."""
        from .sm80_flash_bwd_launch import varlen_backward

        return varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               problem, seqused_k=seqused_k)

    def __call__(self, q, k, v, out, lse, problem, sinks=None):
        """Write out (B, Hq, Sq, D) and lse (B, Hq, Sq) fp32 on torch's current stream; sinks:
        the problem's (Hq,) sink logits (any float dtype: passed on as fp32).

        With TVM-FFI (`runtime.tvm_ffi_available()`) the compiled function takes the torch tensors
        themselves and reads torch's current stream; otherwise each tensor is wrapped with
        `from_torch`. Either way a warm call builds no kernel object and derives no layout."""
        sinks = _sinks_fp32(sinks, problem)
        launch = self.launch_plan(problem)
        if launch is not None:
            if q.requires_grad or k.requires_grad or v.requires_grad:
                # DLPack export refuses tensors that require grad; a detached alias shares the storage.
                q, k, v = q.detach(), k.detach(), v.detach()
            launch(q, k, v, out, lse, sinks)
            return out, lse
        from cute_kernels.runtime import current_stream, from_torch

        config = _config_for_problem(problem)
        _, offset, group = launch_scalars(problem)
        offset_lo, _ = window_scalars(problem)
        kernel = _kernel_for(config)
        tensors = [from_torch(t, assumed_align=16, leading_dim=3) for t in (q, k, v, out)]
        tensors.append(from_torch(lse, assumed_align=4, leading_dim=2))
        scale, score_scale = softcap_scalars(problem)
        args = (*tensors, cutlass.Float32(scale), cutlass.Int32(offset), cutlass.Int32(offset_lo),
                cutlass.Int32(group))
        tail = (None, None, None, None, None, *_feature_args(problem, score_scale, sinks, None))
        stream = current_stream()
        compiled = compile_kernel(kernel, *args, stream, *tail, key=("attention.sm80_flash", config))
        compiled(*args, stream, *tail)
        return out, lse

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, out, lse, problem, sinks=None,
               seqused_k=None, offsets=None):
        """The packed (varlen) forward: q (Tq, Hq, D), k/v (Tk, Hkv, D), out (Tq, Hq, D),
        lse (Hq, Tq) fp32, int32 cu_seqlens (B + 1,) (and seqused_k (B,)) already validated by
        the caller (`varlen.attention_varlen_forward`); causal alignment and window per sequence.
        offsets (`varlen.HostOffsets`) is not read: this grid takes the sequences in order."""
        from cute_kernels.runtime import current_stream, from_torch

        config = _config_for_problem(problem)
        kernel = _kernel_for(config)
        # (T, H, D) -> (1, H, T, D): the fixed-length kernel's modes, batch 1, rows offset per CTA.
        views = [t.permute(1, 0, 2).unsqueeze(0) for t in (q, k, v, out)]
        tensors = [from_torch(t, assumed_align=16, leading_dim=3) for t in views]
        tensors.append(from_torch(lse.unsqueeze(0), assumed_align=4, leading_dim=2))
        cu = [from_torch(t, assumed_align=4, leading_dim=0) for t in (cu_seqlens_q, cu_seqlens_k)]
        window_left, window_right = varlen_window_scalars(problem)
        scale, score_scale = softcap_scalars(problem)
        args = (*tensors, cutlass.Float32(scale), cutlass.Int32(window_right), cutlass.Int32(-window_left),
                cutlass.Int32(problem.heads_q // problem.heads_kv))
        tail = (*cu, cutlass.Int32(problem.batch), cutlass.Int32(max_seqlen_q),
                cutlass.Int32(bottom_right_flag(problem)),
                *_feature_args(problem, score_scale, _sinks_fp32(sinks, problem), seqused_k))
        stream = current_stream()
        compiled = compile_kernel(kernel, *args, stream, *tail, key=("attention.sm80_flash.varlen", config))
        compiled(*args, stream, *tail)
        return out, lse


# The warm path's caches (`runtime.plan_cache`): building a kernel object derives every layout
# (~1 ms), so each exists once per config; the config once per (head dim, dtype, mask flags);
# the TVM-FFI function (torch tensors in, torch's current stream) once per config.
_KERNELS = WarmCache("attention.sm80_flash.kernels")
_CONFIGS = WarmCache("attention.sm80_flash.configs")
_COMPILED = WarmCache("attention.sm80_flash.tvm_ffi")


def _kernel_for(config) -> FlashAttentionSm80:
    return memo(_KERNELS, config, FlashAttentionSm80, config)


def _config_for_problem(problem) -> FlashSm80Config:
    """`config_for` the problem's head dim, dtype, mask flags and score features, built once
    each (`problem_checks.config_of`)."""
    return config_of(_CONFIGS, problem, config_for, softcap=problem.softcap is not None, sinks=problem.sinks,
                     seqused_k=problem.seqused_k)


def _sinks_fp32(sinks, problem):
    """The sinks as the kernels read them (contiguous fp32), or None without them."""
    if not problem.sinks:
        return None
    import torch

    if sinks is None:
        raise ValueError(f"the problem has sinks but none were passed ({problem.describe()})")
    return sinks.detach().to(torch.float32).contiguous()


def _feature_args(problem, score_scale: float, sinks, seqused_k) -> tuple:
    """(score scale, sinks, seqused_k) as DSL arguments (the tensors None where absent)."""
    from cute_kernels.runtime import from_torch

    wrap = lambda t: None if t is None else from_torch(t, assumed_align=4, leading_dim=0)  # noqa: E731
    return cutlass.Float32(score_scale), wrap(sinks), wrap(seqused_k if problem.seqused_k else None)


def _compile_tvm_ffi(config: FlashSm80Config):
    """The TVM-FFI forward of `config` (`forward_host.compile_tvm_ffi`, with the varlen and
    feature arguments after the stream, absent in a dense build), kept in `_COMPILED`."""
    fn = compile_tvm_ffi(compile_kernel, _kernel_for(config), config.dtype, ("attention.sm80_flash", "tvm_ffi", config),
                         tail=(None, None, None, None, None, *_fake_features(config)))
    _COMPILED[config] = fn
    return fn


RUNG = Sm80FlashRung()
