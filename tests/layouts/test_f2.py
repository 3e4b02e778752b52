"""The F2 view: linear maps over GF(2) that agree with the layouts, compose and invert as ours do,
and go back to CuTe layouts (plain or swizzled)."""

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cute_kernels.layouts import (
    ComposedLayout, Layout, LayoutError, Swizzle, composition, gmma_smem_atom, left_inverse, right_inverse, size,
)
from cute_kernels.layouts.analysis import element_offset_fn
from cute_kernels.layouts.f2 import F2Layout, f2, f2_swizzle
from cute_kernels.layouts.strategies import f2_layouts, f2_swizzled_layouts


def _values(x, n):
    return [x(i) for i in range(n)]


def test_a_row_major_tile_and_its_swizzle():
    F = f2("(8,64):(64,1)")
    assert F.in_names == ("m0", "m1", "m2", "n0", "n1", "n2", "n3", "n4", "n5")
    assert F.columns == (64, 128, 256, 1, 2, 4, 8, 16, 32)
    assert F.to_cute() == Layout((8, 64), (64, 1))
    S = f2("Sw<3,4,3> o 0 o (8,64):(64,1)", dtype="bf16")  # the 128-byte swizzle, on bf16 elements
    assert S.columns == (64 | 8, 128 | 16, 256 | 32, 1, 2, 4, 8, 16, 32)
    assert S.matrix()[3] == [1, 0, 0, 0, 0, 0, 1, 0, 0]  # o3 = m0 ^ n3
    assert S.to_cute() == ComposedLayout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))
    assert S.to_cute(dtype="bf16") == ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1)))
    assert f2(gmma_smem_atom("K_SW128", "bf16")).columns == S.columns
    assert str(S).splitlines()[5] == "o3  [ 1  .  .  .  .  .  1  .  . ]"
    assert "<svg" in S.to_svg() and "m0" in S.to_svg()


def test_names_and_tv_layouts():
    tv = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))  # m16n8 C fragment: (T,V) -> m + 16 n
    F = f2(tv, names=("t", "v"))
    assert F.in_names == ("t0", "t1", "t2", "t3", "t4", "v0", "v1") and F.modes == (("t", (0, 5)), ("v", (5, 2)))
    assert F.is_injective() and F.to_layout() == Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))


def test_refusals_say_where():
    with pytest.raises(LayoutError, match=r"input bits m1 and n0 both set output bit o1"):
        f2(Layout((4, 2), (1, 2)))
    with pytest.raises(LayoutError, match="shape 6 is not a power of two"):
        f2(Layout((6, 2), (1, 6)))
    with pytest.raises(LayoutError, match="affine"):
        f2(ComposedLayout(Swizzle(1, 0, 1), 4, Layout(4, 1)))
    with pytest.raises(LayoutError, match="only a bijection"):
        f2(Layout(4, 2)).inverse()
    general = F2Layout((3, 1, 4, 12), 4, ("a0", "a1", "a2", "a3"), (("a", (0, 4)),))
    with pytest.raises(LayoutError, match="neither a layout nor one swizzle"):
        general.to_cute()


@given(f2_layouts())
def test_the_view_computes_the_layout(layout):
    F = f2(layout)
    assert _values(F, size(layout)) == _values(layout, size(layout))
    back = F.to_cute()
    assert _values(back, size(layout)) == _values(layout, size(layout))


@given(f2_swizzled_layouts())
def test_swizzled_views_compute_and_go_back(layout):
    F = f2(layout)
    n = size(layout)
    assert _values(F, n) == _values(layout, n)
    assert _values(F.to_cute(), n) == _values(layout, n)


@given(f2_swizzled_layouts(), st.sampled_from(["bf16", "f32", "e4m3"]))
def test_byte_swizzles_match_the_smem_convention(layout, dtype):
    from cute_kernels.layouts.atoms import dtype_bits

    k = {16: 1, 32: 2, 8: 0}[dtype_bits(dtype)]
    sw = layout.outer
    on_bytes = ComposedLayout(Swizzle(sw.bits, sw.base + k, sw.shift), 0, layout.inner)
    assume(sw.shift > 0 or sw.base + k >= 0)
    F = f2(on_bytes, dtype=dtype)
    offset = element_offset_fn(on_bytes, dtype_bits(dtype), "bytes")
    assert _values(F, size(layout)) == _values(offset, size(layout))


@given(st.data())
def test_composition_agrees_with_f2_composition(data):
    a = data.draw(f2_layouts(max_bits=8))
    bits = size(a).bit_length() - 1
    assume(bits >= 1)
    b = data.draw(f2_layouts(max_bits=bits).filter(lambda b: b.cosize() <= size(a)))
    r = composition(a, b)
    assert f2(r).columns == f2(a).compose(f2(b)).columns


@given(f2_layouts(compact=True))
def test_inverses_agree_with_f2_inversion(layout):
    inverse = f2(layout).inverse()
    assert f2(right_inverse(layout)).columns == inverse.columns
    assert f2(left_inverse(layout)).columns == inverse.columns
    assert inverse.compose(f2(layout)).columns == tuple(1 << b for b in range(f2(layout).in_bits))


@given(f2_swizzled_layouts())
def test_swizzled_inverse_agrees(layout):
    inverse = f2(layout).inverse()
    assert f2(right_inverse(layout)).columns == inverse.columns
    assert _values(inverse, size(layout)) == _values(right_inverse(layout), size(layout))


def test_swizzle_view_is_an_involution():
    S = f2_swizzle(Swizzle(3, 4, 3))
    assert S.compose(S).columns == tuple(1 << b for b in range(10))
    assert S.inverse().columns == S.columns


def test_jupyter_draws_the_bit_matrix_of_a_large_tile():
    F = f2(Layout((128, 128), (128, 1)))  # 14 input bits: a 14 x 14 picture, not 2**14 cells
    assert F._repr_svg_() is not None and "n6" in F._repr_svg_()
