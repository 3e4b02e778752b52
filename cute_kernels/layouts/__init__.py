"""CuTe's layout algebra in pure Python: layouts, swizzles and the operations that combine them.

Everything public is re-exported here flat, named as in CuTe::

    >>> from cute_kernels.layouts import Layout, composition
    >>> composition(Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1)))
    Layout(((2, 2), 3), ((24, 2), 8))

Besides the algebra (one module per operation, as in CuTe) the package holds the workbench: atoms
and tiled MMAs/copies, the memory-access analysis (``analysis``), drawing (``render``, with the
size ``budget``), the F2 view (``f2``), the swizzle search (``swizzle_search``), ``explain``
(with the step recorder ``trace``) and the interactive page (``html``). Where NVIDIA's
implementations disagree, ``semantics`` chooses (the DSL's rule by default).

Importing this package imports neither torch nor the CuTe DSL nor hypothesis (the hypothesis
strategies live in :mod:`cute_kernels.layouts.strategies`, imported explicitly).
"""

from __future__ import annotations

from typing import Any

from . import int_tuple
from .basis import ArithTuple, E, ScaledBasis
from .coalesce import coalesce, filter, filter_zeros
from .complement import complement
from .composed import ComposedLayout, make_swizzle_layout
from .composition import InexactCompositionError, composition, with_shape
from .divide import flat_divide, logical_divide, tiled_divide, zipped_divide
from .errors import LayoutError
from .int_tuple import (
    IntTuple,
    ceil_div,
    compatible,
    congruent,
    crd2crd,
    crd2idx,
    idx2crd,
    inner_product,
    prefix_product,
    product,
    shape_div,
    shape_mod,
    suffix_product,
    weakly_compatible,
    weakly_congruent,
)
from .inverse import left_inverse, max_common_layout, max_common_vector, nullspace, right_inverse
from .layout import (
    Layout,
    append,
    cosize,
    depth,
    flatten_layout,
    get,
    group,
    is_layout,
    make_identity_layout,
    make_layout,
    make_ordered_layout,
    prepend,
    rank,
    replace,
    same_function,
    select,
    shape,
    size,
    slice_and_offset,
    stride,
    take,
)
from .parse import parse_int_tuple, parse_layout
from .product import (
    blocked_product,
    flat_product,
    logical_product,
    raked_product,
    tile_to_shape,
    tiled_product,
    zipped_product,
)
from .recast import downcast, recast_layout, upcast
from .semantics import SEMANTICS, current_semantics, layout_semantics
from .swizzle import Swizzle, make_swizzle

# The workbench: atoms, tiled MMAs and copies, analysis and rendering (all pure Python).
from .analysis import Access, bank_conflicts, coalescing, vector_width
from .atoms import CopyAtom, MmaAtom, atom, atom_names, dtype_bits, dtype_name
from .copy_atoms import tma_atom
from .f2 import F2Layout, f2
from .swizzle_search import SwizzleSearch, find_swizzle, fragment_access
from .explain import Explanation, explain
from .render import print_layout, to_html, to_latex, to_svg
from .smem_atoms import SmemAtom, gmma_smem_atom, smem_atom
from .tiled import TiledCopy, TiledMMA, make_tiled_copy, make_tiled_mma


def flatten(x: Any) -> Any:
    """CuTe's ``flatten``: a layout with depth <= 1 and the same function, or the leaves of an int tuple."""
    if isinstance(x, Layout):
        return flatten_layout(x)
    if isinstance(x, ComposedLayout):
        return x.with_inner(flatten(x.inner))
    return int_tuple.flatten(x)


__all__ = [
    "Explanation", "explain", "F2Layout", "f2", "SwizzleSearch", "find_swizzle", "fragment_access",
    "Access", "CopyAtom", "MmaAtom", "SmemAtom", "TiledCopy", "TiledMMA", "atom", "atom_names",
    "bank_conflicts", "coalescing", "dtype_bits", "dtype_name", "gmma_smem_atom", "make_tiled_copy",
    "make_tiled_mma", "print_layout", "smem_atom", "tma_atom", "to_html", "to_latex", "to_svg",
    "vector_width",
    "SEMANTICS", "current_semantics", "layout_semantics",
    "ArithTuple", "ComposedLayout", "E", "InexactCompositionError", "IntTuple", "Layout", "LayoutError", "ScaledBasis", "Swizzle",
    "append", "blocked_product", "ceil_div", "coalesce", "compatible", "complement", "composition",
    "congruent", "cosize", "crd2crd", "crd2idx", "depth", "downcast", "filter", "filter_zeros",
    "flat_divide", "flat_product", "flatten", "flatten_layout", "get", "group", "idx2crd",
    "inner_product", "int_tuple", "is_layout", "left_inverse", "logical_divide", "logical_product",
    "make_identity_layout", "make_layout", "make_ordered_layout", "make_swizzle", "make_swizzle_layout",
    "max_common_layout", "max_common_vector", "nullspace", "parse_int_tuple", "parse_layout",
    "prefix_product", "prepend", "product", "raked_product", "rank", "recast_layout", "replace",
    "right_inverse", "same_function", "select", "shape", "shape_div", "shape_mod", "size",
    "slice_and_offset", "stride", "suffix_product", "take", "tile_to_shape", "tiled_divide",
    "tiled_product", "upcast", "weakly_compatible", "weakly_congruent", "with_shape",
    "zipped_divide", "zipped_product",
]
