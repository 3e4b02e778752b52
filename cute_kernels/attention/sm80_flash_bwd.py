"""Rung `sm80_flash`, backward: dQ, dK, dV with FlashAttention-2's algorithm on mma.sync.

With P = exp(S * scale - lse) recomputed from the forward's log-sum-exp (no S or P is stored),
D_i = sum_d dO[i, d] * O[i, d], dP = dO V^T and dS = P * (dP - D):

    dV = P^T dO        dK = scale * dS^T Q        dQ = scale * dS K

Two kernels, each a forward-shaped loop built from the same blocks (`sm80_blocks`):

- `FlashAttentionSm80BwdDKDV`: one CTA per (K/V block, KV head, batch) holds K and V in shared
  memory and dK, dV in fp32 registers, and walks the Q blocks (of every query head of its GQA
  group) that see its keys: S^T = K Q^T and dP^T = V dO^T (ldmatrix from smem), then P^T and
  dS^T in registers feed dV += P^T dO and dK += dS^T Q as A operands (dO^T and Q^T read with
  ldmatrix.trans). lse and D are per column here, loaded per Q block.
- `FlashAttentionSm80BwdDQ`: one CTA per (Q block, head, batch), like the forward: S and dP
  again, dS in registers, dQ += dS K (K^T by ldmatrix.trans).

dQ is computed by its own pass instead of fp32 atomics from the dK/dV pass: deterministic, at
the price of recomputing S and dP once more. D is computed on the host side (one fused torch
reduction), and rows the forward left empty (lse = -inf) enter with lse = +inf, so their P is 0.
Loads are not overlapped with compute here (one K/V or Q/dO tile in flight at a time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from cute_kernels.runtime import to_cute

from . import block_info
from .fragments import accumulator_as_a, mn_view
from .mask import apply_causal_mask_kq, apply_mask
from .sm80_blocks import (assume_aligned_rows, copy_layouts, gemm_rs, gemm_ss, load_rows, smem_atom_width,
                          smem_operand, smem_tile_layout, store_tile, transposed)
from .problem_checks import launch_scalars
from .softmax import LOG2_E

__all__ = ["FlashSm80BwdConfig", "bwd_config_for", "FlashAttentionSm80BwdDQ", "FlashAttentionSm80BwdDKDV"]

_CUTLASS = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


@dataclass(frozen=True)
class FlashSm80BwdConfig:
    """The static shape of the backward kernels: head_dim (multiple of 16, at most 128), dtype,
    causal. The dQ pass owns block_m Q rows per CTA and steps over block_n K/V rows; the dK/dV
    pass owns block_n K/V rows per CTA and steps over dkdv_block_m Q rows. num_warps splits the
    rows a CTA owns, 16 per warp."""

    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    block_m: int = 64
    block_n: int = 64
    dkdv_block_m: int = 64
    num_warps: int = 4

    def validate(self) -> "FlashSm80BwdConfig":
        d = self.head_dim
        if not isinstance(d, int) or d < 16 or d > 128 or d % 16:
            raise ValueError(f"FlashSm80BwdConfig.head_dim must be a multiple of 16 in [16, 128], got {d!r}")
        if self.dtype not in _CUTLASS:
            raise ValueError(f"FlashSm80BwdConfig.dtype must be one of {tuple(_CUTLASS)}, got {self.dtype!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"FlashSm80BwdConfig.causal must be a bool, got {self.causal!r}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"FlashSm80BwdConfig.num_warps must be 1, 2, 4 or 8, got {self.num_warps!r}")
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v % (16 * self.num_warps):
                raise ValueError(f"FlashSm80BwdConfig.{name} = {v} must be a multiple of 16 * num_warps")
        if self.dkdv_block_m % 16 or self.dkdv_block_m < 16:
            raise ValueError(f"FlashSm80BwdConfig.dkdv_block_m must be a positive multiple of 16, got {self.dkdv_block_m}")
        rows_per_copy = self.threads // (smem_atom_width(d) // 8)
        for name in ("block_m", "block_n", "dkdv_block_m"):
            if getattr(self, name) % rows_per_copy:
                raise ValueError(f"FlashSm80BwdConfig.{name} must be a multiple of {rows_per_copy} (rows per copy pass)")
        return self

    @property
    def threads(self) -> int:
        return 32 * self.num_warps


def bwd_config_for(head_dim: int, dtype: str, causal: bool) -> FlashSm80BwdConfig:
    """64 x 64 tiles with 4 warps (each warp: 16 rows of the tile it owns). At D > 64 dK and dV
    take 2 x D/2 fp32 registers per thread, so the dK/dV pass steps over fewer Q rows (32, and
    16 with the causal mask's extra live values) to stay free of spills (checked by the variants)."""
    dkdv_block_m = 64 if head_dim <= 64 else (16 if causal else 32)
    # ... but at least the rows one copy pass moves (64 at D = 80 or 112, whose 32-byte
    # swizzle rows take 2 threads each).
    dkdv_block_m = max(dkdv_block_m, 128 // (smem_atom_width(head_dim) // 8))
    return FlashSm80BwdConfig(head_dim=head_dim, dtype=dtype, causal=causal, dkdv_block_m=dkdv_block_m).validate()


def _tiled_mma(dtype, num_warps: int):
    return cute.make_tiled_mma(warp.MmaF16BF16Op(dtype, cutlass.Float32, (16, 8, 16)), (num_warps, 1, 1),
                               permutation_mnk=(16 * num_warps, 16, 16))


def _copies(dtype, threads: int, head_dim: int):
    thr, val = copy_layouts(threads, head_dim)
    thr, val = to_cute(thr), to_cute(val)
    g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype,
                              num_bits_per_copy=128)
    store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    return cute.make_tiled_copy_tv(g2s, thr, val), cute.make_tiled_copy_tv(store, thr, val)


@cute.jit
def _dsoftmax(s_mn: cute.Tensor, dp_mn: cute.Tensor, lse2, d_vals, scale_log2: cutlass.Float32,
              per_row: cutlass.Constexpr):
    """In place: s -> P = 2^(s * scale_log2 - lse2), dp -> dS = P * (dp - D). lse2 (log2-domain
    lse) and d_vals are indexed by row (per_row) or by column of the (rows, cols) views."""
    for r in cutlass.range_constexpr(cute.size(s_mn.shape[0])):
        for c in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
            i = r if cutlass.const_expr(per_row) else c
            p = cute.math.exp2(s_mn[r, c] * scale_log2 - lse2[i], fastmath=True)
            s_mn[r, c] = p
            dp_mn[r, c] = p * (dp_mn[r, c] - d_vals[i])


def _to(t: cute.Tensor, dtype) -> cute.Tensor:
    r = cute.make_fragment_like(t, dtype)
    r.store(t.load().to(dtype))
    return r


class FlashAttentionSm80BwdDQ:
    """dQ (B, Hq, Sq, D) from q, k, v, dO, lse (+inf for empty rows), D (B, Hq, Sq) fp32."""

    def __init__(self, config: FlashSm80BwdConfig):
        self.config = config.validate()
        self.dtype = _CUTLASS[config.dtype]
        c = self.config
        self.smem_q_layout = smem_tile_layout(c.block_m, c.head_dim)
        self.smem_kv_layout = smem_tile_layout(c.block_n, c.head_dim)
        self.smem_kt_layout = transposed(self.smem_kv_layout, c.block_n, c.head_dim)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
                 mD: cute.Tensor, mdQ: cute.Tensor, softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32,
                 qhead_per_kvhead: cutlass.Int32, stream):
        c = self.config
        mQ, mK, mV, mdO, mdQ = [assume_aligned_rows(t) for t in (mQ, mK, mV, mdO, mdQ)]
        q_layout, kv_layout = to_cute(self.smem_q_layout), to_cute(self.smem_kv_layout)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(kv_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(kv_layout)], 1024]

        gmem_load, gmem_store = _copies(self.dtype, c.threads, c.head_dim)
        grid = (cute.ceil_div(mQ.shape[2], c.block_m), mQ.shape[1], mQ.shape[0])
        self.kernel(mQ, mK, mV, mdO, mLSE, mD, mdQ, softmax_scale, causal_offset, qhead_per_kvhead, gmem_load,
                    gmem_store, _tiled_mma(self.dtype, c.num_warps), SharedStorage).launch(
            grid=grid, block=[c.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mD: cute.Tensor, mdQ: cute.Tensor, softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32,
               qhead_per_kvhead: cutlass.Int32, gmem_load: cute.TiledCopy, gmem_store: cute.TiledCopy,
               tiled_mma: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        c = self.config
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        kv_head = head // qhead_per_kvhead
        seqlen_q, seqlen_k = mQ.shape[2], mK.shape[2]
        n_block_max, n_unmasked_end = block_info.n_block_range(
            m_block, seqlen_q, seqlen_k, causal_offset, block_m=c.block_m, block_n=c.block_n, causal=c.causal,
            minimum=cutlass.min, maximum=cutlass.max)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(to_cute(self.smem_q_layout))
        sdO = storage.sdO.get_tensor(to_cute(self.smem_q_layout))
        sK = storage.sK.get_tensor(to_cute(self.smem_kv_layout))
        sV = storage.sV.get_tensor(to_cute(self.smem_kv_layout))
        sKt = cute.make_tensor(sK.iterator, to_cute(self.smem_kt_layout))

        tile_q, tile_kv = (c.block_m, c.head_dim), (c.block_n, c.head_dim)
        thr_load = gmem_load.get_slice(tidx)
        tQcQ = thr_load.partition_S(cute.make_identity_tensor(tile_q))
        tKVcKV = thr_load.partition_S(cute.make_identity_tensor(tile_kv))
        gK = cute.local_tile(mK[batch, kv_head, None, None], tile_kv, (None, 0))
        gV = cute.local_tile(mV[batch, kv_head, None, None], tile_kv, (None, 0))
        tKgK, tKsK = thr_load.partition_S(gK), thr_load.partition_D(sK)
        tVgV, tVsV = thr_load.partition_S(gV), thr_load.partition_D(sV)

        rows_left = seqlen_q - m_block * c.block_m
        load_rows(gmem_load, thr_load.partition_S(cute.local_tile(mQ[batch, head, None, None], tile_q, (m_block, 0))),
                  thr_load.partition_D(sQ), tQcQ, rows_left)
        load_rows(gmem_load, thr_load.partition_S(cute.local_tile(mdO[batch, head, None, None], tile_q, (m_block, 0))),
                  thr_load.partition_D(sdO), tQcQ, rows_left)
        cute.arch.cp_async_commit_group()

        thr_mma = tiled_mma.get_slice(tidx)
        frags = (
            smem_operand(tiled_mma, sQ, "A", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sK, "B", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sdO, "A", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sV, "B", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sKt, "B", self.dtype, tidx, transpose=True),
        )
        acc_dq = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_q), cutlass.Float32)
        acc_dq.fill(0.0)

        # Per-row lse (log2 domain) and D of this thread's rows; rows past the end get P = 0.
        t_coord_s = mn_view(thr_mma.partition_C(cute.make_identity_tensor((c.block_m, c.block_n))))
        num_rows = cute.size(t_coord_s.shape[0])
        lse2 = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        d_rows = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        for r in cutlass.range_constexpr(num_rows):
            row = m_block * c.block_m + t_coord_s[r, 0][0]
            lse2[r] = cutlass.Float32.inf
            d_rows[r] = 0.0
            if row < seqlen_q:
                lse2[r] = mLSE[batch, head, row] * LOG2_E
                d_rows[r] = mD[batch, head, row]

        scale_log2 = softmax_scale * LOG2_E
        for i in cutlass.range(n_block_max - n_unmasked_end, unroll=1):
            self.dq_block(n_block_max - 1 - i, True, m_block, seqlen_k, causal_offset, gmem_load, tKgK, tKsK,
                          tVgV, tVsV, tKVcKV, tiled_mma, thr_mma, frags, acc_dq, t_coord_s, lse2, d_rows, scale_log2)
        for i in cutlass.range(n_unmasked_end, unroll=1):
            self.dq_block(n_unmasked_end - 1 - i, False, m_block, seqlen_k, causal_offset, gmem_load, tKgK, tKsK,
                          tVgV, tVsV, tKVcKV, tiled_mma, thr_mma, frags, acc_dq, t_coord_s, lse2, d_rows, scale_log2)

        for e in cutlass.range_constexpr(cute.size(acc_dq)):
            acc_dq[e] = acc_dq[e] * softmax_scale
        g_dq = cute.local_tile(mdQ[batch, head, None, None], tile_q, (m_block, 0))
        store_tile(acc_dq, self.dtype, sQ, gmem_store, tiled_mma, g_dq, tile_q, rows_left, tidx)

    @cute.jit
    def dq_block(self, n_block: cutlass.Int32, masked: cutlass.Constexpr, m_block: cutlass.Int32,
                 seqlen_k: cutlass.Int32, causal_offset: cutlass.Int32, gmem_load: cute.TiledCopy,
                 tKgK: cute.Tensor, tKsK: cute.Tensor, tVgV: cute.Tensor, tVsV: cute.Tensor, tKVcKV: cute.Tensor,
                 tiled_mma: cute.TiledMma, thr_mma, frags, acc_dq: cute.Tensor, t_coord_s: cute.Tensor,
                 lse2: cute.Tensor, d_rows: cute.Tensor, scale_log2: cutlass.Float32):
        """dQ += dS K for K/V block n_block (S, P, dP, dS recomputed)."""
        c = self.config
        q_frag, k_frag, do_frag, v_frag, kt_frag = frags
        # Every warp is done with the previous block's K and V.
        cute.arch.barrier()
        rows_left = seqlen_k - n_block * c.block_n
        load_rows(gmem_load, tKgK[None, None, None, n_block], tKsK, tKVcKV, rows_left)
        load_rows(gmem_load, tVgV[None, None, None, n_block], tVsV, tKVcKV, rows_left)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        acc_s = cute.make_rmem_tensor(thr_mma.partition_shape_C((c.block_m, c.block_n)), cutlass.Float32)
        acc_s.fill(0.0)
        gemm_ss(tiled_mma, acc_s, q_frag, k_frag)
        acc_dp = cute.make_rmem_tensor(thr_mma.partition_shape_C((c.block_m, c.block_n)), cutlass.Float32)
        acc_dp.fill(0.0)
        gemm_ss(tiled_mma, acc_dp, do_frag, v_frag)

        s_mn = mn_view(acc_s)
        if cutlass.const_expr(masked):
            apply_mask(s_mn, t_coord_s, m_block * c.block_m, n_block * c.block_n, seqlen_k, causal_offset, c.causal)
        _dsoftmax(s_mn, mn_view(acc_dp), lse2, d_rows, scale_log2, True)
        gemm_rs(tiled_mma, acc_dq, accumulator_as_a(_to(acc_dp, self.dtype)), kt_frag)


class FlashAttentionSm80BwdDKDV:
    """dK, dV (B, Hkv, Sk, D) from q, k, v, dO, lse (+inf for empty rows), D (B, Hq, Sq) fp32;
    a KV head sums over the qhead_per_kvhead query heads of its group."""

    def __init__(self, config: FlashSm80BwdConfig):
        self.config = config.validate()
        self.dtype = _CUTLASS[config.dtype]
        c = self.config
        self.smem_q_layout = smem_tile_layout(c.dkdv_block_m, c.head_dim)
        self.smem_qt_layout = transposed(self.smem_q_layout, c.dkdv_block_m, c.head_dim)
        self.smem_kv_layout = smem_tile_layout(c.block_n, c.head_dim)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
                 mD: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, softmax_scale: cutlass.Float32,
                 causal_offset: cutlass.Int32, qhead_per_kvhead: cutlass.Int32, stream):
        c = self.config
        mQ, mK, mV, mdO, mdK, mdV = [assume_aligned_rows(t) for t in (mQ, mK, mV, mdO, mdK, mdV)]
        q_layout, kv_layout = to_cute(self.smem_q_layout), to_cute(self.smem_kv_layout)

        @cute.struct
        class SharedStorage:
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(kv_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(kv_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_layout)], 1024]

        gmem_load, gmem_store = _copies(self.dtype, c.threads, c.head_dim)
        grid = (cute.ceil_div(mK.shape[2], c.block_n), mK.shape[1], mK.shape[0])
        self.kernel(mQ, mK, mV, mdO, mLSE, mD, mdK, mdV, softmax_scale, causal_offset, qhead_per_kvhead,
                    gmem_load, gmem_store, _tiled_mma(self.dtype, c.num_warps), SharedStorage).launch(
            grid=grid, block=[c.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mD: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, softmax_scale: cutlass.Float32,
               causal_offset: cutlass.Int32, qhead_per_kvhead: cutlass.Int32, gmem_load: cute.TiledCopy,
               gmem_store: cute.TiledCopy, tiled_mma: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        c = self.config
        tidx, _, _ = cute.arch.thread_idx()
        n_block, kv_head, batch = cute.arch.block_idx()
        seqlen_q, seqlen_k = mQ.shape[2], mK.shape[2]
        m_block_min, m_block_max = block_info.m_block_range(
            n_block, seqlen_q, causal_offset, block_m=c.dkdv_block_m, block_n=c.block_n, causal=c.causal,
            maximum=cutlass.max)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sK = storage.sK.get_tensor(to_cute(self.smem_kv_layout))
        sV = storage.sV.get_tensor(to_cute(self.smem_kv_layout))
        sQ = storage.sQ.get_tensor(to_cute(self.smem_q_layout))
        sdO = storage.sdO.get_tensor(to_cute(self.smem_q_layout))
        sQt = cute.make_tensor(sQ.iterator, to_cute(self.smem_qt_layout))
        sdOt = cute.make_tensor(sdO.iterator, to_cute(self.smem_qt_layout))

        tile_q, tile_kv = (c.dkdv_block_m, c.head_dim), (c.block_n, c.head_dim)
        thr_load = gmem_load.get_slice(tidx)
        tQcQ = thr_load.partition_S(cute.make_identity_tensor(tile_q))
        tKVcKV = thr_load.partition_S(cute.make_identity_tensor(tile_kv))
        rows_left = seqlen_k - n_block * c.block_n
        load_rows(gmem_load, thr_load.partition_S(cute.local_tile(mK[batch, kv_head, None, None], tile_kv,
                                                                  (n_block, 0))),
                  thr_load.partition_D(sK), tKVcKV, rows_left)
        load_rows(gmem_load, thr_load.partition_S(cute.local_tile(mV[batch, kv_head, None, None], tile_kv,
                                                                  (n_block, 0))),
                  thr_load.partition_D(sV), tKVcKV, rows_left)
        cute.arch.cp_async_commit_group()

        thr_mma = tiled_mma.get_slice(tidx)
        frags = (
            smem_operand(tiled_mma, sK, "A", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sQ, "B", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sV, "A", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sdO, "B", self.dtype, tidx, transpose=False),
            smem_operand(tiled_mma, sdOt, "B", self.dtype, tidx, transpose=True),
            smem_operand(tiled_mma, sQt, "B", self.dtype, tidx, transpose=True),
        )
        acc_dk = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_kv), cutlass.Float32)
        acc_dv = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_kv), cutlass.Float32)
        acc_dk.fill(0.0)
        acc_dv.fill(0.0)
        # (key row, query column) of each S^T element this thread holds.
        t_coord_st = mn_view(thr_mma.partition_C(cute.make_identity_tensor((c.block_n, c.dkdv_block_m))))

        scale_log2 = softmax_scale * LOG2_E
        for g in cutlass.range(qhead_per_kvhead, unroll=1):
            head = kv_head * qhead_per_kvhead + g
            gQ = cute.local_tile(mQ[batch, head, None, None], tile_q, (None, 0))
            gdO = cute.local_tile(mdO[batch, head, None, None], tile_q, (None, 0))
            tQgQ, tdOgdO = thr_load.partition_S(gQ), thr_load.partition_S(gdO)
            for m_block in cutlass.range(m_block_min, m_block_max, unroll=1):
                self.dkdv_block(m_block, n_block, batch, head, seqlen_q, causal_offset, gmem_load,
                                tQgQ[None, None, None, m_block], thr_load.partition_D(sQ),
                                tdOgdO[None, None, None, m_block], thr_load.partition_D(sdO), tQcQ, mLSE, mD,
                                tiled_mma, thr_mma, frags, acc_dk, acc_dv, t_coord_st, scale_log2)

        for e in cutlass.range_constexpr(cute.size(acc_dk)):
            acc_dk[e] = acc_dk[e] * softmax_scale
        store_tile(acc_dk, self.dtype, sK, gmem_store, tiled_mma,
                   cute.local_tile(mdK[batch, kv_head, None, None], tile_kv, (n_block, 0)), tile_kv, rows_left, tidx)
        store_tile(acc_dv, self.dtype, sV, gmem_store, tiled_mma,
                   cute.local_tile(mdV[batch, kv_head, None, None], tile_kv, (n_block, 0)), tile_kv, rows_left, tidx)

    @cute.jit
    def dkdv_block(self, m_block: cutlass.Int32, n_block: cutlass.Int32, batch, head, seqlen_q: cutlass.Int32,
                   causal_offset: cutlass.Int32, gmem_load: cute.TiledCopy, tQgQ: cute.Tensor, tQsQ: cute.Tensor,
                   tdOgdO: cute.Tensor, tdOsdO: cute.Tensor, tQcQ: cute.Tensor, mLSE: cute.Tensor,
                   mD: cute.Tensor, tiled_mma: cute.TiledMma, thr_mma, frags, acc_dk: cute.Tensor,
                   acc_dv: cute.Tensor, t_coord_st: cute.Tensor, scale_log2: cutlass.Float32):
        """dV += P^T dO and dK += dS^T Q for Q block m_block of query head `head`."""
        c = self.config
        k_frag, q_frag, v_frag, do_frag, dot_frag, qt_frag = frags
        # Every warp is done with the previous Q and dO tiles.
        cute.arch.barrier()
        rows_left = seqlen_q - m_block * c.dkdv_block_m
        load_rows(gmem_load, tQgQ, tQsQ, tQcQ, rows_left)
        load_rows(gmem_load, tdOgdO, tdOsdO, tQcQ, rows_left)
        cute.arch.cp_async_commit_group()

        # lse (log2 domain) and D of this thread's query columns, under the copies.
        num_cols = cute.size(t_coord_st.shape[1])
        lse2 = cute.make_rmem_tensor((num_cols,), cutlass.Float32)
        d_cols = cute.make_rmem_tensor((num_cols,), cutlass.Float32)
        for j in cutlass.range_constexpr(num_cols):
            row = m_block * c.dkdv_block_m + t_coord_st[0, j][1]
            lse2[j] = cutlass.Float32.inf
            d_cols[j] = 0.0
            if row < seqlen_q:
                lse2[j] = mLSE[batch, head, row] * LOG2_E
                d_cols[j] = mD[batch, head, row]

        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        acc_st = cute.make_rmem_tensor(thr_mma.partition_shape_C((c.block_n, c.dkdv_block_m)), cutlass.Float32)
        acc_st.fill(0.0)
        gemm_ss(tiled_mma, acc_st, k_frag, q_frag)       # S^T = K Q^T
        acc_dpt = cute.make_rmem_tensor(thr_mma.partition_shape_C((c.block_n, c.dkdv_block_m)), cutlass.Float32)
        acc_dpt.fill(0.0)
        gemm_ss(tiled_mma, acc_dpt, v_frag, do_frag)     # dP^T = V dO^T

        st_mn = mn_view(acc_st)
        if cutlass.const_expr(c.causal):
            apply_causal_mask_kq(st_mn, t_coord_st, n_block * c.block_n, m_block * c.dkdv_block_m, causal_offset)
        _dsoftmax(st_mn, mn_view(acc_dpt), lse2, d_cols, scale_log2, False)
        gemm_rs(tiled_mma, acc_dv, accumulator_as_a(_to(acc_st, self.dtype)), dot_frag)
        gemm_rs(tiled_mma, acc_dk, accumulator_as_a(_to(acc_dpt, self.dtype)), qt_frag)


# ---- compile-only variants ------------------------------------------------------------------------


def build_dq_variant(head_dim: int = 128, dtype: str = "bfloat16", causal: bool = False):
    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    config = bwd_config_for(head_dim, dtype, causal)
    t = _CUTLASS[dtype]
    q, k, v, do, dq = [fake_tensor(t, 4, leading_dim=3, assumed_align=16) for _ in range(5)]
    lse, d = [fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4) for _ in range(2)]
    args = (q, k, v, do, lse, d, dq, cutlass.Float32(1.0 / math.sqrt(head_dim)), cutlass.Int32(0),
            cutlass.Int32(1), fake_stream())
    return CompileJob(FlashAttentionSm80BwdDQ(config), args, ("attention.sm80_flash_bwd_dq", config))


def build_dkdv_variant(head_dim: int = 128, dtype: str = "bfloat16", causal: bool = False):
    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    config = bwd_config_for(head_dim, dtype, causal)
    t = _CUTLASS[dtype]
    q, k, v, do, dk, dv = [fake_tensor(t, 4, leading_dim=3, assumed_align=16) for _ in range(6)]
    lse, d = [fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4) for _ in range(2)]
    args = (q, k, v, do, lse, d, dk, dv, cutlass.Float32(1.0 / math.sqrt(head_dim)), cutlass.Int32(0),
            cutlass.Int32(1), fake_stream())
    return CompileJob(FlashAttentionSm80BwdDKDV(config), args, ("attention.sm80_flash_bwd_dkdv", config))


BWD_VARIANT_CONFIGS = {
    f"d{d}_{dt}{'_causal' if causal else ''}": {"head_dim": d, "dtype": dt, "causal": causal}
    for d, dt, causal in ((64, "float16", True), (128, "bfloat16", True))
}


def _register() -> None:
    from cute_kernels.runtime import register_variant

    register_variant("attention.sm80_flash_bwd_dq", build_dq_variant, configs=BWD_VARIANT_CONFIGS,
                     requires={"HMMA", "LDSM", "LDGSTS"})
    register_variant("attention.sm80_flash_bwd_dkdv", build_dkdv_variant, configs=BWD_VARIANT_CONFIGS,
                     requires={"HMMA", "LDSM", "LDGSTS"})


_register()


# ---- host side ------------------------------------------------------------------------------------


def supports_backward(problem) -> str | None:
    """None when the backward kernels take `problem` (an `api.AttentionProblem`), else why not."""
    d = problem.head_dim
    if d % 16 or not 16 <= d <= 128:
        return f"the sm80_flash backward takes head dims that are multiples of 16 up to 128, not {d}"
    if problem.head_dim_v != d:
        return f"the sm80_flash backward needs the value head dim ({problem.head_dim_v}) equal to D ({d})"
    return None


_KERNELS: dict = {}


def _kernel(cls, config):
    key = (cls, config)
    if key not in _KERNELS:
        _KERNELS[key] = cls(config)
    return _KERNELS[key]


def backward(dout, q, k, v, out, lse, problem):
    """(dq, dk, dv) for 4-D q (B, Hq, Sq, D), k, v (B, Hkv, Sk, D), the forward's out and lse
    (natural log, -inf for rows that saw no key) and the output gradient dout, on torch's
    current stream. dq, dk, dv are new contiguous tensors of q's dtype."""
    import torch

    from cute_kernels.runtime import compile_kernel, current_stream, from_torch

    dtype_name = str(problem.dtype).removeprefix("torch.")
    config = bwd_config_for(problem.head_dim, dtype_name, problem.causal is not None)
    if any(s % 8 for s, n in zip(dout.stride()[:-1], dout.shape[:-1]) if n > 1) or dout.stride(-1) != 1 \
            or dout.data_ptr() % 16:
        dout = dout.contiguous()
    # D_i = dO_i . O_i, and rows that saw no key enter with lse = +inf (so P = 0 there).
    d_rows = (dout.float() * out.float()).sum(-1).contiguous()
    lse_b = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse).contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    t4 = lambda t: from_torch(t, assumed_align=16, leading_dim=3)  # noqa: E731
    t3 = lambda t: from_torch(t, assumed_align=4, leading_dim=2)  # noqa: E731
    scale, offset, group = launch_scalars(problem)
    scalars = (cutlass.Float32(scale), cutlass.Int32(offset), cutlass.Int32(group))
    stream = current_stream()
    args = (t4(q), t4(k), t4(v), t4(dout), t3(lse_b), t3(d_rows), t4(dq), *scalars)
    fn = compile_kernel(_kernel(FlashAttentionSm80BwdDQ, config), *args, stream,
                        key=("attention.sm80_flash_bwd_dq", config))
    fn(*args, stream)
    args = (t4(q), t4(k), t4(v), t4(dout), t3(lse_b), t3(d_rows), t4(dk), t4(dv), *scalars)
    fn = compile_kernel(_kernel(FlashAttentionSm80BwdDKDV, config), *args, stream,
                        key=("attention.sm80_flash_bwd_dkdv", config))
    fn(*args, stream)
    return dq, dk, dv
