import pytest
from hypothesis import given

from cute_kernels.layouts import (
    ComposedLayout, Layout, LayoutError, Swizzle, coalesce, complement, composition, flat_divide,
    logical_divide, logical_product, make_layout, rank, same_function, size, tiled_divide, zipped_divide,
)
from cute_kernels.layouts.strategies import divide_pairs, product_pairs

DOC_LAYOUT = Layout((9, (4, 8)), (59, (13, 1)))
DOC_TILER = (Layout(3, 3), Layout((2, 4), (1, 8)))


def test_examples_from_cute_docs():
    assert str(logical_divide(DOC_LAYOUT, DOC_TILER)) == "((3,3),((2,4),(2,2))):((177,59),((13,2),(26,1)))"
    assert str(zipped_divide(DOC_LAYOUT, DOC_TILER)) == "((3,(2,4)),(3,(2,2))):((177,(13,2)),(59,(26,1)))"
    assert str(tiled_divide(DOC_LAYOUT, DOC_TILER)) == "((3,(2,4)),3,(2,2)):((177,(13,2)),59,(26,1))"
    assert str(flat_divide(DOC_LAYOUT, DOC_TILER)) == "(3,(2,4),3,(2,2)):(177,(13,2),59,(26,1))"
    assert logical_divide(Layout((4, 2, 3), (2, 1, 8)), Layout(4, 2)) == Layout(((2, 2), (2, 3)), ((4, 1), (2, 8)))
    assert logical_divide(Layout((4, 8), (8, 1)), 2) == Layout((2, (2, 8)), (8, (16, 1)))


def _tile_size(t, mode):
    if t is None:
        return size(mode)
    return t if isinstance(t, int) else size(t)


@given(divide_pairs(by_mode=False))
def test_logical_divide_is_composition_with_tiler_and_complement(pair):
    L, T = pair
    D = logical_divide(L, T)
    assert rank(D) == 2
    assert same_function(D[0], composition(L, T))
    full = make_layout(T, complement(T, coalesce(L).shape))
    for i in range(size(D)):
        assert D(i) == L(full(i))
    assert size(D[0]) == size(T)


@given(divide_pairs(by_mode=True))
def test_divides_by_mode_shape_contracts(pair):
    L, tiler = pair
    D = logical_divide(L, tiler)
    modes = list(L)
    assert rank(D) == rank(L)
    for i, t in enumerate(tiler):
        if t is None:
            assert D[i] == modes[i]
        else:
            assert size(D[i][0]) == _tile_size(t, modes[i])
    if any(t is None and rank(modes[i]) != 2 for i, t in enumerate(tiler)):
        # As in CuTe, a mode left whole (None) must itself be a (tile, rest) pair to be zipped.
        with pytest.raises(LayoutError, match="rank-2"):
            zipped_divide(L, tiler)
        return
    if any(t is None for t in tiler):
        return
    Z = zipped_divide(L, tiler)
    assert rank(Z) == 2 and rank(Z[0]) == len(tiler)
    assert all(size(Z[0][i]) == size(D[i][0]) for i in range(len(tiler)))
    # zipped_divide only regroups modes: ((t0, t1..), (r0, r1..)) == ((t0, r0), (t1, r1), ...)
    for i0 in range(size(Z[0])):
        for i1 in range(size(Z[1])):
            from cute_kernels.layouts.int_tuple import idx2crd

            tc = idx2crd(i0, Z[0].shape)
            rc = idx2crd(i1, Z[1].shape)
            tc = tc if isinstance(tc, tuple) else (tc,)
            rc = rc if isinstance(rc, tuple) else (rc,)
            crd = tuple((tc[k], rc[k]) for k in range(len(tiler))) + tuple(rc[len(tiler):])
            assert Z(i0, i1) == D(crd)
    T = tiled_divide(L, tiler)
    F = flat_divide(L, tiler)
    assert T[0] == Z[0] and rank(T) == 1 + rank(Z[1])
    assert rank(F) == rank(Z[0]) + rank(Z[1])
    assert same_function(T, Z) and same_function(F, Z)


@given(product_pairs())
def test_divide_undoes_product(pair):
    A, B = pair
    P = logical_product(A, B)
    D = logical_divide(P, Layout(size(A)))
    assert same_function(D[0], A)
    assert same_function(D[1], P[1])


def test_divide_of_a_composed_layout_divides_the_inner_layout():
    S = ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1)))
    D = zipped_divide(S, (8, 8))
    assert isinstance(D, ComposedLayout) and D.outer == Swizzle(3, 4, 3)
    assert D.inner == zipped_divide(Layout((8, 64), (64, 1)), (8, 8))
    assert all(D(i) == S.outer(D.inner(i)) for i in range(size(D)))
