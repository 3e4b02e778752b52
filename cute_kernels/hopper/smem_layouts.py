"""Shared-memory layouts of the Hopper kernels, from `cute_kernels.layouts` GMMA atoms.

A wgmma operand (and the epilogue's staging buffer) is one GMMA smem atom
(`cute_kernels.layouts.smem_atoms`: `Swizzle(B,4,3) o (8,W):(W,1)` K-major or
`(W,8):(1,W)` MN-major, swizzle on byte addresses) tiled over the tile and the pipeline stages.
`gmma_atom` picks the widest swizzle whose row fits the tile's major extent (128B for every
tile we use), `staged_smem_layout` converts it with `runtime.to_cute` and tiles it at trace
time. Kernels keep the results as `smem_a_layout`, `smem_b_layout`, `smem_c_layout`.
"""

from __future__ import annotations


def gmma_atom(major: str, dtype, major_extent: int):
    """The `SmemAtom` (layouts.smem_atoms) with the widest swizzle dividing `major_extent`.

    `major` is "K" or "MN"; `dtype` anything `layouts.atoms.dtype_name` accepts (DSL numeric
    types included). Raises ValueError if the major extent is not a multiple of 16 bytes.
    """
    from cute_kernels.layouts.atoms import dtype_bits, dtype_name
    from cute_kernels.layouts.smem_atoms import gmma_smem_atom

    if major not in ("K", "MN"):
        raise ValueError(f"major must be 'K' or 'MN', got {major!r}")
    name = dtype_name(dtype)
    extent_bytes = major_extent * dtype_bits(name) // 8
    for kind, row in (("SW128", 128), ("SW64", 64), ("SW32", 32), ("INTER", 16)):
        if extent_bytes % row == 0:
            return gmma_smem_atom(f"{major}_{kind}", name)
    raise ValueError(f"major extent {major_extent} of {name} is not a multiple of 16 bytes")


def to_dsl_layout(atom):
    """The atom as a DSL ComposedLayout (inside @cute.jit code)."""
    from cute_kernels.runtime import to_cute

    return to_cute(atom.layout)


def staged_smem_layout(atom, tile_rows: int, tile_cols: int, stages: int):
    """`atom` tiled to (rows = M or N, cols = K, stages) for a wgmma operand.

    K-major atoms repeat down the rows first so each 128-byte K row stays contiguous;
    MN-major atoms repeat along the rows' contiguous mode first.
    """
    import cutlass.cute as cute

    order = (0, 1, 2) if atom.major == "K" else (1, 0, 2)
    return cute.tile_to_shape(to_dsl_layout(atom), (tile_rows, tile_cols, stages), order=order)


def staged_epi_layout(atom, epi_m: int, epi_n: int, stages: int):
    """The epilogue ring: `atom` (N-contiguous output = "K" atom, M-contiguous = "MN") tiled to
    (epi_m, epi_n, stages)."""
    import cutlass.cute as cute

    order = (1, 0, 2) if atom.major == "MN" else (0, 1, 2)
    return cute.tile_to_shape(to_dsl_layout(atom), (epi_m, epi_n, stages), order=order)
