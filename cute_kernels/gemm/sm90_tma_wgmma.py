"""Rung 5, `sm90_tma_wgmma`: TMA + wgmma with a multistage mbarrier pipeline, one warpgroup.

D[m, n, l] = alpha * sum_k A[m, k, l] * B[n, k, l], fp32 accumulation; one CTA per output
tile, 128 threads (a single warpgroup that both loads and computes).

What it adds over the sm80 rung: operands arrive by TMA (one thread issues a whole tile,
bytes are counted on an mbarrier) into 128B-swizzled smem that `wgmma.mma_async` reads
directly, with no register staging. The pipeline keeps `stages - 1` k-tiles in flight:
  prologue   warp 0 issues TMA for k-tiles 0 .. stages-2
  k-tile kt  wait full[kt] -> wgmma(kt) -> commit -> wait until wgmma(kt-1) retires ->
             release empty[kt-1] -> warp 0 issues TMA for k-tile kt+stages-1 into that slot
The epilogue writes the tile through smem with stmatrix and a TMA store (OOB clipped).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils as utils

from cute_kernels.gemm.sm90_config import Sm90GemmConfig
from cute_kernels.hopper import epilogue, smem_layouts, tma, wgmma
from cute_kernels.hopper import pipeline as hpipe


def _major(t) -> str:
    le = utils.LayoutEnum.from_tensor(t)
    return "K" if le.sm90_mma_major_mode() == cute.nvgpu.OperandMajorMode.K else "MN"


class Sm90TmaWgmmaGemm:
    """One warpgroup per CTA tile (tile_m x tile_n, tile_m in {64, 128}), no clusters."""

    threads = 128

    def __init__(self, config: Sm90GemmConfig, acc_dtype=cutlass.Float32):
        self.config = config.validate()
        if config.cluster_m * config.cluster_n != 1:
            raise ValueError("sm90_tma_wgmma runs without clusters: cluster_m = cluster_n = 1")
        if config.tile_m not in (64, 128) or config.tile_n > 256:
            raise ValueError("sm90_tma_wgmma: tile_m must be 64 or 128 (one warpgroup)")
        self.acc_dtype = acc_dtype
        self.tile_mnk = (config.tile_m, config.tile_n, config.tile_k)
        self.epi_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.threads)

    def _setup(self, a, b, c):
        cfg = self.config
        tm, tn, tk = self.tile_mnk
        self.a_dtype, self.b_dtype, self.c_dtype = a.element_type, b.element_type, c.element_type
        self.c_layout = utils.LayoutEnum.from_tensor(c)
        self.a_major, self.b_major = _major(a), _major(b)
        self.tiled_mma = wgmma.make_tiled_mma(self.a_dtype, self.b_dtype, self.a_major, self.b_major,
                                              self.acc_dtype, (1, 1, 1), tn)
        self.stages = cfg.resolved_stages(self.a_dtype.width // 8, self.c_dtype.width)
        self.epi_tile = (min(64, tm), min(32, tn))
        c_major = "MN" if self.c_layout.is_m_major_c() else "K"
        self.smem_a_layout = smem_layouts.staged_smem_layout(
            smem_layouts.gmma_atom(self.a_major, self.a_dtype, tk if self.a_major == "K" else tm), tm, tk, self.stages)
        self.smem_b_layout = smem_layouts.staged_smem_layout(
            smem_layouts.gmma_atom(self.b_major, self.b_dtype, tk if self.b_major == "K" else tn), tn, tk, self.stages)
        self.smem_c_layout = smem_layouts.staged_epi_layout(
            smem_layouts.gmma_atom(c_major, self.c_dtype, self.epi_tile[0 if c_major == "MN" else 1]),
            *self.epi_tile, cfg.epi_stages)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, alpha: cutlass.Float32,
                 max_active_clusters: cutlass.Constexpr, stream):
        """a: (M, K, L), b: (N, K, L), c: (M, N, L); `max_active_clusters` is unused (one CTA per tile)."""
        self._setup(a, b, c)
        tm, tn, tk = self.tile_mnk
        tma_a, gA = tma.make_tma_load(a, self.smem_a_layout, (tm, tk), 1)
        tma_b, gB = tma.make_tma_load(b, self.smem_b_layout, (tn, tk), 1)
        tma_c, gC = tma.make_tma_store(c, self.smem_c_layout, self.epi_tile)

        @cute.struct
        class Storage:
            barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[self.a_dtype, cute.cosize(self.smem_a_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.b_dtype, cute.cosize(self.smem_b_layout)], 1024]
            sC: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(self.smem_c_layout)], 1024]

        self.storage = Storage
        grid = (cute.ceil_div(c.shape[0], tm), cute.ceil_div(c.shape[1], tn), c.shape[2])
        self.kernel(tma_a, gA, tma_b, gB, tma_c, gC, self.tiled_mma, self.smem_a_layout, self.smem_b_layout,
                    self.smem_c_layout, alpha).launch(grid=grid, block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_c: cute.CopyAtom, mC: cute.Tensor, tiled_mma: cute.TiledMma,
               smem_a_layout: cute.ComposedLayout, smem_b_layout: cute.ComposedLayout,
               smem_c_layout: cute.ComposedLayout, alpha: cutlass.Float32):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, bl = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            tma.prefetch(tma_a, tma_b, tma_c)

        # --- shared storage and the pipeline (consumers: the 4 warps of the warpgroup)
        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        tx_bytes = (cute.size_in_bytes(self.a_dtype, cute.slice_(smem_a_layout, (None, None, 0)))
                    + cute.size_in_bytes(self.b_dtype, cute.slice_(smem_b_layout, (None, None, 0))))
        one_cta = cute.make_layout((1, 1, 1))
        pipe = hpipe.make_mainloop_pipeline(storage.barriers.data_ptr(), stages=self.stages, tx_bytes=tx_bytes,
                                            consumer_warps=4, cluster_layout_mnk=one_cta, mcast_a=1, mcast_b=1)
        sA = storage.sA.get_tensor(smem_a_layout.outer, swizzle=smem_a_layout.inner)
        sB = storage.sB.get_tensor(smem_b_layout.outer, swizzle=smem_b_layout.inner)
        sC = storage.sC.get_tensor(smem_c_layout.outer, swizzle=smem_c_layout.inner)

        # --- partition: this CTA's tiles of A, B (rows, K, k-tiles) and C
        tm, tn, tk = self.tile_mnk
        gA = cute.local_tile(mA, (tm, tk), (bm, None, bl))
        gB = cute.local_tile(mB, (tn, tk), (bn, None, bl))
        gC = cute.local_tile(mC, (tm, tn), (bm, bn, bl))
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                                      cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
                                                      cute.group_modes(gB, 0, 2))
        k_tiles = cute.size(gA, mode=[2])
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(gC).shape, self.acc_dtype)
        cute.arch.sync_threads()  # barrier init visible to all warps

        # --- prologue: fill stages-1 slots
        load = hpipe.producer_state(self.stages)
        if warp_idx == 0:
            for _ in range(min(self.stages - 1, k_tiles)):
                load = self.load_k_tile(pipe, load, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB)

        # --- main loop
        read = hpipe.consumer_state(self.stages)
        release = hpipe.consumer_state(self.stages)
        wgmma.fence()
        pipe.consumer_wait(read)
        wgmma.mma_k_tile(tiled_mma, acc, tCrA, tCrB, read.index, zero_init=True)
        wgmma.commit_group()
        read.advance()
        if warp_idx == 0 and self.stages - 1 < k_tiles:
            load = self.load_k_tile(pipe, load, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB)
        for kt in range(1, k_tiles):
            pipe.consumer_wait(read)
            wgmma.mma_k_tile(tiled_mma, acc, tCrA, tCrB, read.index)
            wgmma.commit_group()
            wgmma.wait_group(1)
            pipe.consumer_release(release)
            release.advance()
            read.advance()
            if warp_idx == 0 and kt + self.stages - 1 < k_tiles:
                load = self.load_k_tile(pipe, load, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB)
        wgmma.wait_group(0)
        pipe.consumer_release(release)

        # --- epilogue: 64 x 32 sub-tiles through the smem ring, TMA store
        r2s = epilogue.make_r2s_copy(self.c_layout, self.c_dtype, self.acc_dtype, tiled_mma)
        thr_r2s = r2s.get_slice(tidx)
        tRS_sC = thr_r2s.partition_D(sC)
        tRS_acc = r2s.retile(acc)
        frag_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
        tRS_rAcc = cute.make_rmem_tensor(frag_shape, self.acc_dtype)
        tRS_rC = cute.make_rmem_tensor(frag_shape, self.c_dtype)
        frag_size = cute.size(tRS_rAcc)
        store_pipe = hpipe.make_store_pipeline(stages=cfg.epi_stages, threads=self.threads)
        gC_epi = cute.zipped_divide(gC, self.epi_tile)
        bSG_sC, bSG_gC = cute.nvgpu.cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_epi)
        epi_grid = gC_epi.shape[1]
        epi_order = cute.make_layout(epi_grid, stride=(epi_grid[1], 1))
        for e in cutlass.range_constexpr(cute.size(gC_epi, mode=[1])):
            for v in cutlass.range_constexpr(frag_size):
                tRS_rAcc[v] = tRS_acc[e * frag_size + v] * alpha
            tRS_rC.store(tRS_rAcc.load().to(self.c_dtype))
            buf = e % cfg.epi_stages
            cute.copy(r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
            cute.arch.fence_proxy("async.shared", space="cta")
            self.epi_barrier.arrive_and_wait()
            if warp_idx == 0:
                cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_order.get_hier_coord(e))])
                store_pipe.producer_commit()
                store_pipe.producer_acquire()
            self.epi_barrier.arrive_and_wait()
        if warp_idx == 0:
            store_pipe.producer_tail()

    @cute.jit
    def load_k_tile(self, pipe, state, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB):
        """Warp 0: TMA k-tile `state.count` of A and B into slot `state.index`; returns the advanced state."""
        pipe.producer_acquire(state)
        bar = pipe.producer_get_barrier(state)
        cute.copy(tma_a, tAgA[(None, state.count)], tAsA[(None, state.index)], tma_bar_ptr=bar)
        cute.copy(tma_b, tBgB[(None, state.count)], tBsB[(None, state.index)], tma_bar_ptr=bar)
        pipe.producer_commit(state)
        state.advance()
        return state


def _make_rung():
    from cute_kernels.gemm.sm90_rung import Sm90Rung

    def pick(m, n, k, in_bytes=2):
        return Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, epi_stages=2, schedule="pingpong")

    return Sm90Rung("sm90_tma_wgmma", Sm90TmaWgmmaGemm, pick=pick)


rung = _make_rung()

VARIANTS = {
    "default": {"tile_n": 128, "cluster_m": 1, "epi_stages": 2, "schedule": "pingpong"},
    "fp16_fp32out": {"tile_n": 128, "cluster_m": 1, "epi_stages": 2, "schedule": "pingpong",
                     "in_dtype": "fp16", "out_dtype": "fp32"},
    "mn_major": {"tile_n": 128, "cluster_m": 1, "epi_stages": 2, "schedule": "pingpong",
                 "a_major": "MN", "b_major": "MN"},
}


def _register() -> None:
    from cute_kernels.gemm.sm90_rung import register_compile_variants

    register_compile_variants("gemm.sm90_tma_wgmma", Sm90TmaWgmmaGemm, VARIANTS, {"HGMMA", "UTMALDG", "UTMASTG"})


_register()
