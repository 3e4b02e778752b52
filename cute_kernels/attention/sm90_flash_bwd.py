"""Rung `sm90_flash`, backward: dQ, dK, dV with FlashAttention-2/3's algorithm on Hopper's
TMA and warpgroup MMA.

With P = exp(S * scale - lse) recomputed from the forward's log-sum-exp (natural log, fp32),
D_i = sum_d dO[i, d] O[i, d], dP = dO V^T and dS = P * (dP - D):

    dV = P^T dO        dK = scale * dS^T Q        dQ = scale * dS K

One kernel, `FlashAttentionSm90Bwd`: a CTA owns `block_n` = 128 keys of one (query head,
batch) and is three warpgroups (`hopper.warp_roles`):

    producer   warpgroup 0 gives registers back; one warp TMA-loads K and V once, then for
               each Q block (`block_m` = 64 rows) that sees these keys, ascending: Q, dO and the
               block's lse2 and D (1-D boxes) into an mbarrier pipeline of `stages` slots
    consumers  warpgroups 1 and 2 each own 64 of the keys and compute, per Q block, in the
               transposed frame (keys are wgmma's M): S^T = K Q^T and dP^T = V dO^T (wgmma SS,
               two commit groups, so P^T is computed while dP^T is still running), P^T and
               dS^T in fp32 registers (exp2 with the scale folded in, the causal and
               sequence-end masks as selects), then dV += P^T dO and dK += dS^T Q with the
               16-bit P^T and dS^T as register A operands (wgmma RS, the forward's P re-view).
               dS^T is also written to shared memory (stmatrix, two alternating buffers), and
               dQ_blk = dS K is one wgmma SS over both warpgroups' keys (each warpgroup takes
               half of the head dim), scaled and added to an fp32 dQ accumulator in global
               memory: staged in shared memory and added by one TMA reduce-add
               (cp.reduce.async.bulk.tensor) per warpgroup, or with per-element
               `red.global.add.f32` (`FlashSm90BwdConfig.dq_tma_reduce`)

Schedule options (`FlashSm90BwdConfig`, all off by default): `dq_tma_reduce` (above),
`early_dv` issues dV += P^T dO before dS^T is computed, `defer_dkv_wait` lets the next step's
S^T and dP^T queue behind this step's dV and dK, `prep_kernel` computes D and lse2 with the
`sm90_bwd_prep` kernel instead of torch ops. Every combination compiles without spills, but
only the default schedule has run on a GPU so far (the GPU tests parametrize the others, so
running them on an H200 is what promotes an option to a default).

Epilogue: dV and scale * dK converted and stored from registers (rows past Sk skipped). With
GQA each CTA writes its query head's share into fp32 buffers (B, Hq, Sk, D) that the host sums
over the group (deterministic for dK/dV); with Hq == Hkv it writes dk/dv directly.

Pre-processing (D and lse in base 2, empty rows' lse = -inf mapped to +inf so that their P is
0, both padded to whole Q blocks) is torch ops by default or the small `sm90_bwd_prep` kernel;
the zeroed fp32 dQ accumulator and its conversion to q's dtype (post-processing) are torch
ops. Rows and keys past the sequence ends: TMA zero-fills the loads, lse2 of a missing row is
+inf (P = 0), and keys past Sk are masked, so a tail needs no separate code path.

Measured (H200, B4 H32 S2048 D128 bf16, default schedule, whole call): 2.85 ms non-causal and
1.84 ms causal, 0.51x and 0.48x cuDNN's SDPA backward (kernel alone 2.39 / 1.42 ms).

What this version does not do yet (FA3 does): a dedicated warp for the dQ reduce-add and a
pipelined (ping-pong) schedule across the two consumer warpgroups; both consumers meet at a
named barrier every step (dS^T in shared memory). dQ is accumulated with fp32 atomics /
reductions, so its rounding may vary run to run (`deterministic=True` falls back to the sm80
backward, whose dQ pass is deterministic). Head dims other than 64 and 128 are refused
(`supports_backward` says why): 96 because dQ's head-dim split does not fall on a swizzle atom,
192 and 256 because the fp32 dK and dV accumulators of a 128-key block do not fit in registers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from cute_kernels.hopper import smem_layouts, tma, wgmma
from cute_kernels.hopper import pipeline as hpipe
from cute_kernels.hopper.warp_roles import THREADS_PER_WARPGROUP, WarpRoles

from . import block_info
from .problem_checks import launch_scalars
from .softmax import LOG2_E
from .sm90_layouts import accumulator_value_layout, mn_view_layout
from .sm90_softmax import acc_as_a, acc_mn_view

__all__ = ["FlashSm90BwdConfig", "bwd_config_for", "FlashAttentionSm90Bwd", "supports_backward", "backward",
           "build_variant", "BWD_VARIANT_CONFIGS", "HEAD_DIMS"]

_CUTLASS = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
HEAD_DIMS = (64, 128)
_REGS = 65536
_SMEM_LIMIT = 227 * 1024
_CONSUMER_THREADS = 2 * THREADS_PER_WARPGROUP
# Named barrier ids (0 is __syncthreads): "dS^T of this step is in shared memory", both consumers.
_DS_BARRIER = 2
# "This warpgroup's dQ half is in shared memory / may be rewritten": 3 + warpgroup.
_DQ_BARRIER = 3


@dataclass(frozen=True)
class FlashSm90BwdConfig:
    """The static shape of one compiled backward kernel.

    head_dim: D of Q, K, V (one of `HEAD_DIMS`); dtype: "float16" | "bfloat16"; causal: whether
    the causal diagonal is tested (its alignment is a runtime column offset); block_m: Q rows per
    step (the N of S^T = K Q^T, the K of dV += P^T dO); block_n: keys per CTA (two consumer
    warpgroups x 64); stages: smem slots of the Q/dO pipeline; dkv_fp32: dK/dV are written as
    fp32 per query head (GQA, summed on the host) instead of in `dtype`; dq_tma_reduce: each
    step's dQ tile is staged in shared memory and added to global memory by one TMA reduce-add
    per warpgroup (else by per-element `red.global.add.f32` from registers); defer_dkv_wait: a
    step does not wait for its dV and dK GEMMs, the next step's S^T and dP^T queue behind them
    (wgmma groups retire in order, so waiting for the next S^T frees P^T, dS^T and the Q/dO
    slot); early_dv: dV += P^T dO
    is issued as soon as P^T is in registers, under the dS^T arithmetic; prep_kernel: D and lse2
    come from the `sm90_bwd_prep` kernel instead of torch ops (host side only); producer_regs /
    consumer_regs: the setmaxnreg budgets.
    """

    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    block_m: int = 64
    block_n: int = 128
    stages: int = 2
    dkv_fp32: bool = False
    dq_tma_reduce: bool = False
    defer_dkv_wait: bool = False
    early_dv: bool = False
    prep_kernel: bool = False
    producer_regs: int = 24
    consumer_regs: int = 240

    def validate(self) -> "FlashSm90BwdConfig":
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"FlashSm90BwdConfig.head_dim must be one of {HEAD_DIMS}, got {self.head_dim!r}")
        if self.dtype not in _CUTLASS:
            raise ValueError(f"FlashSm90BwdConfig.dtype must be one of {tuple(_CUTLASS)}, got {self.dtype!r}")
        for name in ("causal", "dkv_fp32", "dq_tma_reduce", "defer_dkv_wait", "early_dv", "prep_kernel"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FlashSm90BwdConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.block_m != 64:
            raise ValueError(f"FlashSm90BwdConfig.block_m must be 64 (one wgmma N of S^T), got {self.block_m!r}")
        if self.block_n != 128:
            raise ValueError(f"FlashSm90BwdConfig.block_n must be 128 (two consumer warpgroups x 64 keys), "
                             f"got {self.block_n!r}")
        if self.stages not in (1, 2, 3):
            raise ValueError(f"FlashSm90BwdConfig.stages must be 1 to 3, got {self.stages!r}")
        for name in ("producer_regs", "consumer_regs"):
            r = getattr(self, name)
            if not isinstance(r, int) or r % 8 or not 24 <= r <= 256:
                raise ValueError(f"FlashSm90BwdConfig.{name} must be a multiple of 8 in [24, 256], got {r!r}")
        if 128 * (self.producer_regs + 2 * self.consumer_regs) > _REGS:
            raise ValueError(f"setmaxnreg budgets {self.producer_regs} + 2 x {self.consumer_regs} per thread exceed "
                             f"the {_REGS} registers of an SM for 3 warpgroups")
        if self.smem_bytes > _SMEM_LIMIT:
            raise ValueError(f"FlashSm90BwdConfig needs {self.smem_bytes} bytes of shared memory, over sm_90's "
                             f"{_SMEM_LIMIT}: lower stages")
        return self

    @property
    def threads(self) -> int:
        return 3 * THREADS_PER_WARPGROUP

    @property
    def smem_bytes(self) -> int:
        """K and V (block_n x D), `stages` slots of Q and dO (block_m x D), two dS^T buffers
        (block_n x block_m), all 16-bit; the fp32 dQ tile (block_m x D); lse2 and D per stage;
        barriers and alignment slack."""
        d = self.head_dim
        return (2 * (2 * self.block_n * d + 2 * self.stages * self.block_m * d + 2 * self.block_n * self.block_m)
                + 4 * self.block_m * d + 2 * 4 * self.block_m * self.stages + 2048)

    @property
    def tx_bytes_kv(self) -> int:
        return 2 * 2 * self.block_n * self.head_dim

    @property
    def tx_bytes_qdo(self) -> int:
        return 2 * 2 * self.block_m * self.head_dim + 2 * 4 * self.block_m


def bwd_config_for(head_dim: int, dtype: str, causal: bool, *, dkv_fp32: bool = False) -> FlashSm90BwdConfig:
    """The tile for a head dim: 64 Q rows per step against 128 keys per CTA."""
    return FlashSm90BwdConfig(head_dim=head_dim, dtype=dtype, causal=causal, dkv_fp32=dkv_fp32).validate()


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


def _transposed(t: cute.Tensor, rows: int, cols: int, stages: int) -> cute.Tensor:
    """(rows, cols, stages) smem tensor viewed (cols, rows, stages): an operand read MN-major
    (e.g. dO as the B of dV += P^T dO, N = head dim) from a buffer filled row-major."""
    return cute.composition(t, cute.make_layout((cols, rows, stages), stride=(rows, 1, rows * cols)))


class FlashAttentionSm90Bwd:
    """dq_accum (+)=, dk, dv for q, dO (B, Hq, Sq, D), k, v (B, Hkv, Sk, D), lse2 (base-2 lse,
    +inf for rows without keys) and D (B, Hq, Sq) fp32; dk, dv (B, Hq, Sk, D) per query head."""

    def __init__(self, config: FlashSm90BwdConfig):
        self.config = config.validate()
        self.dtype = _CUTLASS[config.dtype]
        self.dkv_dtype = cutlass.Float32 if config.dkv_fp32 else self.dtype
        self.roles = WarpRoles(consumer_warpgroups=2, producer_regs=config.producer_regs,
                               consumer_regs=config.consumer_regs)
        self.roles.validate()
        c = self.config
        # GMMA smem atoms (`cute_kernels.layouts.smem_atoms`). Q, dO, K, V are stored row-major
        # (D contiguous, K-major for S^T and dP^T; read through transposed views where they are
        # MN-major operands); dS^T is stored (keys, queries) with the queries contiguous.
        self.smem_atom = smem_layouts.gmma_atom("K", c.dtype, c.head_dim)
        self.ds_atom = smem_layouts.gmma_atom("K", c.dtype, c.block_m)
        # The fp32 dQ tile in 32B-swizzled 8 x 8 blocks: a thread's accumulator values then sit at
        # static offsets from one address (one XOR pattern per thread), and a warp's 64-bit stores
        # fill whole blocks without bank conflicts. The TMA reduce-add moves (64, 8) boxes.
        self.dq_atom = smem_layouts.gmma_atom("K", "float32", 8)

    # ---- host side -----------------------------------------------------------------------------

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
                 mDrow: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                 softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32, qhead_per_kvhead: cutlass.Int32,
                 stream):
        """Launch over (key blocks, query heads, batch)."""
        c = self.config
        d, bm, bn = c.head_dim, c.block_m, c.block_n
        # (B, H, S, D) -> (S, D, H, B): a TMA box is a (rows, D) slab of one (head, batch).
        to_sdhb = lambda t: cute.make_tensor(t.iterator, cute.select(t.layout, mode=[2, 3, 1, 0]))  # noqa: E731
        mQ, mK, mV, mdO, mdK, mdV = [to_sdhb(t) for t in (mQ, mK, mV, mdO, mdK, mdV)]

        smem_kv_layout = smem_layouts.staged_smem_layout(self.smem_atom, bn, d, 1)
        smem_qdo_layout = smem_layouts.staged_smem_layout(self.smem_atom, bm, d, c.stages)
        smem_ds_layout = smem_layouts.staged_smem_layout(self.ds_atom, bn, bm, 2)
        tma_k, tK = tma.make_tma_load(mK, smem_kv_layout, (bn, d), 1)
        tma_v, tV = tma.make_tma_load(mV, smem_kv_layout, (bn, d), 1)
        tma_q, tQ = tma.make_tma_load(mQ, smem_qdo_layout, (bm, d), 1)
        tma_do, tdO = tma.make_tma_load(mdO, smem_qdo_layout, (bm, d), 1)
        # lse2 and D (flat, padded to whole Q blocks) ride on the Q/dO barrier: one 64-float box each.
        smem_row_layout = cute.make_layout((bm, c.stages))
        # dQ tile: (bm, D/2) per consumer warpgroup for the TMA reduce-add, the same bytes viewed
        # (bm, D) for the accumulator's partition (column blocks of 32 follow the row blocks, so
        # warpgroup 1's half starts where the second "stage" does).
        smem_dq_layout = smem_layouts.staged_smem_layout(self.dq_atom, bm, d // 2, 2)
        smem_dq_full = smem_layouts.staged_smem_layout(self.dq_atom, bm, d, 1)
        mdQ2 = cute.make_tensor(mdQacc.iterator, cute.make_layout((mdQacc.shape[0] // d, d), stride=(d, 1)))
        tma_dq, tdQ = cpasync.make_tiled_tma_atom(cpasync.CopyReduceBulkTensorTileS2GOp(), mdQ2,
                                                  cute.slice_(smem_dq_layout, (None, None, 0)), (bm, d // 2))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_lse, tLSE = cpasync.make_tiled_tma_atom(g2s, mLSE2, cute.make_layout(bm), (bm,))
        tma_drow, tDrow = cpasync.make_tiled_tma_atom(g2s, mDrow, cute.make_layout(bm), (bm,))

        # S^T = K Q^T and dP^T = V dO^T: keys on M (one 64-row atom per consumer warpgroup).
        # Two copies of each MMA: the first k step overwrites (ACCUMULATE off), set once outside
        # any loop so no MMA state is carried through control flow.
        mma_sdp0 = wgmma.make_tiled_mma(self.dtype, self.dtype, "K", "K", cutlass.Float32, (2, 1, 1), bm)
        mma_sdp = wgmma.make_tiled_mma(self.dtype, self.dtype, "K", "K", cutlass.Float32, (2, 1, 1), bm)
        # dV += P^T dO, dK += dS^T Q: A from registers, B (dO, Q) MN-major through transposed views.
        mma_dkv = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, wgmma.operand_major("K"), wgmma.operand_major("MN"), cutlass.Float32,
            (2, 1, 1), tiler_mn=(64, d), a_source=warpgroup.OperandSource.RMEM)
        # dQ_blk = dS K: Q rows on M, the head dim split over the two warpgroups; dS (from dS^T)
        # and K both MN-major.
        mma_dq0 = wgmma.make_tiled_mma(self.dtype, self.dtype, "MN", "MN", cutlass.Float32, (1, 2, 1), d // 2)
        mma_dq = wgmma.make_tiled_mma(self.dtype, self.dtype, "MN", "MN", cutlass.Float32, (1, 2, 1), d // 2)

        @cute.struct
        class SharedStorage:
            bar_kv: cute.struct.MemRange[cutlass.Int64, 2]
            bar_qdo: cute.struct.MemRange[cutlass.Int64, 2 * c.stages]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_kv_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_kv_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_qdo_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_qdo_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_ds_layout)], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, cute.cosize(smem_dq_layout)], 1024]
            sLSE: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, bm * c.stages], 128]
            sDrow: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, bm * c.stages], 128]

        grid = (cute.ceil_div(mK.shape[0], bn), mQ.shape[2], mQ.shape[3])
        self.kernel(tma_k, tK, tma_v, tV, tma_q, tQ, tma_do, tdO, tma_lse, tLSE, tma_drow, tDrow, tma_dq, tdQ, mdQacc,
                    mdK, mdV,
                    softmax_scale, softmax_scale * LOG2_E, causal_offset, qhead_per_kvhead, mQ.shape[0],
                    smem_kv_layout, smem_qdo_layout, smem_ds_layout, smem_row_layout, smem_dq_layout, smem_dq_full,
                    mma_sdp0, mma_sdp, mma_dkv, mma_dq0, mma_dq, SharedStorage).launch(
                        grid=grid, block=[c.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    # ---- device side ---------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, tma_k: cute.CopyAtom, mK: cute.Tensor, tma_v: cute.CopyAtom, mV: cute.Tensor,
               tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_do: cute.CopyAtom, mdO: cute.Tensor,
               tma_lse: cute.CopyAtom, mLSE2: cute.Tensor, tma_drow: cute.CopyAtom, mDrow: cute.Tensor,
               tma_dq: cute.CopyAtom, mdQ2: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
               scale: cutlass.Float32, scale_log2: cutlass.Float32, causal_offset: cutlass.Int32,
               qhead_per_kvhead: cutlass.Int32, seqlen_q: cutlass.Int32,
               smem_kv_layout: cute.ComposedLayout, smem_qdo_layout: cute.ComposedLayout,
               smem_ds_layout: cute.ComposedLayout, smem_row_layout: cute.Layout,
               smem_dq_layout: cute.ComposedLayout, smem_dq_full: cute.ComposedLayout, mma_sdp0: cute.TiledMma,
               mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq0: cute.TiledMma, mma_dq: cute.TiledMma,
               SharedStorage: cutlass.Constexpr):
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
        sLSE = storage.sLSE.get_tensor(smem_row_layout)
        sdQ = storage.sdQ.get_tensor(smem_dq_layout.outer, swizzle=smem_dq_layout.inner)
        sdQ_full = storage.sdQ.get_tensor(smem_dq_full.outer, swizzle=smem_dq_full.inner)
        sDrow = storage.sDrow.get_tensor(smem_row_layout)

        n_block, head, batch = cute.arch.block_idx()
        kv_head = head // qhead_per_kvhead
        seqlen_k = mK.shape[0]
        m_block_min, m_block_max = block_info.m_block_range(
            n_block, seqlen_q, causal_offset, block_m=bm, block_n=bn, causal=c.causal, maximum=cutlass.max)
        m_count = cutlass.max(m_block_max - m_block_min, 0)
        # This (batch, head)'s first row in the flat, padded lse2 / D / dQ accumulator.
        rows_base = (batch * cute.arch.grid_dim()[1] + head) * ((seqlen_q + bm - 1) // bm * bm)
        cute.arch.sync_threads()  # the mbarrier inits are visible to every warp

        warpgroup_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        if warpgroup_idx == 0:
            self.roles.become_producer()
            if warp_idx == 0:
                gK = cute.local_tile(mK[None, None, kv_head, batch], (bn, d), (n_block, 0))
                gV = cute.local_tile(mV[None, None, kv_head, batch], (bn, d), (n_block, 0))
                gQ = cute.local_tile(mQ[None, None, head, batch], (bm, d), (None, 0))
                gdO = cute.local_tile(mdO[None, None, head, batch], (bm, d), (None, 0))
                gLSE = cute.local_tile(mLSE2, (bm,), (None,))
                gDrow = cute.local_tile(mDrow, (bm,), (None,))
                self.produce(tma_k, gK, sK, tma_v, gV, sV, tma_q, gQ, sQ, tma_do, gdO, sdO, tma_lse, gLSE, sLSE,
                             tma_drow, gDrow, sDrow, pipe_kv, pipe_qdo, m_block_min, rows_base // bm, m_count)
        else:
            self.roles.become_consumer()
            gdQ2 = cute.local_tile(mdQ2, (bm, d // 2), (None, None))
            self.consume((tma_dq, gdQ2, sdQ, sdQ_full), mma_sdp0, mma_sdp, mma_dkv, mma_dq0, mma_dq, sK, sV, sQ, sdO,
                         sdS, pipe_kv, pipe_qdo,
                         sLSE, sDrow, mdQacc, mdK[None, None, head, batch], mdV[None, None, head, batch], scale,
                         scale_log2, causal_offset, n_block, seqlen_q, seqlen_k, m_block_min, m_count, rows_base,
                         tidx - THREADS_PER_WARPGROUP)

    @cute.jit
    def produce(self, tma_k, gK, sK, tma_v, gV, sV, tma_q, gQ, sQ, tma_do, gdO, sdO, tma_lse, gLSE, sLSE,
                tma_drow, gDrow, sDrow, pipe_kv, pipe_qdo, m_block_min: cutlass.Int32, row_block_base: cutlass.Int32,
                m_count: cutlass.Int32):
        """Producer warp: K and V once (one barrier), then Q[m], dO[m], lse2[m], D[m] for m
        ascending (lse2 and D are flat: block m is box row_block_base + m)."""
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        tdOsdO, tdOgdO = cpasync.tma_partition(tma_do, 0, cute.make_layout(1), cute.group_modes(sdO, 0, 2),
                                               cute.group_modes(gdO, 0, 2))
        tLsL, tLgL = cpasync.tma_partition(tma_lse, 0, cute.make_layout(1), cute.group_modes(sLSE, 0, 1),
                                           cute.group_modes(gLSE, 0, 1))
        tDsD, tDgD = cpasync.tma_partition(tma_drow, 0, cute.make_layout(1), cute.group_modes(sDrow, 0, 1),
                                           cute.group_modes(gDrow, 0, 1))
        kv_state = hpipe.producer_state(1)
        pipe_kv.producer_acquire(kv_state)
        cute.copy(tma_k, tKgK, tKsK[None, 0], tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
        cute.copy(tma_v, tVgV, tVsV[None, 0], tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
        state = hpipe.producer_state(self.config.stages)
        for i in cutlass.range(m_count, unroll=1):
            m = m_block_min + i
            pipe_qdo.producer_acquire(state)
            cute.copy(tma_q, tQgQ[None, m], tQsQ[None, state.index], tma_bar_ptr=pipe_qdo.producer_get_barrier(state))
            cute.copy(tma_do, tdOgdO[None, m], tdOsdO[None, state.index],
                      tma_bar_ptr=pipe_qdo.producer_get_barrier(state))
            cute.copy(tma_lse, tLgL[None, row_block_base + m], tLsL[None, state.index],
                      tma_bar_ptr=pipe_qdo.producer_get_barrier(state))
            cute.copy(tma_drow, tDgD[None, row_block_base + m], tDsD[None, state.index],
                      tma_bar_ptr=pipe_qdo.producer_get_barrier(state))
            state.advance()
        pipe_qdo.producer_tail(state)

    @cute.jit
    def consume(self, dq_tma, mma_sdp0: cute.TiledMma, mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma,
                mma_dq0: cute.TiledMma, mma_dq: cute.TiledMma, sK, sV, sQ, sdO, sdS, pipe_kv, pipe_qdo,
                sLSE, sDrow, gdQacc, gdK, gdV, scale: cutlass.Float32, scale_log2: cutlass.Float32,
                causal_offset: cutlass.Int32, n_block: cutlass.Int32, seqlen_q: cutlass.Int32,
                seqlen_k: cutlass.Int32, m_block_min: cutlass.Int32, m_count: cutlass.Int32,
                rows_base: cutlass.Int32, ctidx: cutlass.Int32):
        """Consumer warpgroups (ctidx in [0, 256): keys 64 (ctidx // 128) .. + 63 of the block)."""
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
        tdQrdS = mma_dq.make_fragment_A(thr_dq.partition_A(_transposed(sdS, bn, bm, 2)))
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
        t_p, t_ds = acc_as_a(r_p), acc_as_a(r_ds)
        a_shape = thr_dkv.partition_shape_A((bn, bm))
        if cutlass.const_expr(str(cute.shape(t_p)) != str(a_shape)):
            raise RuntimeError(f"P^T's A view {cute.shape(t_p)} does not match wgmma's A fragment {a_shape}")
        s_mn, dp_mn = acc_mn_view(acc_s), acc_mn_view(acc_dp)
        # Tile-local (key, query) of each score this thread holds.
        coord_s = acc_mn_view(thr_sdp.partition_C(cute.make_identity_tensor((bn, bm))))
        coord_dq = thr_dq.partition_C(cute.make_identity_tensor((bm, d)))
        ncols = cute.size(s_mn.shape[1])
        if cutlass.const_expr(ncols != len(mn_offsets(bm)[1])):
            raise RuntimeError(f"S^T's column view has {ncols} columns, mn_offsets({bm}) {len(mn_offsets(bm)[1])}")
        stmatrix = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_r2s = cute.make_tiled_copy_C(stmatrix, mma_sdp).get_slice(ctidx)
        ds_ready = pipeline.NamedBarrier(barrier_id=_DS_BARRIER, num_threads=_CONSUMER_THREADS)
        key_base = n_block * bn
        # The TMA reduce-add of dQ: (atom, gmem tiles (bm, D/2, row blocks, 2), this warpgroup's
        # smem half, the accumulator-shaped smem view, the warpgroup's named barrier, whether this
        # thread issues the copies).
        tma_dq, gdQ2, sdQ, sdQ_full = dq_tma
        wg = ctidx // THREADS_PER_WARPGROUP
        dq_red = (tma_dq, gdQ2, sdQ, thr_dq.partition_C(sdQ_full[None, None, 0]),
                  [pipeline.NamedBarrier(barrier_id=_DQ_BARRIER + i, num_threads=THREADS_PER_WARPGROUP)
                   for i in (0, 1)], wg, ctidx % THREADS_PER_WARPGROUP == 0)

        pipe_kv.consumer_wait(hpipe.consumer_state(1))
        state = hpipe.consumer_state(c.stages)
        prev = state.clone()
        for i in cutlass.range(m_count, unroll=1):
            state, prev = self.step(m_block_min + i, i % 2, i > 0, state, prev, mma_sdp0, mma_sdp, mma_dkv, mma_dq0,
                              mma_dq, tSrK,
                              tSrQ, tdPrV, tdPrdO, tdVrdOt, tdKrQt, tdQrdS, tdQrKt, acc_s, acc_dp, acc_dv, acc_dk,
                              acc_dq, r_p, r_ds, t_p, t_ds, s_mn, dp_mn, coord_s, coord_dq, thr_r2s,
                              stmatrix, sdS, ds_ready, pipe_qdo, sLSE, sDrow, gdQacc, scale, scale_log2,
                              causal_offset, key_base, rows_base, seqlen_k, dq_red)
        if cutlass.const_expr(c.defer_dkv_wait):
            wgmma.wait_group(0)  # the last dV, dK GEMMs
            if m_count > 0:
                pipe_qdo.consumer_release(prev)
        if cutlass.const_expr(c.dq_tma_reduce):
            if ctidx % THREADS_PER_WARPGROUP == 0:
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
             t_p, t_ds, s_mn, dp_mn, coord_s, coord_dq, thr_r2s, stmatrix, sdS, ds_ready, pipe_qdo,
             sLSE, sDrow, gdQacc, scale: cutlass.Float32, scale_log2: cutlass.Float32,
             causal_offset: cutlass.Int32, key_base: cutlass.Int32, rows_base: cutlass.Int32,
             seqlen_k: cutlass.Int32, dq_red):
        """Q block m against this CTA's keys; dS^T goes through smem buffer `buf`. Returns the
        advanced pipeline state and this step's (whose slot a deferred release frees), both
        loop-carried by the caller."""
        c = self.config
        bm = c.block_m
        row_base = m * bm
        first = rows_base + row_base
        t_row, t_col = coord_s[0, 0]
        row_offs, col_offs = mn_offsets(bm)
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

        # P^T = 2^(S^T scale_log2 - lse2), 0 past Sk and above the causal diagonal; dS^T = P^T (dP^T - D).
        # lse2 and D of this thread's queries (columns) come from this stage's smem copy; the host
        # pads both to whole Q blocks (lse2 = +inf, D = 0 past Sq, so P = 0 there).
        # Key key_base + t_row + row_offs[r] exists while row_offs[r] < key_room, and is seen by
        # query row_base + t_col + col_offs[j] when row_offs[r] - col_offs[j] <= diag.
        key_room = seqlen_k - key_base - t_row
        diag = row_base + causal_offset - key_base + t_col - t_row
        for r in cutlass.range_constexpr(cute.size(s_mn.shape[0])):
            key_ok = cutlass.Int32(row_offs[r]) < key_room
            for j in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
                keep = key_ok
                if cutlass.const_expr(c.causal):
                    keep = keep & (cutlass.Int32(row_offs[r] - col_offs[j]) <= diag)
                p = cute.math.exp2(s_mn[r, j] * scale_log2 - sLSE[t_col + col_offs[j], stage], fastmath=True)
                s_mn[r, j] = cutlass.select_(keep, p, cutlass.Float32(0.0))
        r_p.store(acc_s.load().to(self.dtype))
        if cutlass.const_expr(c.early_dv):
            # dV += P^T dO runs under the dS^T arithmetic.
            wgmma.fence()
            for kb in cutlass.range_constexpr(cute.size(t_p, mode=[2])):
                cute.gemm(mma_dkv, acc_dv, t_p[None, None, kb], tdVrdOt[None, None, kb, stage], acc_dv)
            wgmma.commit_group()
            wgmma.wait_group(1)  # dP^T landed; dV in flight
        else:
            wgmma.wait_group(0)
        for r in cutlass.range_constexpr(cute.size(s_mn.shape[0])):
            for j in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
                dp_mn[r, j] = s_mn[r, j] * (dp_mn[r, j] - sDrow[t_col + col_offs[j], stage])
        r_ds.store(acc_dp.load().to(self.dtype))

        # dS^T -> smem (the A of dQ for both warpgroups). Buffer `buf` was last read by the dQ
        # GEMM two steps ago, which every consumer waited for before last step's barrier.
        cute.copy(stmatrix, thr_r2s.retile(r_ds), thr_r2s.partition_D(sdS[None, None, buf]))
        cute.arch.fence_proxy("async.shared", space="cta")
        ds_ready.arrive_and_wait()

        wgmma.fence()
        for kb in cutlass.range_constexpr(cute.size(tdQrdS, mode=[2])):
            cute.gemm(mma_dq0 if kb == 0 else mma_dq, acc_dq, tdQrdS[None, None, kb, buf], tdQrKt[None, None, kb, 0],
                      acc_dq)
        wgmma.commit_group()
        if cutlass.const_expr(not c.early_dv):
            for kb in cutlass.range_constexpr(cute.size(t_p, mode=[2])):
                cute.gemm(mma_dkv, acc_dv, t_p[None, None, kb], tdVrdOt[None, None, kb, stage], acc_dv)
        for kb in cutlass.range_constexpr(cute.size(t_ds, mode=[2])):
            cute.gemm(mma_dkv, acc_dk, t_ds[None, None, kb], tdKrQt[None, None, kb, stage], acc_dk)
        wgmma.commit_group()
        wgmma.wait_group(1)  # dQ_blk landed (and an early dV); dK (and dV) still in flight

        # The fp32 accumulator is padded to whole Q blocks (rows past Sq receive dS = 0), so
        # neither path needs a predicate.
        if cutlass.const_expr(c.dq_tma_reduce):
            self.reduce_dq_tma(acc_dq, scale, (rows_base + row_base) // bm, dq_red)
        else:
            t_q, t_d = coord_dq[0]
            base = gdQacc.iterator + (cutlass.Int64(first + t_q) * c.head_dim + t_d)
            dq_offs = acc_offsets(c.head_dim // 2, c.head_dim)
            for j in cutlass.range_constexpr(cute.size(acc_dq)):
                cute.arch.red(base + dq_offs[j], acc_dq[j] * scale, op="add", dtype=cutlass.Float32, sem="relaxed",
                              scope="gpu")
        if cutlass.const_expr(not c.defer_dkv_wait):
            wgmma.wait_group(0)
            pipe_qdo.consumer_release(state)
        prev = state.clone()
        state.advance()
        return state, prev

    @cute.jit
    def reduce_dq_tma(self, acc_dq, scale: cutlass.Float32, row_block: cutlass.Int32, dq_red):
        """scale * dQ_blk -> this warpgroup's half of the smem tile -> one TMA reduce-add into
        rows [64 row_block, + 64) of the flat accumulator. The tile is rewritten only after the
        previous step's reduce has read it (bulk wait by the issuing thread, then the barrier)."""
        tma_dq, gdQ2, sdQ, tdQsdQ, bars, wg, issuer = dq_red
        if issuer:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        self.wg_sync(bars, wg)
        for j in cutlass.range_constexpr(cute.size(acc_dq)):
            tdQsdQ[j] = acc_dq[j] * scale
        cute.arch.fence_proxy("async.shared", space="cta")
        self.wg_sync(bars, wg)
        if issuer:
            t_s, t_g = cpasync.tma_partition(tma_dq, 0, cute.make_layout(1),
                                             cute.group_modes(sdQ[None, None, wg], 0, 2),
                                             cute.group_modes(gdQ2[None, None, row_block, wg], 0, 2))
            cute.copy(tma_dq, t_s, t_g)
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def wg_sync(self, bars, wg: cutlass.Int32):
        if wg == 0:
            bars[0].arrive_and_wait()
        else:
            bars[1].arrive_and_wait()


# ---- compile-only variants ------------------------------------------------------------------------


def build_variant(head_dim: int = 128, dtype: str = "bfloat16", causal: bool = False, dkv_fp32: bool = False,
                  **tile):
    """A CompileJob for the backward over fake (B, H, S, D) tensors with symbolic sizes."""
    from dataclasses import replace

    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    config = replace(bwd_config_for(head_dim, dtype, causal, dkv_fp32=dkv_fp32), **tile).validate()
    return CompileJob(_kernel_for(config), _fake_args(config, fake_tensor, fake_stream),
                      ("attention.sm90_flash_bwd", config))


def _fake_args(config: FlashSm90BwdConfig, fake_tensor, fake_stream):
    t = _CUTLASS[config.dtype]
    dkv_t = cutlass.Float32 if config.dkv_fp32 else t
    q, k, v, do = [fake_tensor(t, 4, leading_dim=3, assumed_align=16, stride_divisibility=8) for _ in range(4)]
    lse2, drow, dq = [fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=16) for _ in range(3)]
    dk, dv = [fake_tensor(dkv_t, 4, leading_dim=3, assumed_align=16) for _ in range(2)]
    return (q, k, v, do, lse2, drow, dq, dk, dv, cutlass.Float32(1.0 / math.sqrt(config.head_dim)),
            cutlass.Int32(0), cutlass.Int32(1), fake_stream())


BWD_VARIANT_CONFIGS = {
    f"d{d}_{dt}{'_causal' if causal else ''}{'_gqa' if gqa else ''}": {"head_dim": d, "dtype": dt, "causal": causal,
                                                                      "dkv_fp32": gqa}
    for d, dt, causal, gqa in (
        (64, "float16", True, False), (64, "bfloat16", False, True), (128, "bfloat16", False, False),
        (128, "bfloat16", True, False), (128, "float16", True, True),
    )
}
# The schedule options (compile-checked here; see the module docstring): the TMA reduce-add of
# dQ alone, and with the early dV and the deferred dV/dK wait.
BWD_VARIANT_CONFIGS["d128_bfloat16_tma"] = {"head_dim": 128, "dtype": "bfloat16", "causal": False,
                                            "dq_tma_reduce": True}
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_tma_early_defer"] = {
    "head_dim": 128, "dtype": "bfloat16", "causal": True, "dq_tma_reduce": True, "early_dv": True,
    "defer_dkv_wait": True}
BWD_VARIANT_CONFIGS["d64_float16_causal_gqa_tma_early_defer"] = {
    "head_dim": 64, "dtype": "float16", "causal": True, "dkv_fp32": True, "dq_tma_reduce": True, "early_dv": True,
    "defer_dkv_wait": True}


def _register() -> None:
    from cute_kernels.runtime import register_variant

    register_variant("attention.sm90_flash_bwd", build_variant, configs=BWD_VARIANT_CONFIGS,
                     requires={"HGMMA", "UTMALDG"})


_register()


# ---- host side ------------------------------------------------------------------------------------


def supports_backward(problem) -> str | None:
    """None when this backward takes `problem` (an `api.AttentionProblem`), else why not."""
    if str(problem.dtype).removeprefix("torch.") not in _CUTLASS:
        return f"the sm90_flash backward takes float16 and bfloat16, not {problem.dtype}"
    d = problem.head_dim
    if d not in HEAD_DIMS:
        return (f"the sm90_flash backward takes head dims {HEAD_DIMS}, not {d} (96: dQ's head-dim split "
                "does not fall on a swizzle atom; 192 and 256: the dK and dV accumulators of a 128-key "
                "block do not fit in registers)")
    if problem.head_dim_v != d:
        return f"the sm90_flash backward needs the value head dim ({problem.head_dim_v}) equal to D ({d})"
    if getattr(problem, "window_left", None) is not None:
        return "sliding windows are not implemented in the sm90_flash backward"
    if not (math.isfinite(problem.scale) and problem.scale > 0):
        return f"scale {problem.scale} must be finite and > 0"
    return None


_KERNELS: dict = {}


def _kernel_for(config: FlashSm90BwdConfig) -> FlashAttentionSm90Bwd:
    kernel = _KERNELS.get(config)
    if kernel is None:
        kernel = _KERNELS[config] = FlashAttentionSm90Bwd(config)
    return kernel


def _tma_ready(t):
    """`t` itself when TMA can read it (16-byte aligned pointer, unit last stride, other strides
    multiples of 8 elements), else a contiguous copy."""
    if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 8 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
        return t.contiguous()
    return t


def backward(dout, q, k, v, out, lse, problem, *, deterministic: bool = False, config=None):
    """(dq, dk, dv) for 4-D q (B, Hq, Sq, D), k, v (B, Hkv, Sk, D), the forward's out and lse
    (B, Hq, Sq) (natural log, -inf for rows that saw no key) and the output gradient dout, on
    torch's current stream. dq, dk, dv are new contiguous tensors of q's dtype; with GQA dk and
    dv sum over the query heads sharing a key/value head.

    dQ is summed with fp32 atomics, so its rounding may differ from run to run; with
    `deterministic=True` the call goes to the sm80 backward (a separate dQ pass, no atomics).
    `config`: a `FlashSm90BwdConfig` to use instead of `bwd_config_for` (benchmarks, bisection);
    its head dim, dtype, causality and dkv_fp32 must match the problem."""
    import torch

    why = supports_backward(problem)
    if why is not None:
        raise ValueError(f"sm90_flash backward: {why}")
    if deterministic:
        from .sm80_flash_bwd import backward as sm80_backward
        from .sm80_flash_bwd import supports_backward as sm80_supports

        why = sm80_supports(problem)
        if why is not None:
            raise ValueError(f"deterministic backward unavailable: {why}")
        return sm80_backward(dout, q, k, v, out, lse, problem)

    from cute_kernels.runtime import compile_kernel, current_stream, from_torch

    group = problem.heads_q // problem.heads_kv
    dtype_name = str(problem.dtype).removeprefix("torch.")
    if config is not None:
        config = config.validate()
        want = (problem.head_dim, dtype_name, problem.causal is not None, group > 1)
        if (config.head_dim, config.dtype, config.causal, config.dkv_fp32) != want:
            raise ValueError(f"config {config} does not match the problem (head_dim, dtype, causal, dkv_fp32) = {want}")
    else:
        config = _CONFIGS.get((problem.head_dim, dtype_name, problem.causal is not None, group > 1))
    if config is None:
        config = bwd_config_for(problem.head_dim, dtype_name, problem.causal is not None, dkv_fp32=group > 1)
        _CONFIGS[(problem.head_dim, dtype_name, problem.causal is not None, group > 1)] = config
    q, k, v, dout = (_tma_ready(t) for t in (q, k, v, dout))
    # Pre-processing: D_i = dO_i . O_i; lse in base 2, rows that saw no key enter with +inf (P = 0).
    # All three are padded to whole Q blocks (lse2 = +inf and D = 0 in the padding, so P = 0 there)
    # and passed flat: the kernel reads and adds without predicates.
    b, hq, sq, sk, d = problem.batch, problem.heads_q, problem.seqlen_q, problem.seqlen_k, problem.head_dim
    sq_pad = -(-sq // config.block_m) * config.block_m
    if config.prep_kernel and dout.numel() < 2**31:
        from .sm90_bwd_prep import preprocess

        d_rows, lse2 = preprocess(dout, out, lse, config.block_m)
    else:  # torch ops (also past the prep kernel's 32-bit element offsets)
        d_rows = torch.zeros((b, hq, sq_pad), dtype=torch.float32, device=q.device)
        d_rows[:, :, :sq] = (dout.float() * out.float()).sum(-1)
        lse2 = torch.full((b, hq, sq_pad), math.inf, dtype=torch.float32, device=q.device)
        lse2[:, :, :sq] = torch.where(torch.isneginf(lse), math.inf, lse.float() * LOG2_E)
    dq_acc = torch.zeros((b, hq, sq_pad, d), dtype=torch.float32, device=q.device)
    if group > 1:
        dk_h = torch.empty((b, hq, sk, d), dtype=torch.float32, device=q.device)
        dv_h = torch.empty((b, hq, sk, d), dtype=torch.float32, device=q.device)
    else:
        dk_h = torch.empty((b, hq, sk, d), dtype=k.dtype, device=k.device)
        dv_h = torch.empty((b, hq, sk, d), dtype=v.dtype, device=v.device)
    t4 = lambda t: from_torch(t, assumed_align=16, leading_dim=3)  # noqa: E731
    t1 = lambda t: from_torch(t.view(-1), assumed_align=16, leading_dim=0)  # noqa: E731
    _, offset, _ = launch_scalars(problem)
    args = (t4(q), t4(k), t4(v), t4(dout), t1(lse2), t1(d_rows), t1(dq_acc), t4(dk_h), t4(dv_h),
            cutlass.Float32(problem.scale), cutlass.Int32(offset), cutlass.Int32(group))
    stream = current_stream()
    fn = compile_kernel(_kernel_for(config), *args, stream, key=("attention.sm90_flash_bwd", config))
    fn(*args, stream)
    # Post-processing: dQ to q's dtype; GQA's per-query-head dK, dV summed over each group.
    dq = dq_acc[:, :, :sq].to(q.dtype)
    if group > 1:
        dk = dk_h.view(b, problem.heads_kv, group, sk, d).sum(2).to(k.dtype)
        dv = dv_h.view(b, problem.heads_kv, group, sk, d).sum(2).to(v.dtype)
    else:
        dk, dv = dk_h, dv_h
    return dq, dk, dv


_CONFIGS: dict = {}
