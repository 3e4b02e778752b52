"""Size budgets: huge layouts print a corner, draw a corner, and analyses refuse with a message."""

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given

from cute_kernels.layouts import ComposedLayout, Layout, LayoutError, Swizzle, bank_conflicts, coalescing, vector_width
from cute_kernels.layouts import budget, render
from cute_kernels.layouts.analysis import _enumerated_vector, _plain_vector
from cute_kernels.layouts.strategies import edge_layouts, layouts

HUGE = Layout((100000, 100000), (1, 100000))


def _counting_calls(monkeypatch):
    """How many coordinates get evaluated: a bounded render or analysis evaluates a corner's
    worth, an unbounded one the whole 10^10-cell grid (it would never finish)."""
    calls = [0]
    real = Layout.__call__

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Layout, "__call__", counted)
    return calls


def test_a_huge_layout_prints_its_corner(monkeypatch):
    calls = _counting_calls(monkeypatch)
    text = render.layout_text(HUGE)
    assert calls[0] <= 4 * 64 * 64
    lines = text.splitlines()
    assert lines[0] == "(100000,100000):(1,100000)"
    assert lines[-1] == ("(showing rows 0-63 and columns 0-63 of the 100000 x 100000 grid: 10000000000 cells, "
                         "more than the budget of 4096; pass max_cells= (--max-cells N) to draw more)")
    assert [c.strip() for c in lines[3].split("|")[1:4]] == ["0", "100000", "200000"]
    assert len(text) < 100_000


def test_4096_square_is_bounded_in_every_form():
    big = Layout((4096, 4096), (1, 4096))
    assert len(render.layout_text(big)) < 100_000
    svg = render.to_svg(big)
    assert len(svg) < 3_000_000 and "showing rows 0-127 and columns 0-127" in svg
    ET.fromstring(svg)
    assert "showing rows" in render.to_latex(big)
    full = render.layout_text(Layout((70, 70), (70, 1)), max_cells=70 * 70)
    assert "showing" not in full and full.count("\n") > 140


def test_clip_keeps_the_short_side():
    c = budget.clip(2, 100000, 4096)
    assert (c.rows, c.cols) == (2, 2048)
    c = budget.clip(100000, 3, 4096)
    assert (c.rows, c.cols, c.clipped) == (1365, 3, True)
    c = budget.clip(8, 8, 4096)
    assert (c.rows, c.cols, c.clipped, c.note()) == (8, 8, False, "")
    with pytest.raises(LayoutError, match="positive"):
        budget.clip(8, 8, 0)


def test_analyses_refuse_past_the_element_budget():
    big = Layout((4096, 4096), (4096, 1))
    with pytest.raises(LayoutError, match=r"has 16777216 elements, more than the budget of 1048576.*max_elements="):
        bank_conflicts(big, "ldmatrix_x4", "bf16")
    with pytest.raises(LayoutError, match="budget"):
        coalescing(big, "bf16", "vec128")
    assert bank_conflicts(Layout((64, 64), (64, 1)), "vec128", "bf16", max_elements=4096).conflict_free
    with pytest.raises(LayoutError, match="budget of 100"):
        bank_conflicts(Layout((64, 64), (64, 1)), "vec128", "bf16", max_elements=100)
    swizzled = ComposedLayout(Swizzle(3, 4, 3), 0, big)
    with pytest.raises(LayoutError, match="budget"):
        vector_width(swizzled, "bf16")
    with pytest.raises(LayoutError, match="cosize"):
        swizzled.cosize()


def test_plain_vector_width_is_computed_at_any_size(monkeypatch):
    calls = _counting_calls(monkeypatch)
    assert vector_width(HUGE, "bf16").elements == 8
    assert vector_width(Layout((100000, 100000), (100000, 1)), "f32").elements == 4
    assert vector_width(Layout((6, 100000), (1, 8)), "bf16").elements == 2
    assert calls[0] < 10_000  # from the strides, not by enumerating


@given(layouts(max_stride=12))
def test_plain_vector_width_matches_enumeration(layout):
    for limit in (1, 2, 8):
        assert _plain_vector(layout, limit) == _enumerated_vector(layout, 16, "elements", limit, 1 << 20)


@given(edge_layouts())
def test_plain_vector_width_matches_enumeration_at_the_edges(layout):
    assert _plain_vector(layout, 16) == _enumerated_vector(layout, 8, "elements", 16, 1 << 20)
