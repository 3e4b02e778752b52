"""Rung `sm80_flash`, backward: dQ, dK, dV with FlashAttention-2's algorithm on mma.sync.

With P = exp(S * scale - lse) recomputed from the forward's log-sum-exp (no S or P is stored),
D_i = sum_d dO[i, d] * O[i, d], dP = dO V^T and dS = P * (dP - D):

    dV = P^T dO        dK = scale * dS^T Q        dQ = scale * dS K

Two kernels, each a forward-shaped loop built from the same blocks (`sm80_blocks`):

- `FlashAttentionSm80BwdDKDV`: one CTA per (K/V block, KV head, batch) holds K and V in shared
  memory and dK, dV in fp32 registers, and walks the Q blocks (of every query head of its GQA
  group) that see its keys (`block_info.m_block_range`): S^T = K Q^T and dP^T = V dO^T
  (ldmatrix from smem), then P^T and dS^T in registers feed dV += P^T dO and dK += dS^T Q as A
  operands (dO^T and Q^T read with ldmatrix.trans). lse and D are per column here, loaded per
  Q block.
- `FlashAttentionSm80BwdDQ`: one CTA per (Q block, head, batch), like the forward: S and dP
  again, dS in registers, dQ += dS K (K^T by ldmatrix.trans), over the K/V blocks
  [n_block_min, n_block_max) the forward visits.

Masks are the forward's (`mask`): the upper diagonal (`causal`: causality or a right window
bound) and, with a left window bound (`local`), the lower one, on every visited block. Above
D = 128 the gradient GEMMs are split over the head dim by a second group of warps
(`FlashSm80BwdConfig.col_warps`). Both kernels also take packed variable-length batches
(cu_seqlens read on the device, `seqlen_info`), as the forward does.

dQ is computed by its own pass instead of fp32 atomics from the dK/dV pass: deterministic, at
the price of recomputing S and dP once more. D is computed on the host side (one fused torch
reduction), and rows the forward left empty (lse = -inf) enter with lse = +inf, so their P is 0.
Loads are not overlapped with compute here (one K/V or Q/dO tile in flight at a time).

Score features (`features`): with `softcap` (the cap c a runtime argument) S is recomputed as
t = tanh(S * scale / c) before the mask, as the forward does, then P = 2^(t c log2 e - lse2)
and dS = P (dP - D) (1 - t^2), the tanh's derivative, in the elementwise pass that holds t
anyway (a masked t of -inf gives P = 0 and a factor of 0); sinks need nothing here (the
forward's lse includes them); varlen's `seqused_k` sets each sequence's key count.
The host side (supports_backward, backward, varlen_backward) is `sm80_flash_bwd_launch`.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from cute_kernels.runtime import to_cute

from . import block_info, seqlen_info
from .fragments import accumulator_as_a, mn_view
from .mask import apply_causal_mask_kq, apply_mask, apply_window_mask_kq
from .sm80_blocks import (assume_aligned_rows, copy_layouts, gemm_rs, gemm_ss, load_rows, smem_atom_width,
                          smem_operand, smem_tile_layout, store_tile, transposed)
from .softmax import LOG2_E, apply_softcap

__all__ = ["FlashSm80BwdConfig", "bwd_config_for", "FlashAttentionSm80BwdDQ", "FlashAttentionSm80BwdDKDV",
           "supports_backward", "backward", "varlen_backward"]

_CUTLASS = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


@dataclass(frozen=True)
class FlashSm80BwdConfig:
    """The static shape of the backward kernels: head_dim (multiple of 16, at most 256), dtype,
    causal (the upper diagonal is tested: causality or a right window bound), local (a window's
    lower bound is tested). The dQ pass owns block_m Q rows per CTA and steps over block_n K/V
    rows; the dK/dV pass owns block_n K/V rows per CTA and steps over dkdv_block_m Q rows.

    num_warps splits the rows a CTA owns, 16 per warp, in the score GEMMs (S, dP: no warp splits
    a score row, so a score fragment is the next GEMM's A operand in place). col_warps > 1 adds
    warps that split the head dim of the gradient GEMMs (dQ += dS K, dV += P^T dO, dK += dS^T Q):
    each fp32 accumulator then takes 1/col_warps of the registers, at the price of every score
    tile being computed col_warps times (once per column group of warps).
    softcap: scores are soft-capped (`features`); seqused_k: (varlen) each sequence's key count
    comes from a seqused_k tensor."""

    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    block_m: int = 64
    block_n: int = 64
    dkdv_block_m: int = 64
    num_warps: int = 4
    local: bool = False
    col_warps: int = 1
    softcap: bool = False
    seqused_k: bool = False

    def validate(self) -> "FlashSm80BwdConfig":
        d = self.head_dim
        if not isinstance(d, int) or d < 16 or d > 256 or d % 16:
            raise ValueError(f"FlashSm80BwdConfig.head_dim must be a multiple of 16 in [16, 256], got {d!r}")
        if self.dtype not in _CUTLASS:
            raise ValueError(f"FlashSm80BwdConfig.dtype must be one of {tuple(_CUTLASS)}, got {self.dtype!r}")
        for name in ("causal", "local", "softcap", "seqused_k"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FlashSm80BwdConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"FlashSm80BwdConfig.num_warps must be 1, 2, 4 or 8, got {self.num_warps!r}")
        if self.col_warps not in (1, 2):
            raise ValueError(f"FlashSm80BwdConfig.col_warps must be 1 or 2, got {self.col_warps!r}")
        if d % (16 * self.col_warps):
            raise ValueError(f"FlashSm80BwdConfig.head_dim = {d} must be a multiple of 16 * col_warps = "
                             f"{16 * self.col_warps}")
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
        return 32 * self.num_warps * self.col_warps

    @property
    def score_threads(self) -> int:
        """The threads of one score GEMM (one column group of warps)."""
        return 32 * self.num_warps


def bwd_config_for(head_dim: int, dtype: str, causal: bool, local: bool = False, softcap: bool = False,
                   seqused_k: bool = False) -> FlashSm80BwdConfig:
    """Tiles chosen so the SASS has no spills (checked by the variants). Up to D = 128: 64 x 64
    tiles with 4 warps (each warp: 16 rows of the tile it owns); at D > 64 dK and dV take
    2 x D/2 fp32 registers per thread, so the dK/dV pass steps over fewer Q rows (32, and 16 with
    a mask's extra live values). Above D = 128 the accumulators alone would pass the 255
    registers a thread has, so 4 more warps split the head dim (col_warps = 2, 256 threads; as
    FlashAttention-2's 8 warps at D = 256): each accumulator takes D/4 registers per thread.
    A soft cap counts as a mask here (its tanh holds values live the same way)."""
    masked = causal or local or softcap
    features = {"softcap": softcap, "seqused_k": seqused_k}
    if head_dim <= 128:
        dkdv_block_m = 64 if head_dim <= 64 else (16 if masked else 32)
        # ... but at least the rows one copy pass moves (64 at D = 80 or 112, whose 32-byte
        # swizzle rows take 2 threads each).
        dkdv_block_m = max(dkdv_block_m, 128 // (smem_atom_width(head_dim) // 8))
        return FlashSm80BwdConfig(head_dim=head_dim, dtype=dtype, causal=causal, local=local,
                                  dkdv_block_m=dkdv_block_m, **features).validate()
    # D = 160 and 224 (a 32-column tile, interleaved between the two warp groups) keep 8 to 16
    # bytes of spills in some mask variants, outside the inner loop; 192 and 256 have none.
    col_warps = 2 if head_dim % 32 == 0 else 1
    dkdv_block_m = max(32, 32 * 4 * col_warps // (smem_atom_width(head_dim) // 8))
    return FlashSm80BwdConfig(head_dim=head_dim, dtype=dtype, causal=causal, local=local, block_m=64, block_n=64,
                              dkdv_block_m=dkdv_block_m, col_warps=col_warps, **features).validate()


def _permute_width(head_dim: int) -> int:
    """The column tile of the head-dim split gradient GEMMs: the whole head dim at D = 256 (each
    warp's columns contiguous, so its ldmatrix addresses differ by immediates and take fewer
    registers), else 64 (D = 192: a 192-wide tile does not compile) or 32."""
    return head_dim if head_dim == 256 else (64 if head_dim % 64 == 0 else 32)


def _tiled_mma(dtype, num_warps: int, col_warps: int = 1, width: int = 0):
    """num_warps x col_warps warps over (M, N) of m16n8k16 atoms, each warp 16 x 16 per tile;
    with col_warps > 1, over N = width, warp w of a row owning columns [w, w + 1) * width /
    col_warps (contiguous columns share ldmatrix addresses up to immediate offsets)."""
    atom = warp.MmaF16BF16Op(dtype, cutlass.Float32, (16, 8, 16))
    if col_warps == 1:
        return cute.make_tiled_mma(atom, (num_warps, 1, 1), permutation_mnk=(16 * num_warps, 16, 16))
    # tile column (a, w, r) of atom column a, warp w, repeat r -> a + w * width / col_warps + 8 r.
    cols = cute.make_layout((8, col_warps, width // (8 * col_warps)), stride=(1, width // col_warps, 8))
    return cute.make_tiled_mma(atom, (num_warps, col_warps, 1), permutation_mnk=(16 * num_warps, cols, 16))


def _copies(dtype, threads: int, head_dim: int):
    thr, val = copy_layouts(threads, head_dim)
    thr, val = to_cute(thr), to_cute(val)
    g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype,
                              num_bits_per_copy=128)
    store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    return cute.make_tiled_copy_tv(g2s, thr, val), cute.make_tiled_copy_tv(store, thr, val)


@cute.jit
def _p_and_ds(s: cutlass.Float32, dp: cutlass.Float32, lse2: cutlass.Float32, d_val: cutlass.Float32,
              scale_log2: cutlass.Float32, capped: cutlass.Constexpr):
    """(P, dS) of one (masked) score s: P = 2^(s * scale_log2 - lse2), dS = P (dp - D); when
    `capped`, s is the soft cap's t = tanh(...) (-inf where masked) and dS carries the tanh's
    derivative (1 - t^2), with t clamped at -1 so that a masked entry's factor is 0, not -inf
    (its P is 0; a NaN t still reaches dS through P)."""
    p = cute.math.exp2(s * scale_log2 - lse2, fastmath=True)
    ds = p * (dp - d_val)
    if cutlass.const_expr(capped):
        t = cute.arch.fmax(s, cutlass.Float32(-1.0))
        ds = ds * (cutlass.Float32(1.0) - t * t)
    return p, ds


@cute.jit
def _dsoftmax(s_mn: cute.Tensor, dp_mn: cute.Tensor, lse2, d_vals, scale_log2: cutlass.Float32,
              per_row: cutlass.Constexpr, capped: cutlass.Constexpr = False):
    """In place: s -> P = 2^(s * scale_log2 - lse2), dp -> dS = P * (dp - D) (`_p_and_ds`).
    lse2 (log2-domain lse) and d_vals are indexed by row (per_row) or by column of the
    (rows, cols) views."""
    for r in cutlass.range_constexpr(cute.size(s_mn.shape[0])):
        for c in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
            i = r if cutlass.const_expr(per_row) else c
            s_mn[r, c], dp_mn[r, c] = _p_and_ds(s_mn[r, c], dp_mn[r, c], lse2[i], d_vals[i], scale_log2, capped)


@cute.jit
def _dsoftmax_cols(s_mn: cute.Tensor, dp_mn: cute.Tensor, coord_mn: cute.Tensor, s_lse2: cute.Tensor,
                   s_d: cute.Tensor, scale_log2: cutlass.Float32, capped: cutlass.Constexpr = False):
    """`_dsoftmax` of a transposed tile (columns = query rows), lse2 and D read per column from
    shared memory (s_lse2, s_d indexed by the tile-local column `coord_mn` gives)."""
    for c in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
        col = coord_mn[0, c][1]
        lse2, d_val = s_lse2[col], s_d[col]
        for r in cutlass.range_constexpr(cute.size(s_mn.shape[0])):
            s_mn[r, c], dp_mn[r, c] = _p_and_ds(s_mn[r, c], dp_mn[r, c], lse2, d_val, scale_log2, capped)


def _to(t: cute.Tensor, dtype) -> cute.Tensor:
    r = cute.make_fragment_like(t, dtype)
    r.store(t.load().to(dtype))
    return r


def _sequence(mCuSeqlensQ, mCuSeqlensK, batch, seqlen_q, seqlen_k, causal_offset, offset_lo, bottom_right,
              mSeqUsedK=None):
    """(seqlen_q, seqlen_k, causal_offset, offset_lo, offset_q, offset_k) of this CTA's sequence:
    the tensors' own lengths for a dense launch, else read from cu_seqlens (the key count from
    mSeqUsedK when given), with both offsets moved by the sequence's base bottom_right * (Sk_b -
    Sq_b)."""
    if cutlass.const_expr(mCuSeqlensQ is None):
        return seqlen_q, seqlen_k, causal_offset, offset_lo, 0, 0
    info = seqlen_info.varlen_seqlens(mCuSeqlensQ, mCuSeqlensK, batch)
    seqlen_k = info.seqlen_k
    if cutlass.const_expr(mSeqUsedK is not None):
        seqlen_k = mSeqUsedK[batch]
    base = bottom_right * (seqlen_k - info.seqlen_q)
    return info.seqlen_q, seqlen_k, causal_offset + base, offset_lo + base, info.offset_q, info.offset_k


def _scales(config, softmax_scale, softcap):
    """(scale_log2, score_scale or None): the exponent's scale and, with a soft cap, the
    pre-tanh one (`problem_checks.softcap_scalars`)."""
    if cutlass.const_expr(config.softcap):
        return softcap * LOG2_E, softmax_scale / softcap
    return softmax_scale * LOG2_E, None


def _rows(t: cute.Tensor, batch, head, offset, varlen: bool) -> cute.Tensor:
    """The (S, D) or (S,) view of (batch, head) of a (B, H, S, D) / (B, H, S) tensor; varlen:
    of the packed (1, H, T, ...) tensor, starting at row `offset`."""
    if cute.rank(t) == 4:
        if varlen:
            return cute.domain_offset((offset, 0), t[0, head, None, None])
        return t[batch, head, None, None]
    if varlen:
        return cute.domain_offset((offset,), t[0, head, None])
    return t[batch, head, None]


def _launch_shape(mQ, mK, block, which: str, num_sequences, max_seqlen):
    """The grid's first and third modes: (tiles of S, batch) or, varlen, (tiles of the longest
    sequence, sequences)."""
    src = mQ if which == "q" else mK
    if max_seqlen is None:
        return cute.ceil_div(src.shape[2], block), src.shape[0]
    return cute.ceil_div(max_seqlen, block), num_sequences


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
                 offset_lo: cutlass.Int32, qhead_per_kvhead: cutlass.Int32, stream,
                 mCuSeqlensQ: cute.Tensor | None = None, mCuSeqlensK: cute.Tensor | None = None,
                 num_sequences: cutlass.Int32 | None = None, max_seqlen_q: cutlass.Int32 | None = None,
                 bottom_right: cutlass.Int32 | None = None, softcap: cutlass.Float32 | None = None,
                 mSeqUsedK: cute.Tensor | None = None):
        """Launch over (Q blocks, query heads, batch). Varlen (cu_seqlens given): the tensors
        are packed (1, H, T, ...) views and the offsets relative to each sequence's base, as in
        `FlashAttentionSm80`. softcap: the cap c (with `config.softcap`); mSeqUsedK (B,) int32
        (varlen, with `config.seqused_k`)."""
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
        tiles, batches = _launch_shape(mQ, mK, c.block_m, "q", num_sequences, max_seqlen_q)
        self.kernel(mQ, mK, mV, mdO, mLSE, mD, mdQ, softmax_scale, causal_offset, offset_lo, qhead_per_kvhead,
                    gmem_load, gmem_store, _tiled_mma(self.dtype, c.num_warps),
                    _tiled_mma(self.dtype, c.num_warps, c.col_warps, _permute_width(c.head_dim)), SharedStorage,
                    mCuSeqlensQ, mCuSeqlensK, bottom_right, softcap, mSeqUsedK).launch(
            grid=(tiles, mQ.shape[1], batches), block=[c.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mD: cute.Tensor, mdQ: cute.Tensor, softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32,
               offset_lo: cutlass.Int32, qhead_per_kvhead: cutlass.Int32, gmem_load: cute.TiledCopy,
               gmem_store: cute.TiledCopy, mma_s: cute.TiledMma, mma_acc: cute.TiledMma,
               SharedStorage: cutlass.Constexpr, mCuSeqlensQ: cute.Tensor | None, mCuSeqlensK: cute.Tensor | None,
               bottom_right: cutlass.Int32 | None, softcap: cutlass.Float32 | None, mSeqUsedK: cute.Tensor | None):
        c = self.config
        varlen = mCuSeqlensQ is not None
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        kv_head = head // qhead_per_kvhead
        seqlen_q, seqlen_k, causal_offset, offset_lo, offset_q, offset_k = _sequence(
            mCuSeqlensQ, mCuSeqlensK, batch, mQ.shape[2], mK.shape[2], causal_offset, offset_lo, bottom_right,
            mSeqUsedK)
        n_block_max, n_unmasked_end = block_info.n_block_range(
            m_block, seqlen_q, seqlen_k, causal_offset, block_m=c.block_m, block_n=c.block_n, causal=c.causal,
            minimum=cutlass.min, maximum=cutlass.max)
        if cutlass.const_expr(varlen):
            # The grid covers the longest sequence: a tile past this one's end visits no block.
            live = cutlass.min(cutlass.max(seqlen_q - m_block * c.block_m, 0), 1)
            n_block_max, n_unmasked_end = n_block_max * live, n_unmasked_end * live
        n_block_min = block_info.n_block_min(m_block, offset_lo, block_m=c.block_m, block_n=c.block_n,
                                             local=c.local, maximum=cutlass.max)
        n_masked = n_block_max - n_unmasked_end
        if cutlass.const_expr(c.local):
            n_masked = cutlass.max(n_block_max - n_block_min, 0)

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
        gK = cute.local_tile(_rows(mK, batch, kv_head, offset_k, varlen), tile_kv, (None, 0))
        gV = cute.local_tile(_rows(mV, batch, kv_head, offset_k, varlen), tile_kv, (None, 0))
        tKgK, tKsK = thr_load.partition_S(gK), thr_load.partition_D(sK)
        tVgV, tVsV = thr_load.partition_S(gV), thr_load.partition_D(sV)

        rows_left = seqlen_q - m_block * c.block_m
        gQ = cute.local_tile(_rows(mQ, batch, head, offset_q, varlen), tile_q, (m_block, 0))
        gdO = cute.local_tile(_rows(mdO, batch, head, offset_q, varlen), tile_q, (m_block, 0))
        load_rows(gmem_load, thr_load.partition_S(gQ), thr_load.partition_D(sQ), tQcQ, rows_left)
        load_rows(gmem_load, thr_load.partition_S(gdO), thr_load.partition_D(sdO), tQcQ, rows_left)
        cute.arch.cp_async_commit_group()

        # The score GEMMs run on one column group of warps (each group computes the same S, dP).
        tidx_s = tidx % c.score_threads
        thr_mma_s = mma_s.get_slice(tidx_s)
        thr_mma_acc = mma_acc.get_slice(tidx)
        frags = (
            smem_operand(mma_s, sQ, "A", self.dtype, tidx_s, transpose=False),
            smem_operand(mma_s, sK, "B", self.dtype, tidx_s, transpose=False),
            smem_operand(mma_s, sdO, "A", self.dtype, tidx_s, transpose=False),
            smem_operand(mma_s, sV, "B", self.dtype, tidx_s, transpose=False),
            smem_operand(mma_acc, sKt, "B", self.dtype, tidx, transpose=True),
        )
        acc_dq = cute.make_rmem_tensor(thr_mma_acc.partition_shape_C(tile_q), cutlass.Float32)
        acc_dq.fill(0.0)

        # Per-row lse (log2 domain) and D of this thread's rows; rows past the end get P = 0.
        t_coord_s = mn_view(thr_mma_s.partition_C(cute.make_identity_tensor((c.block_m, c.block_n))))
        num_rows = cute.size(t_coord_s.shape[0])
        lse2 = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        d_rows = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        g_lse, g_d = _rows(mLSE, batch, head, offset_q, varlen), _rows(mD, batch, head, offset_q, varlen)
        for r in cutlass.range_constexpr(num_rows):
            row = m_block * c.block_m + t_coord_s[r, 0][0]
            lse2[r] = cutlass.Float32.inf
            d_rows[r] = 0.0
            if row < seqlen_q:
                lse2[r] = g_lse[row] * LOG2_E
                d_rows[r] = g_d[row]

        scale_log2, score_scale = _scales(c, softmax_scale, softcap)
        offsets = (causal_offset, offset_lo)
        for i in cutlass.range(n_masked, unroll=1):
            self.dq_block(n_block_max - 1 - i, True, m_block, seqlen_k, offsets, gmem_load, tKgK, tKsK,
                          tVgV, tVsV, tKVcKV, mma_s, thr_mma_s, mma_acc, frags, acc_dq, t_coord_s, lse2, d_rows,
                          scale_log2, score_scale)
        if cutlass.const_expr(not c.local):
            for i in cutlass.range(n_unmasked_end, unroll=1):
                self.dq_block(n_unmasked_end - 1 - i, False, m_block, seqlen_k, offsets, gmem_load, tKgK, tKsK,
                              tVgV, tVsV, tKVcKV, mma_s, thr_mma_s, mma_acc, frags, acc_dq, t_coord_s, lse2, d_rows,
                              scale_log2, score_scale)

        acc_dq.store(acc_dq.load() * softmax_scale)
        g_dq = cute.local_tile(_rows(mdQ, batch, head, offset_q, varlen), tile_q, (m_block, 0))
        store_tile(acc_dq, self.dtype, sQ, gmem_store, mma_acc, g_dq, tile_q, rows_left, tidx)

    @cute.jit
    def dq_block(self, n_block: cutlass.Int32, masked: cutlass.Constexpr, m_block: cutlass.Int32,
                 seqlen_k: cutlass.Int32, offsets, gmem_load: cute.TiledCopy,
                 tKgK: cute.Tensor, tKsK: cute.Tensor, tVgV: cute.Tensor, tVsV: cute.Tensor, tKVcKV: cute.Tensor,
                 mma_s: cute.TiledMma, thr_mma_s, mma_acc: cute.TiledMma, frags, acc_dq: cute.Tensor,
                 t_coord_s: cute.Tensor, lse2: cute.Tensor, d_rows: cute.Tensor, scale_log2: cutlass.Float32,
                 score_scale=None):
        """dQ += dS K for K/V block n_block (S, P, dP, dS recomputed). offsets: the mask's
        (causal_offset, offset_lo); score_scale: the soft cap's (None without one)."""
        c = self.config
        causal_offset, offset_lo = offsets
        q_frag, k_frag, do_frag, v_frag, kt_frag = frags
        # Every warp is done with the previous block's K and V.
        cute.arch.barrier()
        rows_left = seqlen_k - n_block * c.block_n
        load_rows(gmem_load, tKgK[None, None, None, n_block], tKsK, tKVcKV, rows_left)
        load_rows(gmem_load, tVgV[None, None, None, n_block], tVsV, tKVcKV, rows_left)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        acc_s = cute.make_rmem_tensor(thr_mma_s.partition_shape_C((c.block_m, c.block_n)), cutlass.Float32)
        acc_s.fill(0.0)
        gemm_ss(mma_s, acc_s, q_frag, k_frag)
        acc_dp = cute.make_rmem_tensor(thr_mma_s.partition_shape_C((c.block_m, c.block_n)), cutlass.Float32)
        acc_dp.fill(0.0)
        gemm_ss(mma_s, acc_dp, do_frag, v_frag)

        s_mn = mn_view(acc_s)
        if cutlass.const_expr(c.softcap):
            apply_softcap(acc_s, score_scale)
        if cutlass.const_expr(masked):
            apply_mask(s_mn, t_coord_s, m_block * c.block_m, n_block * c.block_n, seqlen_k, causal_offset, c.causal,
                       offset_lo, c.local)
        _dsoftmax(s_mn, mn_view(acc_dp), lse2, d_rows, scale_log2, True, c.softcap)
        gemm_rs(mma_acc, acc_dq, accumulator_as_a(_to(acc_dp, self.dtype)), kt_frag)


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
                 causal_offset: cutlass.Int32, offset_lo: cutlass.Int32, qhead_per_kvhead: cutlass.Int32, stream,
                 mCuSeqlensQ: cute.Tensor | None = None, mCuSeqlensK: cute.Tensor | None = None,
                 num_sequences: cutlass.Int32 | None = None, max_seqlen_k: cutlass.Int32 | None = None,
                 bottom_right: cutlass.Int32 | None = None, softcap: cutlass.Float32 | None = None,
                 mSeqUsedK: cute.Tensor | None = None):
        """Launch over (K/V blocks, KV heads, batch); varlen and the features as
        `FlashAttentionSm80BwdDQ`, the grid then covering the longest key sequence."""
        c = self.config
        mQ, mK, mV, mdO, mdK, mdV = [assume_aligned_rows(t) for t in (mQ, mK, mV, mdO, mdK, mdV)]
        q_layout, kv_layout = to_cute(self.smem_q_layout), to_cute(self.smem_kv_layout)

        @cute.struct
        class SharedStorage:
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(kv_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(kv_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_layout)], 1024]
            # lse (log2 domain) and D of the current Q block's rows.
            sLSE: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, c.dkdv_block_m], 16]
            sDrow: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, c.dkdv_block_m], 16]

        gmem_load, gmem_store = _copies(self.dtype, c.threads, c.head_dim)
        tiles, batches = _launch_shape(mQ, mK, c.block_n, "k", num_sequences, max_seqlen_k)
        self.kernel(mQ, mK, mV, mdO, mLSE, mD, mdK, mdV, softmax_scale, causal_offset, offset_lo, qhead_per_kvhead,
                    gmem_load, gmem_store, _tiled_mma(self.dtype, c.num_warps),
                    _tiled_mma(self.dtype, c.num_warps, c.col_warps, _permute_width(c.head_dim)), SharedStorage,
                    mCuSeqlensQ, mCuSeqlensK, bottom_right, softcap, mSeqUsedK).launch(
            grid=(tiles, mK.shape[1], batches), block=[c.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mD: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, softmax_scale: cutlass.Float32,
               causal_offset: cutlass.Int32, offset_lo: cutlass.Int32, qhead_per_kvhead: cutlass.Int32,
               gmem_load: cute.TiledCopy, gmem_store: cute.TiledCopy, mma_s: cute.TiledMma, mma_acc: cute.TiledMma,
               SharedStorage: cutlass.Constexpr, mCuSeqlensQ: cute.Tensor | None, mCuSeqlensK: cute.Tensor | None,
               bottom_right: cutlass.Int32 | None, softcap: cutlass.Float32 | None, mSeqUsedK: cute.Tensor | None):
        c = self.config
        varlen = mCuSeqlensQ is not None
        tidx, _, _ = cute.arch.thread_idx()
        n_block, kv_head, batch = cute.arch.block_idx()
        seqlen_q, seqlen_k, causal_offset, offset_lo, offset_q, offset_k = _sequence(
            mCuSeqlensQ, mCuSeqlensK, batch, mQ.shape[2], mK.shape[2], causal_offset, offset_lo, bottom_right,
            mSeqUsedK)
        m_block_min, m_block_max = block_info.m_block_range(
            n_block, seqlen_q, causal_offset, block_m=c.dkdv_block_m, block_n=c.block_n, causal=c.causal,
            maximum=cutlass.max, offset_lo=offset_lo, local=c.local, minimum=cutlass.min)
        if cutlass.const_expr(varlen):
            # The grid covers the longest key sequence: a block past this one's end visits nothing.
            live = cutlass.min(cutlass.max(seqlen_k - n_block * c.block_n, 0), 1)
            m_block_max = m_block_min + cutlass.max(m_block_max - m_block_min, 0) * live

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sK = storage.sK.get_tensor(to_cute(self.smem_kv_layout))
        sV = storage.sV.get_tensor(to_cute(self.smem_kv_layout))
        sQ = storage.sQ.get_tensor(to_cute(self.smem_q_layout))
        sdO = storage.sdO.get_tensor(to_cute(self.smem_q_layout))
        sQt = cute.make_tensor(sQ.iterator, to_cute(self.smem_qt_layout))
        sdOt = cute.make_tensor(sdO.iterator, to_cute(self.smem_qt_layout))
        s_rows = (storage.sLSE.get_tensor(cute.make_layout(c.dkdv_block_m)),
                  storage.sDrow.get_tensor(cute.make_layout(c.dkdv_block_m)))

        tile_q, tile_kv = (c.dkdv_block_m, c.head_dim), (c.block_n, c.head_dim)
        thr_load = gmem_load.get_slice(tidx)
        tQcQ = thr_load.partition_S(cute.make_identity_tensor(tile_q))
        tKVcKV = thr_load.partition_S(cute.make_identity_tensor(tile_kv))
        rows_left = seqlen_k - n_block * c.block_n
        gK = cute.local_tile(_rows(mK, batch, kv_head, offset_k, varlen), tile_kv, (n_block, 0))
        gV = cute.local_tile(_rows(mV, batch, kv_head, offset_k, varlen), tile_kv, (n_block, 0))
        load_rows(gmem_load, thr_load.partition_S(gK), thr_load.partition_D(sK), tKVcKV, rows_left)
        load_rows(gmem_load, thr_load.partition_S(gV), thr_load.partition_D(sV), tKVcKV, rows_left)
        cute.arch.cp_async_commit_group()

        # The score GEMMs run on one column group of warps (each group computes the same S^T, dP^T).
        tidx_s = tidx % c.score_threads
        thr_mma_s = mma_s.get_slice(tidx_s)
        thr_mma_acc = mma_acc.get_slice(tidx)
        frags = (
            smem_operand(mma_s, sK, "A", self.dtype, tidx_s, transpose=False),
            smem_operand(mma_s, sQ, "B", self.dtype, tidx_s, transpose=False),
            smem_operand(mma_s, sV, "A", self.dtype, tidx_s, transpose=False),
            smem_operand(mma_s, sdO, "B", self.dtype, tidx_s, transpose=False),
            smem_operand(mma_acc, sdOt, "B", self.dtype, tidx, transpose=True),
            smem_operand(mma_acc, sQt, "B", self.dtype, tidx, transpose=True),
        )
        acc_dk = cute.make_rmem_tensor(thr_mma_acc.partition_shape_C(tile_kv), cutlass.Float32)
        acc_dv = cute.make_rmem_tensor(thr_mma_acc.partition_shape_C(tile_kv), cutlass.Float32)
        acc_dk.fill(0.0)
        acc_dv.fill(0.0)
        # (key row, query column) of each S^T element this thread holds.
        t_coord_st = mn_view(thr_mma_s.partition_C(cute.make_identity_tensor((c.block_n, c.dkdv_block_m))))

        scale_log2, score_scale = _scales(c, softmax_scale, softcap)
        # One flat loop over (query head of the group, Q block): per-head addresses are
        # recomputed per step instead of held in registers across an inner loop.
        m_blocks = cutlass.max(m_block_max - m_block_min, 0)
        for step in cutlass.range(qhead_per_kvhead * m_blocks, unroll=1):
            g = step // m_blocks
            m_block = m_block_min + step - g * m_blocks
            head = kv_head * qhead_per_kvhead + g
            gQ = cute.local_tile(_rows(mQ, batch, head, offset_q, varlen), tile_q, (m_block, 0))
            gdO = cute.local_tile(_rows(mdO, batch, head, offset_q, varlen), tile_q, (m_block, 0))
            g_lse, g_d = _rows(mLSE, batch, head, offset_q, varlen), _rows(mD, batch, head, offset_q, varlen)
            self.dkdv_block(m_block, n_block, seqlen_q, (causal_offset, offset_lo), gmem_load,
                            thr_load.partition_S(gQ), thr_load.partition_D(sQ), thr_load.partition_S(gdO),
                            thr_load.partition_D(sdO), tQcQ, g_lse, g_d, s_rows, tidx, mma_s, thr_mma_s, mma_acc,
                            frags, acc_dk, acc_dv, t_coord_st, scale_log2, score_scale)

        acc_dk.store(acc_dk.load() * softmax_scale)
        g_dk = cute.local_tile(_rows(mdK, batch, kv_head, offset_k, varlen), tile_kv, (n_block, 0))
        g_dv = cute.local_tile(_rows(mdV, batch, kv_head, offset_k, varlen), tile_kv, (n_block, 0))
        store_tile(acc_dk, self.dtype, sK, gmem_store, mma_acc, g_dk, tile_kv, rows_left, tidx)
        store_tile(acc_dv, self.dtype, sV, gmem_store, mma_acc, g_dv, tile_kv, rows_left, tidx)

    @cute.jit
    def dkdv_block(self, m_block: cutlass.Int32, n_block: cutlass.Int32, seqlen_q: cutlass.Int32, offsets,
                   gmem_load: cute.TiledCopy, tQgQ: cute.Tensor, tQsQ: cute.Tensor, tdOgdO: cute.Tensor,
                   tdOsdO: cute.Tensor, tQcQ: cute.Tensor, g_lse: cute.Tensor, g_d: cute.Tensor, s_rows,
                   tidx: cutlass.Int32, mma_s: cute.TiledMma, thr_mma_s, mma_acc: cute.TiledMma, frags,
                   acc_dk: cute.Tensor, acc_dv: cute.Tensor, t_coord_st: cute.Tensor, scale_log2: cutlass.Float32,
                   score_scale=None):
        """dV += P^T dO and dK += dS^T Q for Q block m_block of one query head (g_lse, g_d: its
        (Sq,) lse and D, staged per Q block in s_rows). offsets: the mask's (causal_offset, offset_lo)."""
        c = self.config
        causal_offset, offset_lo = offsets
        k_frag, q_frag, v_frag, do_frag, dot_frag, qt_frag = frags
        # Every warp is done with the previous Q and dO tiles.
        cute.arch.barrier()
        rows_left = seqlen_q - m_block * c.dkdv_block_m
        load_rows(gmem_load, tQgQ, tQsQ, tQcQ, rows_left)
        load_rows(gmem_load, tdOgdO, tdOsdO, tQcQ, rows_left)
        cute.arch.cp_async_commit_group()

        # lse (log2 domain) and D of the Q block's rows to shared memory, under the copies: held
        # in registers through the GEMMs they would take 2 per column of every thread.
        s_lse2, s_d = s_rows
        if tidx < c.dkdv_block_m:
            row = m_block * c.dkdv_block_m + tidx
            lse_row, d_row = cutlass.Float32.inf, cutlass.Float32(0.0)
            if row < seqlen_q:
                lse_row, d_row = g_lse[row] * LOG2_E, g_d[row]
            s_lse2[tidx] = lse_row
            s_d[tidx] = d_row

        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        # A warp's B fragment of one k step of the gradient GEMMs spans its whole head-dim share:
        # past 64 columns, operands in flight one step ahead would push dK, dV out of registers.
        prefetch = c.head_dim // c.col_warps <= 64
        acc_st = cute.make_rmem_tensor(thr_mma_s.partition_shape_C((c.block_n, c.dkdv_block_m)), cutlass.Float32)
        acc_st.fill(0.0)
        gemm_ss(mma_s, acc_st, k_frag, q_frag, prefetch)       # S^T = K Q^T
        acc_dpt = cute.make_rmem_tensor(thr_mma_s.partition_shape_C((c.block_n, c.dkdv_block_m)), cutlass.Float32)
        acc_dpt.fill(0.0)
        gemm_ss(mma_s, acc_dpt, v_frag, do_frag, prefetch)     # dP^T = V dO^T

        st_mn = mn_view(acc_st)
        if cutlass.const_expr(c.softcap):
            apply_softcap(acc_st, score_scale)
        key_base, query_base = n_block * c.block_n, m_block * c.dkdv_block_m
        if cutlass.const_expr(c.causal):
            apply_causal_mask_kq(st_mn, t_coord_st, key_base, query_base, causal_offset)
        if cutlass.const_expr(c.local):
            apply_window_mask_kq(st_mn, t_coord_st, key_base, query_base, offset_lo)
        _dsoftmax_cols(st_mn, mn_view(acc_dpt), t_coord_st, s_lse2, s_d, scale_log2, c.softcap)
        gemm_rs(mma_acc, acc_dv, accumulator_as_a(_to(acc_st, self.dtype)), dot_frag, prefetch)
        gemm_rs(mma_acc, acc_dk, accumulator_as_a(_to(acc_dpt, self.dtype)), qt_frag, prefetch)


def supports_backward(problem) -> str | None:
    """None when the backward kernels take `problem`; see `sm80_flash_bwd_launch`."""
    from .sm80_flash_bwd_launch import supports_backward as supports

    return supports(problem)


def backward(dout, q, k, v, out, lse, problem):
    """(dq, dk, dv) of the dense launch; see `sm80_flash_bwd_launch.backward`."""
    from .sm80_flash_bwd_launch import backward as run

    return run(dout, q, k, v, out, lse, problem)


def varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, problem):
    """(dq, dk, dv) of the packed launch; see `sm80_flash_bwd_launch.varlen_backward`."""
    from .sm80_flash_bwd_launch import varlen_backward as run

    return run(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, problem)
