"""The two composition rules (``semantics="dsl"``, the default, and ``"pycute"``): the cases that
differ, the context manager, and the laws each rule promises where B reaches beyond A."""

import pytest
from hypothesis import assume, given

from cute_kernels.layouts import (
    Layout, LayoutError, blocked_product, coalesce, complement, composition, current_semantics, flat_divide,
    layout_semantics, logical_divide, logical_product, make_layout, raked_product, same_function, size,
    tiled_divide, zipped_divide,
)
from cute_kernels.layouts.strategies import beyond_divide_pairs, beyond_pairs, composable_pairs, product_pairs


def test_the_cases_where_the_rules_differ():
    a, b = Layout((8, 1), (1, 1)), Layout((8, 1, 2), (2, 32, 1))
    assert composition(a, b) == Layout(((4, 2), 1, 2), ((2, 1), 4, 1))  # the DSL and CuTe C++
    assert composition(a, b, semantics="cpp") == composition(a, b)
    assert composition(a, b, semantics="pycute") == Layout((8, 1, 2), (2, 32, 1))
    assert composition(Layout(1, 1), Layout(2, 1)) == Layout(2, 1)
    assert composition(Layout(1, 1), Layout(2, 1), semantics="pycute") == Layout(2, 0)
    # the divide inherits the rule: a 16-tile of an 8-element layout reaches past it
    assert logical_divide(a, Layout(16, 1)) == Layout(((8, 2), 1), ((1, 1), 0))
    assert logical_divide(a, Layout(16, 1), semantics="pycute") == Layout((16, 1), (1, 0))


def test_context_manager_nests_and_restores():
    a, b = Layout(1, 1), Layout(2, 1)
    assert current_semantics() == "dsl"
    with layout_semantics("pycute"):
        assert composition(a, b) == Layout(2, 0)
        assert zipped_divide(a, Layout(2, 1)) == Layout((2, 1), (0, 0))
        with layout_semantics("dsl"):
            assert composition(a, b) == Layout(2, 1)
        assert composition(a, b, semantics="dsl") == Layout(2, 1)  # an argument wins over the block
        assert current_semantics() == "pycute"
    assert current_semantics() == "dsl"
    assert zipped_divide(a, Layout(2, 1)) == Layout((2, 1), (1, 0))
    with pytest.raises(RuntimeError):
        with layout_semantics("pycute"):
            raise RuntimeError
    assert current_semantics() == "dsl"


def test_unknown_semantics_is_named():
    with pytest.raises(LayoutError, match="unknown layout semantics 'c'; use one of dsl, cpp, pycute"):
        composition(Layout(4, 1), Layout(2, 1), semantics="c")
    with pytest.raises(LayoutError, match="unknown layout semantics"):
        with layout_semantics("numpy"):
            pass


def test_pycute_keeps_the_modes_beyond_a_tuple_tiler():
    a = Layout((4, 8, 3), (8, 1, 32))
    assert composition(a, (2, 4)) == Layout((2, 4), (8, 1))
    assert composition(a, (2, 4), semantics="pycute") == Layout((2, 4, 3), (8, 1, 32))


def test_semantics_argument_on_every_composing_operation():
    a, t = Layout((8, 1), (1, 1)), Layout(16, 1)
    for op in (logical_divide, zipped_divide, tiled_divide, flat_divide):
        assert same_function(op(a, t, semantics="pycute"), Layout(16, 1)), op.__name__
        assert "semantics" in op.__doc__, op.__name__
    for op in (logical_product, blocked_product, raked_product, composition):
        assert "semantics" in op.__doc__, op.__name__


@given(beyond_pairs("dsl"))
def test_dsl_rule_extends_the_last_leaf_as_written(pair):
    a, b = pair
    r = composition(a, b)
    # a(i) past size(a) continues a's last leaf: what the DSL and CuTe C++ compose against
    assert all(r(i) == a(b(i)) for i in range(size(b)))


@given(beyond_pairs("pycute"))
def test_pycute_rule_extends_coalesce_of_a(pair):
    a, b = pair
    r = composition(a, b, semantics="pycute")
    flat = coalesce(a)
    assert all(r(i) == flat(b(i)) for i in range(size(b)))


@given(composable_pairs())
def test_inside_the_domain_the_rules_agree(pair):
    a, b = pair
    assume(b.cosize() <= a.size() and all(d >= 0 for d in _leaves(b.stride)))
    assert same_function(composition(a, b), composition(a, b, semantics="pycute"))


@pytest.mark.parametrize("semantics", ["dsl", "pycute"])
@given(pair=beyond_divide_pairs())
def test_divides_compose_with_the_completed_tiler(semantics, pair):
    a, t = pair
    cotarget = a.size() if semantics == "pycute" else coalesce(a).shape
    try:
        complete = make_layout(t, complement(t, cotarget))
        d = logical_divide(a, t, semantics=semantics)
    except LayoutError:
        assume(False)
    extended = a if semantics == "dsl" else coalesce(a)
    assert size(d) == size(complete)
    assert all(d(i) == extended(complete(i)) for i in range(size(d)))
    for op in (zipped_divide, tiled_divide, flat_divide):  # a layout tiler: the same function
        assert same_function(op(a, t, semantics=semantics), d)


@given(product_pairs())
def test_products_agree_under_both_rules(pair):
    block, tiler = pair
    for op in (logical_product, blocked_product, raked_product):
        try:
            ours = op(block, tiler)
        except LayoutError:
            with pytest.raises(LayoutError):
                op(block, tiler, semantics="pycute")
            continue
        assert op(block, tiler, semantics="pycute") == ours


def _leaves(t):
    return [x for y in t for x in _leaves(y)] if isinstance(t, tuple) else [t]
