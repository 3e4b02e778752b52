from hypothesis import given
from hypothesis import strategies as st

import pytest

from cute_kernels.layouts import LayoutError
from cute_kernels.layouts.int_tuple import (
    compact_col_major, compatible, congruent, crd2idx, depth, flatten, idx2crd, prefix_product, product,
    rank, shape_div, shape_mod, slice_, suffix_product, unflatten, weakly_congruent,
)
from cute_kernels.layouts.strategies import shapes


def test_basic_values():
    assert flatten((2, (3, (4,)), 5)) == (2, 3, 4, 5)
    assert flatten(7) == (7,)
    assert product((2, (3, 4))) == 24 and product(()) == 1
    assert prefix_product((2, (3, 4))) == (1, (2, 6))
    assert suffix_product((2, (3, 4))) == (12, (4, 1))
    assert compact_col_major((4, 1, 3)) == (1, 0, 4)
    assert rank((1, (2, 3))) == 2 and rank(5) == 1
    assert depth(5) == 0 and depth((1, (2, 3))) == 2


def test_shape_div_and_mod():
    assert shape_div((4, 6), 8) == (1, 3)
    assert shape_div(3, 6) == 1
    assert shape_div(12, 4) == 3
    assert shape_mod((4, 6), 8) == (4, 2)
    with pytest.raises(LayoutError, match="divisibility"):
        shape_div(6, 4)


def test_crd2idx_weakly_congruent_and_idx2crd():
    shape, stride = (2, (3, 4)), (1, (2, 6))
    assert idx2crd(13, shape) == (1, (0, 2))
    assert crd2idx((1, (0, 2)), shape, stride) == 13
    assert crd2idx((1, 6), shape, stride) == 13  # an int inside a tuple mode is decoded colex
    with pytest.raises(LayoutError, match="congruent"):
        crd2idx((1, 2, 3), shape, stride)


@given(shapes())
def test_idx2crd_crd2idx_round_trip(shape):
    for i in range(product(shape)):
        crd = idx2crd(i, shape)
        assert congruent(crd, shape)
        assert crd2idx(crd, shape) == i


@given(shapes(), st.data())
def test_unflatten_inverts_flatten(shape, data):
    assert unflatten(flatten(shape), shape) == shape


def test_compatibility_relations():
    assert compatible(24, (2, (3, 4)))
    assert compatible((6, 4), ((2, 3), 4))
    assert not compatible((6, 4), (4, 6))
    assert weakly_congruent((1, 2), ((1, 2), 3))
    assert not weakly_congruent(((1, 2), 3), (1, 2))


def test_slice_follows_cute_lift():
    assert slice_((None, 3), (4, 8)) == (4,)
    assert slice_((None, (2, None)), (4, (2, (3, 5)))) == (4, (3, 5))
    assert slice_(None, (4, 8)) == (4, 8)
