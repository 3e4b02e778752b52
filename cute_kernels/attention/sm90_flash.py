"""Rung `sm90_flash`: FlashAttention-3's forward pass with Hopper's TMA and warpgroup MMA.

A CTA owns 128 query rows of one (batch, head) and is three warpgroups (`hopper.warp_roles`;
with `consumer_warpgroups=3`, `config_for`'s choice up to D = 64, 192 rows and four):

    producer   warpgroup 0 gives registers back (setmaxnreg.dec); one warp TMA-loads Q once and
               K and V blocks (descending, masked blocks first, as `block_info` orders them)
               into two mbarrier pipelines of `stages` 128B-swizzled slots each, in the order
               the consumers use them (`k_lead`): K of the first block, Q, then K of block n
               before V of block n + 1
    consumers  warpgroups 1 and 2 grow their registers (setmaxnreg.inc); each owns 64 rows:
               S = Q K^T by wgmma SS, mask, online softmax in registers (`sm90_softmax`: base 2,
               scale folded in, fp32 statistics), P converted to 16 bits in registers (two
               values per instruction, `sm90_softmax.to_16bit`) and O += P V by wgmma RS (P
               re-viewed as the A operand, `sm90_layouts.p_as_a_layout`)

The consumer loop overlaps within a warpgroup: block n's S = Q K_n is issued together with
block n+1's O += P V (the previous block, visited before it), softmax of S_n runs while the
P V GEMM is still in flight, and O is rescaled only after it retires. With `pingpong` the
consumer warpgroups also take turns issuing those GEMMs (a ring of named barriers 2, 3, ...), so
one's softmax runs under the others' tensor-core work.

Epilogue: O /= l, converted, written with stmatrix into Q's buffer (each warpgroup into its
own rows, which only it read), then one TMA store of the tile (rows past the sequence end are
clipped by the tensor map); LSE (natural log) by one thread of each row quad.

Masks (`mask`, `block_info`): with `causal` the upper diagonal j <= i + causal_offset, with
`local` (a sliding window's left bound) also j >= i + offset_lo; both offsets are runtime
Int32s (`problem_checks.launch_scalars` / `window_scalars`), so one kernel serves every
alignment, window and length. A Q block visits K/V blocks [n_block_min, n_block_max), highest
first; without `local` n_block_min = 0 and only the blocks from n_unmasked_end up are masked,
with it every visited block is. An empty range (rows that see no key) writes O = 0, LSE = -inf.

Causal work is balanced by launching the longest Q tiles first: with `lpt` (`config_for` sets it
for causal problems without a left window bound) the grid is one dimension mapped by
`block_info.lpt_tile` (groups of heads whose K/V fit L2, last Q block first within a group);
otherwise m_block is reversed along grid x.

Measured on an H200 (bf16, N(0,1), do_bench medians, FlashAttention-4 4.0.0b36 and cuDNN SDPA
in the same process; ms ours / FA4 / cuDNN): B4 H32 S2048 D128 0.447 / 0.434 / 0.448, causal
0.274 / 0.263 / 0.284; B2 H16 S8192 D128 1.671 / 1.611 / 1.766, causal 0.905 / 0.887 / 1.042;
B8 H16 S2048 D64 0.300 / 0.281 / 0.305, causal 0.197 / 0.182 / 0.184; B2 H16 S4096 D256
0.754 / 0.765 / 0.873, causal 0.438 / 0.444 / 0.533: geomean 0.97x FA4 and 1.07x cuDNN (a
second run of the same code: 0.95x and 1.06x; S8192 D128 drifts most, 0.90x to 0.96x). The
previous state was 0.90x and 0.95x: converting P two values per instruction took D = 256 from
0.85x to 1.01x FA4 (its 80-column rows went one value at a time plus a byte permute), and the
192 x 128 tile with three consumers took D = 64 from 0.82x to 0.94x (causal 0.88x to 0.92x,
same run). Measured slower on these cases and left off by `config_for`: rescale_threshold 8
(3-6%), rescale_early (up to 7%, neutral at D = 64), exp2_poly 1 (10%: the consumers are
issue-bound, not MUFU-bound), 3 K/V stages, block_n 176 up to D = 128 and 64 at D = 256, and
no ping-pong at D = 256.

Score features (`features`): with `softcap` each S block is turned into tanh(S * scale / c)
right after its GEMM lands (before the mask; `softmax.apply_softcap`) and the softmax runs with
scale_log2 = c log2 e; with `sinks` the head's sink logit (an fp32 (Hq,) tensor) joins every
row's denominator in the epilogue (`OnlineSoftmax.finalize`). Both are compile-time flags of
the config, their values runtime arguments.

Varlen (`config.varlen`, `Sm90FlashRung.varlen`): packed sequences delimited by cu_seqlens (and
seqused_k), one CTA per (q tile of max_seqlen_q, head, sequence slot), the slots mapped to
sequences by an order of decreasing work (`launch_order`, from the offsets the host validated,
kept on the device per batch: the longest launched first; within a sequence the last Q tile
first). Q, K, V and O go through ragged tensor maps (`ragged`): each sequence's boxes are
clipped at its own end, so loads past it read zeros (a neighbour's rows, NaN or not, never
enter) and the TMA store of O writes only its rows.

Layouts come from `cute_kernels.layouts` (GMMA smem atoms via `hopper.smem_layouts`, the
register views via `sm90_layouts`) and are converted with `runtime.to_cute` while tracing.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from cute_kernels.hopper import smem_layouts, tma, wgmma
from cute_kernels.runtime import compile_kernel, tvm_ffi_available
from cute_kernels.runtime.plan_cache import WarmCache, memo
from cute_kernels.hopper import pipeline as hpipe
from cute_kernels.hopper.warp_roles import THREADS_PER_WARPGROUP, WarpRoles

from . import block_info
from .features import feature_reason
from .forward_host import compile_tvm_ffi
from .problem_checks import common_reason, config_of, launch_scalars, softcap_scalars, window_scalars
from .ragged import ragged, seq_rows
from .softmax import LOG2_E, apply_softcap
from .sm90_layouts import FlashSm90Config, config_for, short_rows
from .sm90_softmax import Sm90Softmax, acc_as_a, acc_mn_view, mask_scores, to_16bit

__all__ = ["FlashAttentionSm90", "FlashSm90Config", "config_for", "RUNG", "build_variant"]

_CUTLASS = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
# Threads of one ping-pong turn barrier: the warpgroup that waits and the one that hands over.
_TURN_THREADS = 2 * THREADS_PER_WARPGROUP
# Named barrier ids (0 is __syncthreads): the epilogue's "O is in shared memory" barrier over
# all consumer warpgroups is 1; warpgroup w's turn to issue GEMMs is 2 + w.
_EPILOGUE_BARRIER = 1
_TURN_BARRIER = 2


def _transposed(t: cute.Tensor, rows: int, cols: int, stages: int) -> cute.Tensor:
    """(rows, cols, stages) smem tensor viewed (cols, rows, stages): V read as wgmma's
    MN-major B operand (N = head dim, K = keys) from the buffer TMA filled row-major."""
    return cute.composition(t, cute.make_layout((cols, rows, stages), stride=(rows, 1, rows * cols)))


class FlashAttentionSm90:
    """out, lse = attention(q, k, v) for q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D), out like q,
    lse (B, Hq, Sq) fp32; head h reads K/V head h // qhead_per_kvhead."""

    def __init__(self, config: FlashSm90Config):
        self.config = config.validate()
        self.dtype = _CUTLASS[config.dtype]
        self.roles = WarpRoles(consumer_warpgroups=config.consumer_warpgroups, producer_regs=config.producer_regs,
                               consumer_regs=config.consumer_regs)
        # No roles.validate(): it allows two consumer warpgroups at most (the GEMM's limit), and the
        # config has already checked these budgets against the register file for its own count.
        c = self.config
        # GMMA smem atoms (`cute_kernels.layouts.smem_atoms`), K-major over the head dim: Q, K and V
        # are all stored row-major (D contiguous); V is read through a transposed view.
        self.smem_atom = smem_layouts.gmma_atom("K", c.dtype, c.head_dim)

    # ---- host side -----------------------------------------------------------------------------

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32, offset_lo: cutlass.Int32,
                 qhead_per_kvhead: cutlass.Int32, stream, score_scale: cutlass.Float32,
                 mSinks: cute.Tensor | None = None, mCuSeqlensQ: cute.Tensor | None = None,
                 mCuSeqlensK: cute.Tensor | None = None, mSeqUsedK: cute.Tensor | None = None,
                 mOrder: cute.Tensor | None = None, max_seqlen_q: cutlass.Int32 | None = None,
                 bottom_right: cutlass.Int32 | None = None):
        """Launch over (q tiles, heads, batch). Row i sees keys j <= i + causal_offset (with
        `causal`) and j >= i + offset_lo (with `local`; ignored otherwise). softmax_scale and
        score_scale are `problem_checks.softcap_scalars` (with `softcap`: the cap c and scale / c;
        score_scale is unused otherwise); mSinks: (Hq,) fp32 sink logits (with `sinks`).

        Varlen (`config.varlen`): q, k, v, o are the packed (T, H, D) tensors viewed (1, H, T, D),
        lse (H, T) viewed (1, H, T); mCuSeqlensQ/K (B + 1,) int32, mSeqUsedK (B,) int32 or None,
        mOrder (B,) int32 the sequences in launch order (longest first), max_seqlen_q the grid's
        tiles; both offsets relative to each sequence's base bottom_right * (Sk_b - Sq_b)."""
        c = self.config
        d, bm, bn = c.head_dim, c.block_m, c.block_n
        # (B, H, S, D) -> (S, D, H, B): a TMA box is a (rows, D) slab of one (head, batch), and the
        # tensor map clips rows past S (zero-filled loads, dropped stores).
        qkvo = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[2, 3, 1, 0])) for t in (mQ, mK, mV, mO)]
        if cutlass.const_expr(c.varlen):
            # Ragged views (`ragged`): the tensor map then clips each sequence's rows at its end.
            qkvo = [ragged(t) for t in qkvo]
        mQ, mK, mV, mO = qkvo
        mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))

        smem_q_layout = smem_layouts.staged_smem_layout(self.smem_atom, bm, d, 1)
        smem_kv_layout = smem_layouts.staged_smem_layout(self.smem_atom, bn, d, c.stages)
        tma_q, tQ = tma.make_tma_load(mQ, smem_q_layout, (bm, d), 1)
        tma_k, tK = tma.make_tma_load(mK, smem_kv_layout, (bn, d), 1)
        tma_v, tV = tma.make_tma_load(mV, smem_kv_layout, (bn, d), 1)
        tma_o, tO = tma.make_tma_store(mO, smem_q_layout, (bm, d))

        wgs = (c.consumer_warpgroups, 1, 1)  # one 64-row wgmma atom per consumer warpgroup
        tiled_mma_qk = wgmma.make_tiled_mma(self.dtype, self.dtype, "K", "K", cutlass.Float32, wgs, bn)
        # A second copy for the first k step of S = Q K^T, which overwrites S (ACCUMULATE off): each
        # MMA's field is set once, outside any loop, so no MMA state is carried through control flow.
        tiled_mma_qk0 = wgmma.make_tiled_mma(self.dtype, self.dtype, "K", "K", cutlass.Float32, wgs, bn)
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, wgmma.operand_major("K"), wgmma.operand_major("MN"), cutlass.Float32,
            wgs, tiler_mn=(64, d), a_source=warpgroup.OperandSource.RMEM)

        @cute.struct
        class SharedStorage:
            bar_q: cute.struct.MemRange[cutlass.Int64, 2]
            bar_k: cute.struct.MemRange[cutlass.Int64, 2 * c.stages]
            bar_v: cute.struct.MemRange[cutlass.Int64, 2 * c.stages]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_q_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_kv_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(smem_kv_layout)], 1024]

        grid = (cute.ceil_div(mQ.shape[0], bm), mQ.shape[2], mQ.shape[3])
        if cutlass.const_expr(c.lpt):
            grid = (cute.ceil_div(mQ.shape[0], bm) * mQ.shape[2] * mQ.shape[3], 1, 1)
        if cutlass.const_expr(c.varlen):
            grid = (cute.ceil_div(max_seqlen_q, bm), mQ.shape[2], mCuSeqlensQ.shape[0] - 1)
        self.kernel(tma_q, tQ, tma_k, tK, tma_v, tV, tma_o, tO, mLSE, softmax_scale * LOG2_E, causal_offset,
                    offset_lo, qhead_per_kvhead, smem_q_layout, smem_kv_layout, tiled_mma_qk, tiled_mma_qk0, tiled_mma_pv,
                    SharedStorage, score_scale, mSinks, mCuSeqlensQ, mCuSeqlensK, mSeqUsedK, mOrder,
                    bottom_right).launch(grid=grid, block=[c.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    # ---- device side ---------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor,
               tma_v: cute.CopyAtom, mV: cute.Tensor, tma_o: cute.CopyAtom, mO: cute.Tensor, mLSE: cute.Tensor,
               scale_log2: cutlass.Float32, causal_offset: cutlass.Int32, offset_lo: cutlass.Int32,
               qhead_per_kvhead: cutlass.Int32, smem_q_layout: cute.ComposedLayout, smem_kv_layout: cute.ComposedLayout,
               tiled_mma_qk: cute.TiledMma, tiled_mma_qk0: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
               SharedStorage: cutlass.Constexpr, score_scale: cutlass.Float32, mSinks: cute.Tensor | None,
               mCuSeqlensQ: cute.Tensor | None, mCuSeqlensK: cute.Tensor | None, mSeqUsedK: cute.Tensor | None,
               mOrder: cute.Tensor | None, bottom_right: cutlass.Int32 | None):
        c = self.config
        d, bm, bn = c.head_dim, c.block_m, c.block_n
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            tma.prefetch(tma_q, tma_k, tma_v, tma_o)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * c.consumer_warpgroups)
        pipe_q = pipeline.PipelineTmaAsync.create(barrier_storage=storage.bar_q.data_ptr(), num_stages=1,
                                                  producer_group=producer, consumer_group=consumers,
                                                  tx_count=c.tx_bytes_q)
        pipe_k = pipeline.PipelineTmaAsync.create(barrier_storage=storage.bar_k.data_ptr(), num_stages=c.stages,
                                                  producer_group=producer, consumer_group=consumers,
                                                  tx_count=c.tx_bytes_kv)
        pipe_v = pipeline.PipelineTmaAsync.create(barrier_storage=storage.bar_v.data_ptr(), num_stages=c.stages,
                                                  producer_group=producer, consumer_group=consumers,
                                                  tx_count=c.tx_bytes_kv)
        sQ = storage.sQ.get_tensor(smem_q_layout.outer, swizzle=smem_q_layout.inner)[None, None, 0]
        sK = storage.sK.get_tensor(smem_kv_layout.outer, swizzle=smem_kv_layout.inner)
        sV = storage.sV.get_tensor(smem_kv_layout.outer, swizzle=smem_kv_layout.inner)

        # This CTA's work: the longest causal tiles are launched first.
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        if cutlass.const_expr(c.lpt):
            group = block_info.lpt_heads_per_group(seqlen_k, d, maximum=cutlass.max)
            m_block, head, batch = block_info.lpt_tile(cute.arch.block_idx()[0], (seqlen_q + bm - 1) // bm,
                                                       mQ.shape[2], mQ.shape[3], group, minimum=cutlass.min)
        else:
            m_block = cute.arch.grid_dim()[0] - 1 - cute.arch.block_idx()[0]
            _, head, batch = cute.arch.block_idx()
        kv_head = head // qhead_per_kvhead
        # This CTA's (S, D) views of Q, K, V, O and (S,) of LSE.
        if cutlass.const_expr(c.varlen):
            batch = mOrder[batch]
            offset_q, offset_k = mCuSeqlensQ[batch], mCuSeqlensK[batch]
            seqlen_q = mCuSeqlensQ[batch + 1] - offset_q
            seqlen_k = mCuSeqlensK[batch + 1] - offset_k
            if cutlass.const_expr(mSeqUsedK is not None):
                seqlen_k = mSeqUsedK[batch]  # the host checked it is within the sequence's rows
            base = bottom_right * (seqlen_k - seqlen_q)
            causal_offset, offset_lo = causal_offset + base, offset_lo + base
            # Row r of the sequence is row T - S_b + r of its ragged view, at its last mode's offset + S_b.
            mQ_s, mO_s = seq_rows(mQ, head, offset_q, seqlen_q), seq_rows(mO, head, offset_q, seqlen_q)
            mK_s, mV_s = seq_rows(mK, kv_head, offset_k, seqlen_k), seq_rows(mV, kv_head, offset_k, seqlen_k)
            mLSE_s = cute.domain_offset((offset_q,), mLSE[None, head, 0])
        else:
            mQ_s, mO_s, mLSE_s = mQ[None, None, head, batch], mO[None, None, head, batch], mLSE[None, head, batch]
            mK_s, mV_s = mK[None, None, kv_head, batch], mV[None, None, kv_head, batch]
        n_block_max, n_unmasked_end = block_info.n_block_range(
            m_block, seqlen_q, seqlen_k, causal_offset, block_m=bm, block_n=bn, causal=c.causal,
            minimum=cutlass.min, maximum=cutlass.max)
        if cutlass.const_expr(c.varlen):
            # The grid covers the longest sequence: a tile past this one's end visits no block.
            live = cutlass.min(cutlass.max(seqlen_q - m_block * bm, 0), 1)
            n_block_max, n_unmasked_end = n_block_max * live, n_unmasked_end * live
        # With a left window bound the blocks below the first row's first key are skipped and
        # every visited one is masked: [n_block_min, n_block_max), possibly empty.
        n_block_min = block_info.n_block_min(m_block, offset_lo, block_m=bm, block_n=bn, local=c.local,
                                             maximum=cutlass.max)
        if cutlass.const_expr(c.local):
            n_unmasked_end = n_block_min
        cute.arch.sync_threads()  # the mbarrier inits are visible to every warp

        warpgroup_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        if warpgroup_idx == 0:
            self.roles.become_producer()
            if warp_idx == 0:
                gQ = cute.local_tile(mQ_s, (bm, d), (m_block, 0))
                gK = cute.local_tile(mK_s, (bn, d), (None, 0))
                gV = cute.local_tile(mV_s, (bn, d), (None, 0))
                self.produce(tma_q, gQ, sQ, tma_k, gK, sK, tma_v, gV, sV, pipe_q, pipe_k, pipe_v, n_block_min,
                             n_block_max)
        else:
            self.roles.become_consumer()
            wg = warpgroup_idx - 1
            gO = cute.local_tile(mO_s, (bm, d), (m_block, 0))
            sink_log2 = None
            if cutlass.const_expr(c.sinks):
                sink_log2 = mSinks[head] * LOG2_E
            self.consume(tiled_mma_qk, tiled_mma_qk0, tiled_mma_pv, sQ, sK, sV, pipe_q, pipe_k, pipe_v, tma_o, gO,
                         mLSE_s, scale_log2, causal_offset, offset_lo, m_block, seqlen_q,
                         seqlen_k, n_block_min, n_block_max, n_unmasked_end, tidx - THREADS_PER_WARPGROUP, warp_idx,
                         wg, (score_scale, sink_log2))

    @cute.jit
    def produce(self, tma_q, gQ, sQ, tma_k, gK, sK, tma_v, gV, sV, pipe_q, pipe_k, pipe_v,
                n_block_min: cutlass.Int32, n_block_max: cutlass.Int32):
        """Producer warp: Q once, then K[n], V[n] for n = n_block_max - 1 down to n_block_min; with
        `k_lead` in the consumers' order of use: K[n_block_max - 1], Q, then K[n - 1] before V[n].
        Nothing when the range is empty (the consumers then skip their main loop)."""
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        n_blocks = n_block_max - n_block_min
        if n_blocks > 0 and cutlass.const_expr(self.config.k_lead):
            k_state = hpipe.producer_state(self.config.stages)
            v_state = hpipe.producer_state(self.config.stages)
            pipe_k.producer_acquire(k_state)
            cute.copy(tma_k, tKgK[None, n_block_max - 1], tKsK[None, k_state.index],
                      tma_bar_ptr=pipe_k.producer_get_barrier(k_state))
            k_state.advance()
            q_state = hpipe.producer_state(1)
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
            for i in cutlass.range(n_blocks - 1, unroll=1):
                n = n_block_max - 2 - i
                pipe_k.producer_acquire(k_state)
                cute.copy(tma_k, tKgK[None, n], tKsK[None, k_state.index],
                          tma_bar_ptr=pipe_k.producer_get_barrier(k_state))
                k_state.advance()
                pipe_v.producer_acquire(v_state)
                cute.copy(tma_v, tVgV[None, n + 1], tVsV[None, v_state.index],
                          tma_bar_ptr=pipe_v.producer_get_barrier(v_state))
                v_state.advance()
            pipe_v.producer_acquire(v_state)
            cute.copy(tma_v, tVgV[None, n_block_min], tVsV[None, v_state.index],
                      tma_bar_ptr=pipe_v.producer_get_barrier(v_state))
            v_state.advance()
            pipe_k.producer_tail(k_state)
            pipe_v.producer_tail(v_state)
        if n_blocks > 0 and cutlass.const_expr(not self.config.k_lead):
            q_state = hpipe.producer_state(1)
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
            k_state = hpipe.producer_state(self.config.stages)
            v_state = hpipe.producer_state(self.config.stages)
            for i in cutlass.range(n_blocks, unroll=1):
                n = n_block_max - 1 - i
                pipe_k.producer_acquire(k_state)
                cute.copy(tma_k, tKgK[None, n], tKsK[None, k_state.index],
                          tma_bar_ptr=pipe_k.producer_get_barrier(k_state))
                k_state.advance()
                pipe_v.producer_acquire(v_state)
                cute.copy(tma_v, tVgV[None, n], tVsV[None, v_state.index],
                          tma_bar_ptr=pipe_v.producer_get_barrier(v_state))
                v_state.advance()
            pipe_k.producer_tail(k_state)
            pipe_v.producer_tail(v_state)

    @cute.jit
    def consume(self, tiled_mma_qk: cute.TiledMma, tiled_mma_qk0: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
                sQ, sK, sV, pipe_q, pipe_k, pipe_v, tma_o, gO, gLSE, scale_log2: cutlass.Float32,
                causal_offset: cutlass.Int32, offset_lo: cutlass.Int32, m_block: cutlass.Int32,
                seqlen_q: cutlass.Int32, seqlen_k: cutlass.Int32, n_block_min: cutlass.Int32,
                n_block_max: cutlass.Int32, n_unmasked_end: cutlass.Int32, ctidx: cutlass.Int32,
                warp_idx: cutlass.Int32, wg: cutlass.Int32, features):
        """Consumer warpgroup `wg` (0 .. consumer_warpgroups - 1, rows 64 wg .. 64 wg + 63 of the tile).
        features: (score_scale, sink_log2 or None), see `__call__`."""
        c = self.config
        d, bm, bn = c.head_dim, c.block_m, c.block_n
        # Set once, outside any branch or loop: an MMA field set inside one is state the tracer
        # cannot carry out of it.
        tiled_mma_qk0.set(warpgroup.Field.ACCUMULATE, False)
        tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, True)
        tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)
        thr_qk = tiled_mma_qk.get_slice(ctidx)
        thr_pv = tiled_mma_pv.get_slice(ctidx)
        tSrQ = tiled_mma_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = tiled_mma_qk.make_fragment_B(thr_qk.partition_B(sK))
        sVt = _transposed(sV, bn, d, c.stages)
        tOrVt = tiled_mma_pv.make_fragment_B(thr_pv.partition_B(sVt))
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((bm, bn)), cutlass.Float32)
        acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((bm, d)), cutlass.Float32)
        acc_o.fill(0.0)
        r_p = cute.make_rmem_tensor(acc_s.layout, self.dtype)
        t_p = acc_as_a(r_p)
        # The re-view must have exactly the shape wgmma RS expects of its register A operand.
        a_shape = thr_pv.partition_shape_A((bm, bn))
        if cutlass.const_expr(str(cute.shape(t_p)) != str(a_shape)):
            raise RuntimeError(f"P's A view {cute.shape(t_p)} does not match wgmma's A fragment {a_shape}")
        acc_s_mn, acc_o_mn = acc_mn_view(acc_s), acc_mn_view(acc_o)
        # Tile-local (row, col) of each score this thread holds, for the mask and the LSE rows.
        coord_s = acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor((bm, bn))))
        softmax = Sm90Softmax(2, scale_log2, c.rescale_threshold, c.exp2_poly)
        row_scale = cute.make_rmem_tensor((2,), cutlass.Float32)
        turn = [pipeline.NamedBarrier(barrier_id=_TURN_BARRIER + i, num_threads=_TURN_THREADS)
                for i in range(c.consumer_warpgroups)]
        row_base = m_block * bm
        # The epilogue's stmatrix partition (O's register layout is the P V accumulator's).
        stmatrix = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_r2s = cute.make_tiled_copy_C(stmatrix, tiled_mma_pv).get_slice(ctidx)

        score_scale, sink_log2 = features
        if n_block_max > n_block_min:
            self.mainloop((tiled_mma_qk0, tiled_mma_qk), tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_s, acc_o, r_p, t_p,
                          acc_s_mn, acc_o_mn, coord_s, softmax, row_scale, pipe_q, pipe_k, pipe_v, turn, wg, row_base,
                          seqlen_k, causal_offset, offset_lo, n_block_min, n_block_max, n_unmasked_end, score_scale)

        # ---- epilogue
        lse = cute.make_rmem_tensor((2,), cutlass.Float32)
        softmax.finalize(acc_o_mn, lse, sink_log2)
        if ctidx % 4 == 0:
            for r in cutlass.range_constexpr(2):
                row = row_base + coord_s[r, 0][0]
                if row < seqlen_q:
                    gLSE[row] = lse[r]
        self.store_o(stmatrix, thr_r2s, acc_o, sQ, tma_o, gO, warp_idx)

    @cute.jit
    def mainloop(self, tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_s, acc_o, r_p, t_p, acc_s_mn, acc_o_mn,
                 coord_s, softmax: Sm90Softmax, row_scale, pipe_q, pipe_k, pipe_v, turn, wg: cutlass.Int32,
                 row_base: cutlass.Int32, seqlen_k: cutlass.Int32, causal_offset: cutlass.Int32,
                 offset_lo: cutlass.Int32, n_block_min: cutlass.Int32, n_block_max: cutlass.Int32,
                 n_unmasked_end: cutlass.Int32, score_scale: cutlass.Float32):
        """Every K/V block of this tile (n_block_max > n_block_min): the first alone, then the
        overlapped steps, then the last block's P V."""
        c = self.config
        bn = c.block_n
        k_state = hpipe.consumer_state(c.stages)
        v_state = hpipe.consumer_state(c.stages)
        if cutlass.const_expr(c.pingpong):
            # Warpgroup 0 issues first: the last one (which hands over to it) gives it the first turn.
            if wg == c.consumer_warpgroups - 1:
                turn[0].arrive()
        pipe_q.consumer_wait(hpipe.consumer_state(1))

        # ---- the first block (the highest; masked when any block is): S alone, then softmax
        n_first = n_block_max - 1
        self.wait_turn(turn, wg)
        pipe_k.consumer_wait(k_state)
        self.gemm_qk(tiled_mma_qk, acc_s, tSrQ, tSrK, k_state.index)
        self.pass_turn(turn, wg, n_block_max - n_block_min > 1)
        wgmma.wait_group(0)
        pipe_k.consumer_release(k_state)
        k_state.advance()
        if cutlass.const_expr(c.softcap):
            apply_softcap(acc_s, score_scale)
        mask_scores(acc_s_mn, coord_s, row_base, n_first * bn, seqlen_k, causal_offset, c.causal, offset_lo, c.local)
        softmax.update(acc_s_mn, row_scale)  # O is still 0: nothing to rescale
        if cutlass.const_expr(c.rescale_early):
            row_scale.fill(1.0)  # what the first step applies to O (still 0)
        to_16bit(acc_s, r_p)

        # ---- the rest, descending: one loop, the mask applied while n is past n_unmasked_end (one
        # loop body, not a masked and an unmasked copy: with two, ptxas kept more accumulator
        # copies live than setmaxnreg's 240 registers allow and serialized the wgmma)
        for i in cutlass.range(n_first - n_block_min, unroll=1):
            n = n_first - 1 - i
            k_state, v_state = self.step(n, n >= n_unmasked_end, n > n_block_min, tiled_mma_qk, tiled_mma_pv, tSrQ,
                                         tSrK, tOrVt, acc_s, acc_o, r_p, t_p, acc_s_mn, acc_o_mn, coord_s, softmax,
                                         row_scale, pipe_k, pipe_v, k_state, v_state, turn, wg, row_base, seqlen_k,
                                         causal_offset, offset_lo, score_scale)

        # ---- the last block's O += P V
        if cutlass.const_expr(c.rescale_early):
            softmax.rescale(acc_o_mn, row_scale)
        pipe_v.consumer_wait(v_state)
        self.gemm_pv(tiled_mma_pv, acc_o, t_p, tOrVt, v_state.index)
        wgmma.wait_group(0)
        pipe_v.consumer_release(v_state)
        v_state.advance()

    @cute.jit
    def step(self, n: cutlass.Int32, masked: cutlass.Boolean, more: cutlass.Boolean, tiled_mma_qk, tiled_mma_pv,
             tSrQ, tSrK, tOrVt, acc_s, acc_o, r_p, t_p, acc_s_mn, acc_o_mn, coord_s, softmax: Sm90Softmax,
             row_scale, pipe_k, pipe_v, k_state, v_state, turn, wg: cutlass.Int32, row_base: cutlass.Int32,
             seqlen_k: cutlass.Int32, causal_offset: cutlass.Int32, offset_lo: cutlass.Int32,
             score_scale: cutlass.Float32):
        """Block n: issue S = Q K_n and O += P V of the previous block together; softmax of S_n
        under the P V GEMM; O rescaled and P overwritten once that GEMM retired (with
        `rescale_early`, O is rescaled by the previous block's factors between issuing the two
        GEMMs instead, under S's). `more`: a block follows (the ping-pong turn is passed only to
        a warpgroup that will take it). Returns the advanced pipeline states (loop-carried by
        the caller)."""
        c = self.config
        self.wait_turn(turn, wg)
        pipe_k.consumer_wait(k_state)
        self.gemm_qk(tiled_mma_qk, acc_s, tSrQ, tSrK, k_state.index)
        if cutlass.const_expr(c.rescale_early):
            softmax.rescale(acc_o_mn, row_scale)  # the previous block's factors, under S's GEMM
        pipe_v.consumer_wait(v_state)
        self.gemm_pv(tiled_mma_pv, acc_o, t_p, tOrVt, v_state.index)
        self.pass_turn(turn, wg, more)
        wgmma.wait_group(1)  # S_n landed; P V still in flight
        pipe_k.consumer_release(k_state)
        k_state.advance()
        if cutlass.const_expr(c.softcap):
            apply_softcap(acc_s, score_scale)
        if masked:
            mask_scores(acc_s_mn, coord_s, row_base, n * c.block_n, seqlen_k, causal_offset, c.causal, offset_lo,
                        c.local)
        softmax.update(acc_s_mn, row_scale)
        wgmma.wait_group(0)  # P V retired: O and P are free
        pipe_v.consumer_release(v_state)
        v_state.advance()
        if cutlass.const_expr(not c.rescale_early):
            softmax.rescale(acc_o_mn, row_scale)
        to_16bit(acc_s, r_p)
        return k_state, v_state

    @cute.jit
    def gemm_qk(self, tiled_mma, acc_s, tSrQ, tSrK, stage):
        """acc_s = Q K_stage^T, issued and committed, not waited. `tiled_mma` is the pair (overwrite,
        accumulate): the first k step overwrites S."""
        wgmma.fence()
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            mma = tiled_mma[0] if kb == 0 else tiled_mma[1]
            cute.gemm(mma, acc_s, tSrQ[None, None, kb], tSrK[None, None, kb, stage], acc_s)
        wgmma.commit_group()

    @cute.jit
    def gemm_pv(self, tiled_mma, acc_o, t_p, tOrVt, stage):
        """acc_o += P V_stage with P from registers, issued and committed, not waited."""
        wgmma.fence()
        for kb in cutlass.range_constexpr(cute.size(t_p, mode=[2])):
            cute.gemm(tiled_mma, acc_o, t_p[None, None, kb], tOrVt[None, None, kb, stage], acc_o)
        wgmma.commit_group()

    @cute.jit
    def wait_turn(self, turn, wg: cutlass.Int32):
        if cutlass.const_expr(self.config.pingpong):
            for w in cutlass.range_constexpr(len(turn)):
                if wg == w:
                    turn[w].arrive_and_wait()

    @cute.jit
    def pass_turn(self, turn, wg: cutlass.Int32, more: cutlass.Boolean):
        """Hand the tensor cores to the next warpgroup of the ring. The last one skips its last
        hand-off: warpgroup 0 takes exactly n_block_max turns (one given up front), so every
        arrive is matched by one wait."""
        if cutlass.const_expr(self.config.pingpong):
            last = len(turn) - 1
            for w in cutlass.range_constexpr(last):
                if wg == w:
                    turn[w + 1].arrive()
            if wg == last:
                if more:
                    turn[0].arrive()

    @cute.jit
    def store_o(self, stmatrix, thr_r2s, acc_o, sO, tma_o, gO, warp_idx: cutlass.Int32):
        """O (normalized) -> 16 bits -> stmatrix into sO (Q's buffer: each warpgroup writes only
        the rows it alone read) -> one TMA store of the tile."""
        r_o = cute.make_rmem_tensor(acc_o.layout, self.dtype)
        to_16bit(acc_o, r_o)
        cute.copy(stmatrix, thr_r2s.retile(r_o), thr_r2s.partition_D(sO))
        cute.arch.fence_proxy("async.shared", space="cta")
        pipeline.NamedBarrier(barrier_id=_EPILOGUE_BARRIER,
                              num_threads=THREADS_PER_WARPGROUP * self.config.consumer_warpgroups).arrive_and_wait()
        if warp_idx == 4:
            tOsO, tOgO = cpasync.tma_partition(tma_o, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2),
                                               cute.group_modes(gO, 0, 2))
            cute.copy(tma_o, tOsO, tOgO)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)


# ---- compile-only variants ------------------------------------------------------------------------


def _fake_sinks(config):
    """The fake (Hq,) fp32 sinks argument of a build (None without `sinks`)."""
    from cute_kernels.runtime import fake_tensor

    return fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=4) if config.sinks else None


def build_variant(head_dim: int = 128, dtype: str = "bfloat16", causal: bool = False, local: bool = False, **tile):
    """A CompileJob for `sm90_flash` over fake (B, H, S, D) tensors with symbolic sizes; `tile`
    (block_n, stages, pingpong, producer_regs, consumer_regs, softcap, sinks, ...) overrides
    `config_for`."""
    from dataclasses import replace

    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    features = {name: tile.pop(name) for name in ("softcap", "sinks", "seqused_k", "short") if name in tile}
    config = replace(config_for(head_dim, dtype, causal, local, **features), **tile).validate()
    t = _CUTLASS[dtype]
    # TMA needs 16-byte aligned strides: the rung checks it, the fake tensors state it.
    qkvo = [fake_tensor(t, 4, leading_dim=3, assumed_align=16, stride_divisibility=8) for _ in range(4)]
    lse = fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4)
    args = (*qkvo, lse, cutlass.Float32(1.0 / math.sqrt(head_dim)), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(1),
            fake_stream(), cutlass.Float32(1.0), _fake_sinks(config))
    return CompileJob(FlashAttentionSm90(config), args, ("attention.sm90_flash", config))


VARIANT_CONFIGS = {
    f"d{d}_{dt}{'_causal' if causal else ''}": {"head_dim": d, "dtype": dt, "causal": causal}
    for d, dt, causal in (
        (64, "bfloat16", False), (64, "float16", True), (128, "bfloat16", False), (128, "bfloat16", True),
        (128, "float16", False), (96, "bfloat16", True), (192, "float16", False), (256, "bfloat16", True),
    )
}
# Without the ping-pong turns (each warpgroup issues as soon as its data is ready): the baseline the
# ping-pong is measured against, and a bisection point when debugging on the GPU.
VARIANT_CONFIGS["d128_bfloat16_causal_no_pingpong"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                        "pingpong": False}
# The producer's earlier order (K and V of a block together, after Q) on the grid (Q blocks, heads,
# batch): the baseline `k_lead` and `lpt` were measured against.
VARIANT_CONFIGS["d128_bfloat16_causal_kv_pairs"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                     "k_lead": False, "lpt": False}
# Sliding windows: the left bound tested too (every visited block masked), with and without causality.
VARIANT_CONFIGS["d128_bfloat16_local"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True, "local": True}
VARIANT_CONFIGS["d64_float16_local_left_only"] = {"head_dim": 64, "dtype": "float16", "local": True}
VARIANT_CONFIGS["d256_bfloat16_causal_local"] = {"head_dim": 256, "dtype": "bfloat16", "causal": True, "local": True}
# Three consumer warpgroups (192-row tiles) within 160 registers each, on 80-key blocks (`config_for`'s
# D = 64 tile is 192 x 128).
VARIANT_CONFIGS["d64_bfloat16_causal_3wg"] = {"head_dim": 64, "dtype": "bfloat16", "causal": True,
                                              "consumer_warpgroups": 3, "producer_regs": 32, "consumer_regs": 160,
                                              "block_n": 80}
# Score features: soft-capped scores and sinks, on the largest tiles of each head-dim class.
VARIANT_CONFIGS["d128_bfloat16_causal_softcap_sinks"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                         "softcap": True, "sinks": True}
VARIANT_CONFIGS["d64_float16_softcap"] = {"head_dim": 64, "dtype": "float16", "softcap": True}
# Short Q sequences at D <= 64 (`short_rows`: ViT-B/16's 197 rows) take 128-row tiles.
VARIANT_CONFIGS["d64_bfloat16_short"] = {"head_dim": 64, "dtype": "bfloat16", "short": True}
VARIANT_CONFIGS["d64_float16_causal_short_softcap"] = {"head_dim": 64, "dtype": "float16", "causal": True,
                                                       "short": True, "softcap": True}
VARIANT_CONFIGS["d256_bfloat16_causal_local_softcap_sinks"] = {"head_dim": 256, "dtype": "bfloat16", "causal": True,
                                                               "local": True, "softcap": True, "sinks": True}


def build_varlen_variant(head_dim: int = 128, dtype: str = "bfloat16", causal: bool = False, local: bool = False,
                         **tile):
    """A CompileJob for the packed (varlen) `sm90_flash` launch: (1, H, T, D) views with symbolic
    sizes, int32 cu_seqlens, seqused_k (with `seqused_k=True`), the launch order, max_seqlen_q and
    the alignment flag."""
    from dataclasses import replace

    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    used = tile.pop("seqused_k", False)
    features = {name: tile.pop(name) for name in ("softcap", "sinks") if name in tile}
    config = replace(config_for(head_dim, dtype, causal, local, varlen=True, **features), **tile).validate()
    t = _CUTLASS[dtype]
    qkvo = [fake_tensor(t, 4, leading_dim=3, assumed_align=16, stride_divisibility=8) for _ in range(4)]
    lse = fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4)
    args = (*qkvo, lse, cutlass.Float32(1.0 / math.sqrt(head_dim)), cutlass.Int32(0), cutlass.Int32(0),
            cutlass.Int32(1), fake_stream(), *_varlen_tail(config, used))
    return CompileJob(FlashAttentionSm90(config), args, _varlen_key(config, used))


def _register() -> None:
    from cute_kernels.runtime import register_variant

    register_variant("attention.sm90_flash", build_variant, configs=VARIANT_CONFIGS, requires={"HGMMA", "UTMALDG"})
    register_variant("attention.sm90_flash_varlen", build_varlen_variant, requires={"HGMMA", "UTMALDG", "UTMASTG"},
                     configs={"d128_bfloat16_causal": {"head_dim": 128, "dtype": "bfloat16", "causal": True},
                              "d64_float16_local_softcap_sinks_seqused": {
                                  "head_dim": 64, "dtype": "float16", "causal": True, "local": True,
                                  "softcap": True, "sinks": True, "seqused_k": True},
                              "d256_bfloat16": {"head_dim": 256, "dtype": "bfloat16"}})


_register()


# ---- the rung --------------------------------------------------------------------------------------


class Sm90FlashRung:
    """The `sm90_flash` rung of the attention ladder (interface in `cute_kernels.attention.registry`)."""

    name = "sm90_flash"
    min_capability = (9, 0)
    # Score features (`features.FEATURES`) the forward kernel implements (seqused_k: varlen only).
    features = ("softcap", "sinks", "seqused_k")

    @property
    def dtypes(self):
        import torch

        return (torch.float16, torch.bfloat16)

    def supports_backward(self, problem) -> str | None:
        from .sm90_flash_bwd import supports_backward

        return supports_backward(problem)

    def backward(self, dout, q, k, v, out, lse, problem, *, deterministic: bool = False):
        """(dq, dk, dv); see `sm90_flash_bwd.backward`."""
        from .sm90_flash_bwd import backward

        return backward(dout, q, k, v, out, lse, problem, deterministic=deterministic)

    def supports_varlen_backward(self, problem) -> str | None:
        """None when `varlen_backward` takes the packed `problem`, else why not."""
        if problem.seqused_k:
            return "the sm90_flash varlen backward does not take seqused_k"
        return self.supports_backward(problem)

    def varlen_backward(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                        max_seqlen_k: int, problem, *, deterministic: bool = False, offsets=None):
        """(dq, dk, dv) of the packed forward (`varlen`); see `sm90_flash_bwd.varlen_backward`
        (offsets: `varlen.HostOffsets`, for the launch order). deterministic: dQ is summed with
        fp32 atomics here, so the call goes to sm80_flash's varlen backward (a separate dQ pass),
        as the dense backward does."""
        args = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, problem)
        if deterministic:
            from .sm80_flash_bwd_launch import supports_backward as sm80_supports
            from .sm80_flash_bwd_launch import varlen_backward as sm80_varlen_backward

            why = sm80_supports(problem)
            if why is not None:
                raise ValueError(f"deterministic varlen backward unavailable: {why}")
            return sm80_varlen_backward(*args)
        from .sm90_flash_bwd import varlen_backward

        return varlen_backward(*args, offsets=offsets)

    def varlen_backward_plan(self, dout, q, k, v, out, lse, problem, *, deterministic: bool = False):
        """The warm replay of `varlen_backward` for tensors of these layouts, or None (the
        deterministic call goes to sm80_flash); see `sm90_flash_bwd.varlen_backward_plan`."""
        if deterministic:
            return None
        from .sm90_flash_bwd import varlen_backward_plan

        return varlen_backward_plan(dout, q, k, v, out, lse, problem)

    def backward_plan(self, dout, q, k, v, out, lse, problem, *, deterministic: bool = False):
        """The warm replay of `backward` for tensors of these layouts, or None; see
        `sm90_flash_bwd.backward_plan`."""
        from .sm90_flash_bwd import backward_plan

        return backward_plan(dout, q, k, v, out, lse, problem, deterministic=deterministic)

    def supports(self, q, k, v, problem) -> str | None:
        why = common_reason(problem, self.dtypes) or feature_reason(problem, self.features)
        if why is not None:
            return why
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.data_ptr() % 16:
                return f"{name}'s data pointer is not 16-byte aligned (TMA); call .contiguous() on it"
            # TMA tensor maps need every stride but the unit one to be a multiple of 16 bytes.
            bad = [s for s in t.stride()[:-1] if s % 8]
            if bad:
                return (f"{name}'s strides {tuple(t.stride())} are not multiples of 8 elements (16 bytes) outside "
                        "the head dim (a TMA requirement); call .contiguous() on it")
        return None

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, out, lse, problem, sinks=None,
               seqused_k=None, offsets=None):
        """The packed (varlen) forward: q (Tq, Hq, D), k/v (Tk, Hkv, D), out (Tq, Hq, D),
        lse (Hq, Tq) fp32, int32 cu_seqlens (B + 1,) (and seqused_k (B,)) validated by the caller
        (`varlen.attention_varlen_forward`), whose values it read are `offsets`
        (`varlen.HostOffsets`); causal alignment and window per sequence; the sequences launched
        longest first (`launch_order`)."""
        if offsets is None:
            raise TypeError("sm90_flash.varlen needs offsets (varlen.HostOffsets, the validated cu_seqlens as the "
                            "host read them); call attention_varlen_forward")
        return _varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, out, lse, problem, sinks, seqused_k,
                       offsets)

    def launch_plan(self, problem):
        """`launch(q, k, v, out, lse, sinks=None)`: the TVM-FFI forward of `problem`'s config with
        its scalars bound (compiled on first use), or None without TVM-FFI. It reads torch's
        current stream at each call and takes tensors that do not require grad, `out`
        TMA-aligned (as `__call__` checks), sinks a contiguous (Hq,) fp32 tensor when the problem
        has them; `problem` must be supported."""
        if not tvm_ffi_available():
            return None
        config = _config_for_problem(problem)
        fn = _COMPILED.get(config)
        if fn is None:
            fn = _compile_tvm_ffi(config)
        _, offset, group = launch_scalars(problem)
        scale, score_scale = softcap_scalars(problem)
        offset_lo, _ = window_scalars(problem)
        # the varlen arguments (cu_seqlens q/k, seqused_k, order, max_seqlen_q, bottom_right) are
        # parameters of the build too, None in a dense one
        return lambda q, k, v, out, lse, sinks=None: fn(q, k, v, out, lse, scale, offset, offset_lo, group,
                                                        score_scale, sinks, *_DENSE_VARLEN_ARGS)

    def __call__(self, q, k, v, out, lse, problem, sinks=None):
        """Write out (B, Hq, Sq, D) and lse (B, Hq, Sq) fp32 on torch's current stream; sinks:
        the problem's (Hq,) sink logits (any float dtype: passed on as fp32).

        With TVM-FFI (`runtime.tvm_ffi_available()`) the compiled function takes the torch tensors
        themselves and reads torch's current stream; otherwise each tensor is wrapped with
        `from_torch`. Either way a warm call builds no kernel object and derives no layout."""
        if out.data_ptr() % 16 or any(s % 8 for s in out.stride()[:-1]):
            raise ValueError(f"out's strides {tuple(out.stride())} must be multiples of 8 elements and its "
                             "pointer 16-byte aligned (TMA store)")
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
        scale, score_scale = softcap_scalars(problem)
        offset_lo, _ = window_scalars(problem)
        kernel = _kernel_for(config)
        tensors = [from_torch(t, assumed_align=16, leading_dim=3) for t in (q, k, v, out)]
        tensors.append(from_torch(lse, assumed_align=4, leading_dim=2))
        args = (*tensors, cutlass.Float32(scale), cutlass.Int32(offset), cutlass.Int32(offset_lo), cutlass.Int32(group))
        tail = (cutlass.Float32(score_scale),
                None if sinks is None else from_torch(sinks, assumed_align=4, leading_dim=0))
        stream = current_stream()
        compiled = compile_kernel(kernel, *args, stream, *tail, key=("attention.sm90_flash", config))
        compiled(*args, stream, *tail)
        return out, lse


def _varlen(rung, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, out, lse, problem, sinks, seqused_k,
            offsets):
    """`Sm90FlashRung.varlen`: the packed launch (`FlashAttentionSm90.__call__`'s varlen form),
    through the TVM-FFI build where there is one (torch tensors in, no wrapping per call)."""
    from .problem_checks import bottom_right_flag, varlen_window_scalars

    if out.data_ptr() % 16 or any(s % 8 for s in out.stride()[:-1]):
        raise ValueError(f"out's strides {tuple(out.stride())} must be multiples of 8 elements and its pointer "
                         "16-byte aligned (TMA store)")
    config = _config_for_problem(problem, varlen=True)
    used = seqused_k is not None
    # (T, H, D) -> (1, H, T, D): the dense kernel's modes, batch 1, rows offset per CTA.
    views = [t.detach().permute(1, 0, 2).unsqueeze(0) for t in (q, k, v, out)]
    window_left, window_right = varlen_window_scalars(problem)
    scale, score_scale = softcap_scalars(problem)
    scalars = (scale, window_right, -window_left, problem.heads_q // problem.heads_kv)
    varlen_args = (cu_seqlens_q, cu_seqlens_k, seqused_k, _order_tensor(offsets, q.device))
    tail_scalars = (max_seqlen_q, bottom_right_flag(problem))
    sinks = _sinks_fp32(sinks, problem)
    if tvm_ffi_available():
        fn = _COMPILED.get((config, used))
        if fn is None:
            fn = _compile_varlen_tvm_ffi(config, used)
        fn(*views, lse.unsqueeze(0), *scalars, score_scale, sinks, *varlen_args, *tail_scalars)
        return out, lse
    from cute_kernels.runtime import current_stream, from_torch

    tensors = [from_torch(t, assumed_align=16, leading_dim=3) for t in views]
    tensors.append(from_torch(lse.unsqueeze(0), assumed_align=4, leading_dim=2))
    args = (*tensors, cutlass.Float32(scale), *(cutlass.Int32(x) for x in scalars[1:]))
    wrap = lambda t: None if t is None else from_torch(t, assumed_align=4, leading_dim=0)  # noqa: E731
    tail = (cutlass.Float32(score_scale), wrap(sinks), *map(wrap, varlen_args), *map(cutlass.Int32, tail_scalars))
    stream = current_stream()
    compiled = compile_kernel(_kernel_for(config), *args, stream, *tail, key=_varlen_key(config, used))
    compiled(*args, stream, *tail)
    return out, lse


# The warm path's caches (`runtime.plan_cache`): building a kernel object derives every layout
# (~1 ms), so each exists once per config; the config once per (head dim, dtype, mask flags);
# the TVM-FFI function (torch tensors in, torch's current stream) once per config.
_KERNELS = WarmCache("attention.sm90_flash.kernels")
_CONFIGS = WarmCache("attention.sm90_flash.configs")
_COMPILED = WarmCache("attention.sm90_flash.tvm_ffi")


def _kernel_for(config) -> FlashAttentionSm90:
    return memo(_KERNELS, config, FlashAttentionSm90, config)


def _config_for_problem(problem, varlen: bool = False) -> FlashSm90Config:
    """`config_for` the problem's head dim, dtype, mask bounds, score features and launch (dense
    or varlen; a dense one's Q length may ask for the short tile, `short_rows`), built once per
    combination (`problem_checks.config_of`)."""
    short = not varlen and short_rows(problem.seqlen_q, problem.head_dim)
    return config_of(_CONFIGS, problem, config_for, softcap=problem.softcap is not None, sinks=problem.sinks,
                     varlen=varlen, short=short)


def launch_order(offsets) -> list[int]:
    """The sequences by decreasing work (query rows x keys used; ties in sequence order) from
    the host's validated offsets (`varlen.HostOffsets`): the varlen grid's last mode, so the
    longest are launched first."""
    cu_q, cu_k, used = offsets.cu_q, offsets.cu_k, offsets.seqused_k
    keys = [cu_k[b + 1] - cu_k[b] for b in range(len(cu_k) - 1)] if used is None else used
    work = [(cu_q[b + 1] - cu_q[b]) * keys[b] for b in range(len(cu_q) - 1)]
    return sorted(range(len(work)), key=lambda b: -work[b])


# offsets -> launch_order's (B,) int32 device tensor: a model's layers pass the same batch.
_ORDERS = WarmCache("attention.sm90_flash.varlen_orders", 64)


def _order_tensor(offsets, device):
    key = (offsets, device)
    order = _ORDERS.get(key)
    if order is None:
        import torch

        from cute_kernels.runtime.lasting import lasting

        order = _ORDERS.put(key, lasting(device, torch.tensor, launch_order(offsets), dtype=torch.int32,
                                         device=device))
    return order


def _sinks_fp32(sinks, problem):
    """The sinks as the kernels read them (contiguous fp32), or None without them."""
    if not problem.sinks:
        return None
    import torch

    if sinks is None:
        raise ValueError(f"the problem has sinks but none were passed ({problem.describe()})")
    return sinks.detach().to(torch.float32).contiguous()


_DENSE_VARLEN_ARGS = (None,) * 6


def _varlen_key(config: FlashSm90Config, used: bool) -> tuple:
    # seqused_k is traced in or out by its presence, so it is part of the key beside the config.
    return ("attention.sm90_flash.varlen", config, used)


def _varlen_tail(config: FlashSm90Config, used: bool) -> tuple:
    """The fake arguments after the stream of a varlen build: score scale, sinks, cu_seqlens
    q/k, seqused_k (None without `used`), the launch order, max_seqlen_q, the alignment flag."""
    from cute_kernels.runtime import fake_tensor

    ints = lambda: fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4)  # noqa: E731
    return (cutlass.Float32(1.0), _fake_sinks(config), ints(), ints(), ints() if used else None, ints(),
            cutlass.Int32(1), cutlass.Int32(1))


def _compile_varlen_tvm_ffi(config: FlashSm90Config, used: bool):
    """The TVM-FFI varlen forward of `config` (with or without seqused_k), kept in `_COMPILED`."""
    fn = compile_tvm_ffi(compile_kernel, _kernel_for(config), config.dtype, (*_varlen_key(config, used), "tvm_ffi"),
                         tail=_varlen_tail(config, used), stride_divisibility=8)
    _COMPILED[(config, used)] = fn
    return fn


def _compile_tvm_ffi(config: FlashSm90Config):
    """The TVM-FFI forward of `config` (`forward_host.compile_tvm_ffi`, with the soft cap's score
    scale and the sinks after the stream), kept in `_COMPILED`."""
    fn = compile_tvm_ffi(compile_kernel, _kernel_for(config), config.dtype, ("attention.sm90_flash", "tvm_ffi", config),
                         tail=(cutlass.Float32(1.0), _fake_sinks(config)))
    _COMPILED[config] = fn
    return fn


RUNG = Sm90FlashRung()
