import pytest
from hypothesis import given
from hypothesis import strategies as st

from cute_kernels.layouts import (
    ComposedLayout, Layout, LayoutError, Swizzle, downcast, recast_layout, size, upcast,
)
from cute_kernels.layouts.strategies import compact_layouts


def test_examples():
    smem = Layout((8, 64), (64, 1))
    assert recast_layout(smem, 16, 32) == Layout((8, 32), (32, 1))     # fp16 -> 32-bit words
    assert recast_layout(smem, 16, 8) == Layout((8, 128), (128, 1))    # fp16 -> bytes
    assert recast_layout(Layout((8, 48), (48, 1)), 16, 24) == Layout((8, 32), (32, 1))
    assert recast_layout(smem, 16, 16) is smem
    assert upcast(Layout((4, 8), (1, 4)), 4) == Layout((1, 8), (1, 1))
    assert downcast(Layout((4, 8), (8, 1)), 2) == Layout((4, 16), (16, 1))
    assert upcast(Swizzle(3, 4, 3), 8) == Swizzle(3, 1, 3)
    assert upcast(Swizzle(3, 2, 3), 8) == Swizzle(2, 0, 3)
    assert downcast(Swizzle(3, 4, 3), 2) == Swizzle(3, 5, 3)


def test_inadmissible_recasts_raise():
    with pytest.raises(LayoutError, match="divisibility"):
        upcast(Layout((4, 8), (1, 6)), 4)
    with pytest.raises(LayoutError, match="adjacent"):
        downcast(Layout((4, 8), (2, 8)), 2)
    with pytest.raises(LayoutError, match="positive"):
        recast_layout(Layout(4), 0, 16)


@given(compact_layouts(max_leaves=3), st.sampled_from([(16, 32), (8, 16), (8, 32), (16, 64), (4, 8)]))
def test_recast_round_trips(L, widths):
    old, new = widths
    ratio = new // old
    contiguous = [s for s, d in zip(_leaves(L.shape), _leaves(L.stride)) if d == 1]
    if not contiguous or contiguous[0] % ratio or contiguous[0] == ratio:
        # The contiguous mode must hold whole vectors, and more than one: otherwise it shrinks to a
        # size-1 stride-1 mode and the next mode (stride == ratio) becomes stride 1 as well (CuTe).
        return
    wide = recast_layout(L, old, new)
    assert size(wide) * ratio == size(L)
    assert recast_layout(wide, new, old) == L
    # the wide layout addresses the same bytes: element w covers old offsets [w*ratio, (w+1)*ratio)
    assert sorted(wide(i) for i in range(size(wide))) == list(range(size(wide)))


def _leaves(t):
    from cute_kernels.layouts.int_tuple import flatten

    return flatten(t)


def test_recast_of_a_swizzled_layout():
    S = ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1)))
    W = recast_layout(S, 16, 128)
    assert W == ComposedLayout(Swizzle(3, 1, 3), 0, Layout((8, 8), (8, 1)))
