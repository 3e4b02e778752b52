import pytest
from hypothesis import given

from cute_kernels.layouts import (
    ComposedLayout, Layout, LayoutError, Swizzle, composition, left_inverse, logical_divide,
    make_swizzle_layout, parse_layout, right_inverse, size, tile_to_shape,
)
from cute_kernels.layouts.strategies import swizzled_layouts

SMEM = ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1)))


def test_str_and_evaluation():
    assert str(SMEM) == "Sw<3,4,3> o 0 o (8,64):(64,1)"
    assert repr(SMEM) == "ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1)))"
    assert parse_layout(str(SMEM)) == SMEM == ComposedLayout.parse(str(SMEM))
    assert eval(repr(SMEM)) == SMEM
    assert SMEM(1, 0) == Swizzle(3, 4, 3)(64)
    assert all(SMEM(m, n) == Swizzle(3, 4, 3)(64 * m + n) for m in range(8) for n in range(64))
    assert SMEM.shape == (8, 64) and size(SMEM) == 512 and len(SMEM) == 2
    assert make_swizzle_layout(Swizzle(3, 4, 3), Layout((8, 64), (64, 1))) == SMEM
    assert hash(SMEM) == hash(parse_layout(str(SMEM)))


def test_slicing_folds_the_offset():
    row = SMEM(3, None)
    assert isinstance(row, ComposedLayout) and row.offset == 192
    assert all(row(n) == SMEM(3, n) for n in range(64))


def test_composition_acts_on_the_inner_layout():
    tile = composition(SMEM, (4, 8))
    assert str(tile) == "Sw<3,4,3> o 0 o (4,8):(64,1)"  # what the CuTe DSL prints (with S<3,4,3>)
    assert composition(Swizzle(3, 4, 3), Layout((8, 64), (64, 1))) == SMEM
    D = logical_divide(SMEM, (Layout(4), Layout(8)))
    assert all(D(i) == SMEM.outer(D.inner(i)) for i in range(size(D)))
    T = tile_to_shape(ComposedLayout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1))), (64, 64))
    assert T == ComposedLayout(Swizzle(3, 3, 3), 0, Layout(((8, 8), (64, 1)), ((64, 512), (1, 0))))


@given(swizzled_layouts())
def test_right_and_left_inverse_of_a_swizzled_layout(S):
    R = right_inverse(S)
    Li = left_inverse(S)
    n = size(S)
    assert sorted(S(i) for i in range(n)) == list(range(n))  # a bijection of [0, n)
    for i in range(n):
        assert S(R(i)) == i
        assert Li(S(i)) == i


def test_inverse_with_an_offset():
    S = ComposedLayout(Swizzle(2, 0, 3), 4, Layout(32, 1))
    R = right_inverse(S)
    assert R == ComposedLayout(Layout(32, 1), -4, Swizzle(2, 0, 3))
    assert all(S(R(y)) == y for y in [S(i) for i in range(28)])


def test_bad_parts_raise():
    with pytest.raises(LayoutError, match="outer"):
        ComposedLayout(3, 0, Layout(4))
    with pytest.raises(LayoutError, match="offset"):
        ComposedLayout(Swizzle(1, 1, 1), 0.5, Layout(4))
