"""The core laws of the algebra, in bulk: at least 20,000 hypothesis examples in every CI run.

Each law runs its own number of examples (more for the cheap ones: hypothesis itself costs about
3 ms an example here, so the set takes about a minute and a half of CPU on the CI machine), scaled
by the profile: 1x under ``ci`` and ``dev``, 5x under ``HYPOTHESIS_PROFILE=deep`` (over 100,000
examples). They are counted as they run, and the last test checks that the whole set reached
``TOTAL``. Under ``CI`` the examples are derandomized, so every run checks the same cases;
``deep`` draws fresh ones each time.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cute_kernels.layouts import (
    coalesce, complement, composition, cosize, idx2crd, crd2idx, left_inverse, logical_divide,
    logical_product, make_layout, parse_layout, right_inverse, size,
)
from cute_kernels.layouts.f2 import f2
from cute_kernels.layouts.strategies import (
    beyond_pairs, composable_pairs, divide_pairs, f2_layouts, f2_swizzled_layouts, injective_layouts, layouts,
    product_pairs, swizzled_layouts, swizzles,
)

SCALE = max(1, settings.default.max_examples // 1000)  # ci: 100 -> 1, deep: 5000 -> 5
TOTAL = 20_000
_ran: dict[str, int] = {}


def law(examples: int, *strategies):
    """A hypothesis test run ``examples * SCALE`` times (on the current profile), counting its examples."""

    def wrap(fn):
        @functools.wraps(fn)  # keeps fn's signature, which @given reads
        def counted(*args, **kwargs):
            _ran[fn.__name__] = _ran.get(fn.__name__, 0) + 1
            fn(*args, **kwargs)

        checks = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
        return settings(settings.default, max_examples=examples * SCALE, deadline=None, suppress_health_check=checks)(
            given(*strategies)(counted))

    return wrap


@law(1200, composable_pairs())
def test_law_composition_is_function_composition(pair):
    a, b = pair
    r = composition(a, b)
    assert all(r(i) == a(b(i)) for i in range(size(b)))


@law(400, beyond_pairs("dsl"))
def test_law_composition_beyond_a_continues_its_last_leaf(pair):
    a, b = pair
    r = composition(a, b)
    assert all(r(i) == a(b(i)) for i in range(size(b)))


@law(400, beyond_pairs("pycute"))
def test_law_pycute_composition_continues_coalesce_of_a(pair):
    a, b = pair
    r, flat = composition(a, b, semantics="pycute"), coalesce(a)
    assert all(r(i) == flat(b(i)) for i in range(size(b)))


@law(3000, layouts())
def test_law_coalesce_preserves_the_function(layout):
    c = coalesce(layout)
    assert size(c) == size(layout) and all(c(i) == layout(i) for i in range(size(layout)))


@law(800, injective_layouts(), st.integers(1, 3))
def test_law_complement_fills_the_gaps(layout, k):
    target = cosize(layout) * k
    c = complement(layout, target)
    both = make_layout(layout, c)
    offsets = [both(i) for i in range(size(both))]
    assert len(set(offsets)) == len(offsets) and set(range(target)) <= set(offsets)


@law(800, divide_pairs(by_mode=False))
def test_law_divide_composes_with_the_completed_tiler(pair):
    layout, tiler = pair
    d = logical_divide(layout, tiler)
    complete = make_layout(tiler, complement(tiler, coalesce(layout).shape))
    assert size(d) == size(complete) and all(d(i) == layout(complete(i)) for i in range(size(d)))


@law(800, product_pairs())
def test_law_product_repeats_the_block(pair):
    block, tiler = pair
    p = logical_product(block, tiler)
    assert p[0] == block and size(p) == size(block) * size(tiler)
    if len({tiler(i) for i in range(size(tiler))}) == size(tiler):  # both injective: so is the product
        offsets = [p(i) for i in range(size(p))]
        assert len(set(offsets)) == len(offsets)


@law(3000, layouts())
def test_law_right_inverse(layout):
    r = right_inverse(layout)
    assert all(layout(r(i)) == i for i in range(size(r)))


@law(1000, injective_layouts())
def test_law_left_inverse(layout):
    li = left_inverse(layout)
    assert all(li(layout(i)) == i for i in range(size(layout)))


@law(800, swizzled_layouts())
def test_law_swizzled_layout_inverse(layout):
    r = right_inverse(layout)
    assert all(layout(r(i)) == i for i in range(size(layout)))


@law(5000, swizzles(), st.integers(0, 1 << 16))
def test_law_swizzle_is_an_involution(sw, x):
    assert sw(sw(x)) == x


@law(400, f2_layouts(), f2_layouts(compact=True))
def test_law_f2_agrees_with_the_algebra(a, c):
    assert [f2(a)(i) for i in range(size(a))] == [a(i) for i in range(size(a))]
    assert f2(right_inverse(c)).columns == f2(c).inverse().columns


@law(400, f2_swizzled_layouts())
def test_law_f2_swizzled_round_trip(layout):
    back = f2(layout).to_cute()
    assert all(back(i) == layout(i) for i in range(size(layout)))


@law(3000, layouts(), st.data())
def test_law_print_parse_and_coordinates_round_trip(layout, data):
    assert parse_layout(str(layout)) == layout
    i = data.draw(st.integers(0, size(layout) - 1))
    crd = idx2crd(i, layout.shape)
    assert crd2idx(crd, layout.shape) == i and layout(crd) == layout(i)


def test_the_laws_ran_at_least_twenty_thousand_examples():
    laws = [name for name in globals() if name.startswith("test_law_")]
    if set(_ran) != set(laws):
        pytest.skip("only part of the law set was selected")
    total = sum(_ran.values())
    assert total >= TOTAL, _ran
