import pytest
from hypothesis import given

from cute_kernels.layouts import (
    ComposedLayout, Layout, LayoutError, Swizzle, blocked_product, flat_product, logical_product,
    make_ordered_layout, raked_product, rank, same_function, size, tile_to_shape, tiled_product,
    zipped_product,
)
from cute_kernels.layouts.int_tuple import compatible, idx2crd, product
from cute_kernels.layouts.strategies import product_pairs


def test_examples_from_cute_docs():
    assert logical_product(Layout((2, 2), (4, 1)), Layout(6, 1)) == Layout(((2, 2), (2, 3)), ((4, 1), (2, 8)))
    assert blocked_product(Layout((2, 5), (5, 1)), Layout((3, 4), (1, 3))) == Layout(((2, 3), (5, 4)), ((5, 10), (1, 30)))
    assert raked_product(Layout((2, 5), (5, 1)), Layout((3, 4), (1, 3))) == Layout(((3, 2), (4, 5)), ((10, 5), (30, 1)))
    assert tile_to_shape(Layout((8, 8), (8, 1)), (32, 64)) == Layout(((8, 4), (8, 8)), ((8, 64), (1, 256)))
    assert tile_to_shape(Layout((8, 8), (8, 1)), (32, 64), (1, 0)) == Layout(((8, 4), (8, 8)), ((8, 512), (1, 64)))
    # rank-1: the single mode holds (block, repeats), as in the CuTe DSL
    assert blocked_product(Layout(2, 1), Layout(3, 1)) == Layout(((2, 3),), ((1, 2),))
    assert raked_product(Layout(2, 1), Layout(3, 1)) == Layout(((3, 2),), ((2, 1),))
    # raked products coalesce each mode
    assert raked_product(Layout((5, 2), (2, 30)), Layout((2, 3), (6, 2))) == Layout(((2, 5), 6), ((60, 2), 10))


def test_logical_product_with_an_int_tiler():
    # pycute (nvidia-cutlass 4.2) returns (4,1):(1,0) here; CuTe and the DSL give (2,4):(1,2).
    assert logical_product(Layout(2, 1), 4) == Layout((2, 4), (1, 2))


@given(product_pairs())
def test_logical_product_contracts(pair):
    A, B = pair
    P = logical_product(A, B)
    assert rank(P) == 2 and P[0] == A
    assert size(P) == size(A) * size(B)
    assert compatible(tuple(product(m) for m in (B.shape if isinstance(B.shape, tuple) else (B.shape,))),
                      P[1].shape if isinstance(B.shape, tuple) else (product(P[1].shape),))
    # the copies of A sit at offsets complement(A)(B(j)): all offsets distinct when B is injective
    if len({B(j) for j in range(size(B))}) == size(B):
        offsets = [P(i) for i in range(size(P))]
        assert len(set(offsets)) == len(offsets)
    Z = zipped_product(A, B)
    assert same_function(Z, P) and same_function(tiled_product(A, B), P) and same_function(flat_product(A, B), P)


def _coords(shape):
    return [idx2crd(i, shape) for i in range(product(shape))]


@given(product_pairs())
def test_blocked_and_raked_products_rearrange_the_logical_product(pair):
    A, B = pair
    r = max(rank(A), rank(B))
    try:
        blocked = blocked_product(A, B)
        raked = raked_product(A, B)
    except LayoutError as e:
        # Only rank-1 operands whose modes are a tuple and an int cannot be zipped (the DSL refuses too).
        assert r == 1 and "rank-1" in str(e)
        return
    assert rank(blocked) == r and rank(raked) == r
    assert size(blocked) == size(raked) == size(A) * size(B)
    image = sorted(logical_product(A, B)(i) for i in range(size(A) * size(B)))
    assert sorted(blocked(i) for i in range(size(blocked))) == image
    assert sorted(raked(i) for i in range(size(raked))) == image
    # in a blocked product, the first size(A) coordinates of mode 0 ... walk one block
    if r > 1:
        for i in range(r):
            assert size(blocked[i]) == size(raked[i])


def test_tile_to_shape_contracts():
    block = Layout((8, 8), (8, 1))
    T = tile_to_shape(block, (64, 32))
    assert size(T[0]) == 64 and size(T[1]) == 32
    assert all(T(m, n) == block(m, n) for m in range(8) for n in range(8))
    with pytest.raises(LayoutError, match="does not divide"):
        tile_to_shape(block, (60, 32))
    with pytest.raises(LayoutError, match="rank"):
        tile_to_shape(Layout((2, 2, 2)), (4, 4))
    S = ComposedLayout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))
    TS = tile_to_shape(S, (64, 128))
    assert isinstance(TS, ComposedLayout) and TS.inner == tile_to_shape(S.inner, (64, 128))


def test_tile_to_shape_order_is_make_ordered_layout():
    block = Layout((2, 2))
    T = tile_to_shape(block, (4, 6), (1, 0))
    assert T == blocked_product(block, make_ordered_layout((2, 3), (1, 0)))
