from hypothesis import given

from cute_kernels.layouts import Layout, coalesce, depth, filter, filter_zeros, flatten, same_function, size
from cute_kernels.layouts.strategies import layouts


def test_examples():
    assert coalesce(Layout((2, (1, 6)), (1, (6, 2)))) == Layout(12, 1)
    assert coalesce(Layout((4, 1), (1, 0))) == Layout(4, 1)
    assert coalesce(Layout((1, 1), (3, 5))) == Layout(1, 0)
    assert coalesce(Layout((2, 4), (1, 4))) == Layout((2, 4), (1, 4))
    # by profile: each mode of the profile is coalesced separately
    L = Layout((2, (3, 4), 5), (1, (2, 6), 24))
    assert coalesce(L, (1, 1, 1)) == Layout((2, 12, 5), (1, 2, 24))
    assert coalesce(L, (1, 1)) == Layout((2, 12, 5), (1, 2, 24))
    assert filter(Layout((4, 2, 3), (1, 0, 4))) == Layout(12, 1)
    assert filter(Layout((4, 2), (0, 0))) == Layout(1, 0)
    assert filter_zeros(Layout((4, 2), (0, 5))) == Layout((1, 2), (0, 5))


@given(layouts())
def test_coalesce_preserves_function_and_size(L):
    C = coalesce(L)
    assert size(C) == size(L)
    assert depth(C) <= 1
    assert same_function(C, L)
    assert coalesce(C) == C  # idempotent


@given(layouts())
def test_coalesce_by_profile_keeps_top_level_modes(L):
    if not isinstance(L.shape, tuple):
        return
    C = coalesce(L, (1,) * len(L))
    assert len(C) == len(L)
    assert all(same_function(C[i], coalesce(L[i])) for i in range(len(L)))
    assert same_function(C, L)


@given(layouts())
def test_filter_keeps_the_image(L):
    F = filter(L)
    assert depth(F) <= 1
    assert {F(i) for i in range(size(F))} == {L(i) for i in range(size(L))}
    assert all(d != 0 for d in flatten(F.stride)) or F == Layout(1, 0)
    assert same_function(filter_zeros(L), filter_zeros(L))  # well-formed
