"""Hypothesis strategies for layouts, so users can property-test their own layout code.

    >>> from hypothesis import given
    >>> from cute_kernels.layouts import composition
    >>> from cute_kernels.layouts.strategies import composable_pairs
    >>> @given(composable_pairs())
    ... def test_composition_is_function_composition(pair):
    ...     a, b = pair
    ...     r = composition(a, b)
    ...     assert all(r(i) == a(b(i)) for i in range(b.size()))

Every strategy draws its integers through hypothesis, so failures shrink. This module imports
hypothesis (a test extra); ``import cute_kernels.layouts`` does not import it.
"""

from __future__ import annotations

from hypothesis import strategies as st

from . import generate as g
from .layout import Layout
from .swizzle import Swizzle

__all__ = [
    "shapes",
    "layouts",
    "compact_layouts",
    "injective_layouts",
    "swizzles",
    "composable_pairs",
    "divide_pairs",
    "product_pairs",
    "swizzled_layouts",
    "edge_layouts",
    "beyond_pairs",
    "beyond_divide_pairs",
    "f2_layouts",
    "f2_swizzled_layouts",
]


def _drawer(draw):
    return lambda lo, hi: draw(st.integers(lo, hi))


@st.composite
def shapes(draw, max_leaves: int = 4, max_leaf: int = 6, max_size: int = 256, max_depth: int = 2):
    """Hierarchical shapes: leaves in ``[1, max_leaf]``, size <= ``max_size``, depth <= ``max_depth``."""
    return g.gen_shape(_drawer(draw), max_leaves, max_leaf, max_size, max_depth)


@st.composite
def layouts(draw, max_leaves: int = 4, max_leaf: int = 6, max_stride: int = 64, max_depth: int = 2,
            allow_zero: bool = True) -> Layout:
    """Arbitrary layouts: random shapes with random non-negative strides (possibly 0, possibly overlapping)."""
    return g.gen_layout(_drawer(draw), max_leaves, max_leaf, max_stride, max_depth, allow_zero)


@st.composite
def compact_layouts(draw, max_leaves: int = 4, max_leaf: int = 6, max_depth: int = 2) -> Layout:
    """Compact layouts: bijections of ``[0, size)`` onto itself, modes in any order."""
    return g.gen_compact_layout(_drawer(draw), max_leaves, max_leaf, max_depth)


@st.composite
def injective_layouts(draw, max_leaves: int = 4, max_leaf: int = 6, max_depth: int = 2) -> Layout:
    """Injective layouts with gaps whose strides satisfy complement's divisibility condition."""
    return g.gen_injective_layout(_drawer(draw), max_leaves, max_leaf, max_depth)


@st.composite
def swizzles(draw, max_bits: int = 3, max_base: int = 4, allow_negative: bool = True) -> Swizzle:
    """Valid ``Swizzle(B, M, S)`` (``|S| >= B``), including negative shifts."""
    return g.gen_swizzle(_drawer(draw), max_bits, max_base, allow_negative)


@st.composite
def composable_pairs(draw, max_leaves: int = 4, max_depth: int = 2) -> tuple[Layout, Layout]:
    """``(A, B)`` for which ``composition(A, B)`` is admissible (divisibility holds, B's modes do not overlap in A)."""
    return g.gen_composable_pair(_drawer(draw), max_leaves, max_depth)


@st.composite
def divide_pairs(draw, by_mode: bool | None = None, max_leaves: int = 4):
    """``(layout, tiler)`` admissible for ``logical_divide``; the tiler is a layout or (``by_mode``) a tuple."""
    return g.gen_divide_pair(_drawer(draw), by_mode, max_leaves)


@st.composite
def product_pairs(draw, max_leaves: int = 3) -> tuple[Layout, Layout]:
    """``(block, tiler)`` admissible for ``logical_product`` (and so for blocked/raked products)."""
    return g.gen_product_pair(_drawer(draw), max_leaves)


@st.composite
def swizzled_layouts(draw, max_bits: int = 2, max_base: int = 2):
    """``Swizzle o 0 o L`` with ``L`` compact and its size a multiple of the swizzle's period,
    so that the composed layout is a bijection of ``[0, size)``."""
    from math import gcd

    from .composed import ComposedLayout

    sw = draw(swizzles(max_bits=max_bits, max_base=max_base))
    layout = draw(compact_layouts(max_leaves=3, max_leaf=4))
    n, period = layout.size(), sw.size()
    reps = period // gcd(n, period)
    if reps > 1:
        layout = Layout((layout.shape, reps), (layout.stride, n))
    return ComposedLayout(sw, 0, layout)


@st.composite
def edge_layouts(draw, max_leaves: int = 4) -> Layout:
    """Layouts biased to the edges: size-1 leaves inside and at the end (with arbitrary strides),
    stride-0 leaves, and layouts of size 1."""
    return g.gen_edge_layout(_drawer(draw), max_leaves)


@st.composite
def beyond_pairs(draw, semantics: str = "dsl") -> tuple[Layout, Layout]:
    """``(A, B)`` admissible for ``composition`` under ``semantics`` with B reaching past
    ``size(A)`` (mostly: a pair is kept after a few failed attempts), A from :func:`edge_layouts`."""
    from .semantics import resolve_semantics

    return g.gen_beyond_pair(_drawer(draw), resolve_semantics(semantics))


@st.composite
def beyond_divide_pairs(draw) -> tuple[Layout, Layout]:
    """``(layout, tiler)`` with a tiler that does not divide the layout, so the divide reaches past it."""
    return g.gen_beyond_divide_pair(_drawer(draw))


@st.composite
def f2_layouts(draw, max_bits: int = 8, compact: bool = False) -> Layout:
    """Layouts that are linear over F2 (power-of-two shapes, images on disjoint bits); ``compact``:
    bijections onto ``[0, 2**n)``."""
    return g.gen_f2_layout(_drawer(draw), max_bits, compact)


@st.composite
def f2_swizzled_layouts(draw, max_bits: int = 9):
    """``Sw o 0 o L`` with ``L`` a compact F2 layout of ``n`` bits and the swizzle inside them: a
    bijection of ``[0, 2**n)`` that is linear over F2."""
    from .composed import ComposedLayout

    d = _drawer(draw)
    n = d(2, max_bits)
    return ComposedLayout(g.gen_f2_swizzle(d, n), 0, g.gen_f2_layout(d, compact=True, bits=n))
