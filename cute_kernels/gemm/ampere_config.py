"""Configs and layouts of the warp-MMA GEMM rungs (`sm70_mma`, `sm80_mma`), in pure Python.

Every layout the two kernels use is computed here with `cute_kernels.layouts` (so the workbench
can print it and `bank_conflicts` / `coalescing` can grade it) and converted to a DSL layout at
trace time with `runtime.to_cute`. Nothing here imports torch or the DSL.

Conventions (as in CuTe): an operand tile in shared memory is (MN, K, stage) for A and B (B is
stored as (N, K)), and (M, N) for the output staging tile; "K-major" means K is the contiguous
mode in global memory. `vec_*` is how many elements one thread moves per global access (a
`cp.async` of 16, 8 or 4 bytes for the inputs; a store of up to 16 bytes for the output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from cute_kernels.layouts import ComposedLayout, Layout, Swizzle, tile_to_shape

__all__ = [
    "WarpMmaConfig",
    "smem_operand_layout",
    "smem_output_layout",
    "gmem_copy_layouts",
    "pick_vector",
    "analyse",
    "accumulator_write_access",
]

_A_MAJORS = ("k", "m")
_B_MAJORS = ("k", "n")
_C_MAJORS = ("n", "m")
_IN_DTYPES = ("float16", "bfloat16")
_OUT_DTYPES = ("float16", "bfloat16", "float32")
_BITS = {"float16": 16, "bfloat16": 16, "float32": 32}


def _pow2(x: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class WarpMmaConfig:
    """One compiled variant of a warp-MMA GEMM.

    tile_m x tile_n x tile_k: the block tile; warps_m x warps_n warps each own a
    (tile_m / warps_m) x (tile_n / warps_n) sub-tile of the output.
    stages: shared-memory buffers of (tile_m + tile_n) x tile_k elements in flight (cp.async
    pipeline depth; `sm70_mma` uses 1, its loads are synchronous).
    raster: the threadblock swizzle's group width in tiles (1 = plain row-by-row order).
    a_major / b_major / c_major: the contiguous mode of a (L, M, K), b (L, K, N), out (L, M, N).
    vec_a / vec_b / vec_c: elements per global access of each operand (powers of two).
    dtype / out_dtype: input and output element types ("float16", "bfloat16", "float32").
    has_c: whether the epilogue reads c (beta != 0).
    """

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 32
    warps_m: int = 2
    warps_n: int = 4
    stages: int = 4
    raster: int = 8
    a_major: str = "k"
    b_major: str = "n"
    c_major: str = "n"
    vec_a: int = 8
    vec_b: int = 8
    vec_c: int = 8
    dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    has_c: bool = False

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def warp_tile(self) -> tuple[int, int]:
        return self.tile_m // self.warps_m, self.tile_n // self.warps_n

    @property
    def stage_bits(self) -> int:
        """Element width of the epilogue's shared-memory staging tile: fp32 when c is added
        (alpha * acc + beta * c is rounded once, after the read-back), else the output's."""
        return 32 if self.has_c else _BITS[self.out_dtype]

    def smem_bytes(self) -> int:
        """Shared memory of one block: the operand stages, or the output tile if larger."""
        ab = (self.tile_m + self.tile_n) * self.tile_k * self.stages * _BITS[self.dtype] // 8
        bits = self.stage_bits
        pad = 0 if self.c_major == "n" else _C_PAD_BITS // bits
        c = (self.tile_m + pad) * self.tile_n * bits // 8
        return max(ab, c)

    def with_(self, **kw) -> "WarpMmaConfig":
        return replace(self, **kw)

    def validate(self, *, mma_m: int = 16, mma_n: int = 16, mma_k: int = 16, min_stages: int = 2,
                 max_smem: int = 227 * 1024) -> "WarpMmaConfig":
        """Raise ValueError naming the first broken rule; return self.

        mma_m / mma_n / mma_k: the warp's MMA granule (16 x 16 x 16 for two m16n8k16 atoms or
        four m8n8k4 quad pairs); min_stages: the pipeline depth the kernel needs.
        """
        name = type(self).__name__
        for f in ("tile_m", "tile_n", "tile_k", "warps_m", "warps_n", "vec_a", "vec_b", "vec_c"):
            v = getattr(self, f)
            if not _pow2(v):
                raise ValueError(f"{name}.{f} must be a positive power of two, got {v!r}")
        for f in ("stages", "raster"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}.{f} must be a positive int, got {v!r}")
        if self.a_major not in _A_MAJORS:
            raise ValueError(f"{name}.a_major must be one of {_A_MAJORS}, got {self.a_major!r}")
        if self.b_major not in _B_MAJORS:
            raise ValueError(f"{name}.b_major must be one of {_B_MAJORS}, got {self.b_major!r}")
        if self.c_major not in _C_MAJORS:
            raise ValueError(f"{name}.c_major must be one of {_C_MAJORS}, got {self.c_major!r}")
        if self.dtype not in _IN_DTYPES:
            raise ValueError(f"{name}.dtype must be one of {_IN_DTYPES}, got {self.dtype!r}")
        if self.out_dtype not in _OUT_DTYPES:
            raise ValueError(f"{name}.out_dtype must be one of {_OUT_DTYPES}, got {self.out_dtype!r}")
        if not isinstance(self.has_c, bool):
            raise ValueError(f"{name}.has_c must be a bool, got {self.has_c!r}")
        if self.threads > 1024:
            raise ValueError(f"{name}: {self.warps_m} x {self.warps_n} warps = {self.threads} threads > 1024")
        wm, wn = self.warp_tile
        if self.tile_m % self.warps_m or wm % mma_m:
            raise ValueError(f"{name}: tile_m {self.tile_m} / warps_m {self.warps_m} must be a multiple of {mma_m}")
        if self.tile_n % self.warps_n or wn % mma_n:
            raise ValueError(f"{name}: tile_n {self.tile_n} / warps_n {self.warps_n} must be a multiple of {mma_n}")
        if self.tile_k % mma_k:
            raise ValueError(f"{name}: tile_k {self.tile_k} must be a multiple of {mma_k}")
        if self.stages < min_stages:
            raise ValueError(f"{name}.stages must be at least {min_stages}, got {self.stages}")
        in_bits, out_bits = _BITS[self.dtype], _BITS[self.out_dtype]
        for f, bits in (("vec_a", in_bits), ("vec_b", in_bits), ("vec_c", out_bits)):
            if getattr(self, f) * bits > 128:
                raise ValueError(f"{name}.{f} = {getattr(self, f)} elements of {bits} bits exceeds a 16-byte access")
        if self.smem_bytes() > max_smem:
            raise ValueError(f"{name}: {self.smem_bytes()} bytes of shared memory exceed the {max_smem} an SM offers")
        # every gmem copy layout must tile its operand tile exactly
        gmem_copy_layouts(self)
        return self


# ---- shared-memory layouts ----------------------------------------------------------------------

def _swizzled_atom(rows_contig: int, other: int, contiguous_first: bool, elem_bits: int):
    """Sw<b, m, s> o 0 o an 8-by-`rows_contig` atom whose contiguous mode holds `rows_contig`
    elements: the XOR moves each 16-byte chunk of a row by the row's index, so the eight rows an
    `ldmatrix` phase (or a row of MMA accumulator pairs) touches fall in eight distinct bank groups.
    """
    m = int(math.log2(128 // elem_bits))  # log2(elements per 16-byte chunk)
    chunks = rows_contig * elem_bits // 128
    b = min(3, int(math.log2(chunks))) if chunks > 1 else 0
    # XOR source: the row index bits, or the 128-byte-line bits when several rows share a line
    s = max(int(math.log2(rows_contig)), int(math.log2(1024 // elem_bits))) - m
    inner = Layout((rows_contig, other), (1, rows_contig)) if contiguous_first else Layout((other, rows_contig), (rows_contig, 1))
    return ComposedLayout(Swizzle(b, m, s), 0, inner)


def smem_operand_layout(mn: int, tile_k: int, stages: int | None, major: str, elem_bits: int = 16):
    """(MN, K, stage) -> element offset of one operand's pipeline buffers ((MN, K) when
    `stages` is None: one buffer).

    K-major: atoms of 8 MN-rows x min(64, tile_k) contiguous K; MN-major: min(64, mn) contiguous
    MN x 8 K. Swizzled so that `ldmatrix` (x4, `.trans` for MN-major) is conflict-free.
    Post-condition: a bijection onto [0, mn * tile_k * stages).
    """
    if major == "k":
        w = min(64, tile_k)
        atom = _swizzled_atom(w, 8, contiguous_first=False, elem_bits=elem_bits)
    else:
        w = min(64, mn)
        atom = _swizzled_atom(w, 8, contiguous_first=True, elem_bits=elem_bits)
    if stages is None:
        return tile_to_shape(atom, (mn, tile_k), (0, 1))
    return tile_to_shape(atom, (mn, tile_k, stages), (0, 1, 2))


def smem_output_layout(tile_m: int, tile_n: int, c_major: str, elem_bits: int):
    """(M, N) -> element offset of the epilogue's staging tile (elements of `elem_bits`).

    Row-major output: whole rows of tile_n elements, swizzled in units of 8 elements, the run
    one row of an m16n8 accumulator fragment covers (4 lanes x 2 values): the unit index is XORed
    with the row index, so the rows one write phase touches (8 rows of 16 bytes for 16-bit
    values, 4 rows of 32 bytes for fp32) land in distinct banks, and the read-back, one long
    vector walk along a row, stays conflict-free. Column-major output: whole columns padded by
    16 bytes (the DSL's vectorizing register->smem copy cannot write a swizzled column-major
    tile from the fragments); the pad shifts consecutive columns by four banks.
    Post-condition: a bijection of the tile onto its offsets (row-major) or an injection.
    """
    if c_major == "n":
        unit_log2 = 3  # 8 elements
        rows_log2 = int(math.log2(tile_n))
        b = int(math.log2(max(1, 1024 // (8 * elem_bits))))  # units per 128-byte line
        s = rows_log2 - unit_log2
        b = max(0, min(b, s))
        atom = ComposedLayout(Swizzle(b, unit_log2, s), 0, Layout((8, tile_n), (tile_n, 1)))
        return tile_to_shape(atom, (tile_m, tile_n), (0, 1))
    return Layout((tile_m, tile_n), (1, tile_m + _C_PAD_BITS // elem_bits))


def accumulator_write_access() -> Layout:
    """(lane, value) -> index (m + 128 n) of one m16n8 accumulator row pair a warp writes to the
    staging tile: lane t holds (t // 4, 2 (t % 4) + v). For `bank_conflicts` on a tile with 128
    rows."""
    return Layout(((4, 8), 2), ((256, 1), 128))


_C_PAD_BITS = 128


# ---- global-memory copy layouts -------------------------------------------------------------

def _copy_layouts(rows: int, cols: int, contiguous: str, vec: int, threads: int, what: str):
    """(thread layout, value layout) over a (rows, cols) tile, vectors along `contiguous`
    ("cols" or "rows"), consecutive threads on consecutive vectors (coalesced)."""
    along = cols if contiguous == "cols" else rows
    across = rows if contiguous == "cols" else cols
    t_along = max(1, min(threads, along // vec))
    if along % vec or (along // vec) % t_along:
        raise ValueError(f"{what}: {along} contiguous elements are not a whole number of {vec}-element vectors")
    t_across = threads // t_along
    if threads % t_along or across % t_across:
        raise ValueError(f"{what}: {threads} threads in {t_along}-wide rows do not tile {across} rows")
    if contiguous == "cols":
        return Layout((t_across, t_along), (t_along, 1)), Layout((1, vec), (0, 1))
    return Layout((t_along, t_across), (1, t_along)), Layout((vec, 1), (1, 0))


def gmem_copy_layouts(config: WarpMmaConfig) -> dict:
    """Thread and value layouts of the three global-memory copies (A, B loads; output store).

    Keys "a", "b", "c" -> (thr_layout, val_layout) over the (M, K), (N, K) and (M, N) tiles.
    """
    t = config.threads
    return {
        "a": _copy_layouts(config.tile_m, config.tile_k, "cols" if config.a_major == "k" else "rows",
                           config.vec_a, t, "A tile copy"),
        "b": _copy_layouts(config.tile_n, config.tile_k, "cols" if config.b_major == "k" else "rows",
                           config.vec_b, t, "B tile copy"),
        "c": _copy_layouts(config.tile_m, config.tile_n, "cols" if config.c_major == "n" else "rows",
                           config.vec_c, t, "output tile copy"),
    }


def pick_vector(extent: int, strides, data_ptr: int, elem_bytes: int, max_elems: int) -> int:
    """The widest vector (elements, a power of two <= max_elems) of a global operand such that
    every vector starts aligned and never straddles the end of its contiguous mode: the
    contiguous extent, every non-unit stride and the base address are all multiples of it.
    Returns 1 when only scalar access is safe.
    """
    v = max_elems
    while v > 1:
        if (extent % v == 0 and data_ptr % (v * elem_bytes) == 0
                and all(s % v == 0 for s in strides)):
            return v
        v //= 2
    return 1


# ---- the analysis the docs and tests print ---------------------------------------------------

def analyse(config: WarpMmaConfig) -> dict:
    """Bank-conflict and coalescing figures of the config's layouts (for the workbench).

    Keys: "smem_a", "smem_b", "smem_c" (BankConflictReport of one stage read with ldmatrix, or
    of the staging tile's read-back), "gmem_a", "gmem_b", "gmem_c" (CoalescingReport of a
    row-major/col-major global tile of the block's shape read with the chosen vectors).
    """
    from cute_kernels.layouts.analysis import bank_conflicts, coalescing

    in_bits = _BITS[config.dtype]
    out_bits = _BITS[config.out_dtype]
    out = {}
    for op, mn, major, trans_major in (("a", config.tile_m, config.a_major, "m"),
                                       ("b", config.tile_n, config.b_major, "n")):
        stage = smem_operand_layout(mn, config.tile_k, None, major, in_bits)
        access = "ldmatrix_x4_trans" if major == trans_major else "ldmatrix_x4"
        out[f"smem_{op}"] = bank_conflicts(stage, access, config.dtype, swizzle_unit="elements")
        vec = getattr(config, f"vec_{op}")
        g = Layout((mn, config.tile_k), (config.tile_k, 1)) if major == "k" else Layout((mn, config.tile_k), (1, mn))
        out[f"gmem_{op}"] = coalescing(g, config.dtype, f"vec{vec * in_bits}" if vec * in_bits >= 8 else "scalar")
    sc = smem_output_layout(config.tile_m, config.tile_n, config.c_major, out_bits)
    vbits = config.vec_c * out_bits
    out["smem_c"] = bank_conflicts(sc, f"vec{vbits}" if vbits >= 32 else "scalar", config.out_dtype,
                                   swizzle_unit="elements")
    g = (Layout((config.tile_m, config.tile_n), (config.tile_n, 1)) if config.c_major == "n"
         else Layout((config.tile_m, config.tile_n), (1, config.tile_m)))
    out["gmem_c"] = coalescing(g, config.out_dtype, f"vec{vbits}" if vbits >= 8 else "scalar")
    return out

