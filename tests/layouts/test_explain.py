"""explain(op, *args): the recorded steps of compositions, complements, divides and products."""

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given

from cute_kernels.layouts import (
    Layout, LayoutError, complement, composition, explain, logical_divide, logical_product,
)
from cute_kernels.layouts import trace
from cute_kernels.layouts.strategies import composable_pairs, layouts


def test_a_composition_walk_in_words():
    e = explain(composition, Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1)))
    assert e.ok and e.result == composition(Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1)))
    assert [s.kind for s in e.steps] == ["flatten", "leaf", "leaf"]
    assert e.steps[1].text == ("B's mode 4:3 walks A's modes: mode 0 (6:8) gives 2:24 (2 elements at stride 3 within it); "
                               "the rest, 2 element(s), continues A's last mode (2:2) at stride 1: 2:2")
    assert str(e).splitlines()[-1] == "  = ((2,2),3):((24,2),8)"
    svg = e.to_svg()
    ET.fromstring(svg)
    assert "B&apos;s modes" in svg or "B's modes" in svg
    assert "B0" in svg and "take" in svg


def test_a_failed_admissibility_says_where():
    e = explain("composition", "(3,4):(1,5)", "2:4")  # layouts as text
    assert not e.ok and e.result is None and e.failed_step == 2
    assert e.steps[1].text == ("B's mode 2:4 fails at A's mode 0 (3:1): the stride 4 left to walk neither divides "
                               "nor is a multiple of 3")
    assert str(e).splitlines()[-1].startswith("  refused at step 2: composition (3,4):(1,5) o 2:4: stride divisibility")
    assert "fail" in e.to_svg()
    carry = explain(composition, Layout((6, 5, 8), (55, 35, 38)), Layout((4, 10), (3, 6)))
    assert "overlap in A's mode 1 (extent 5)" in carry.steps[carry.failed_step - 1].text


def test_complement_modes_and_gaps():
    e = explain(complement, Layout((2, 2), (1, 6)), 24)
    assert e.result == Layout((3, 2), (2, 12))
    assert [s.text for s in e.steps[1:]] == [
        "mode 2:1 starts where the smaller modes end (1): no gap",
        "below mode 2:6 the smaller modes span 2 offset(s): the complement fills the gap with 3:2",
        "above everything (extent 12) the complement repeats up to the codomain 24: 2:12",
    ]
    svg = e.to_svg()
    assert "C5" in svg and "A3" in svg and svg.count(">C1<") == 4  # copy 1 of A starts at offset 2
    bad = explain(complement, Layout((2, 4), (1, 1)))
    assert not bad.ok and "not injective" in bad.steps[-1].text


def test_divide_and_product_show_the_completed_tiler():
    e = explain(logical_divide, Layout((8, 16), (16, 1)), Layout(4, 1))
    assert e.result == logical_divide(Layout((8, 16), (16, 1)), Layout(4, 1))
    tile = next(s for s in e.steps if s.kind == "tile")
    assert tile.text.startswith("the tiler 4:1 is completed by its complement to (8, 16), 32:4")
    assert "t1.0" in e.to_svg()
    p = explain(logical_product, Layout((2, 2), (1, 2)), Layout(3, 1))
    assert p.result == Layout(((2, 2), 3), ((1, 2), 4)) and any(s.kind == "tile" for s in p.steps)
    ET.fromstring(p.to_svg())


def test_explain_errors_and_no_recording_outside():
    with pytest.raises(LayoutError, match="not an operation"):
        explain("no_such_op", Layout(4, 1))
    assert not trace.tracing()
    composition(Layout(4, 1), Layout(2, 2))  # records nothing, raises nothing
    assert "<table>" in explain(composition, Layout(4, 1), Layout(2, 2))._repr_html_()


@given(composable_pairs())
def test_explain_returns_what_the_operation_returns(pair):
    a, b = pair
    e = explain(composition, a, b)
    assert e.ok and e.result == composition(a, b)
    assert sum(s.kind == "leaf" for s in e.steps) >= 1


@given(layouts(), layouts(max_leaves=3, max_stride=12))
def test_explain_refuses_exactly_when_the_operation_does(a, b):
    e = explain(composition, a, b)
    try:
        expected = composition(a, b)
    except LayoutError as err:
        assert not e.ok and str(e.error) == str(err)
        return
    assert e.ok and e.result == expected
