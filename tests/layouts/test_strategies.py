"""The public hypothesis strategies produce what they promise."""

from hypothesis import given

from cute_kernels.layouts import (
    ComposedLayout, Layout, Swizzle, complement, composition, logical_divide, logical_product, size,
)
from cute_kernels.layouts.int_tuple import is_tuple, product
from cute_kernels.layouts.strategies import (
    compact_layouts, composable_pairs, divide_pairs, injective_layouts, layouts, product_pairs, shapes,
    swizzled_layouts, swizzles,
)


@given(shapes(max_size=64))
def test_shapes_respect_their_bounds(shape):
    assert 1 <= product(shape) <= 64


@given(layouts(allow_zero=False))
def test_layouts_without_zero_strides(L):
    assert isinstance(L, Layout) and all(d > 0 for d in _leaves(L.stride))


@given(compact_layouts())
def test_compact_layouts_are_bijections(L):
    assert sorted(L(i) for i in range(size(L))) == list(range(size(L)))


@given(injective_layouts())
def test_injective_layouts_are_injective_and_complementable(L):
    values = [L(i) for i in range(size(L))]
    assert len(set(values)) == len(values)
    complement(L, L.cosize())  # admissible: raises nothing


@given(composable_pairs())
def test_composable_pairs_compose(pair):
    composition(*pair)


@given(divide_pairs())
def test_divide_pairs_divide(pair):
    layout, tiler = pair
    assert is_tuple(tiler) or isinstance(tiler, Layout)
    logical_divide(layout, tiler)


@given(product_pairs())
def test_product_pairs_multiply(pair):
    logical_product(*pair)


@given(swizzles())
def test_swizzles_are_valid(sw):
    assert isinstance(sw, Swizzle) and abs(sw.shift) >= sw.bits


@given(swizzled_layouts())
def test_swizzled_layouts_are_bijections(S):
    assert isinstance(S, ComposedLayout)
    assert sorted(S(i) for i in range(size(S))) == list(range(size(S)))


def _leaves(t):
    from cute_kernels.layouts.int_tuple import flatten

    return flatten(t)
