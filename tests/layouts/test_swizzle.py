import pytest
from hypothesis import given
from hypothesis import strategies as st

from cute_kernels.layouts import LayoutError, Swizzle, make_swizzle, parse_layout
from cute_kernels.layouts.strategies import swizzles


def test_cute_semantics():
    sw = Swizzle(3, 4, 3)
    assert str(sw) == "Sw<3,4,3>" and repr(sw) == "Swizzle(3, 4, 3)"
    assert sw.yyy_mask == 0b111 << 7 and sw.zzz_mask == 0b111 << 4
    # offset ^ ((offset & yyy) >> 3): row bits 7..9 flip the 16-byte chunk bits 4..6
    assert sw(0) == 0 and sw(1 << 7) == (1 << 7) | (1 << 4)
    assert sw(0b101_0000000 | 0b011_0000 | 0b1010) == 0b101_0000000 | (0b011 ^ 0b101) << 4 | 0b1010
    neg = Swizzle(2, 0, -3)  # negative shift: the high bits are the Z bits
    assert neg.yyy_mask == 0b11 and neg.zzz_mask == 0b11 << 3
    assert neg(0b01) == 0b01 | 0b01 << 3


@given(swizzles(), st.integers(0, 1 << 14))
def test_swizzle_is_an_involution(sw, x):
    assert sw(sw(x)) == x


@given(swizzles(max_bits=2, max_base=3))
def test_swizzle_is_a_bijection_on_its_period(sw):
    n = sw.size()
    assert sorted(sw(x) for x in range(n)) == list(range(n))
    assert sorted(sw(x) for x in range(n, 3 * n)) == list(range(n, 3 * n))


def test_invalid_swizzles_raise():
    with pytest.raises(LayoutError, match=r"\|S\| >= B"):
        Swizzle(3, 4, 2)
    with pytest.raises(LayoutError, match="non-negative"):
        Swizzle(-1, 4, 3)


def test_make_swizzle_from_masks_and_merging():
    sw = Swizzle(3, 4, 3)
    assert make_swizzle(sw.yyy_mask, sw.zzz_mask) == sw
    assert make_swizzle(0b11000, 0b11) == Swizzle(2, 0, 3)
    with pytest.raises(LayoutError, match="bit counts"):
        make_swizzle(0b111, 0b1)
    merged = Swizzle(1, 4, 3).compose(Swizzle(1, 5, 3))
    assert merged == Swizzle(2, 4, 3)
    with pytest.raises(LayoutError, match="same shift"):
        Swizzle(1, 4, 3).compose(Swizzle(1, 4, 2))


@given(swizzles())
def test_swizzle_str_parses_back(sw):
    assert parse_layout(str(sw)) == sw
