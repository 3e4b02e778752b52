"""The sm90_flash backward kernel itself, `FlashAttentionSm90Bwd` (device side), and the static
register-fragment offsets it uses; `sm90_flash_bwd` holds its config, the host entry point and
the compile-only variants, and describes the algorithm and schedule.

A CTA owns 128 keys of one (query head, batch) and is three warpgroups: a producer (TMA loads
of K, V once and of Q, dO, lse2, D per Q block) and two consumers of 64 keys each, which
compute S^T, dP^T, P^T, dS^T, dV, dK in registers and dQ_blk = dS K through shared memory, then
add scale * dQ_blk to the fp32 dQ accumulator (8-byte `red.global.add.v2.f32`, or one TMA
reduce-add per warpgroup). Masks: keys past Sk, the upper diagonal j <= i + offset (`causal`)
and a window's lower bound j >= i + offset_lo (`local`), as selects on P^T. With `head_split`
(head dims above 128) the CTA owns 64 keys, each consumer 32 of the queries of S^T and dP^T and
half the head dim of dV, dK and dQ_blk; P^T joins dS^T in shared memory as the A of dV.

Soft cap (`config.softcap`, the cap c a runtime argument): S^T is turned into t = tanh(S^T *
scale / c) before P^T = 2^(t c log2 e - lse2), and dS^T gains the tanh's derivative (1 - t^2).
P^T is computed while dP^T is still in flight and t is not kept (no registers to spare): the
dS^T pass recovers it from P^T itself, t = (log2 P^T + lse2) / (c log2 e), exact to fp32
rounding wherever P^T > 0 (and where P^T = 0, dS^T is 0 whatever the factor).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir import ir
from cutlass._mlir.dialects import vector as _vector
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from cute_kernels.hopper import smem_layouts, tma, wgmma
from cute_kernels.hopper import pipeline as hpipe
from cute_kernels.hopper.warp_roles import THREADS_PER_WARPGROUP, WarpRoles

from . import block_info
from .ragged import ragged, seq_rows
from .softmax import LOG2_E, softcap_tanh
from .sm90_layouts import accumulator_value_layout, mn_view_layout
from .sm90_softmax import acc_as_a, acc_mn_view

__all__ = ["FlashAttentionSm90Bwd", "CUTLASS_DTYPES", "mn_offsets", "acc_offsets"]

CUTLASS_DTYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
_CONSUMER_THREADS = 2 * THREADS_PER_WARPGROUP
# Named barrier ids (0 is __syncthreads): "dS^T of this step is in shared memory", both consumers.
_DS_BARRIER = 2
# "This warpgroup's dQ half is in shared memory / may be rewritten": 3 + warpgroup.
_DQ_BARRIER = 3
# With one dS^T (and P^T) buffer: "both consumers are done reading last step's", before the writes.
_FREE_BARRIER = 5
# dq_writer: per consumer warpgroup, "its dQ_blk is in shared memory" (_DQ_BARRIER + wg: the
# consumers arrive, the writer warp waits) and "the writer has read the last one"
# (_DQ_EMPTY_BARRIER + wg: the other way round); 128 consumers + 32 writer threads each.
_DQ_EMPTY_BARRIER = 7
_DQ_STAGE_THREADS = THREADS_PER_WARPGROUP + 32
# Deterministic dQ: "this CTA's turn at the Q block has come" and "its additions are issued".
_TURN_BARRIER = 6


def _dq_stage_barriers():
    """dq_writer's named barriers, one of each per consumer warpgroup: ("the writer has read its
    last tile", "its dQ_blk is in shared memory"), each for 128 consumers + 32 writer threads."""
    def bars(first: int):
        return [pipeline.NamedBarrier(barrier_id=first + i, num_threads=_DQ_STAGE_THREADS) for i in (0, 1)]

    return bars(_DQ_EMPTY_BARRIER), bars(_DQ_BARRIER)


def mn_offsets(n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(row offsets, column offsets) of the (rows, columns) view (`acc_mn_view`) of an m64nN
    accumulator, relative to the thread's first element: element (r, j) is at tile position
    (first row + rows[r], first column + cols[j]) for every thread. Static (from
    `sm90_layouts`), so masks and per-column loads need one dynamic value per thread."""
    acc, mn = accumulator_value_layout(n), mn_view_layout(n)
    pos = lambda r, j: divmod(acc(mn(r + 2 * j)), 64)[::-1]  # noqa: E731  (m + 64 n -> (m, n))
    return tuple(pos(r, 0)[0] for r in range(2)), tuple(pos(0, j)[1] for j in range(n // 4))


def acc_offsets(n: int, row_stride: int) -> tuple[int, ...]:
    """Element offsets (row * row_stride + column) of every value of an m64nN accumulator
    fragment ((2, 2, N/8), 1, 1), relative to the thread's first value (static, from
    `sm90_layouts.accumulator_value_layout`)."""
    acc = accumulator_value_layout(n)
    return tuple((acc(v) % 64) * row_stride + acc(v) // 64 for v in range(n // 2))


def _f32xn(*values):
    """The MLIR vector<nxf32> of n Float32 values (a vector store's or reduction's operand)."""
    return _vector.from_elements(ir.VectorType.get([len(values)], cutlass.Float32.mlir_type),
                                 [v.ir_value() for v in values])


def _transposed(t: cute.Tensor, rows: int, cols: int, stages: int) -> cute.Tensor:
    """(rows, cols, stages) smem tensor viewed (cols, rows, stages): an operand read MN-major
    (e.g. dO as the B of dV += P^T dO, N = head dim) from a buffer filled row-major."""
    return cute.composition(t, cute.make_layout((cols, rows, stages), stride=(rows, 1, rows * cols)))


def split_atom(dtype, head_dim: int):
    """The K-major smem atom of Q, dO, K and V: the widest swizzle dividing the head dim whose
    width (elements per swizzle row) and half the head dim divide one another, because dQ_blk =
    dS K splits the head dim over the two consumer warpgroups and each half of K^T must be
    whole atoms or lie inside one. D = 64 and 128 keep the 128-byte swizzle (halves of 32 and
    64 columns in 64-column rows); D = 96 takes the 32-byte one (halves of 48 in 16-column rows;
    the 64-byte swizzle's 32-column rows would cut a half mid-row)."""
    from cute_kernels.layouts.atoms import dtype_bits, dtype_name

    bits = dtype_bits(dtype_name(dtype))
    half = head_dim // 2
    for row_bytes in (128, 64, 32, 16):
        width = row_bytes * 8 // bits
        if (head_dim * bits // 8) % row_bytes == 0 and (half % width == 0 or width % half == 0):
            return smem_layouts.gmma_atom("K", dtype, row_bytes * 8 // bits)
    raise ValueError(f"no GMMA smem atom splits head dim {head_dim} in two")


class FlashAttentionSm90Bwd:
    """dq_accum (+)=, dk, dv for q, dO (B, Hq, Sq, D), k, v (B, Hkv, Sk, D), lse2 (base-2 lse,
    +inf for rows without keys) and D (B, Hq, Sq) fp32; dk, dv (B, Hq, Sk, D) per query head."""

    def __init__(self, config):
        """`config`: a `sm90_flash_bwd.FlashSm90BwdConfig` (validated here)."""
        self.config = config.validate()
        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.dkv_dtype = cutlass.Float32 if config.dkv_fp32 else self.dtype
        self.roles = WarpRoles(consumer_warpgroups=2, producer_regs=config.producer_regs,
                               consumer_regs=config.consumer_regs)
        self.roles.validate()
        c = self.config
        # GMMA smem atoms (`cute_kernels.layouts.smem_atoms`). Q, dO, K, V are stored row-major
        # (D contiguous, K-major for S^T and dP^T; read through transposed views where they are
        # MN-major operands); dS^T is stored (keys, queries) with the queries contiguous.
        self.smem_atom = split_atom(c.dtype, c.head_dim)
        self.ds_atom = smem_layouts.gmma_atom("K", c.dtype, c.block_m)
        # The fp32 dQ tile in 32B-swizzled 8 x 8 blocks: a thread's accumulator values then sit at
        # static offsets from one address (one XOR pattern per thread), and a warp's 64-bit stores
        # fill whole blocks without bank conflicts. The TMA reduce-add moves (64, 8) boxes.
        self.dq_atom = smem_layouts.gmma_atom("K", "float32", 8)

    # ---- host side -----------------------------------------------------------------------------

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
                 mDrow: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                 softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32, offset_lo: cutlass.Int32,
                 qhead_per_kvhead: cutlass.Int32, stream, softcap: cutlass.Float32 | None = None):
        """Launch over (key blocks, query heads, batch). softcap: the cap c (with `config.softcap`)."""
        self.launch(mQ, mK, mV, mdO, mLSE2, mDrow, mdQacc, mdK, mdV, softmax_scale, causal_offset, offset_lo,
                    qhead_per_kvhead, stream, softcap, (None, None, None, None, None), None)

    @cute.jit
    def call_deterministic(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                           mLSE2: cute.Tensor, mDrow: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor,
                           mdV: cute.Tensor, softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32,
                           offset_lo: cutlass.Int32, qhead_per_kvhead: cutlass.Int32, stream,
                           softcap: cutlass.Float32 | None, mTurns: cute.Tensor):
        """The dense launch with dQ added in a fixed order (`config.deterministic`): mTurns, int32
        zeros, one per (batch, query head, Q block), counts the key blocks whose dQ_blk has been
        added to that Q block; the CTA of key block n adds its own when the count is n minus
        the block's first key block, then counts itself."""
        self.launch(mQ, mK, mV, mdO, mLSE2, mDrow, mdQacc, mdK, mdV, softmax_scale, causal_offset, offset_lo,
                    qhead_per_kvhead, stream, softcap, (None, None, None, None, None), mTurns)

    @cute.jit
    def call_varlen(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
                    mDrow: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                    softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32, offset_lo: cutlass.Int32,
                    qhead_per_kvhead: cutlass.Int32, stream, softcap: cutlass.Float32 | None,
                    mCuSeqlensQ: cute.Tensor, mCuSeqlensK: cute.Tensor, mOrder: cute.Tensor,
                    max_seqlen_k: cutlass.Int32, bottom_right: cutlass.Int32):
        """The packed launch (`config.varlen`; its own entry, so the dense one's parameter list,
        which TVM-FFI builds take whole, stays as it was): q, k, v, dO, dK, dV are the packed
        (T, H, D) tensors viewed (1, H, T, D); lse2 and D flat (Hq, Tq padded to whole Q blocks:
        the prep pass of the (1, H, T, D) views; rows past a sequence are masked), the dQ
        accumulator flat (Hq, Tq, D); cu_seqlens (B + 1,) int32;
        mOrder (B,) int32 the sequences in launch order (the most work first); the grid covers
        max_seqlen_k's key blocks; both offsets relative to each sequence's base bottom_right *
        (Sk_b - Sq_b)."""
        self.launch(mQ, mK, mV, mdO, mLSE2, mDrow, mdQacc, mdK, mdV, softmax_scale, causal_offset, offset_lo,
                    qhead_per_kvhead, stream, softcap,
                    (mCuSeqlensQ, mCuSeqlensK, mOrder, max_seqlen_k, bottom_right), None)

    @cute.jit
    def launch(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
               mDrow: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
               softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32, offset_lo: cutlass.Int32,
               qhead_per_kvhead: cutlass.Int32, stream, softcap: cutlass.Float32 | None, varlen_args,
               mTurns: cute.Tensor | None):
        """The entries' body; varlen_args: (cu_seqlens q, cu_seqlens k, launch order,
        max_seqlen_k, bottom_right), or Nones; mTurns: the deterministic dQ's counters, or None."""
        mCuSeqlensQ, mCuSeqlensK, mOrder, max_seqlen_k, bottom_right = varlen_args
        c = self.config
        d, bm, bn = c.head_dim, c.block_m, c.block_n
        # (B, H, S, D) -> (S, D, H, B): a TMA box is a (rows, D) slab of one (head, batch).
        to_sdhb = lambda t: cute.make_tensor(t.iterator, cute.select(t.layout, mode=[2, 3, 1, 0]))  # noqa: E731
        mQ, mK, mV, mdO, mdK, mdV = [to_sdhb(t) for t in (mQ, mK, mV, mdO, mdK, mdV)]
        rows_q = mQ.shape[0]  # Sq, or varlen the packed Tq
        if cutlass.const_expr(c.varlen):
            mQ, mK, mV, mdO = [ragged(t) for t in (mQ, mK, mV, mdO)]

        smem_kv_layout = smem_layouts.staged_smem_layout(self.smem_atom, bn, d, 1)
        smem_qdo_layout = smem_layouts.staged_smem_layout(self.smem_atom, bm, d, c.stages)
        smem_ds_layout = smem_layouts.staged_smem_layout(self.ds_atom, bn, bm, c.ds_buffers)
        tma_k, tK = tma.make_tma_load(mK, smem_kv_layout, (bn, d), 1)
        tma_v, tV = tma.make_tma_load(mV, smem_kv_layout, (bn, d), 1)
        tma_q, tQ = tma.make_tma_load(mQ, smem_qdo_layout, (bm, d), 1)
        tma_do, tdO = tma.make_tma_load(mdO, smem_qdo_layout, (bm, d), 1)
        # lse2 and D (flat, padded to whole Q blocks) ride on the Q/dO barrier: one 64-float box each.
        smem_row_layout = cute.make_layout((bm, c.stages))
        if cutlass.const_expr(c.varlen):  # boxes of `row_box` rows from a 16-byte boundary, 128-byte aligned stages
            smem_row_layout = cute.make_layout((c.row_box, c.stages), stride=(1, c.row_stage))
        # dQ tile: (bm, D/2) per consumer warpgroup for the TMA reduce-add, the same bytes viewed
        # (bm, D) for the accumulator's partition (column blocks of 32 follow the row blocks, so
        # warpgroup 1's half starts where the second "stage" does).
        smem_dq_layout = smem_layouts.staged_smem_layout(self.dq_atom, bm, d // 2, 2)
        smem_dq_full = smem_layouts.staged_smem_layout(self.dq_atom, bm, d, 1)
        # The dQ accumulator is (B * Hq, Sq, D) unpadded (the backward's post-processing converts
        # it whole); as (Sq, D, B * Hq) the reduce-add's tensor map clips each head's last block.
        sq = rows_q
        mdQ3 = cute.make_tensor(mdQacc.iterator, cute.make_layout((sq, d, mdQacc.shape[0] // (sq * d)),
                                                                  stride=(d, 1, sq * d)))
        tma_dq, tdQ = cpasync.make_tiled_tma_atom(cpasync.CopyReduceBulkTensorTileS2GOp(), mdQ3,
                                                  cute.slice_(smem_dq_layout, (None, None, 0)), (bm, d // 2))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_lse, tLSE = cpasync.make_tiled_tma_atom(g2s, mLSE2, cute.make_layout(c.row_box), (c.row_box,))
        tma_drow, tDrow = cpasync.make_tiled_tma_atom(g2s, mDrow, cute.make_layout(c.row_box), (c.row_box,))

        # S^T = K Q^T and dP^T = V dO^T: keys on M (one 64-row atom per consumer warpgroup; with
        # head_split both warpgroups take the same 64 keys and half the queries each).
        # Two copies of each MMA: the first k step overwrites (ACCUMULATE off), set once outside
        # any loop so no MMA state is carried through control flow.
        sdp_atoms = (1, 2, 1) if c.head_split else (2, 1, 1)
        mma_sdp0 = wgmma.make_tiled_mma(self.dtype, self.dtype, "K", "K", cutlass.Float32, sdp_atoms, c.s_cols)
        mma_sdp = wgmma.make_tiled_mma(self.dtype, self.dtype, "K", "K", cutlass.Float32, sdp_atoms, c.s_cols)
        # dV += P^T dO, dK += dS^T Q, B (dO, Q) MN-major through transposed views. A from
        # registers (each warpgroup's own keys); with head_split from shared memory (P^T and dS^T
        # of all 64 keys and queries), each warpgroup taking half the head dim.
        if cutlass.const_expr(c.head_split):
            mma_dkv = wgmma.make_tiled_mma(self.dtype, self.dtype, "K", "MN", cutlass.Float32, (1, 2, 1), d // 2)
        else:
            mma_dkv = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, wgmma.operand_major("K"), wgmma.operand_major("MN"), cutlass.Float32,
                (2, 1, 1), tiler_mn=(64, d), a_source=warpgroup.OperandSource.RMEM)
        # dQ_blk = dS K: Q rows on M, the head dim split over the two warpgroups (128 Q rows: the
        # rows split, 64 a warpgroup, each with the whole head dim); dS (from dS^T) and K both
        # MN-major.
        dq_atoms, dq_cols = ((2, 1, 1), d) if bm == 128 else ((1, 2, 1), d // 2)
        mma_dq0 = wgmma.make_tiled_mma(self.dtype, self.dtype, "MN", "MN", cutlass.Float32, dq_atoms, dq_cols)
        mma_dq = wgmma.make_tiled_mma(self.dtype, self.dtype, "MN", "MN", cutlass.Float32, dq_atoms, dq_cols)

        dq_floats = c.dq_stage_floats if c.dq_writer else 32
        if cutlass.const_expr(c.dq_tma_reduce):
            dq_floats = cute.cosize(smem_dq_layout)

        @cute.struct
        class SharedStorage:
            bar_kv: cute.struct.MemRange[cutlass.Int64, 2]
            bar_qdo: cute.struct.MemRange[cutlass.Int64, 2 * c.stages]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_kv_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_kv_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_qdo_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_qdo_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_ds_layout)], 1024]
            # P^T, as dS^T: only head_split reads it from shared memory.
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_ds_layout)
                                                       if c.head_split else 8], 1024 if c.head_split else 16]
            # Only the TMA reduce-add and dq_writer stage dQ in shared memory.
            sdQ: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, dq_floats], 1024]
            sLSE: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, c.row_stage * c.stages], 128]
            sDrow: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, c.row_stage * c.stages], 128]

        # One CTA per (key block, query head, batch), or with `gqa_loop` per (key block, key/value
        # head, batch), walking the query heads of its group one after the other.
        grid = (cute.ceil_div(mK.shape[0], bn), mK.shape[2] if c.gqa_loop else mQ.shape[2], mQ.shape[3])
        if cutlass.const_expr(c.varlen):
            grid = (cute.ceil_div(max_seqlen_k, bn), mQ.shape[2], mCuSeqlensQ.shape[0] - 1)
        # P^T's exponent scale and the soft cap's pre-tanh one (`problem_checks.softcap_scalars`).
        exp_scale, score_scale = softmax_scale, softmax_scale
        if cutlass.const_expr(c.softcap):
            exp_scale, score_scale = softcap, softmax_scale / softcap
        self.kernel(tma_k, tK, tma_v, tV, tma_q, tQ, tma_do, tdO, tma_lse, tLSE, tma_drow, tDrow, tma_dq, tdQ, mdQacc,
                    mdK, mdV,
                    softmax_scale, exp_scale * LOG2_E, causal_offset, offset_lo, qhead_per_kvhead, rows_q,
                    smem_kv_layout, smem_qdo_layout, smem_ds_layout, smem_row_layout, smem_dq_layout, smem_dq_full,
                    mma_sdp0, mma_sdp, mma_dkv, mma_dq0, mma_dq, SharedStorage, score_scale, mCuSeqlensQ,
                    mCuSeqlensK, mOrder, bottom_right, mTurns).launch(
                        grid=grid, block=[c.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    # ---- device side ---------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, tma_k: cute.CopyAtom, mK: cute.Tensor, tma_v: cute.CopyAtom, mV: cute.Tensor,
               tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_do: cute.CopyAtom, mdO: cute.Tensor,
               tma_lse: cute.CopyAtom, mLSE2: cute.Tensor, tma_drow: cute.CopyAtom, mDrow: cute.Tensor,
               tma_dq: cute.CopyAtom, mdQ3: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
               scale: cutlass.Float32, scale_log2: cutlass.Float32, causal_offset: cutlass.Int32,
               offset_lo: cutlass.Int32, qhead_per_kvhead: cutlass.Int32, seqlen_q: cutlass.Int32,
               smem_kv_layout: cute.ComposedLayout, smem_qdo_layout: cute.ComposedLayout,
               smem_ds_layout: cute.ComposedLayout, smem_row_layout: cute.Layout,
               smem_dq_layout: cute.ComposedLayout, smem_dq_full: cute.ComposedLayout, mma_sdp0: cute.TiledMma,
               mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq0: cute.TiledMma, mma_dq: cute.TiledMma,
               SharedStorage: cutlass.Constexpr, score_scale: cutlass.Float32, mCuSeqlensQ: cute.Tensor | None,
               mCuSeqlensK: cute.Tensor | None, mOrder: cute.Tensor | None, bottom_right: cutlass.Int32 | None,
               mTurns: cute.Tensor | None):
        """seqlen_q: Sq, or varlen the packed Tq (each sequence's own lengths come from cu_seqlens)."""
        c = self.config
        d, bm, bn = c.head_dim, c.block_m, c.block_n
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            tma.prefetch(tma_k, tma_v, tma_q, tma_do, tma_lse, tma_drow)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 2 * 4)
        pipe_kv = pipeline.PipelineTmaAsync.create(barrier_storage=storage.bar_kv.data_ptr(), num_stages=1,
                                                   producer_group=producer, consumer_group=consumers,
                                                   tx_count=c.tx_bytes_kv)
        pipe_qdo = pipeline.PipelineTmaAsync.create(barrier_storage=storage.bar_qdo.data_ptr(), num_stages=c.stages,
                                                    producer_group=producer, consumer_group=consumers,
                                                    tx_count=c.tx_bytes_qdo)
        sK = storage.sK.get_tensor(smem_kv_layout.outer, swizzle=smem_kv_layout.inner)
        sV = storage.sV.get_tensor(smem_kv_layout.outer, swizzle=smem_kv_layout.inner)
        sQ = storage.sQ.get_tensor(smem_qdo_layout.outer, swizzle=smem_qdo_layout.inner)
        sdO = storage.sdO.get_tensor(smem_qdo_layout.outer, swizzle=smem_qdo_layout.inner)
        sdS = storage.sdS.get_tensor(smem_ds_layout.outer, swizzle=smem_ds_layout.inner)
        sP = sdS  # unused without head_split
        if cutlass.const_expr(c.head_split):
            sP = storage.sP.get_tensor(smem_ds_layout.outer, swizzle=smem_ds_layout.inner)
        sLSE = storage.sLSE.get_tensor(smem_row_layout)
        sdQ = storage.sdQ.get_tensor(smem_dq_layout.outer, swizzle=smem_dq_layout.inner)
        sdQ_full = storage.sdQ.get_tensor(smem_dq_full.outer, swizzle=smem_dq_full.inner)
        sDrow = storage.sDrow.get_tensor(smem_row_layout)
        sLSE_box, sDrow_box = sLSE, sDrow  # what the TMA writes (the consumers' views may start later)

        n_block, head, batch = cute.arch.block_idx()
        # `head` indexes the grid: a query head, or with `gqa_loop` a key/value head whose
        # `qhead_per_kvhead` query heads this CTA walks (dK, dV summed in registers across them).
        kv_head, q_head0, q_heads = head // qhead_per_kvhead, head, cutlass.Int32(1)
        if cutlass.const_expr(c.gqa_loop):
            kv_head, q_head0, q_heads = head, head * qhead_per_kvhead, qhead_per_kvhead
        seqlen_k = mK.shape[0]
        # (batch, q_head0)'s index among the (batch, query head) pairs, and its first row in the
        # flat lse2 / D (padded to whole Q blocks); the next query head's rows follow after sq_pad.
        # dQ: the first head's first accumulator row and the rows between heads.
        sq_pad = (seqlen_q + bm - 1) // bm * bm
        head_row = batch * mQ.shape[2] + q_head0
        rows_base = head_row * sq_pad
        dq_rows = (head_row * seqlen_q, seqlen_q)
        # dq_writer: (the first query head's first tile block, tile blocks per head, its pair index)
        dq_tiles = (head_row * (sq_pad // bm), sq_pad // bm, head_row)
        seq = None
        gdK, gdV = mdK[None, None, head, batch], mdV[None, None, head, batch]
        if cutlass.const_expr(c.varlen):
            # This sequence's rows: lse2 and D are flat (Hq, Tq padded to whole Q blocks, as the prep
            # pass writes them), the dQ accumulator (Hq, Tq, D); rows past the sequence are the
            # next sequence's, which the consumers mask.
            total_q = seqlen_q
            batch = mOrder[batch]
            offset_q, offset_k = mCuSeqlensQ[batch], mCuSeqlensK[batch]
            seqlen_q = mCuSeqlensQ[batch + 1] - offset_q
            seqlen_k = mCuSeqlensK[batch + 1] - offset_k
            base = bottom_right * (seqlen_k - seqlen_q)
            causal_offset, offset_lo = causal_offset + base, offset_lo + base
            seq = (offset_q, seqlen_q, sq_pad)
            dq_rows = (q_head0 * total_q + offset_q, total_q)
            if cutlass.const_expr(c.dq_writer):
                # FlashAttention-3's padded offsets: sequence b's tiles start at block
                # (first row + b bm) // bm of its head's ceil((Tq + B bm) / bm) (`varlen_tile_rows`)
                head_blocks = (total_q + (mCuSeqlensQ.shape[0] - 1) * bm + bm - 1) // bm
                dq_tiles = (q_head0 * head_blocks + (offset_q + batch * bm) // bm, head_blocks, q_head0)
            gdK = cute.domain_offset((offset_k, 0), mdK[None, None, head, 0])
            gdV = cute.domain_offset((offset_k, 0), mdV[None, None, head, 0])
            # The producer's lse2 / D boxes start at the 16-byte boundary at or below the
            # sequence's first row (`row_box`): the consumers read from that many rows on.
            shift = offset_q % 4
            sLSE = cute.make_tensor(sLSE.iterator + shift, sLSE.layout)
            sDrow = cute.make_tensor(sDrow.iterator + shift, sDrow.layout)
        m_block_min, m_block_max = block_info.m_block_range(
            n_block, seqlen_q, causal_offset, block_m=bm, block_n=bn, causal=c.causal, maximum=cutlass.max,
            offset_lo=offset_lo, local=c.local, minimum=cutlass.min)
        m_count = cutlass.max(m_block_max - m_block_min, 0)
        if cutlass.const_expr(c.varlen):
            # The grid covers the longest sequence: a key block past this one's end visits nothing.
            m_count = m_count * cutlass.min(cutlass.max(seqlen_k - n_block * bn, 0), 1)
        cute.arch.sync_threads()  # the mbarrier inits are visible to every warp

        warpgroup_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        if warpgroup_idx == 0:
            self.roles.become_producer()
            if warp_idx == 0:
                mK_s, mV_s = mK[None, None, kv_head, batch], mV[None, None, kv_head, batch]
                if cutlass.const_expr(c.varlen):
                    mK_s = seq_rows(mK, kv_head, offset_k, seqlen_k)
                    mV_s = seq_rows(mV, kv_head, offset_k, seqlen_k)
                gK = cute.local_tile(mK_s, (bn, d), (n_block, 0))
                gV = cute.local_tile(mV_s, (bn, d), (n_block, 0))
                self.produce(tma_k, gK, sK, tma_v, gV, sV, tma_q, mQ, sQ, tma_do, mdO, sdO, tma_lse, mLSE2, sLSE_box,
                             tma_drow, mDrow, sDrow_box, pipe_kv, pipe_qdo, m_block_min, rows_base // bm, m_count,
                             (q_head0, q_heads, batch, sq_pad // bm), seq)
            if cutlass.const_expr(c.dq_writer):
                if warp_idx == 1:
                    writer_turns = None
                    if cutlass.const_expr(mTurns is not None):
                        writer_turns = (mTurns, sq_pad // bm, offset_lo, n_block, None, cute.arch.lane_idx() == 0)
                    self.write_dq(storage.sdQ.data_ptr(), mdQacc, m_block_min, m_count, q_heads, dq_tiles,
                                  writer_turns)
        else:
            self.roles.become_consumer()
            self.consume((tma_dq, mdQ3, sdQ, sdQ_full, storage.sdQ.data_ptr()), mma_sdp0, mma_sdp, mma_dkv, mma_dq0,
                         mma_dq, sK, sV, sQ, sdO, (sdS, sP), pipe_kv, pipe_qdo,
                         sLSE, sDrow, mdQacc, gdK, gdV, scale,
                         (scale_log2, score_scale), (causal_offset, offset_lo), n_block, seqlen_q, seqlen_k,
                         m_block_min, m_count, (head_row, q_heads, dq_rows), tidx - THREADS_PER_WARPGROUP,
                         None if mTurns is None or c.dq_writer else (mTurns, sq_pad // bm, offset_lo))

    @cute.jit
    def produce(self, tma_k, gK, sK, tma_v, gV, sV, tma_q, mQ, sQ, tma_do, mdO, sdO, tma_lse, mLSE2, sLSE,
                tma_drow, mDrow, sDrow, pipe_kv, pipe_qdo, m_block_min: cutlass.Int32, row_block_base: cutlass.Int32,
                m_count: cutlass.Int32, heads, seq):
        """Producer warp: K and V once (one barrier), then for each query head of the CTA
        (`heads`: first head, count, batch, Q blocks per head) Q[m], dO[m], lse2[m], D[m] for m
        ascending (lse2 and D are flat: block m of the h-th head is box row_block_base + h *
        blocks per head + m). seq: varlen's (first row, rows, lse2 / D rows a head) of the
        sequence (its Q, dO rows through the ragged views; its lse2, D boxes of `row_box` rows
        start at the 16-byte boundary at or below row h * those rows + its first row + m *
        block_m), else None."""
        q_head0, q_heads, batch, head_blocks = heads
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        load_kv = True
        if cutlass.const_expr(self.config.varlen):
            # A key block past this sequence's end (or one no query row sees) loads nothing: the
            # grid covers the longest sequence, so a ragged batch has many such blocks.
            load_kv = m_count > 0
        if load_kv:
            kv_state = hpipe.producer_state(1)
            pipe_kv.producer_acquire(kv_state)
            cute.copy(tma_k, tKgK, tKsK[None, 0], tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
            cute.copy(tma_v, tVgV, tVsV[None, 0], tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
        state = hpipe.producer_state(self.config.stages)
        bm, d = self.config.block_m, self.config.head_dim
        for t in cutlass.range(q_heads * m_count, unroll=1):
            h = t // m_count
            m = m_block_min + (t - h * m_count)
            mQ_h, mdO_h = mQ[None, None, q_head0 + h, batch], mdO[None, None, q_head0 + h, batch]
            mL_h, mD_h, rb, box = mLSE2, mDrow, row_block_base + h * head_blocks, bm
            if cutlass.const_expr(seq is not None):
                first, rows, head_stride = seq
                mQ_h, mdO_h = seq_rows(mQ, q_head0 + h, first, rows), seq_rows(mdO, q_head0 + h, first, rows)
                # `row_box` rows from the 16-byte boundary at or below the block's first row
                start = (q_head0 + h) * head_stride + first - first % 4 + m * bm
                mL_h = cute.domain_offset((start,), mLSE2)
                mD_h = cute.domain_offset((start,), mDrow)
                rb, box = -m, self.config.row_box  # the block's box is tile 0 of that view
            gQ = cute.local_tile(mQ_h, (bm, d), (None, 0))
            gdO = cute.local_tile(mdO_h, (bm, d), (None, 0))
            tLsL, tLgL = cpasync.tma_partition(tma_lse, 0, cute.make_layout(1), cute.group_modes(sLSE, 0, 1),
                                               cute.group_modes(cute.local_tile(mL_h, (box,), (None,)), 0, 1))
            tDsD, tDgD = cpasync.tma_partition(tma_drow, 0, cute.make_layout(1), cute.group_modes(sDrow, 0, 1),
                                               cute.group_modes(cute.local_tile(mD_h, (box,), (None,)), 0, 1))
            tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                               cute.group_modes(gQ, 0, 2))
            tdOsdO, tdOgdO = cpasync.tma_partition(tma_do, 0, cute.make_layout(1), cute.group_modes(sdO, 0, 2),
                                                   cute.group_modes(gdO, 0, 2))
            pipe_qdo.producer_acquire(state)
            cute.copy(tma_q, tQgQ[None, m], tQsQ[None, state.index], tma_bar_ptr=pipe_qdo.producer_get_barrier(state))
            cute.copy(tma_do, tdOgdO[None, m], tdOsdO[None, state.index],
                      tma_bar_ptr=pipe_qdo.producer_get_barrier(state))
            cute.copy(tma_lse, tLgL[None, rb + m], tLsL[None, state.index],
                      tma_bar_ptr=pipe_qdo.producer_get_barrier(state))
            cute.copy(tma_drow, tDgD[None, rb + m], tDsD[None, state.index],
                      tma_bar_ptr=pipe_qdo.producer_get_barrier(state))
            state.advance()
        pipe_qdo.producer_tail(state)

    @cute.jit
    def consume(self, dq_tma, mma_sdp0: cute.TiledMma, mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma,
                mma_dq0: cute.TiledMma, mma_dq: cute.TiledMma, sK, sV, sQ, sdO, score_smem, pipe_kv, pipe_qdo,
                sLSE, sDrow, gdQacc, gdK, gdV, scale: cutlass.Float32, scales,
                offsets, n_block: cutlass.Int32, seqlen_q: cutlass.Int32,
                seqlen_k: cutlass.Int32, m_block_min: cutlass.Int32, m_count: cutlass.Int32,
                rows, ctidx: cutlass.Int32, turns):
        """Consumer warpgroups (ctidx in [0, 256): keys 64 (ctidx // 128) .. + 63 of the block;
        with head_split all 64 keys, queries and head dim columns 32 and D / 2 (ctidx // 128) on).
        score_smem: the dS^T and P^T buffers. rows: (the first query head's index among the
        (batch, query head) pairs, the query heads this CTA walks, (its first dQ accumulator
        row, the rows from one query head's to the next's)). turns: the deterministic dQ's
        (counters, Q blocks per head, offset_lo), or None."""
        head_row, q_heads, (dq_row0, dq_head_rows) = rows
        sdS, sP = score_smem
        c = self.config
        d, bm, bn = c.head_dim, c.block_m, c.block_n
        mma_sdp0.set(warpgroup.Field.ACCUMULATE, False)
        mma_sdp.set(warpgroup.Field.ACCUMULATE, True)
        mma_dkv.set(warpgroup.Field.ACCUMULATE, True)
        mma_dq0.set(warpgroup.Field.ACCUMULATE, False)
        mma_dq.set(warpgroup.Field.ACCUMULATE, True)
        thr_sdp = mma_sdp.get_slice(ctidx)
        thr_dkv = mma_dkv.get_slice(ctidx)
        thr_dq = mma_dq.get_slice(ctidx)
        # S^T, dP^T operands: K, V as A (keys x D), Q, dO as B (queries x D, per stage).
        tSrK = mma_sdp.make_fragment_A(thr_sdp.partition_A(sK))
        tSrQ = mma_sdp.make_fragment_B(thr_sdp.partition_B(sQ))
        tdPrV = mma_sdp.make_fragment_A(thr_sdp.partition_A(sV))
        tdPrdO = mma_sdp.make_fragment_B(thr_sdp.partition_B(sdO))
        # dV, dK operands: dO^T, Q^T (D x queries, per stage) as MN-major B.
        tdVrdOt = mma_dkv.make_fragment_B(thr_dkv.partition_B(_transposed(sdO, bm, d, c.stages)))
        tdKrQt = mma_dkv.make_fragment_B(thr_dkv.partition_B(_transposed(sQ, bm, d, c.stages)))
        # dQ operands: dS (queries x keys, per buffer) and K^T (D x keys), both MN-major.
        tdQrdS = mma_dq.make_fragment_A(thr_dq.partition_A(_transposed(sdS, bn, bm, c.ds_buffers)))
        tdQrKt = mma_dq.make_fragment_B(thr_dq.partition_B(_transposed(sK, bn, d, 1)))

        acc_s = cute.make_rmem_tensor(thr_sdp.partition_shape_C((bn, bm)), cutlass.Float32)
        acc_dp = cute.make_rmem_tensor(thr_sdp.partition_shape_C((bn, bm)), cutlass.Float32)
        acc_dv = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, d)), cutlass.Float32)
        acc_dk = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, d)), cutlass.Float32)
        acc_dq = cute.make_rmem_tensor(thr_dq.partition_shape_C((bm, d)), cutlass.Float32)
        acc_dv.fill(0.0)
        acc_dk.fill(0.0)
        r_p = cute.make_rmem_tensor(acc_s.layout, self.dtype)
        r_ds = cute.make_rmem_tensor(acc_s.layout, self.dtype)
        if cutlass.const_expr(c.head_split):
            # P^T and dS^T (keys x queries, queries contiguous: K-major A) per buffer.
            t_p = mma_dkv.make_fragment_A(thr_dkv.partition_A(sP))
            t_ds = mma_dkv.make_fragment_A(thr_dkv.partition_A(sdS))
        else:
            t_p, t_ds = acc_as_a(r_p), acc_as_a(r_ds)
            a_shape = thr_dkv.partition_shape_A((bn, bm))
            if cutlass.const_expr(str(cute.shape(t_p)) != str(a_shape)):
                raise RuntimeError(f"P^T's A view {cute.shape(t_p)} does not match wgmma's A fragment {a_shape}")
        s_mn, dp_mn = acc_mn_view(acc_s), acc_mn_view(acc_dp)
        # Tile-local (key, query) of each score this thread holds.
        coord_s = acc_mn_view(thr_sdp.partition_C(cute.make_identity_tensor((bn, bm))))
        coord_dq = thr_dq.partition_C(cute.make_identity_tensor((bm, d)))
        ncols = cute.size(s_mn.shape[1])
        if cutlass.const_expr(ncols != len(mn_offsets(c.s_cols)[1])):
            raise RuntimeError(f"S^T's column view has {ncols} columns, mn_offsets({c.s_cols}) "
                               f"{len(mn_offsets(c.s_cols)[1])}")
        stmatrix = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_r2s = cute.make_tiled_copy_C(stmatrix, mma_sdp).get_slice(ctidx)
        ds_ready = pipeline.NamedBarrier(barrier_id=_DS_BARRIER, num_threads=_CONSUMER_THREADS)
        smem_free = pipeline.NamedBarrier(barrier_id=_FREE_BARRIER, num_threads=_CONSUMER_THREADS)
        key_base = n_block * bn
        # The TMA reduce-add of dQ: (atom, gmem tiles (bm, D/2, row blocks, 2), this warpgroup's
        # smem half, the accumulator-shaped smem view, the warpgroup's named barrier, whether this
        # thread's warp issues the copies). The whole first warp of each warpgroup takes the
        # issuing branch: the TMA copy elects its lane with elect.sync over the full warp, which
        # never returns when a single lane enters it alone (the hang of the first GPU run).
        tma_dq, mdQ3, sdQ, sdQ_full, sdq_ptr = dq_tma
        wg = ctidx // THREADS_PER_WARPGROUP
        issuer_warp = cute.arch.make_warp_uniform((ctidx % THREADS_PER_WARPGROUP) // 32) == 0
        dq_red = (tma_dq, mdQ3, sdQ, thr_dq.partition_C(sdQ_full[None, None, 0]),
                  [pipeline.NamedBarrier(barrier_id=_DQ_BARRIER + i, num_threads=THREADS_PER_WARPGROUP)
                   for i in (0, 1)], wg, issuer_warp)
        if cutlass.const_expr(c.dq_writer):
            # This thread's first chunk in its warpgroup's tile (`sm90_layouts.dq_tile_layout`).
            dq_red = (sdq_ptr + (wg * c.dq_tile_floats + (ctidx % THREADS_PER_WARPGROUP) * 4), wg,
                      *_dq_stage_barriers())
        if cutlass.const_expr(turns is not None):
            turns = (*turns, n_block, pipeline.NamedBarrier(barrier_id=_TURN_BARRIER, num_threads=_CONSUMER_THREADS),
                     ctidx == 0)

        wait_kv = True
        if cutlass.const_expr(c.varlen):
            wait_kv = m_count > 0  # else `produce` loaded no K/V; the epilogue writes the block's zeros
        if wait_kv:
            pipe_kv.consumer_wait(hpipe.consumer_state(1))
        state = hpipe.consumer_state(c.stages)
        prev = state.clone()
        operands = (mma_sdp0, mma_sdp, mma_dkv, mma_dq0, mma_dq, tSrK, tSrQ, tdPrV, tdPrdO, tdVrdOt, tdKrQt,
                    tdQrdS, tdQrKt, acc_s, acc_dp, acc_dv, acc_dk, acc_dq, r_p, r_ds, t_p, t_ds, s_mn, dp_mn,
                    coord_s, coord_dq, thr_r2s, stmatrix, (sdS, sP), (ds_ready, smem_free), pipe_qdo, sLSE, sDrow,
                    gdQacc, scale, scales, offsets, key_base)
        for t in cutlass.range(q_heads * m_count, unroll=1):
            h = t // m_count
            m = m_block_min + (t - h * m_count)
            pair_rows = (head_row + h, dq_row0 + h * dq_head_rows)
            unmasked = False
            if cutlass.const_expr(c.unmasked_interior):
                # The same step without the mask where the whole tile is allowed; the test is
                # uniform over the CTA, so both consumers take the same copy.
                causal_offset, offset_lo = offsets
                unmasked = block_info.tile_unmasked(m, n_block, seqlen_q, seqlen_k, causal_offset, offset_lo,
                                                    block_m=bm, block_n=bn, causal=c.causal, local=c.local,
                                                    rows_masked=c.varlen)
            if unmasked:
                state, prev = self.step(m, t % c.ds_buffers, t > 0, state, prev, *operands, pair_rows, seqlen_q,
                                        seqlen_k, dq_red, turns, masked=False)
            else:
                state, prev = self.step(m, t % c.ds_buffers, t > 0, state, prev, *operands, pair_rows, seqlen_q,
                                        seqlen_k, dq_red, turns)
        if cutlass.const_expr(c.defer_dkv_wait):
            wgmma.wait_group(0)  # the last dV, dK GEMMs
            if q_heads * m_count > 0:
                pipe_qdo.consumer_release(prev)
        if cutlass.const_expr(c.dq_tma_reduce):
            if issuer_warp:
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the last reduce has read its tile

        # ---- epilogue: dV, scale * dK (rows past Sk skipped)
        coord_kv = thr_dkv.partition_C(cute.make_identity_tensor((bn, d)))
        for j in cutlass.range(cute.size(acc_dv), unroll_full=True):
            key, col = coord_kv[j]
            if key_base + key < seqlen_k:
                gdV[key_base + key, col] = acc_dv[j].to(self.dkv_dtype)
                gdK[key_base + key, col] = (acc_dk[j] * scale).to(self.dkv_dtype)

    @cute.jit
    def step(self, m: cutlass.Int32, buf: cutlass.Int32, has_prev: cutlass.Boolean, state, prev, mma_sdp0, mma_sdp,
             mma_dkv, mma_dq0, mma_dq, tSrK,
             tSrQ, tdPrV, tdPrdO, tdVrdOt, tdKrQt, tdQrdS, tdQrKt, acc_s, acc_dp, acc_dv, acc_dk, acc_dq, r_p, r_ds,
             t_p, t_ds, s_mn, dp_mn, coord_s, coord_dq, thr_r2s, stmatrix, score_smem, barriers, pipe_qdo,
             sLSE, sDrow, gdQacc, scale: cutlass.Float32, scales,
             offsets, key_base: cutlass.Int32, head_rows, seqlen_q: cutlass.Int32,
             seqlen_k: cutlass.Int32, dq_red, turns=None, masked: bool = True):
        """Q block m against this CTA's keys; dS^T (and with head_split P^T) goes through smem
        buffer `buf` (score_smem: both buffers; barriers: "dS^T is written", "last step's
        buffer is free"). Returns the advanced pipeline state and this step's (whose slot a
        deferred release frees), both loop-carried by the caller. scales: (P^T's exponent scale
        in log2 units, the soft cap's pre-tanh scale); head_rows: the (batch, query head) pair's
        index and its first row of the dQ accumulator (head_row * Sq, varlen h * Tq + the
        sequence's first row). Varlen: rows past the sequence (whose lse2 and D are the next
        sequence's) are masked in P^T and dS^T. turns: the deterministic dQ's (counters, Q blocks
        per head, offset_lo, this CTA's key block, the consumers' barrier, whether this thread
        waits and counts), or None. masked: False where the tile needs no mask (the caller's
        `block_info.tile_unmasked`): P^T and dS^T then skip the mask's tests and selects."""
        head_row, dq_row = head_rows
        c = self.config
        scale_log2, score_scale = scales
        sdS, sP = score_smem
        ds_ready, smem_free = barriers
        bm = c.block_m
        row_base = m * bm
        t_row, t_col = coord_s[0, 0]
        row_offs, col_offs = mn_offsets(c.s_cols)
        pipe_qdo.consumer_wait(state)
        stage = state.index
        wgmma.fence()
        ksteps = cute.size(tSrK, mode=[2])
        for kb in cutlass.range_constexpr(ksteps):
            cute.gemm(mma_sdp0 if kb == 0 else mma_sdp, acc_s, tSrK[None, None, kb, 0], tSrQ[None, None, kb, stage],
                      acc_s)
        wgmma.commit_group()
        for kb in cutlass.range_constexpr(ksteps):
            cute.gemm(mma_sdp0 if kb == 0 else mma_sdp, acc_dp, tdPrV[None, None, kb, 0],
                      tdPrdO[None, None, kb, stage], acc_dp)
        wgmma.commit_group()
        wgmma.wait_group(1)  # S^T landed (and the previous step's dV, dK); dP^T still in flight
        if cutlass.const_expr(c.defer_dkv_wait):
            if has_prev:
                pipe_qdo.consumer_release(prev)

        # P^T = 2^(S^T scale_log2 - lse2), 0 past Sk and outside the diagonal bounds; dS^T = P^T (dP^T - D).
        # lse2 and D of this thread's queries (columns) come from this stage's smem copy; the host
        # pads both to whole Q blocks (lse2 = +inf, D = 0 past Sq, so P = 0 there).
        # Key key_base + t_row + row_offs[r] exists while row_offs[r] < key_room, and is seen by
        # query row_base + t_col + col_offs[j] when diag_lo <= row_offs[r] - col_offs[j] <= diag
        # (j <= i + offset and, with a window's lower bound, j >= i + offset_lo).
        causal_offset, offset_lo = offsets
        key_room = seqlen_k - key_base - t_row
        row_room = seqlen_q - row_base - t_col  # varlen: query row_base + t_col + c exists while c < row_room
        diag = row_base + causal_offset - key_base + t_col - t_row
        diag_lo = row_base + offset_lo - key_base + t_col - t_row
        for r in cutlass.range_constexpr(cute.size(s_mn.shape[0])):
            key_ok = cutlass.Int32(row_offs[r]) < key_room
            for j in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
                keep = key_ok
                if cutlass.const_expr(c.varlen):
                    keep = keep & (cutlass.Int32(col_offs[j]) < row_room)
                if cutlass.const_expr(c.causal):
                    keep = keep & (cutlass.Int32(row_offs[r] - col_offs[j]) <= diag)
                if cutlass.const_expr(c.local):
                    keep = keep & (cutlass.Int32(row_offs[r] - col_offs[j]) >= diag_lo)
                x = s_mn[r, j]
                if cutlass.const_expr(c.softcap):
                    x = softcap_tanh(x * score_scale)
                p = cute.math.exp2(x * scale_log2 - sLSE[t_col + col_offs[j], stage], fastmath=True)
                if cutlass.const_expr(masked):
                    p = cutlass.select_(keep, p, cutlass.Float32(0.0))
                s_mn[r, j] = p
        r_p.store(acc_s.load().to(self.dtype))
        if cutlass.const_expr(c.ds_buffers == 1):
            # This warpgroup's reads of the last step's buffer are done (waited for above or at
            # the end of that step); the barrier waits for the other's.
            smem_free.arrive_and_wait()
        if cutlass.const_expr(c.head_split):
            # P^T -> smem: the A of dV for both warpgroups (each holds 32 of its query columns).
            cute.copy(stmatrix, thr_r2s.retile(r_p), thr_r2s.partition_D(sP[None, None, buf]))
        if cutlass.const_expr(c.early_dv):
            # dV += P^T dO runs under the dS^T arithmetic.
            wgmma.fence()
            for kb in cutlass.range_constexpr(cute.size(t_p, mode=[2])):
                cute.gemm(mma_dkv, acc_dv, t_p[None, None, kb], tdVrdOt[None, None, kb, stage], acc_dv)
            wgmma.commit_group()
            wgmma.wait_group(1)  # dP^T landed; dV in flight
        else:
            wgmma.wait_group(0)
        if cutlass.const_expr(c.softcap):
            inv_scale_log2 = cute.arch.rcp_approx(scale_log2)
        for r in cutlass.range_constexpr(cute.size(s_mn.shape[0])):
            for j in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
                p = s_mn[r, j]
                ds = p * (dp_mn[r, j] - sDrow[t_col + col_offs[j], stage])
                if cutlass.const_expr(c.softcap):
                    # t from P^T itself (module docstring); P^T = 0 takes factor 0 (log2 0 = -inf).
                    t = (cute.math.log2(p, fastmath=True) + sLSE[t_col + col_offs[j], stage]) * inv_scale_log2
                    ds = ds * cutlass.select_(p > cutlass.Float32(0.0), cutlass.Float32(1.0) - t * t,
                                              cutlass.Float32(0.0))
                if cutlass.const_expr(c.varlen and masked):
                    # A masked row's D is another sequence's (maybe not finite): 0 * it is not 0.
                    ds = cutlass.select_(cutlass.Int32(col_offs[j]) < row_room, ds, cutlass.Float32(0.0))
                dp_mn[r, j] = ds
        r_ds.store(acc_dp.load().to(self.dtype))

        # dS^T -> smem (the A of dQ for both warpgroups; with head_split of dK too). With two
        # buffers, buffer `buf` was last read by the GEMMs of two steps ago, which every consumer
        # waited for before last step's barrier; with one, `smem_free` above.
        cute.copy(stmatrix, thr_r2s.retile(r_ds), thr_r2s.partition_D(sdS[None, None, buf]))
        cute.arch.fence_proxy("async.shared", space="cta")
        ds_ready.arrive_and_wait()

        wgmma.fence()
        for kb in cutlass.range_constexpr(cute.size(tdQrdS, mode=[2])):
            cute.gemm(mma_dq0 if kb == 0 else mma_dq, acc_dq, tdQrdS[None, None, kb, buf], tdQrKt[None, None, kb, 0],
                      acc_dq)
        wgmma.commit_group()
        if cutlass.const_expr(c.head_split):
            for kb in cutlass.range_constexpr(cute.size(t_p, mode=[2])):
                cute.gemm(mma_dkv, acc_dv, t_p[None, None, kb, buf], tdVrdOt[None, None, kb, stage], acc_dv)
            for kb in cutlass.range_constexpr(cute.size(t_ds, mode=[2])):
                cute.gemm(mma_dkv, acc_dk, t_ds[None, None, kb, buf], tdKrQt[None, None, kb, stage], acc_dk)
        else:
            if cutlass.const_expr(not c.early_dv):
                for kb in cutlass.range_constexpr(cute.size(t_p, mode=[2])):
                    cute.gemm(mma_dkv, acc_dv, t_p[None, None, kb], tdVrdOt[None, None, kb, stage], acc_dv)
            for kb in cutlass.range_constexpr(cute.size(t_ds, mode=[2])):
                cute.gemm(mma_dkv, acc_dk, t_ds[None, None, kb], tdKrQt[None, None, kb, stage], acc_dk)
        wgmma.commit_group()
        wgmma.wait_group(1)  # dQ_blk landed (and an early dV); dK (and dV) still in flight

        # The fp32 accumulator holds Sq rows per head (no padding, so the post-processing
        # converts it in one contiguous pass): rows of the last block past Sq are skipped (the
        # TMA reduce-add's tensor map clips them).
        if cutlass.const_expr(c.dq_tma_reduce):
            self.reduce_dq_tma(acc_dq, scale, m, head_row, dq_red)
        elif cutlass.const_expr(c.dq_writer):
            self.stage_dq(acc_dq, scale, dq_red)
        else:
            # Values 2p and 2p + 1 of the accumulator are adjacent columns: one 8-byte
            # red.global.add.v2.f32 each, so a warp's reduction fills whole 32-byte sectors.
            t_q, t_d = coord_dq[0]
            base = gdQacc.iterator + (cutlass.Int64(dq_row + row_base + t_q) * c.head_dim + t_d)
            room = seqlen_q - row_base - t_q  # this thread's rows r exist while r < room
            dq_offs = acc_offsets(c.head_dim if bm == 128 else c.head_dim // 2, c.head_dim)
            if cutlass.const_expr(turns is not None):
                turn = self.wait_turn(turns, head_row, m)
            for p in cutlass.range_constexpr(cute.size(acc_dq) // 2):
                if cutlass.Int32(dq_offs[2 * p] // c.head_dim) < room:
                    cute.arch.red(base + dq_offs[2 * p], _f32xn(acc_dq[2 * p] * scale, acc_dq[2 * p + 1] * scale),
                                  op="add", dtype=cutlass.Float32, sem="relaxed", scope="gpu")
            if cutlass.const_expr(turns is not None):
                self.end_turn(turns, turn)
        if cutlass.const_expr(not c.defer_dkv_wait):
            wgmma.wait_group(0)
            pipe_qdo.consumer_release(state)
        prev = state.clone()
        state.advance()
        return state, prev

    @cute.jit
    def wait_turn(self, turns, head_row: cutlass.Int32, m: cutlass.Int32):
        """Deterministic dQ: wait until the key blocks before this one that see Q block m (from
        the block's first, `block_info.n_block_min`: the blocks that see a Q block are
        consecutive) have added their dQ_blk to it. One thread polls the block's counter with
        acquire loads, then the consumers meet. Returns the counter's address. Key block n
        waits only on blocks n' < n, launched before it, so the wait always ends."""
        mTurns, m_blocks, offset_lo, n_block, bar, waiter = turns
        c = self.config
        first = block_info.n_block_min(m, offset_lo, block_m=c.block_m, block_n=c.block_n, local=c.local,
                                       maximum=cutlass.max)
        turn = mTurns.iterator + (head_row * m_blocks + m)
        if waiter:
            while cute.arch.load(turn, cutlass.Int32, sem="acquire", scope="gpu") != n_block - first:
                pass
        if cutlass.const_expr(bar is not None):
            bar.arrive_and_wait()
        return turn

    @cute.jit
    def end_turn(self, turns, turn):
        """Every consumer's additions are issued (the barrier; the dQ writer's have completed);
        one thread then makes them visible at gpu scope before the count (fence, then a release
        add)."""
        _, _, _, _, bar, waiter = turns
        if cutlass.const_expr(bar is not None):
            bar.arrive_and_wait()
        if waiter:
            cute.arch.fence_acq_rel_gpu()
            cute.arch.red(turn, cutlass.Int32(1), op="add", dtype=cutlass.Int32, sem="release", scope="gpu")

    @cute.jit
    def reduce_dq_tma(self, acc_dq, scale: cutlass.Float32, m: cutlass.Int32, head_row: cutlass.Int32, dq_red):
        """scale * dQ_blk -> this warpgroup's half of the smem tile -> one TMA reduce-add into
        rows [64 m, + 64) of (batch, head) `head_row` of the accumulator (rows past Sq clipped).
        The tile is rewritten only after the previous step's reduce has read it (bulk wait by the
        issuing warp, then the barrier)."""
        tma_dq, mdQ3, sdQ, tdQsdQ, bars, wg, issuer = dq_red
        if issuer:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        self.wg_sync(bars, wg)
        for j in cutlass.range_constexpr(cute.size(acc_dq)):
            tdQsdQ[j] = acc_dq[j] * scale
        cute.arch.fence_proxy("async.shared", space="cta")
        self.wg_sync(bars, wg)
        if issuer:
            g = cute.local_tile(mdQ3[None, None, head_row], (self.config.block_m, self.config.head_dim // 2), (m, wg))
            t_s, t_g = cpasync.tma_partition(tma_dq, 0, cute.make_layout(1),
                                             cute.group_modes(sdQ[None, None, wg], 0, 2), cute.group_modes(g, 0, 2))
            cute.copy(tma_dq, t_s, t_g)
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def stage_dq(self, acc_dq, scale: cutlass.Float32, dq_stage):
        """dq_writer, consumer side: once the writer has read this warpgroup's last tile, store
        scale * dQ_blk to it in fragment order (`sm90_layouts.dq_tile_layout`: value 4 k + e of
        thread t at float (k * 128 + t) * 4 + e, one 16-byte store per 4 values), then tell
        the writer it is there."""
        base, wg, empty, full = dq_stage
        self.wg_sync(empty, wg)
        for k in cutlass.range_constexpr(cute.size(acc_dq) // 4):
            v = [acc_dq[4 * k + e] * scale for e in range(4)]
            cute.arch.store(base + k * 4 * THREADS_PER_WARPGROUP, _f32xn(*v), ss="cta")
        cute.arch.fence_proxy("async.shared", space="cta")
        if wg == 0:
            full[0].arrive()
        else:
            full[1].arrive()

    @cute.jit
    def write_dq(self, sdq_ptr, gdQacc: cute.Tensor, m_block_min: cutlass.Int32, m_count: cutlass.Int32,
                 q_heads: cutlass.Int32, tiles, turns):
        """dq_writer, the producer warpgroup's second warp: per step (the consumers' order: each
        query head of the CTA, its Q blocks ascending), wait for each consumer warpgroup's
        staged dQ_blk and add it whole to its tile of the accumulator with one bulk reduction
        issued by lane 0, handing a tile back once its reduction has read it. The accumulator
        holds the tiles in the order of the shared ones: (batch, query head) pair, Q block,
        warpgroup, each `dq_tile_floats` in fragment order (the host un-permutes it). tiles:
        (the first query head's first tile block, tile blocks from one head's to the next's, its
        (batch, query head) pair index); packed sequences: the sequence's first block of its
        head's padded rows. turns: the deterministic dQ's
        (counters, Q blocks per head, offset_lo, key block, None, whether this lane waits and
        counts), or None: lane 0 waits for the Q block's turn before its reductions, and counts
        once they have completed."""
        c = self.config
        tile = c.dq_tile_floats
        first_block, m_blocks, head_row = tiles
        lane = cute.arch.lane_idx()
        empty, full = _dq_stage_barriers()
        for t in cutlass.range(q_heads * m_count, unroll=1):
            h = t // m_count
            m = m_block_min + (t - h * m_count)
            for w in cutlass.range_constexpr(2):
                # the last step's reduction of warpgroup w's tile has read it (groups retire in
                # order: w = 0's is the older of the two)
                cute.arch.cp_async_bulk_wait_group(1 - w, read=True)
                empty[w].arrive()
            if cutlass.const_expr(turns is not None):
                turn = self.wait_turn(turns, head_row + h, m)
                cute.arch.fence_proxy("async.global")  # the reductions below come after the acquire
            g = gdQacc.iterator + cutlass.Int64(first_block + h * m_blocks + m) * (2 * tile)
            for w in cutlass.range_constexpr(2):
                full[w].arrive_and_wait()
                if lane == 0:
                    tma.bulk_reduce_add_f32(g + w * tile, sdq_ptr + w * tile, tile * 4)
                cute.arch.cp_async_bulk_commit_group()
            if cutlass.const_expr(turns is not None):
                cute.arch.cp_async_bulk_wait_group(0, read=False)  # the additions are done
                self.end_turn(turns, turn)
        cute.arch.cp_async_bulk_wait_group(0, read=False)

    @cute.jit
    def wg_sync(self, bars, wg: cutlass.Int32):
        if wg == 0:
            bars[0].arrive_and_wait()
        else:
            bars[1].arrive_and_wait()
