import pytest
from hypothesis import given

from cute_kernels.layouts import (
    Layout, LayoutError, append, cosize, depth, flatten, get, group, make_identity_layout, make_layout,
    make_ordered_layout, parse_layout, prepend, rank, replace, same_function, select, shape, size,
    slice_and_offset, stride, take,
)
from cute_kernels.layouts.int_tuple import idx2crd
from cute_kernels.layouts.strategies import layouts


def test_default_stride_is_cute_column_major():
    assert Layout((4, (2, 3))).stride == (1, (4, 8))
    assert Layout(8) == Layout(8, 1)
    # CuTe gives size-1 modes stride 0 in make_layout(shape)
    assert Layout((4, 1, 3)).stride == (1, 0, 4)


def test_evaluation_index_hierarchical_and_flat():
    L = Layout((4, (2, 2)), (2, (1, 8)))
    assert [L(i) for i in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert L(1, (1, 1)) == 2 + 1 + 8
    assert L((1, (1, 1))) == 11
    assert L(1, 1, 1) == 11          # flat coordinate: one int per leaf
    assert L(1, 3) == 11             # natural coordinate: an int inside a tuple mode
    with pytest.raises(LayoutError):
        L(1, 2, 3, 4)


def test_str_and_repr_match_cute():
    L = Layout((4, (2, 2)), (2, (1, 8)))
    assert str(L) == "(4,(2,2)):(2,(1,8))"
    assert repr(L) == "Layout((4, (2, 2)), (2, (1, 8)))"
    assert str(Layout(8, 1)) == "8:1"
    assert str(Layout((8,), (1,))) == "(8):(1)"
    assert eval(repr(L)) == L


@given(layouts())
def test_str_parses_back_and_repr_evaluates_back(L):
    assert parse_layout(str(L)) == L
    assert Layout.parse(str(L)) == L
    assert eval(repr(L)) == L


def test_equality_is_structural_and_hashable():
    a = Layout((2, 2), (1, 2))
    b = Layout(4, 1)
    assert a != b and same_function(a, b)
    assert hash(Layout((2, 2), (1, 2))) == hash(a)
    assert len({a, Layout([2, 2], [1, 2])}) == 1
    assert not same_function(Layout(4, 1), Layout(4, 2))
    assert not same_function(Layout(4, 1), Layout(8, 1))


def test_queries():
    L = Layout((4, (2, 3)), (3, (1, 12)))
    assert size(L) == 24 and L.size() == 24
    assert cosize(L) == L(23) + 1 == 3 * 3 + 1 + 2 * 12 + 1
    assert rank(L) == 2 and depth(L) == 2 and len(L) == 2
    assert shape(L, 1) == (2, 3) and stride(L, 1, 1) == 12
    assert L[1] == Layout((2, 3), (1, 12)) and get(L, 1, 0) == Layout(2, 1)
    assert size(L, 1) == 6
    assert select(L, 1, 0) == Layout(((2, 3), 4), ((1, 12), 3))
    assert take(L, 1, 2) == Layout(((2, 3),), ((1, 12),))
    assert append(L, Layout(5, 100)) == Layout((4, (2, 3), 5), (3, (1, 12), 100))
    assert prepend(L) == Layout((1, 4, (2, 3)), (0, 3, (1, 12)))
    assert append(Layout(4, 1), n=3) == Layout((4, 1, 1), (1, 0, 0))
    assert replace(L, 0, Layout(7, 7)) == Layout((7, (2, 3)), (7, (1, 12)))
    assert group(Layout((2, 3, 4, 5)), 1, 3) == Layout((2, (3, 4), 5), (1, (2, 6), 24))
    assert flatten(L) == Layout((4, 2, 3), (3, 1, 12))
    assert make_layout(Layout(4, 1), Layout((2, 3), (4, 8))) == Layout((4, (2, 3)), (1, (4, 8)))


@given(layouts())
def test_group_and_flatten_preserve_the_function(L):
    assert same_function(flatten(L), L)
    if rank(L) >= 2:
        assert same_function(group(L, 0, 2), L)


def test_slicing_with_none():
    L = Layout((4, 8), (8, 1))
    assert L(None, 3) == Layout((4,), (8,))
    assert L(2, None) == Layout((8,), (1,))
    sub, off = slice_and_offset((None, 3), L)
    assert off == 3 and all(L(i, 3) == off + sub(i) for i in range(4))
    N = Layout((2, (3, 4)), (1, (2, 6)))
    sub, off = slice_and_offset((1, (None, 2)), N)
    assert sub == Layout((3,), (2,)) and off == 1 + 12


@given(layouts())
def test_slice_and_offset_post_condition(L):
    if rank(L) < 2:
        return
    crd = (None,) + tuple(0 if i % 2 else m.size() - 1 for i, m in enumerate(L))[1:]
    sub, off = slice_and_offset(crd, L)
    for i in range(L[0].size()):
        assert L((i,) + crd[1:]) == off + sub(i)


def test_make_ordered_layout():
    # CuTe's examples (layout.hpp)
    assert make_ordered_layout((2, 2, 2, 2), (0, 2, 3, 1)) == Layout((2, 2, 2, 2), (1, 4, 8, 2))
    # (CuTe C++'s second example treats its dynamic orders as large; with all-static orders, as in
    # the CuTe DSL, the orders are simply sorted.)
    assert make_ordered_layout((2, 3, 4, 5), (2, 67, 42, 50)) == Layout((2, 3, 4, 5), (1, 40, 2, 8))
    assert make_ordered_layout((2, (3, 4)), (1, 0)) == Layout((2, (3, 4)), (12, (1, 3)))
    assert make_ordered_layout((4, 8)) == Layout((4, 8), (1, 4))
    assert make_ordered_layout((4, 8), (1, 0)) == Layout((4, 8), (8, 1))
    with pytest.raises(LayoutError, match="congruent"):
        make_ordered_layout((4, 8), (0, 1, 2))


def test_make_identity_layout_maps_coordinates_to_themselves():
    I = make_identity_layout((4, 8))
    assert str(I) == "(4,8):(1@0,1@1)"
    assert all(I(m, n) == (m, n) for m in range(4) for n in range(8))
    N = make_identity_layout((4, (2, 3)))
    assert str(N) == "(4,(2,3)):(1@0,(1@0@1,1@1@1))"  # as the CuTe DSL prints it
    for i in range(24):
        assert N(i) == idx2crd(i, (4, (2, 3)))
    assert parse_layout(str(N)) == N


def test_invalid_layouts_raise():
    with pytest.raises(LayoutError, match="positive"):
        Layout((4, 0))
    with pytest.raises(LayoutError, match="congruent"):
        Layout((4, 2), (1, (2, 3)))
    with pytest.raises(LayoutError, match="out of range"):
        Layout((4, 2))[2]


def test_bad_coordinates_raise_the_builtin_errors_python_expects():
    L = Layout((4, 8), (8, 1))
    with pytest.raises(TypeError, match=r"takes integer indices .* not str 'a'"):
        L("a")
    with pytest.raises(TypeError, match="not float 1.5"):
        L(1.5, 0)
    with pytest.raises(TypeError, match="not bool"):
        L(True)
    with pytest.raises(IndexError, match=r"index -1 is out of range for layout \(4,8\):\(8,1\).*0\.\.31"):
        L(-1)
    with pytest.raises(IndexError, match="index -2"):
        L((1, -2))
    for exc in (TypeError, IndexError):  # both are LayoutErrors too: one except clause catches all
        assert issubclass({TypeError: type(_raised(L, "a")), IndexError: type(_raised(L, -1))}[exc], LayoutError)
    assert L(31) == 31 and L(32) == 8  # past the size, CuTe's last mode continues
    assert L([1, 2]) == 10 and str(L(None, 3)) == "(4):(8)"


def _raised(layout, arg):
    try:
        layout(arg)
    except LayoutError as err:
        return err
    raise AssertionError("no error")
