"""Rung 7, `sm90_persistent`: warp-specialized persistent GEMM with TMA multicast clusters.

D[m, n, l] = act(alpha * sum_k A[m, k, l] * B[n, k, l] + beta * C[m, n, l] + bias), fp32
accumulation; the epilogue terms after the sum are optional and fixed per build
(`hopper.epilogue.EpilogueSpec`).

Structure (one CTA per SM, walking output tiles with a static persistent scheduler):
- warpgroup 0, the producer, gives up registers (setmaxnreg.dec) and one warp issues TMA loads
  of A and B k-tiles into a ring of 128B-swizzled smem stages, multicast across the cluster
  (A to the CTAs of a cluster row, B to a cluster column). It runs ahead into the next tile
  while the consumers finish the current one, so loads overlap the epilogue.
- warpgroups 1..2, the consumers (setmaxnreg.inc), split the tile along M (cooperative) and
  issue `wgmma.mma_async` from smem, keeping one wgmma group in flight and releasing a stage
  when the group that read it retires.
- the epilogue fuses alpha, beta * C, bias and the activation in registers, converts, writes 128x32 sub-tiles to smem with stmatrix and
  one warp stores them with TMA through a ring of buffers; stores drain asynchronously under
  the next tile's main loop.
- a split-K build (`split_k=True`, launched through `SplitKLaunch`) cuts K's k-tiles into
  chunks, one scheduler unit per (tile, chunk), and reduces the chunks' products in the kernel
  (`exchange_partials`): every chunk writes its fp32 accumulators to a workspace and counts
  itself in on a per-tile counter; the chunk that arrives last sums the tile's partials in
  chunk order (so the sum does not depend on which CTA finished first) and runs the ordinary
  fused epilogue into the (M, N, 1) output. No CTA waits on another; the counters reset
  themselves.
- a gated build (`EpilogueSpec.gate`, SwiGLU) computes a (tile_m, tile_n) tile of the gate-up
  product and stores its (tile_m, tile_n / 2) gated half (and, with `gate_preact`, the product
  itself first): the output and the scheduler's tiles are half as wide as B's.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils as utils

from cute_kernels.gemm.sm90_config import Sm90GemmConfig
from cute_kernels.hopper import epilogue, smem_layouts, tile_scheduler, tma, wgmma
from cute_kernels.hopper.epilogue import EpilogueSpec
from cute_kernels.hopper import pipeline as hpipe
from cute_kernels.hopper.warp_roles import THREADS_PER_WARPGROUP, WarpRoles


def _major(layout_enum, operand: str) -> str:
    """'K' or 'MN' for A/B from the DSL LayoutEnum of the (rows, K, L) tensor."""
    return "K" if layout_enum.sm90_mma_major_mode() == cute.nvgpu.OperandMajorMode.K else "MN"


class Sm90PersistentGemm:
    """The kernel for one static config; sizes, strides, alpha and beta are runtime arguments.

    Schedules: "cooperative" (both consumer warpgroups on one tile, split along M) and
    "pingpong" (each warpgroup owns whole tiles, alternating; see `consume` for why its
    hand-off barrier makes the parity-only mbarrier waits exact). Both are checked on H200 by
    tests/gemm/test_sm90_gpu.py, test_sm90_epilogue.py and the GEMM fuzz.
    """

    fuses_epilogue = True
    reduces_split_k = True  # has a split-K build (`split_k=True`, `SplitKLaunch`)

    def __init__(self, config: Sm90GemmConfig, acc_dtype=cutlass.Float32, epilogue_spec: EpilogueSpec | None = None,
                 split_k: bool = False):
        self.config = config.validate()
        self.epi = (epilogue_spec or EpilogueSpec()).validate()
        self.split_k = split_k
        if split_k and self.epi.gate is not None:
            raise ValueError("a split-K build takes no gated epilogue (its tiles are the gate-up product's)")
        self.pingpong = config.schedule == "pingpong"
        if self.pingpong and (config.epi_stages % 2 or config.tile_m not in (64, 128)):
            raise ValueError("ping-pong splits the epilogue ring between 2 warpgroups (even epi_stages) "
                             "and each warpgroup owns a whole tile (tile_m = 64 or 128)")
        self.acc_dtype = acc_dtype
        self.promote = False  # set in _setup: 8-bit inputs without fp8_fast_accum
        self.roles = WarpRoles(consumer_warpgroups=2)
        self.roles.validate()
        # warpgroups per MMA tile: 2 split a tile (cooperative), 1 owns it (ping-pong)
        self.mma_warpgroups = 1 if self.pingpong else 2
        self.epi_threads = THREADS_PER_WARPGROUP * self.mma_warpgroups
        self.tile_mnk = (config.tile_m, config.tile_n, config.tile_k)
        self.cluster_mn = (config.cluster_m, config.cluster_n)
        self.gated = self.epi.gate is not None
        if self.gated and config.tile_n % 64:
            raise ValueError(f"a gated epilogue needs tile_n a multiple of 64 (whole gate/up block pairs in each "
                             f"half-width epilogue sub-tile), got {config.tile_n}")
        # the output tile: half of the product's columns when gated
        self.out_tile_n = config.tile_n // 2 if self.gated else config.tile_n

    # ----- host side: layouts, TMA atoms, grid -------------------------------------------
    def _setup(self, a, b, c):
        cfg = self.config
        self.a_dtype, self.b_dtype, self.c_dtype = a.element_type, b.element_type, c.element_type
        self.c_layout = utils.LayoutEnum.from_tensor(c)
        self.a_major = _major(utils.LayoutEnum.from_tensor(a), "A")
        self.b_major = _major(utils.LayoutEnum.from_tensor(b), "B")
        self.tiled_mma = wgmma.make_tiled_mma(
            self.a_dtype, self.b_dtype, self.a_major, self.b_major, self.acc_dtype,
            (self.mma_warpgroups, 1, 1), cfg.tile_n,
        )
        # the MMA whose accumulator partition is the output's: the half-width one when gated
        self.out_mma = wgmma.make_tiled_mma(
            self.a_dtype, self.b_dtype, self.a_major, self.b_major, self.acc_dtype,
            (self.mma_warpgroups, 1, 1), self.out_tile_n,
        ) if self.gated else self.tiled_mma
        if self.gated and self.a_dtype.width == 8:
            raise ValueError("a gated epilogue takes 16-bit inputs")
        # the tile's slices of the bias and row-wise scales, staged in smem once per tile (one
        # buffer per warpgroup owning tiles); an absent vector gets an empty range
        self.staged = epilogue.staged_vectors(self.epi, self.tile_mnk[:2], self.epi_threads)
        self.stage_buffers = 2 if self.pingpong else 1
        self.staged_elems = {name: self.staged[name].smem_elems(self.stage_buffers) if name in self.staged else 0
                             for name in epilogue.STAGED}
        extra = sum(4 * n + 16 for n in self.staged_elems.values() if n) + (8 if self.split_k else 0)  # + sLast
        self.stages = cfg.resolved_stages(self.a_dtype.width // 8, self.c_dtype.width, extra_bytes=extra)
        tm, tn, tk = self.tile_mnk
        self.promote = self.a_dtype.width == 8 and not cfg.fp8_fast_accum
        if self.a_dtype.width == 8 and (self.a_major != "K" or self.b_major != "K"):
            raise ValueError("fp8 wgmma reads both operands K-major: A (M, K) and B (N, K) with unit stride along K")
        if self.promote and not cfg.fp8_promotion_fits():
            raise ValueError(f"fp8 promotion keeps two {tm // self.mma_warpgroups}x{tn} fp32 accumulators per "
                             "warpgroup, more than its registers hold: use a smaller tile (at most 64x128 per "
                             "warpgroup) or fp8_fast_accum=True")
        self.epi_tile = cfg.epi_tile(self.c_dtype.width)
        tm, tn, tk = self.tile_mnk
        self.atom_a = smem_layouts.gmma_atom(self.a_major, self.a_dtype, tk if self.a_major == "K" else tm)
        self.atom_b = smem_layouts.gmma_atom(self.b_major, self.b_dtype, tk if self.b_major == "K" else tn)
        c_major = "MN" if self.c_layout.is_m_major_c() else "K"
        self.atom_c = smem_layouts.gmma_atom(c_major, self.c_dtype, self.epi_tile[0 if c_major == "MN" else 1])
        self.smem_a_layout = smem_layouts.staged_smem_layout(self.atom_a, tm, tk, self.stages)
        self.smem_b_layout = smem_layouts.staged_smem_layout(self.atom_b, tn, tk, self.stages)
        self.smem_c_layout = smem_layouts.staged_epi_layout(self.atom_c, *self.epi_tile, cfg.epi_stages)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, c_src: cute.Tensor, bias: cute.Tensor,
                 scale_a: cute.Tensor, scale_b: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
                 max_active_clusters: cutlass.Constexpr, stream):
        """a: (M, K, L), b: (N, K, L), c: (M, N, L); c = act(alpha * a . b^T + beta * c_src + bias)
        per batch. c_src (M, N, L) and bias (M or N,) are read only when the epilogue spec says so
        (pass any tensor of the compiled dtype otherwise); with `scale_ab` alpha is multiplied by
        scale_a[0] * scale_b[0] (per-tensor fp8 scales, read on the device), or with `scale_rows`
        each element by scale_a[m] * scale_b[n] (row-wise scales, (M,) and (N,))."""
        # the split-K operands are never read by this build: the bias stands in for them
        self.launch_with(a, b, c, c_src, bias, scale_a, scale_b, bias, bias, cutlass.Int32(1), alpha, beta,
                         max_active_clusters, stream)

    @cute.jit
    def launch_with(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, c_src: cute.Tensor, bias: cute.Tensor,
                    scale_a: cute.Tensor, scale_b: cute.Tensor, workspace: cute.Tensor, counters: cute.Tensor,
                    splits: cutlass.Int32, alpha: cutlass.Float32, beta: cutlass.Float32,
                    max_active_clusters: cutlass.Constexpr, stream):
        """`__call__`'s launch, plus a split-K build's workspace, counters and K chunk count
        (`SplitKLaunch`)."""
        self._setup(a, b, c)
        cfg = self.config
        tm, tn, tk = self.tile_mnk
        tma_a, gA = tma.make_tma_load(a, self.smem_a_layout, (tm, tk), cfg.cluster_n)
        tma_b, gB = tma.make_tma_load(b, self.smem_b_layout, (tn, tk), cfg.cluster_m)
        tma_c, gC = tma.make_tma_store(c, self.smem_c_layout, self.epi_tile)
        # a gated build's product, stored beside its gated half (else a stand-in never used)
        tma_p, gP = tma.make_tma_store(c_src, self.smem_c_layout, self.epi_tile) \
            if cutlass.const_expr(self.epi.gate_preact) else (tma_c, gC)
        # the scheduler's units: output tiles per batch, or with split-K per K chunk
        units = cute.make_identity_tensor((c.shape[0], c.shape[1], splits)) if cutlass.const_expr(self.split_k) \
            else c
        sched = tile_scheduler.make_params(units, (tm, self.out_tile_n), self.cluster_mn, cfg.swizzle,
                                           cfg.raster == "m")
        grid = tile_scheduler.grid_shape(sched, max_active_clusters)

        @cute.struct
        class Storage:
            mainloop_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[self.a_dtype, cute.cosize(self.smem_a_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.b_dtype, cute.cosize(self.smem_b_layout)], 1024]
            sC: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(self.smem_c_layout)], 1024]
            sBias: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.staged_elems["bias"]], 16]
            sScaleA: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.staged_elems["scale_a"]], 16]
            sScaleB: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.staged_elems["scale_b"]], 16]
            # split-K: per tile-owning warpgroup, whether its chunk was the tile's last to arrive
            sLast: cute.struct.MemRange[cutlass.Int32, 2 if self.split_k else 0]

        self.storage = Storage
        self.kernel(
            tma_a, gA, tma_b, gB, tma_c, gC, tma_p, gP, self.tiled_mma, cute.make_layout((*self.cluster_mn, 1)),
            self.smem_a_layout, self.smem_b_layout, self.smem_c_layout, sched, alpha, beta, c_src, bias,
            scale_a, scale_b, workspace, counters, splits,
        ).launch(grid=grid, block=[self.roles.threads, 1, 1], cluster=(*self.cluster_mn, 1),
                 min_blocks_per_mp=1, stream=stream)

    # ----- device side ------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_c: cute.CopyAtom, mC: cute.Tensor, tma_p: cute.CopyAtom, mP: cute.Tensor,
               tiled_mma: cute.TiledMma, cluster_layout: cute.Layout,
               smem_a_layout: cute.ComposedLayout, smem_b_layout: cute.ComposedLayout,
               smem_c_layout: cute.ComposedLayout, sched_params: utils.PersistentTileSchedulerParams,
               alpha: cutlass.Float32, beta: cutlass.Float32, c_src: cute.Tensor, bias: cute.Tensor,
               scale_a: cute.Tensor, scale_b: cute.Tensor, workspace: cute.Tensor, counters: cute.Tensor,
               splits: cutlass.Int32):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            tma.prefetch(tma_a, tma_b, tma_c)
            if cutlass.const_expr(self.epi.gate_preact):
                tma.prefetch(tma_p)

        # --- shared storage and the mainloop pipeline
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cluster_layout.get_flat_coord(cta_rank)
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.storage)
        a_stage = cute.slice_(smem_a_layout, (None, None, 0))
        b_stage = cute.slice_(smem_b_layout, (None, None, 0))
        tx_bytes = cute.size_in_bytes(self.a_dtype, a_stage) + cute.size_in_bytes(self.b_dtype, b_stage)
        ab_pipe = hpipe.make_mainloop_pipeline(
            storage.mainloop_barriers.data_ptr(), stages=self.stages, tx_bytes=tx_bytes,
            consumer_warps=4 * self.mma_warpgroups, cluster_layout_mnk=cluster_layout,
            mcast_a=cfg.cluster_n, mcast_b=cfg.cluster_m,
        )
        if cute.size(self.cluster_mn) > 1:
            cute.arch.cluster_arrive_relaxed()

        sA = storage.sA.get_tensor(smem_a_layout.outer, swizzle=smem_a_layout.inner)
        sB = storage.sB.get_tensor(smem_b_layout.outer, swizzle=smem_b_layout.inner)
        sC = storage.sC.get_tensor(smem_c_layout.outer, swizzle=smem_c_layout.inner)
        # the staged slices, (length, buffer) each, in `epilogue.STAGED` order (None: not staged)
        sStaged = [None, None, None]
        for i, (name, field) in enumerate(zip(epilogue.STAGED, (storage.sBias, storage.sScaleA, storage.sScaleB))):
            if cutlass.const_expr(name in self.staged):
                sStaged[i] = field.get_tensor(cute.make_layout((self.staged[name].length, self.stage_buffers)))

        # --- partition: global tiles (rows, K, RestRows, RestK, L) and their TMA views
        tm, tn, tk = self.tile_mnk
        gA = cute.local_tile(mA, (tm, tk), (None, None, None))
        gB = cute.local_tile(mB, (tn, tk), (None, None, None))
        gC = cute.local_tile(mC, (tm, self.out_tile_n), (None, None, None))
        gP = cute.local_tile(mP, (tm, tn), (None, None, None)) if cutlass.const_expr(self.epi.gate_preact) else gC
        # (m, n, l) of every output element, tiled like gC: where the fused epilogue reads C and bias
        cC = cute.local_tile(cute.make_identity_tensor(mC.shape), (tm, self.out_tile_n), (None, None, None))
        if cutlass.const_expr(self.epi.scale_ab and not self.epi.scale_rows):
            alpha = alpha * scale_a[0].to(cutlass.Float32) * scale_b[0].to(cutlass.Float32)
        epi_args = (cC, (mC.shape[0], mC.shape[1]), alpha, beta, c_src, bias, scale_a, scale_b, sStaged, tma_p, gP)
        split_args = (workspace, counters, splits, storage.sLast.get_tensor(cute.make_layout(2))) \
            if cutlass.const_expr(self.split_k) else None
        tAsA, tAgA = tma.partition_load(tma_a, cluster_layout, cluster_coord, 0, sA, gA)
        tBsB, tBgB = tma.partition_load(tma_b, cluster_layout, cluster_coord, 1, sB, gB)
        k_tiles = cute.size(gA, mode=[3])
        if cutlass.const_expr(self.split_k):
            # every unit runs one chunk of the same number of k-tiles; the last chunk's k-tiles
            # past K are wholly out of bounds, which TMA fills with zeros (they add nothing)
            k_tiles = (k_tiles + splits - 1) // splits

        if cute.size(self.cluster_mn) > 1:
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()

        warpgroup = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        if warpgroup == 0:
            self.roles.become_producer()
            if warp_idx == 0:
                a_mask, b_mask = tma.multicast_masks(cluster_layout, cluster_coord, cfg.cluster_n > 1, cfg.cluster_m > 1)
                self.produce(ab_pipe, sched_params, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, a_mask, b_mask, k_tiles)
        else:
            self.roles.become_consumer()
            if cutlass.const_expr(self.pingpong):
                # consumer warpgroup wg (0 or 1, a runtime value) takes every other tile
                wg = warpgroup - 1
                self.consume(ab_pipe, sched_params, tiled_mma, sA, sB, sC, gC, tma_c, epi_args, split_args, k_tiles,
                             tidx - THREADS_PER_WARPGROUP * (1 + wg), warp_idx, wg)
            else:
                self.consume(ab_pipe, sched_params, tiled_mma, sA, sB, sC, gC, tma_c, epi_args, split_args, k_tiles,
                             tidx - THREADS_PER_WARPGROUP, warp_idx, 0)

    @cute.jit
    def produce(self, ab_pipe, sched_params, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, a_mask, b_mask, k_tiles):
        """Producer warp: for each scheduled tile, TMA every k-tile of A and B into the ring (with
        split-K, the `k_tiles` of the unit's chunk l: k-tiles l * k_tiles onwards of batch 0)."""
        sched = tile_scheduler.create(sched_params)
        work = sched.initial_work_tile_info()
        state = hpipe.producer_state(self.stages)
        while work.is_valid_tile:
            m, n, l = work.tile_idx
            k0 = 0
            if cutlass.const_expr(self.split_k):
                k0, l = l * k_tiles, 0
            tAgA_t = tAgA[(None, m, None, l)]
            tBgB_t = tBgB[(None, n, None, l)]
            for kt in range(k_tiles):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                cute.copy(tma_a, tAgA_t[(None, k0 + kt)], tAsA[(None, state.index)], tma_bar_ptr=bar,
                          mcast_mask=a_mask)
                cute.copy(tma_b, tBgB_t[(None, k0 + kt)], tBsB[(None, state.index)], tma_bar_ptr=bar,
                          mcast_mask=b_mask)
                ab_pipe.producer_commit(state)
                state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        ab_pipe.producer_tail(state)

    @cute.jit
    def consume(self, ab_pipe, sched_params, tiled_mma, sA, sB, sC, gC, tma_c, epi_args, split_args, k_tiles, ctidx,
                warp_idx, wg):
        """Consumer warpgroups: main loop of wgmma over the k-tiles, then the TMA-store epilogue.

        Cooperative (`wg` = 0, static): both warpgroups run this on every tile, each on half its rows.
        Ping-pong: warpgroup `wg` takes tiles wg, wg+2, ... of this CTA's sequence, so its
        epilogue runs while the other warpgroup's main loop uses the tensor cores. The producer
        fills stages in tile order, so a warpgroup skips the other's k_tiles stages in its
        pipeline states.

        Why the ping-pong waits are exact: an mbarrier wait tests only the parity of the phase,
        so waiting on fill number c of slot c % S is correct only if fill c - S has already
        completed (else the parity matches a phase that completed long ago and the wait falls
        through on stale data). A warpgroup starts waiting on tile t's stages only after the
        other one has passed every wait of tile t-1 (`my_turn` / `their_turn` named barriers,
        256 threads: one warpgroup arrives, the other syncs), and within a tile waits are in
        order, so when fill c is awaited every fill before c has completed. The hand-off is
        signalled only when the other warpgroup has a next tile (`has_tile_after`), so every
        arrive is matched by exactly one sync. Fills are never ahead of waits either: the
        producer refills a slot only after its empty barrier completed, i.e. after the
        consumer of the previous fill released it.
        """
        cfg = self.config
        cC, extent_mn, alpha, beta, c_src, bias, scale_a, scale_b, sStaged, tma_p, gP = epi_args
        ring = cfg.epi_stages // 2 if self.pingpong else cfg.epi_stages
        epi_barrier = pipeline.NamedBarrier(barrier_id=1 + wg, num_threads=self.epi_threads)
        # Ping-pong math order: warpgroup wg may start waiting on the mainloop pipeline only after
        # the other one has passed all its waits for the previous tile. Besides keeping the tensor
        # cores to one warpgroup at a time, this is needed for correctness: mbarrier waits test a
        # phase *parity*, so a waiter must never run two phases ahead of a slot.
        my_turn = pipeline.NamedBarrier(barrier_id=3 + wg, num_threads=2 * THREADS_PER_WARPGROUP)
        their_turn = pipeline.NamedBarrier(barrier_id=4 - wg, num_threads=2 * THREADS_PER_WARPGROUP)
        thr_mma = tiled_mma.get_slice(ctidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(gC).shape[:3], self.acc_dtype)
        # fp8 without fast accumulation: each k-tile accumulates into `acc` from zero and is added
        # into `acc_main` in full fp32 (wgmma's fp8 accumulator keeps fewer mantissa bits)
        acc_main = cute.make_rmem_tensor(acc.shape, self.acc_dtype) if cutlass.const_expr(self.promote) else acc

        r2s = epilogue.make_r2s_copy(self.c_layout, self.c_dtype, self.acc_dtype, tiled_mma)
        thr_r2s = r2s.get_slice(ctidx)
        tRS_sC = thr_r2s.partition_D(sC)
        tRS_acc = r2s.retile(acc_main)
        frag_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
        # gated: the gated half stored through the half-width MMA's partition of the same ring
        r2s_out, tRS_sC_out, tRS_acc_out = r2s, tRS_sC, tRS_acc
        if cutlass.const_expr(self.gated):
            r2s_out = epilogue.make_r2s_copy(self.c_layout, self.c_dtype, self.acc_dtype, self.out_mma)
            tRS_sC_out = r2s_out.get_slice(ctidx).partition_D(sC)
            tRS_acc_out = r2s_out.retile(epilogue.gate_view(acc_main))
        tRS_rAcc = cute.make_rmem_tensor(frag_shape, self.acc_dtype)
        tRS_rC = cute.make_rmem_tensor(frag_shape, self.c_dtype)
        store_pipe = hpipe.make_store_pipeline(stages=ring, threads=self.epi_threads)
        # per staged vector (`epilogue.STAGED` order; None where not staged): its source, its
        # registers between prefetch and stage, and this warpgroup's smem slice
        sources = (bias, scale_a, scale_b)
        stage_regs = [None, None, None]
        slices = [None, None, None]
        for i, name in enumerate(epilogue.STAGED):
            if cutlass.const_expr(name in self.staged):
                stage_regs[i] = self.staged[name].fragment()
                slices[i] = sStaged[i][(None, wg)]
        store_warp = 4 + 4 * wg  # the first warp of the (first) consumer warpgroup issues TMA stores
        stride = 2 if self.pingpong else 1

        sched = tile_scheduler.create(sched_params)
        read = hpipe.consumer_state(self.stages)
        release = hpipe.consumer_state(self.stages)
        if cutlass.const_expr(self.pingpong):
            # the second warpgroup starts one tile (and its k_tiles stages) later
            sched.advance_to_next_work(advance_count=wg)
            read.advance(k_tiles * wg)
            release.advance(k_tiles * wg)
        work = sched.get_current_work()
        done = cutlass.Int32(0)  # tiles this warpgroup has run
        stored = cutlass.Int32(0)  # tiles it has stored (its epilogue ring's position)
        while work.is_valid_tile:
            m, n, l = work.tile_idx
            # the tile's first row and column: where its staged slices start
            m0, n0 = m * self.tile_mnk[0], n * self.out_tile_n
            for i, name in enumerate(epilogue.STAGED):
                if cutlass.const_expr(name in self.staged):
                    # loaded now so that the loads' latency hides under the main loop
                    along_m = self.staged[name].dim == "m"
                    self.staged[name].prefetch(sources[i], stage_regs[i], m0 if along_m else n0,
                                               extent_mn[0] if along_m else extent_mn[1], ctidx)
            if cutlass.const_expr(self.pingpong):
                if done > 0 or wg == 1:
                    my_turn.arrive_and_wait()
            if cutlass.const_expr(self.promote):
                # main loop, promoted: every k-tile fresh in acc, retired, then added to acc_main
                acc_main.fill(0.0)
                for kt in range(k_tiles):
                    wgmma.fence()
                    ab_pipe.consumer_wait(read)
                    wgmma.mma_k_tile(tiled_mma, acc, tCrA, tCrB, read.index, zero_init=True)
                    wgmma.commit_group()
                    wgmma.wait_group(0)
                    ab_pipe.consumer_release(release)
                    release.advance()
                    read.advance()
                    acc_main.store(acc_main.load() + acc.load())
            else:
                # main loop: the first k-tile overwrites acc; one wgmma group stays in flight
                wgmma.fence()
                ab_pipe.consumer_wait(read)
                wgmma.mma_k_tile(tiled_mma, acc, tCrA, tCrB, read.index, zero_init=True)
                wgmma.commit_group()
                read.advance()
                for kt in range(1, k_tiles):
                    ab_pipe.consumer_wait(read)
                    wgmma.mma_k_tile(tiled_mma, acc, tCrA, tCrB, read.index)
                    wgmma.commit_group()
                    wgmma.wait_group(1)
                    ab_pipe.consumer_release(release)
                    release.advance()
                    read.advance()
            if cutlass.const_expr(self.pingpong):
                # hand the pipeline to the other warpgroup if it has a next tile (the tile right
                # after this one in this CTA's sequence), so no arrival is left unmatched
                if tile_scheduler.has_tile_after(sched, 1):
                    their_turn.arrive()
            if cutlass.const_expr(not self.promote):
                wgmma.wait_group(0)
                ab_pipe.consumer_release(release)
                release.advance()
            if cutlass.const_expr(self.pingpong):
                read.advance(k_tiles)
                release.advance(k_tiles)

            # split-K: the chunks' sums meet in the workspace; only the tile's last chunk stores it
            stores = True
            l_out = l
            if cutlass.const_expr(self.split_k):
                stores = self.exchange_partials(acc_main, split_args, m, n, l, extent_mn, ctidx, wg, epi_barrier)
                l_out = 0
            if stores:
                # epilogue: fuse in registers, then sub-tiles of epi_tile through the smem ring and TMA store
                if cutlass.const_expr(len(self.staged) > 0):
                    for i, name in enumerate(epilogue.STAGED):
                        if cutlass.const_expr(name in self.staged):
                            self.staged[name].stage(stage_regs[i], slices[i], ctidx)
                    epi_barrier.arrive_and_wait()
                if cutlass.const_expr(self.gated):
                    # the product first (its sub-tiles read the accumulator before gating rewrites it)
                    pre_count = self.subtile_count(self.tile_mnk[1]) if cutlass.const_expr(self.epi.gate_preact) else 0
                    base = stored * (pre_count + self.subtile_count(self.out_tile_n))
                    if cutlass.const_expr(self.epi.gate_preact):
                        self.store_subtiles(tRS_acc, alpha, None, r2s, tRS_sC, tRS_rAcc, tRS_rC, sC, tma_p,
                                            gP[(None, None, m, n, l_out)], base, ring, wg, warp_idx, store_warp,
                                            epi_barrier, store_pipe)
                    epilogue.gate_in_place(acc_main, alpha)
                    self.store_subtiles(tRS_acc_out, 1.0, None, r2s_out, tRS_sC_out, tRS_rAcc, tRS_rC, sC, tma_c,
                                        gC[(None, None, m, n, l_out)], base + pre_count, ring, wg, warp_idx, store_warp,
                                        epi_barrier, store_pipe)
                else:
                    fusion = None
                    if cutlass.const_expr(self.epi.fused):
                        staged = (*slices, m0, n0) if cutlass.const_expr(len(self.staged) > 0) else None
                        coords = r2s.retile(thr_mma.partition_C(cC[(None, None, m, n, l_out)]))
                        fusion = (coords, extent_mn, alpha, beta, c_src, bias, scale_a, scale_b, staged)
                    self.store_subtiles(tRS_acc, alpha, fusion, r2s, tRS_sC, tRS_rAcc, tRS_rC, sC, tma_c,
                                        gC[(None, None, m, n, l_out)], stored * self.subtile_count(self.out_tile_n),
                                        ring, wg, warp_idx, store_warp, epi_barrier, store_pipe)
                stored += 1
            done += 1
            sched.advance_to_next_work(advance_count=stride)
            work = sched.get_current_work()
        store_pipe.producer_tail()

    @cute.jit
    def exchange_partials(self, acc: cute.Tensor, split_args, m, n, l, extent_mn, ctidx, wg, epi_barrier):
        """Split-K's in-kernel reduction for chunk `l` of tile (m, n); True when this warpgroup
        (or pair, cooperative) now holds the tile's whole sum in `acc` and stores the tile.

        Every chunk writes `acc` to its slot of the workspace (fp32; per (tile, chunk) one block
        of tile_m * tile_n values, thread t's value group g at 16-byte vector g * threads + t,
        so each warp writes 512 contiguous bytes). After a barrier (which orders every thread's
        stores before it) one thread adds 1 to the tile's counter, acquire-release: the chunk that
        brings the count to S is the tile's last, resets the counter for the next launch, and
        sums all S blocks in chunk order into `acc` (its own included, re-read: the same order
        whichever CTA arrived last, so the sum is deterministic). Nothing waits on another CTA,
        so no grid residency is assumed. Tiles wholly outside the output do nothing (their
        units only round the grid to clusters and swizzle bands)."""
        workspace, counters, splits, s_last = split_args
        tm, tn = self.tile_mnk[0], self.tile_mnk[1]
        threads = self.epi_threads
        nvec = cute.size(acc) // 4
        per_block = tm * tn // 4  # 16-byte vectors per (tile, chunk) block
        acc_v = cute.make_tensor(acc.iterator, cute.make_layout((4, nvec), stride=(1, 4)))
        ws = cute.make_tensor(workspace.iterator, cute.make_layout((4, workspace.shape[0] // 4), stride=(1, 4)))
        vec = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128)
        stores = cutlass.Boolean(False)
        if m * tm < extent_mn[0] and n * tn < extent_mn[1]:
            tile = m + n * ((extent_mn[0] + tm - 1) // tm)
            counter = counters.iterator + tile
            mine = (tile * splits + l) * per_block + ctidx
            for v in cutlass.range_constexpr(nvec):
                cute.copy(vec, acc_v[(None, v)], ws[(None, mine + v * threads)])
            epi_barrier.arrive_and_wait()
            if ctidx == 0:
                arrived = cute.arch.atomic_add(counter, cutlass.Int32(1), sem="acq_rel", scope="gpu")
                last = cutlass.Int32(0)
                if arrived == splits - 1:
                    last = cutlass.Int32(1)
                    cute.arch.store(counter, cutlass.Int32(0))
                s_last[wg] = last
            epi_barrier.arrive_and_wait()
            if s_last[wg] == 1:
                group = math.gcd(nvec, _SPLIT_VECS)
                part = cute.make_rmem_tensor(cute.make_layout((4, group), stride=(1, 4)), cutlass.Float32)
                first = tile * splits * per_block + ctidx
                for v in cutlass.range_constexpr(nvec):
                    cute.copy(vec, ws[(None, first + v * threads)], acc_v[(None, v)])
                for j in cutlass.range(1, splits, unroll=1):
                    block = first + j * per_block
                    # a group of vectors in flight at a time: loads issued together, then added
                    for g in cutlass.range_constexpr(nvec // group):
                        for v in cutlass.range_constexpr(group):
                            cute.copy(vec, ws[(None, block + (g * group + v) * threads)], part[(None, v)])
                        for v in cutlass.range_constexpr(group):
                            for e in cutlass.range_constexpr(4):
                                acc_v[e, g * group + v] = acc_v[e, g * group + v] + part[e, v]
                stores = cutlass.Boolean(True)
        return stores

    def subtile_count(self, tile_n: int) -> int:
        """Epilogue sub-tiles in a (tile_m, tile_n) tile (trace time)."""
        return (self.tile_mnk[0] // self.epi_tile[0]) * (tile_n // self.epi_tile[1])

    @cute.jit
    def store_subtiles(self, tRS_vals, scale, fusion, r2s, tRS_sC, tRS_rAcc, tRS_rC, sC, tma_atom, g_tile, base,
                       ring, wg, warp_idx, store_warp, epi_barrier, store_pipe):
        """One tile's values stored through the smem ring, sub-tile by sub-tile, its buffers
        counted from `base`: each value of the retiled fragment `tRS_vals` times `scale`, or with
        `fusion` (the fragment's coordinates, then `epilogue.fuse`'s operands) the fused epilogue
        of it; converted, written to smem (stmatrix when 16-bit), and TMA-stored by one warp."""
        g_sub = cute.zipped_divide(g_tile, self.epi_tile)
        bSG_sC, bSG_gC = cute.nvgpu.cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), g_sub)
        grid = g_sub.shape[1]
        order = cute.make_layout(grid, stride=(grid[1], 1))
        frag_size = cute.size(tRS_rAcc)
        for e in cutlass.range_constexpr(cute.size(g_sub, mode=[1])):
            for v in cutlass.range_constexpr(frag_size):
                if cutlass.const_expr(fusion is not None):
                    coords, extent_mn, alpha, beta, c_src, bias, scale_a, scale_b, staged = fusion
                    tRS_rAcc[v] = epilogue.fuse(self.epi, tRS_vals[e * frag_size + v], coords[e * frag_size + v],
                                                extent_mn, alpha, beta, c_src, bias, scale_a, scale_b, staged)
                else:
                    tRS_rAcc[v] = tRS_vals[e * frag_size + v] * scale
            tRS_rC.store(tRS_rAcc.load().to(self.c_dtype))
            buf = (base + e) % ring + wg * ring
            cute.copy(r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
            cute.arch.fence_proxy("async.shared", space="cta")
            epi_barrier.arrive_and_wait()
            if warp_idx == store_warp:
                cute.copy(tma_atom, bSG_sC[(None, buf)], bSG_gC[(None, order.get_hier_coord(e))])
                store_pipe.producer_commit()
                store_pipe.producer_acquire()
            epi_barrier.arrive_and_wait()


# 16-byte workspace vectors a split-K reduction keeps in flight per thread (32 registers) while
# it adds a chunk's block (ptxas hoists further loads where registers allow)
_SPLIT_VECS = 8


class SplitKLaunch:
    """The launch of a split-K build (`Sm90PersistentGemm(..., split_k=True)`): a (M, K, 1) and b
    (N, K, 1) as for any launch, c the (M, N, 1) output, K's k-tiles cut into `splits` chunks of
    ceil(k_tiles / splits) each (the last one's tiles past K read as zeros), `workspace` an fp32
    vector of at least tiles * splits * tile_m * tile_n elements (16-byte aligned; scratch) and
    `counters` an int32 vector of at least one zero per output tile (ceil(M / tile_m) *
    ceil(N / tile_n)), left zero by every launch that completes, so one zeroed buffer serves
    every launch that does not run concurrently with another using it."""

    def __init__(self, kern: "Sm90PersistentGemm"):
        if not kern.split_k:
            raise ValueError("SplitKLaunch needs a split-K build: Sm90PersistentGemm(..., split_k=True)")
        self.kern = kern

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, c_src: cute.Tensor, bias: cute.Tensor,
                 scale_a: cute.Tensor, scale_b: cute.Tensor, workspace: cute.Tensor, counters: cute.Tensor,
                 splits: cutlass.Int32, alpha: cutlass.Float32, beta: cutlass.Float32,
                 max_active_clusters: cutlass.Constexpr, stream):
        self.kern.launch_with(a, b, c, c_src, bias, scale_a, scale_b, workspace, counters, splits, alpha, beta,
                              max_active_clusters, stream)


def _make_rung():
    from cute_kernels.gemm.sm90_rung import Sm90Rung

    return Sm90Rung("sm90_persistent", Sm90PersistentGemm)


rung = _make_rung()

VARIANTS = {
    "default": {},
    "fp16": {"in_dtype": "fp16", "out_dtype": "fp16"},
    "fp32_out": {"out_dtype": "fp32"},
    "cluster_1x2": {"cluster_m": 1, "cluster_n": 2},
    "tile_128x128": {"tile_n": 128},
    # the 128x192 class pick_config takes where 128x256 tiles leave a partial wave (ViT's N = 768)
    "tile_128x192_1x2_bias_gelu": {"tile_n": 192, "cluster_m": 1, "cluster_n": 2, "bias": "n",
                                   "activation": "gelu_tanh"},
    "tile_128x192_a_m_major_b_n_major": {"tile_n": 192, "cluster_m": 1, "a_major": "MN", "b_major": "MN"},
    "a_m_major": {"a_major": "MN"},
    "b_n_major": {"b_major": "MN"},
    "c_m_major": {"c_major": "M"},
    "pingpong_128x128": {"tile_n": 128, "schedule": "pingpong"},
    "pingpong_128x128_1x2": {"tile_n": 128, "schedule": "pingpong", "cluster_m": 1, "cluster_n": 2},
    # pick_config's short-K class (EVA-02's K = 768 layers) as nn.Linear runs it: the forward
    # with its bias fused, the input gradient with B read N-major
    "pingpong_128x128_1x2_bias": {"tile_n": 128, "schedule": "pingpong", "cluster_m": 1, "cluster_n": 2, "bias": "n"},
    "pingpong_128x128_1x2_b_n_major": {"tile_n": 128, "schedule": "pingpong", "cluster_m": 1, "cluster_n": 2,
                                       "b_major": "MN"},
    "epi_c_bias_n_gelu": {"beta_c": True, "bias": "n", "activation": "gelu"},  # erf (the 128x192 build: tanh)
    "epi_bias_m_silu_fp32": {"bias": "m", "activation": "silu", "out_dtype": "fp32"},
    "epi_relu_pingpong": {"tile_n": 128, "schedule": "pingpong", "beta_c": True, "activation": "relu"},
    "pingpong_64x128": {"tile_m": 64, "tile_n": 128, "schedule": "pingpong", "cluster_m": 1},
    # SwiGLU gate-up products (EpilogueSpec.gate): the gated half, and with the product beside it
    "swiglu_preact": {"gate": "swiglu", "gate_preact": True},
    "swiglu_pingpong_128x128_1x2": {"tile_n": 128, "schedule": "pingpong", "cluster_m": 1, "cluster_n": 2,
                                    "gate": "swiglu"},
    # split-K builds (in-kernel reduction): the weight-gradient class (M-major A, N-major B)
    # and the swapped small-M one with a fused bias and activation
    "split_k": {"split_k": True, "a_major": "MN", "b_major": "MN"},
    "split_k_128x192_bias_gelu": {"split_k": True, "tile_n": 192, "cluster_m": 1, "cluster_n": 2, "bias": "n",
                                  "activation": "gelu_tanh", "out_dtype": "fp32"},
    "split_k_skinny_swap_64x16": {"split_k": True, "tile_m": 64, "tile_n": 16, "schedule": "pingpong",
                                  "cluster_m": 1, "c_major": "M", "bias": "m"},
    # swap-AB builds of the small-M path (sm90_skinny): 16 output columns, M-major output
    "skinny_swap_64x16": {"tile_m": 64, "tile_n": 16, "schedule": "pingpong", "cluster_m": 1, "c_major": "M",
                          "bias": "m"},
    "skinny_swap_64x16_mn_fp32": {"tile_m": 64, "tile_n": 16, "schedule": "pingpong", "cluster_m": 1, "c_major": "M",
                                  "a_major": "MN", "b_major": "MN", "out_dtype": "fp32"},
}

# fp8 builds (per-tensor scales read on the device); their SASS MMA is QGMMA (.E4M3 / .E5M2)
FP8_VARIANTS = {
    "e4m3": {"in_dtype": "e4m3", "tile_n": 128, "tile_k": 128, "scale_ab": True},
    "e5m2_fp32out": {"in_dtype": "e5m2", "out_dtype": "fp32", "tile_n": 128, "tile_k": 128, "scale_ab": True},
    "e4m3_fast_accum_128x256": {"in_dtype": "e4m3", "tile_k": 128, "fp8_fast_accum": True, "scale_ab": True},
    "e4m3_pingpong_128x64": {"in_dtype": "e4m3", "tile_n": 64, "tile_k": 128, "schedule": "pingpong", "scale_ab": True},
    "e4m3_bias_gelu": {"in_dtype": "e4m3", "tile_n": 128, "tile_k": 128, "scale_ab": True, "bias": "n",
                       "activation": "gelu_tanh"},
    "e4m3_skinny_swap_64x16": {"in_dtype": "e4m3", "tile_m": 64, "tile_n": 16, "tile_k": 128, "schedule": "pingpong",
                               "cluster_m": 1, "c_major": "M", "scale_ab": True, "bias": "m"},
    # row-wise scales (one per row of A, one per column of B), as torch._scaled_mm's
    "e4m3_rowwise": {"in_dtype": "e4m3", "tile_n": 128, "tile_k": 128, "scale_ab": True, "scale_rows": True},
    # split-K reduced in the kernel, on the promoted (two-accumulator) path
    "e4m3_rowwise_split_k": {"in_dtype": "e4m3", "tile_n": 128, "tile_k": 128, "scale_ab": True, "scale_rows": True,
                             "split_k": True},
}


def _register() -> None:
    from cute_kernels.gemm.sm90_rung import register_compile_variants

    register_compile_variants("gemm.sm90_persistent", Sm90PersistentGemm, VARIANTS, {"HGMMA", "UTMALDG", "UTMASTG"})
    register_compile_variants("gemm.sm90_persistent_fp8", Sm90PersistentGemm, FP8_VARIANTS, {"QGMMA", "UTMALDG", "UTMASTG"})


_register()
