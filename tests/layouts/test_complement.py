import pytest
from hypothesis import given
from hypothesis import strategies as st

from cute_kernels.layouts import Layout, LayoutError, complement, cosize, filter, make_layout, size
from cute_kernels.layouts.strategies import injective_layouts


def test_examples_from_cute_docs():
    assert complement(Layout(4, 1), 24) == Layout(6, 4)
    assert complement(Layout(6, 4), 24) == Layout(4, 1)
    assert complement(Layout((4, 6), (1, 4)), 24) == Layout(1, 0)
    assert complement(Layout(4, 2), 24) == Layout((2, 3), (1, 8))
    assert complement(Layout((2, 4), (1, 6)), 24) == Layout(3, 2)
    assert complement(Layout((2, 2), (1, 6)), 24) == Layout((3, 2), (2, 12))
    assert complement(Layout(4, 2)) == Layout(2, 1)  # default cotarget: cosize


@given(injective_layouts(), st.integers(1, 4))
def test_complement_is_ordered_disjoint_and_covers(L, k):
    cotarget = cosize(L) * k
    C = complement(L, cotarget)
    values = [C(i) for i in range(size(C))]
    assert values == sorted(values) and len(set(values)) == len(values)           # ordered
    image = {L(j) for j in range(size(L))}
    assert not (set(values[1:]) & image)                                            # disjoint
    # (L, C) is injective and covers [0, cotarget): the complement fills exactly the gaps
    both = make_layout(L, C)
    offsets = [both(i) for i in range(size(both))]
    assert len(set(offsets)) == len(offsets)
    assert set(range(cotarget)) <= set(offsets)
    assert size(C) >= cotarget // size(filter(L))


def test_inadmissible_complements_raise():
    with pytest.raises(LayoutError, match="not injective"):
        complement(Layout((2, 2), (1, 1)), 8)
    with pytest.raises(LayoutError, match="divisibility"):
        complement(Layout((2, 2), (1, 3)), 12)
    with pytest.raises(LayoutError, match="negative"):
        complement(Layout(4, -1), 8)
