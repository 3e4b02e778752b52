import pytest
from hypothesis import given

from cute_kernels.layouts import (
    Layout, LayoutError, composition, left_inverse, max_common_layout, max_common_vector, nullspace,
    right_inverse, size, filter,
)
from cute_kernels.layouts.strategies import compact_layouts, injective_layouts, layouts


def test_examples():
    assert right_inverse(Layout((2, 3, 4), (12, 1, 3))) == Layout((12, 2), (2, 1))
    assert right_inverse(Layout((4, 2), (2, 1))) == Layout((2, 4), (4, 1))
    assert right_inverse(Layout(4, 2)) == Layout(1, 0)
    assert left_inverse(Layout(4, 2)) == Layout((2, 4), (0, 1))
    assert nullspace(Layout((2, 3), (0, 1))) == Layout(2, 1)
    assert nullspace(Layout((2, 3, 1), (0, 1, 0))) == Layout((2, 1), (1, 6))
    assert nullspace(Layout((2, 3), (1, 2))) == Layout(1, 0)


@given(layouts())
def test_right_inverse_law(L):
    R = right_inverse(L)
    for i in range(size(R)):
        assert L(R(i)) == i
    C = composition(L, R)
    assert all(C(i) == i for i in range(size(R)))


@given(compact_layouts())
def test_right_inverse_of_a_bijection_is_two_sided(L):
    R = right_inverse(L)
    assert size(R) == size(L)
    assert all(R(L(i)) == i for i in range(size(L)))


@given(injective_layouts())
def test_left_inverse_law(L):
    Li = left_inverse(L)
    for i in range(size(L)):
        assert Li(L(i)) == i


@given(layouts())
def test_left_inverse_is_a_quasi_inverse_where_admissible(L):
    try:
        Li = left_inverse(L)
    except LayoutError:
        return
    if len({L(i) for i in range(size(L))}) == size(L):
        assert all(L(Li(L(i))) == L(i) for i in range(size(L)))


@given(layouts())
def test_nullspace_post_conditions(L):
    N = nullspace(L)
    assert all(L(N(i)) == 0 for i in range(size(N)))
    assert size(N) == size(L) // size(filter(L))
    assert size(nullspace(N)) == 1  # N has no (non-trivial) kernel


@given(layouts(), compact_layouts())
def test_max_common_layout_post_condition(a, b):
    try:
        R = max_common_layout(a, b)
        n = max_common_vector(a, b)
    except LayoutError:
        return
    for i in range(size(R)):
        assert a(R(i)) == i and b(R(i)) == i
    assert n >= 1 and (n == size(R) or n == 1)


def test_max_common_vector_examples():
    row = Layout((4, 8), (8, 1))
    assert max_common_vector(row, row) == 32
    assert max_common_vector(Layout((4, 8), (1, 4)), Layout((4, 8), (1, 8))) == 4
    assert max_common_layout(Layout((4, 8), (1, 4)), Layout((4, 8), (1, 8))) == Layout(4, 1)
    assert max_common_vector(Layout((4, 8), (8, 1)), Layout((4, 8), (1, 4))) == 1


def test_left_inverse_divisibility_raises():
    with pytest.raises(LayoutError, match="divisibility"):
        left_inverse(Layout((2, 3), (3, 2)))
