"""Rung 4, `sm80_mma`: Ampere tensor cores the way CUTLASS 2.x feeds them.

The ideas this rung adds to `sm70_mma`, each with the layout that carries it (all computed in
`cute_kernels.gemm.ampere_config` with `cute_kernels.layouts`, converted by `to_cute`):

- `mma.sync.m16n8k16` (bf16 or fp16 in, fp32 accumulate): a whole warp per 16x8x16 product;
  warps_m x warps_n warps tile the block (`tiled_mma`, atom `SM80_16x8x16_F32BF16BF16F32_TN`).
- `cp.async` global -> shared copies that bypass registers, `stages` deep: while the tensor
  cores chew on k-tile i, tiles i+1 .. i+stages-1 are in flight (`gmem_copy_layouts`: consecutive
  threads on consecutive 16-byte vectors, fully coalesced).
- `ldmatrix.x4` (`.trans` for M- or N-major operands) from a swizzled shared-memory layout
  (`smem_a_layout`, `smem_b_layout`: Sw<2|3,3,3> atoms, conflict-free for ldmatrix).
- Register double buffering: the fragments of k-block j+1 are loaded while the MMAs of k-block j
  issue.
- A threadblock swizzle (`threadblock_swizzle.grouped_tile`) so concurrently running blocks share
  A and B panels in L2.
- An epilogue staged through shared memory (`smem_c_layout`, reusing the operand buffers): the
  accumulator fragments are scaled (alpha, beta * c in fp32), converted, written to shared
  memory, then read back as long row vectors for coalesced global stores.

Any M, N, K >= 1: loads and stores are predicated per vector; the K remainder is handled by
shifting the first k-tile so it is the partial one. A 16-byte cp.async needs every vector to be
aligned and inside its row; the rung picks, per operand, the widest vector (8, 4 or 2 elements)
that the problem's extents, strides and base address allow (`pick_vector`); an operand whose
contiguous extent or strides are odd cannot use cp.async at all and `supports` says so (dispatch
then falls back to a lower rung).
"""

from __future__ import annotations

import functools
import os

import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator
from cutlass.cute.nvgpu import cpasync, warp

from cute_kernels.runtime import (
    CompileJob,
    compile_kernel,
    current_stream,
    fake_stream,
    fake_tensor,
    from_torch,
    register_variant,
    to_cute,
)
from cute_kernels.gemm.ampere_config import (
    WarpMmaConfig,
    gmem_copy_layouts,
    pick_vector,
    smem_operand_layout,
    smem_output_layout,
)
from cute_kernels.gemm.threadblock_swizzle import grouped_tile

__all__ = ["Sm80MmaGemm", "Sm80MmaRung", "RUNG", "DEFAULT_CONFIG", "K_MAJOR_B_CONFIG", "NARROW_CONFIG", "mma_atom_name",
           "build_variant", "config_from_env", "TUNING_ENV"]

# 128x256x64, 3 stages: measured best of a 12-config sweep on the H200 (0.62x cuBLAS at 4096^3,
# 0.63x at 8192^3, against 0.53x / 0.55x for 128x256x32 with 4 stages).
DEFAULT_CONFIG = WarpMmaConfig(tile_k=64, stages=3)
# With B K-major the 128x256x64 tile needs 255 registers and spills; 256x128x64 (4x2 warps)
# does not, and measured within 2% of it (0.61x / 0.63x).
K_MAJOR_B_CONFIG = WarpMmaConfig(tile_m=256, tile_n=128, tile_k=64, warps_m=4, warps_n=2, stages=3)
# For operands whose alignment allows only 8- or 4-byte cp.async: 64 x 32 warp tiles.
NARROW_CONFIG = WarpMmaConfig(tile_m=128, tile_n=128, warps_m=2, warps_n=4, stages=4)
_MAX_GRID_Z = 65535
_DSL_TYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}
_BITS = {"float16": 16, "bfloat16": 16, "float32": 32}


def mma_atom_name(dtype: str) -> str:
    """The `cute_kernels.layouts.atom` name of the MMA this rung issues for `dtype` inputs."""
    return "SM80_16x8x16_F32F16F16F32_TN" if dtype == "float16" else "SM80_16x8x16_F32BF16BF16F32_TN"


def _aligned_view(t, order: list, lead: int, vec: int, elem_bytes: int):
    """While tracing: `t` with its modes permuted by `order`, the extent of its contiguous mode
    `lead` (after permuting) and every dynamic stride declared multiples of `vec`, and its base
    `vec * elem_bytes`-aligned (the rung checked all of it on the host: `pick_vector`)."""
    lay = cute.select(t.layout, mode=order)
    shape, stride = list(lay.shape), list(lay.stride)
    if vec > 1:
        for i in range(3):
            if i == lead:
                shape[i] = cute.assume(shape[i], divby=vec)
            elif not isinstance(stride[i], int):
                stride[i] = cute.assume(stride[i], divby=vec)
    return cute.make_tensor(t.iterator.align(vec * elem_bytes), cute.make_layout(tuple(shape), stride=tuple(stride)))


class Sm80MmaGemm:
    """out = alpha * a @ b (+ beta * c) for a (L, M, K), b (L, K, N), out and c (L, M, N).

    The layouts it uses are attributes (`smem_a_layout`, `smem_b_layout`, `smem_c_layout`,
    `copy_a_layouts`, `copy_b_layouts`, `copy_c_layouts`), computed from the config.
    """

    def __init__(self, config: WarpMmaConfig):
        self.config = config.validate(min_stages=2)
        cfg = self.config
        in_bits = _BITS[cfg.dtype]
        self.smem_a_layout = smem_operand_layout(cfg.tile_m, cfg.tile_k, cfg.stages, cfg.a_major, in_bits)
        self.smem_b_layout = smem_operand_layout(cfg.tile_n, cfg.tile_k, cfg.stages,
                                                 "k" if cfg.b_major == "k" else "m", in_bits)
        self.smem_c_layout = smem_output_layout(cfg.tile_m, cfg.tile_n, cfg.c_major, cfg.stage_bits)
        copies = gmem_copy_layouts(cfg)
        self.copy_a_layouts, self.copy_b_layouts, self.copy_c_layouts = copies["a"], copies["b"], copies["c"]
        self.ab_type = _DSL_TYPES[cfg.dtype]
        self.c_type = _DSL_TYPES[cfg.out_dtype]
        self.stage_type = cutlass.Float32 if cfg.has_c else self.c_type

    # ---- host side --------------------------------------------------------------------------

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream):
        cfg = self.config
        # The kernel's (M, K, L), (N, K, L), (M, N, L) views of our (L, M, K), (L, K, N), (L, M, N).
        # The rung checked (pick_vector) that extents, strides and base are vector multiples;
        # saying so lets the compiler prove every cp.async / store vector aligned.
        in_bytes, out_bytes = self.ab_type.width // 8, self.c_type.width // 8
        mA = _aligned_view(a, [1, 2, 0], 0 if cfg.a_major == "m" else 1, cfg.vec_a, in_bytes)
        mB = _aligned_view(b, [2, 1, 0], 0 if cfg.b_major == "n" else 1, cfg.vec_b, in_bytes)
        mD = _aligned_view(out, [1, 2, 0], 0 if cfg.c_major == "m" else 1, cfg.vec_c, out_bytes)
        mC = cute.make_tensor(c.iterator, cute.select(c.layout, mode=[1, 2, 0]))

        sA_layout = to_cute(self.smem_a_layout)
        sB_layout = to_cute(self.smem_b_layout)
        sC_layout = to_cute(self.smem_c_layout)

        in_bits = self.ab_type.width
        copy_a = cute.make_tiled_copy_tv(self._g2s_atom(cfg.vec_a * in_bits),
                                         to_cute(self.copy_a_layouts[0]), to_cute(self.copy_a_layouts[1]))
        copy_b = cute.make_tiled_copy_tv(self._g2s_atom(cfg.vec_b * in_bits),
                                         to_cute(self.copy_b_layouts[0]), to_cute(self.copy_b_layouts[1]))
        store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.c_type,
                                         num_bits_per_copy=cfg.vec_c * self.c_type.width)
        copy_c = cute.make_tiled_copy_tv(store_atom, to_cute(self.copy_c_layouts[0]), to_cute(self.copy_c_layouts[1]))

        op = warp.MmaF16BF16Op(self.ab_type, cutlass.Float32, (16, 8, 16))
        # N permuted to 16 per warp so one ldmatrix.x4 feeds two n8 atoms of B.
        tiled_mma = cute.make_tiled_mma(op, cute.make_layout((cfg.warps_m, cfg.warps_n, 1)),
                                        permutation_mnk=(cfg.warps_m * 16, cfg.warps_n * 16, 16))

        tiles = cute.ceil_div(mD.shape, (cfg.tile_m, cfg.tile_n, 1))
        tiles_m = cute.size(tiles[0])
        tiles_n = cute.size(tiles[1])
        smem_bytes = cfg.smem_bytes()
        self.kernel(mA, mB, mD, mC, alpha, beta, sA_layout, sB_layout, sC_layout,
                    copy_a, copy_b, copy_c, tiled_mma, tiles_m, tiles_n).launch(
            grid=[tiles_m * tiles_n, 1, cute.size(mD, mode=[2])],
            block=[cfg.threads, 1, 1],
            smem=smem_bytes,
            stream=stream,
        )

    def _g2s_atom(self, bits: int):
        # cp.async.cg (L2 only) moves exactly 16 bytes; narrower vectors need .ca.
        mode = cpasync.LoadCacheMode.GLOBAL if bits == 128 else cpasync.LoadCacheMode.ALWAYS
        return cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=mode), self.ab_type, num_bits_per_copy=bits)

    # ---- device side ------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, mC: cute.Tensor,
               alpha: cutlass.Float32, beta: cutlass.Float32,
               sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout, sC_layout,
               copy_a: cute.TiledCopy, copy_b: cute.TiledCopy, copy_c: cute.TiledCopy,
               tiled_mma: cute.TiledMma, tiles_m: cutlass.Int32, tiles_n: cutlass.Int32):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, bidz = cute.arch.block_idx()
        tm, tn = grouped_tile(bidx, tiles_m, tiles_n, cfg.raster, cutlass.min)
        tiler = (cfg.tile_m, cfg.tile_n, cfg.tile_k)
        coord = (tm, tn, None)
        M, N = mD.shape[0], mD.shape[1]
        # K as the K-major operand with the widest vector sees it (declared a multiple of that
        # vector), so the k-residue shift below keeps its vectors provably aligned.
        K = mA.shape[1]
        if cutlass.const_expr(cfg.b_major == "k" and (cfg.a_major != "k" or cfg.vec_b > cfg.vec_a)):
            K = mB.shape[1]

        # Block tiles: gA (bM, bK, k), gB (bN, bK, k), gD / gC (bM, bN); and their coordinates.
        gA = cute.local_tile(mA[None, None, bidz], tiler=tiler, coord=coord, proj=(1, None, 1))
        gB = cute.local_tile(mB[None, None, bidz], tiler=tiler, coord=coord, proj=(None, 1, 1))
        gD = cute.local_tile(mD[None, None, bidz], tiler=tiler, coord=coord, proj=(1, 1, None))
        idA = cute.make_identity_tensor(mA.layout.shape)
        idB = cute.make_identity_tensor(mB.layout.shape)
        idD = cute.make_identity_tensor(mD.layout.shape)
        cA = cute.local_tile(idA[None, None, bidz], tiler=tiler, coord=coord, proj=(1, None, 1))
        cB = cute.local_tile(idB[None, None, bidz], tiler=tiler, coord=coord, proj=(None, 1, 1))
        cD = cute.local_tile(idD[None, None, bidz], tiler=tiler, coord=coord, proj=(1, 1, None))

        # Make the *first* k-tile the partial one: shift every k-tile back by the remainder, so
        # the main loop's tiles are all full and only the prologue predicates on k.
        k_tiles = cute.size(gA, mode=[2])
        residue = K - cutlass.Int32(cfg.tile_k) * k_tiles
        gA = cute.domain_offset((0, residue, 0), gA)
        gB = cute.domain_offset((0, residue, 0), gB)
        cA = cute.domain_offset((0, residue, 0), cA)
        cB = cute.domain_offset((0, residue, 0), cB)

        smem = SmemAllocator()
        sA = smem.allocate_tensor(self.ab_type, sA_layout, 128)
        sB = smem.allocate_tensor(self.ab_type, sB_layout, 128)
        sC = cute.make_tensor(cute.recast_ptr(sA.iterator, dtype=self.stage_type), sC_layout)

        thr_a = copy_a.get_slice(tidx)
        thr_b = copy_b.get_slice(tidx)
        tAgA, tAsA, tAcA = thr_a.partition_S(gA), thr_a.partition_D(sA), thr_a.partition_S(cA)
        tBgB, tBsB, tBcB = thr_b.partition_S(gB), thr_b.partition_D(sB), thr_b.partition_S(cB)

        # MN predicates, one per vector (a vector never straddles the MN edge: pick_vector).
        tApA = self._mn_predicate(tAgA, tAcA, M)
        tBpB = self._mn_predicate(tBgB, tBcB, N)

        # ---- prologue: zero the buffers (predicated-off vectors stay zero), issue stages-1 tiles
        tAsA.fill(0)
        tBsB.fill(0)
        cute.arch.sync_threads()
        stages = cfg.stages
        k_next = cutlass.Int32(0)
        for kk in cutlass.range_constexpr(cute.size(tAsA, mode=[2])):
            if cute.elem_less(cutlass.Int32(-1), tAcA[0, 0, kk, 0][1]):
                cute.copy(copy_a, tAgA[None, None, kk, 0], tAsA[None, None, kk, 0], pred=tApA[None, None, kk])
        for kk in cutlass.range_constexpr(cute.size(tBsB, mode=[2])):
            if cute.elem_less(cutlass.Int32(-1), tBcB[0, 0, kk, 0][1]):
                cute.copy(copy_b, tBgB[None, None, kk, 0], tBsB[None, None, kk, 0], pred=tBpB[None, None, kk])
        k_next = k_next + 1
        cute.arch.cp_async_commit_group()
        for s in cutlass.range_constexpr(1, stages - 1):
            if s == k_tiles:
                tApA.fill(False)
                tBpB.fill(False)
            cute.copy(copy_a, tAgA[None, None, None, k_next], tAsA[None, None, None, s], pred=tApA)
            cute.copy(copy_b, tBgB[None, None, None, k_next], tBsB[None, None, None, s], pred=tBpB)
            k_next = k_next + 1
            cute.arch.cp_async_commit_group()

        # ---- MMA partitions, ldmatrix copies retiled onto the MMA fragments
        thr_mma = tiled_mma.get_slice(tidx)
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA[None, None, None, 0])
        tCrB = tiled_mma.make_fragment_B(tCsB[None, None, None, 0])
        acc = tiled_mma.make_fragment_C(thr_mma.partition_C(gD))
        acc.fill(0.0)

        ldsm_a = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(cfg.a_major != "k", 4), self.ab_type)
        ldsm_b = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(cfg.b_major != "k", 4), self.ab_type)
        s2r_a = cute.make_tiled_copy_A(ldsm_a, tiled_mma)
        s2r_b = cute.make_tiled_copy_B(ldsm_b, tiled_mma)
        thr_s2r_a = s2r_a.get_slice(tidx)
        thr_s2r_b = s2r_b.get_slice(tidx)
        tXsA = thr_s2r_a.partition_S(sA)
        tXrA = thr_s2r_a.retile(tCrA)
        tXsB = thr_s2r_b.partition_S(sB)
        tXrB = thr_s2r_b.retile(tCrB)

        read = 0
        write = stages - 1
        tXsA_p = tXsA[None, None, None, read]
        tXsB_p = tXsB[None, None, None, read]
        k_blocks = cute.size(tCrA, mode=[2])
        if k_blocks > 1:
            cute.arch.cp_async_wait_group(stages - 2)
            cute.arch.sync_threads()
            cute.copy(s2r_a, tXsA_p[None, None, 0], tXrA[None, None, 0])
            cute.copy(s2r_b, tXsB_p[None, None, 0], tXrB[None, None, 0])

        # ---- main loop: smem pipeline `stages` deep, register pipeline two k-blocks deep
        for k_tile in range(k_tiles):
            for kb in cutlass.range(k_blocks, unroll_full=True):
                if kb == k_blocks - 1:
                    # Last k-block of this tile: move to the next stage once it has landed.
                    tXsA_p = tXsA[None, None, None, read]
                    tXsB_p = tXsB[None, None, None, read]
                    cute.arch.cp_async_wait_group(stages - 2)
                    cute.arch.sync_threads()
                kb_next = (kb + 1) % k_blocks
                cute.copy(s2r_a, tXsA_p[None, None, kb_next], tXrA[None, None, kb_next])
                cute.copy(s2r_b, tXsB_p[None, None, kb_next], tXrB[None, None, kb_next])
                if kb == 0:
                    if k_tile + stages - 1 < k_tiles:
                        cute.copy(copy_a, tAgA[None, None, None, k_next], tAsA[None, None, None, write], pred=tApA)
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrB[None, None, kb], acc)
                if kb == 0:
                    if k_tile + stages - 1 < k_tiles:
                        cute.copy(copy_b, tBgB[None, None, None, k_next], tBsB[None, None, None, write], pred=tBpB)
                    k_next = k_next + 1
                    cute.arch.cp_async_commit_group()
                    write = read
                    read = read + 1
                    if read == stages:
                        read = 0

        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()

        # ---- epilogue, staged through smem (reusing the operand buffers) for coalesced stores
        tCrS = cute.make_fragment_like(acc, self.stage_type)
        tCrS.store((acc.load() * alpha).to(self.stage_type))
        cute.autovec_copy(tCrS, thr_mma.partition_C(sC))
        cute.arch.sync_threads()

        thr_c = copy_c.get_slice(tidx)
        tDsS = thr_c.partition_S(sC)
        tDgD = thr_c.partition_D(gD)
        tDcD = thr_c.partition_D(cD)
        tDrS = cute.make_fragment_like(tDsS)
        cute.autovec_copy(tDsS, tDrS)
        if cutlass.const_expr(cfg.has_c):
            # beta * c joins in fp32 (the staging tile is fp32 then): one rounding in all.
            gC = cute.local_tile(mC[None, None, bidz], tiler=tiler, coord=coord, proj=(1, 1, None))
            tDgC = thr_c.partition_D(gC)
            for i in cutlass.range_constexpr(cute.size(tDrS)):
                if cute.elem_less((tDcD[i][0], tDcD[i][1]), (M, N)):
                    tDrS[i] = tDrS[i] + beta * tDgC[i].to(cutlass.Float32)
        tDrD = cute.make_fragment_like(tDgD)
        tDrD.store(tDrS.load().to(self.c_type))
        tDpD = self._mn2_predicate(tDgD, tDcD, M, N)
        cute.copy(copy_c, tDrD, tDgD, pred=tDpD)

    @cute.jit
    def _mn_predicate(self, tXgX: cute.Tensor, tXcX: cute.Tensor, extent: cutlass.Int32):
        """(rest_v, CPY_MN, CPY_K) booleans, broadcast over k: is the vector's row inside MN?"""
        pred = cute.make_rmem_tensor(
            cute.make_layout((tXgX.shape[0][1], cute.size(tXgX, mode=[1]), cute.size(tXgX, mode=[2])),
                             stride=(cute.size(tXgX, mode=[1]), 1, 0)),
            cutlass.Boolean,
        )
        for v in cutlass.range_constexpr(pred.shape[0]):
            for m in cutlass.range_constexpr(pred.shape[1]):
                pred[v, m, 0] = cute.elem_less(tXcX[(0, v), m, 0, 0][0], extent)
        return pred

    @cute.jit
    def _mn2_predicate(self, tXgX: cute.Tensor, tXcX: cute.Tensor, M: cutlass.Int32, N: cutlass.Int32):
        """(rest_v, CPY_M, CPY_N) booleans: is the output vector inside (M, N)?"""
        pred = cute.make_rmem_tensor(
            cute.make_layout((tXgX.shape[0][1], cute.size(tXgX, mode=[1]), cute.size(tXgX, mode=[2]))),
            cutlass.Boolean,
        )
        for v in cutlass.range_constexpr(pred.shape[0]):
            for m in cutlass.range_constexpr(pred.shape[1]):
                for n in cutlass.range_constexpr(pred.shape[2]):
                    crd = tXcX[(0, v), m, n]
                    pred[v, m, n] = cute.elem_less((crd[0], crd[1]), (M, N))
        return pred


# ---- compile-only builds ----------------------------------------------------------------------

def _fake_args(config: WarpMmaConfig):
    """Fake (L, M, K), (L, K, N), (L, M, N), (L, M, N) tensors with the config's majors and
    the alignment its vectors assume."""
    in_t, out_t = _DSL_TYPES[config.dtype], _DSL_TYPES[config.out_dtype]
    in_b, out_b = _BITS[config.dtype] // 8, _BITS[config.out_dtype] // 8
    return (
        fake_tensor(in_t, 3, leading_dim=2 if config.a_major == "k" else 1, assumed_align=config.vec_a * in_b),
        fake_tensor(in_t, 3, leading_dim=1 if config.b_major == "k" else 2, assumed_align=config.vec_b * in_b),
        fake_tensor(out_t, 3, leading_dim=2 if config.c_major == "n" else 1, assumed_align=config.vec_c * out_b),
        fake_tensor(out_t, 3, leading_dim=2 if config.c_major == "n" else 1, assumed_align=out_b),
        cutlass.Float32(1.0),
        cutlass.Float32(0.0),
        fake_stream(),
    )


_BASES = {"default": DEFAULT_CONFIG, "k_major_b": K_MAJOR_B_CONFIG, "narrow": NARROW_CONFIG}


def build_variant(base: str = "default", **overrides) -> CompileJob:
    """A CompileJob for `Sm80MmaGemm(<base config>.with_(**overrides))` on fake tensors; `base`
    names one of the rung's starting configs ("default", "k_major_b", "narrow")."""
    config = _BASES[base].with_(**overrides).validate(min_stages=2)
    return CompileJob(Sm80MmaGemm(config), _fake_args(config), ("gemm.sm80_mma", config), None)


register_variant(
    "gemm.sm80_mma",
    build_variant,
    configs={
        "default": {},
        "bf16_tn": {"base": "k_major_b", "b_major": "k"},  # C = A.B^T with both K-major (nn.Linear)
        "fp16_fp32out": {"dtype": "float16", "out_dtype": "float32", "vec_c": 4},
        "bf16_am_bk_colout": {"base": "k_major_b", "a_major": "m", "b_major": "k", "c_major": "m"},
        "fp16_am_bn_c": {"base": "narrow", "dtype": "float16", "out_dtype": "float16", "a_major": "m", "b_major": "n",
                         "has_c": True},
        "bf16_128x128_3stage": {"base": "narrow", "warps_n": 2, "warps_m": 2, "stages": 3, "b_major": "k"},
        "bf16_narrow_vectors": {"base": "narrow", "vec_a": 2, "vec_b": 4, "vec_c": 1},
        "fp16_narrow_c_fp32out": {"base": "narrow", "dtype": "float16", "out_dtype": "float32", "vec_a": 4,
                                  "vec_b": 2, "vec_c": 1, "a_major": "m", "b_major": "k", "c_major": "m",
                                  "has_c": True},
    },
    requires={"HMMA", "LDSM", "LDGSTS"},
)


# ---- the rung ----------------------------------------------------------------------------------

_IN = ("float16", "bfloat16")
_OUT = ("float16", "bfloat16", "float32")


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _vector_in(t, lead: int, max_elems: int) -> int:
    """pick_vector for a 3-D view read along mode `lead` (1 or 2, stride 1)."""
    strides = [t.stride(i) for i in range(3) if i != lead and t.stride(i) != 0 and t.shape[i] > 1]
    return pick_vector(t.shape[lead], strides, t.data_ptr(), t.element_size(), max_elems)


def _unit_mode(t, max_elems: int = 8) -> int:
    """The mode (1 or 2) of a 3-D view to treat as contiguous: one with stride 1, the one that
    allows the wider vector when both have stride 1 (a mode of extent 1), mode 2 on ties."""
    modes = [i for i in (2, 1) if t.stride(i) == 1]
    if not modes:
        raise ValueError(f"sm80_mma: a view with strides {tuple(t.stride())} has no unit-stride mode among the last two")
    return max(modes, key=lambda i: (_vector_in(t, i, max_elems), i))


def _vector(t, max_elems: int) -> int:
    """The widest vector of `t` along its chosen contiguous mode."""
    return _vector_in(t, _unit_mode(t, max_elems), max_elems)


@functools.lru_cache(maxsize=None)
def _kernel_for(config: WarpMmaConfig) -> Sm80MmaGemm:
    # Building the kernel object derives and checks all its layouts (hundreds of µs of Python):
    # once per config, not on every call.
    return Sm80MmaGemm(config)


class Sm80MmaRung:
    """The `sm80_mma` rung of the GEMM ladder (interface: `cute_kernels.gemm.registry`).

    `base_config` gives the tile, warps, stages and raster; the rung fills in the per-problem
    fields (majors, vectors, dtypes, has_c) and compiles each distinct config once.
    """

    name = "sm80_mma"
    min_capability = (8, 0)

    def __init__(self, base_config: WarpMmaConfig = DEFAULT_CONFIG, narrow_config: WarpMmaConfig = NARROW_CONFIG,
                 k_major_b_config: WarpMmaConfig | None = K_MAJOR_B_CONFIG):
        self.base_config = base_config.validate(min_stages=2)
        self.narrow_config = narrow_config.validate(min_stages=2)
        # None: K-major B uses base_config too (a tuning sweep's single config)
        self.k_major_b_config = None if k_major_b_config is None else k_major_b_config.validate(min_stages=2)

    @property
    def dtypes(self):
        import torch

        return (torch.float16, torch.bfloat16)

    def config_for(self, a, b, out, has_c: bool) -> WarpMmaConfig:
        """The config this rung compiles for a problem (a, b, out: the 3-D views)."""
        in_max = 8
        out_max = 16 // out.element_size()
        vec_a, vec_b = _vector(a, in_max), _vector(b, in_max)
        # Narrow cp.async vectors (address registers) and the beta * c epilogue (c loads) cost
        # registers: a smaller warp tile keeps those kernels free of spills.
        b_major = "n" if _unit_mode(b) == 2 else "k"
        if min(vec_a, vec_b) < in_max or has_c:
            base = self.narrow_config
        elif b_major == "k" and self.k_major_b_config is not None:
            base = self.k_major_b_config
        else:
            base = self.base_config
        return base.with_(
            a_major="k" if _unit_mode(a) == 2 else "m",
            b_major=b_major,
            c_major="n" if _unit_mode(out, out_max) == 2 else "m",
            vec_a=vec_a,
            vec_b=vec_b,
            vec_c=_vector(out, out_max),
            dtype=_dtype_name(a.dtype),
            out_dtype=_dtype_name(out.dtype),
            has_c=has_c,
        )

    def supports(self, a, b, out) -> str | None:
        if _dtype_name(a.dtype) not in _IN or b.dtype != a.dtype:
            return f"input dtype {a.dtype} not supported (float16, bfloat16)"
        if _dtype_name(out.dtype) not in _OUT:
            return f"output dtype {out.dtype} not supported (float16, bfloat16, float32)"
        if out.shape[0] > _MAX_GRID_Z:
            return f"batch {out.shape[0]} exceeds the grid's z limit {_MAX_GRID_Z}"
        if max(a.shape[1], a.shape[2], b.shape[2]) >= 2**31:
            return "a dimension exceeds 2**31 - 1 (32-bit coordinates)"
        for what, t in (("a", a), ("b", b), ("out", out)):
            if t.stride(1) != 1 and t.stride(2) != 1:
                return f"{what} has strides {tuple(t.stride())}: neither of its last two modes has stride 1"
        for what, t in (("a", a), ("b", b)):
            if _vector(t, 8) < 2:
                return (f"{what} cannot be loaded with cp.async: its contiguous extent, strides or base "
                        f"address are not multiples of 2 elements (4 bytes) (shape {tuple(t.shape)}, "
                        f"strides {tuple(t.stride())})")
        return None

    def __call__(self, a, b, out, *, alpha: float = 1.0, beta: float = 0.0, c=None):
        why = self.supports(a, b, out)
        if why is not None:
            raise ValueError(f"sm80_mma cannot run this problem: {why}")
        has_c = c is not None and beta != 0.0
        config = self.config_for(a, b, out, has_c)
        kernel = _kernel_for(config)
        cin = c if has_c else out
        in_bytes, out_bytes = a.element_size(), out.element_size()
        tensors = [
            from_torch(a, assumed_align=config.vec_a * in_bytes, leading_dim=_unit_mode(a)),
            from_torch(b, assumed_align=config.vec_b * in_bytes, leading_dim=_unit_mode(b)),
            from_torch(out, assumed_align=config.vec_c * out_bytes,
                       leading_dim=_unit_mode(out, 16 // out_bytes)),
            from_torch(cin, assumed_align=cin.element_size(), leading_dim=_unit_mode(cin)),
        ]
        key = ("gemm.sm80_mma", config, str(cin.dtype), _unit_mode(cin),
               *(tuple(s == 0 for s in t.stride()) for t in (a, b, out, cin)))
        stream = current_stream()
        alpha32, beta32 = cutlass.Float32(alpha), cutlass.Float32(beta)
        compiled = compile_kernel(kernel, *tensors, alpha32, beta32, stream, key=key)
        compiled(*tensors, alpha32, beta32, stream)
        return out


TUNING_ENV = "CUTE_KERNELS_SM80_MMA_CONFIG"
_TUNABLE = ("tile_m", "tile_n", "tile_k", "warps_m", "warps_n", "stages", "raster")


def config_from_env(default: WarpMmaConfig = DEFAULT_CONFIG, environ=None) -> WarpMmaConfig:
    """`default` with the shape fields named in $CUTE_KERNELS_SM80_MMA_CONFIG replaced, e.g.
    "tile_k=64,stages=3" (for tuning sweeps on a device without editing code).

    Raises ValueError naming the variable for an unknown field, a non-integer value or a config
    that fails `validate`.
    """
    text = (os.environ if environ is None else environ).get(TUNING_ENV, "").strip()
    if not text:
        return default
    fields = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _TUNABLE:
            raise ValueError(f"${TUNING_ENV}: {item!r} is not 'field=int' with field one of {_TUNABLE}")
        try:
            fields[key] = int(value)
        except ValueError:
            raise ValueError(f"${TUNING_ENV}: {key} = {value!r} is not an integer") from None
    try:
        return default.with_(**fields).validate(min_stages=2)
    except ValueError as err:
        raise ValueError(f"${TUNING_ENV}={text!r}: {err}") from None


# A sweep's config ($CUTE_KERNELS_SM80_MMA_CONFIG) serves both B majors.
RUNG = Sm80MmaRung(config_from_env(), k_major_b_config=None) if os.environ.get(TUNING_ENV, "").strip() else Sm80MmaRung()
