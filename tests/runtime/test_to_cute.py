"""to_cute(L) evaluates equal to L at every index, inside a @cute.jit trace."""

import pytest

pytestmark = pytest.mark.compile

cute = pytest.importorskip("cutlass.cute")

from cute_kernels.layouts.composed import ComposedLayout  # noqa: E402
from cute_kernels.layouts.layout import Layout  # noqa: E402
from cute_kernels.layouts.swizzle import Swizzle  # noqa: E402
from cute_kernels.runtime import to_cute  # noqa: E402

LAYOUTS = [
    Layout(8, 1),
    Layout((4, 8), (8, 1)),
    Layout((4, 8), (1, 5)),
    Layout(((2, 4), (3, 2)), ((1, 6), (2, 24))),
    Layout((2, 3, 4), (0, 1, 3)),  # a broadcast (stride 0) mode
    Layout(((2, 2), 2, (1, 3)), ((4, 1), 16, (7, 32))),
]

COMPOSED = [
    ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1))),  # the 128B smem swizzle atom
    ComposedLayout(Swizzle(2, 3, 3), 0, Layout((16, 32), (32, 1))),
    ComposedLayout(Swizzle(1, 2, 3), 5, Layout((4, 8), (1, 4))),  # a non-zero offset
    ComposedLayout(Swizzle(2, 0, -2), 0, Layout(16, 1)),  # a negative shift
]

SWIZZLES = [Swizzle(3, 4, 3), Swizzle(2, 1, 3), Swizzle(1, 0, -1)]


def _size(layout) -> int:
    return layout.size() if callable(getattr(layout, "size", None)) else layout.size


def _evaluate_in_jit(objects, indices_per_object):
    """[[to_cute(obj)(i) for i in indices] for obj], computed while tracing a jit function."""
    results = []

    @cute.jit
    def trace():
        for obj, indices in zip(objects, indices_per_object):
            converted = to_cute(obj)
            results.append([int(converted(i)) for i in indices])

    trace()
    return results


def test_layouts_and_composed_layouts_agree_everywhere():
    objects = LAYOUTS + COMPOSED
    indices = [range(_size(o)) for o in objects]
    got = _evaluate_in_jit(objects, indices)
    for obj, idx, values in zip(objects, indices, got):
        assert values == [obj(i) for i in idx], f"to_cute({obj!r}) differs"


def test_swizzles_agree_on_their_block():
    indices = [range(sw.size()) for sw in SWIZZLES]
    results = []

    @cute.jit
    def trace():
        for sw, idx in zip(SWIZZLES, indices):
            layout = cute.make_composed_layout(to_cute(sw), 0, cute.make_layout(len(idx)))
            results.append([int(layout(i)) for i in idx])

    trace()
    for sw, idx, values in zip(SWIZZLES, indices, results):
        assert values == [sw(i) for i in idx], f"to_cute({sw!r}) differs"


def test_structure_is_preserved():
    captured = {}

    @cute.jit
    def trace():
        layout = to_cute(LAYOUTS[3])
        captured["shape"] = layout.shape
        captured["stride"] = layout.stride

    trace()
    assert captured["shape"] == LAYOUTS[3].shape
    assert captured["stride"] == LAYOUTS[3].stride


def test_rejects_what_it_cannot_convert():
    with pytest.raises(TypeError, match="Layout"):
        to_cute((4, 8))


# ---- property: random nested layouts, with and without a swizzle ---------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def nested_layouts(draw, max_size=256):
    """A Layout with up to 4 modes, some nested, of size <= max_size, strides in [0, 40]."""
    modes = draw(st.integers(1, 4))
    shape, stride, size = [], [], 1
    for _ in range(modes):
        if draw(st.booleans()):
            sub = draw(st.lists(st.integers(1, 4), min_size=2, max_size=3))
            sub_size = 1
            for s in sub:
                sub_size *= s
            if size * sub_size > max_size:
                continue
            size *= sub_size
            shape.append(tuple(sub))
            stride.append(tuple(draw(st.integers(0, 40)) for _ in sub))
        else:
            extent = draw(st.integers(1, 8))
            if size * extent > max_size:
                continue
            size *= extent
            shape.append(extent)
            stride.append(draw(st.integers(0, 40)))
    if not shape:
        return Layout(1, 0)
    if len(shape) == 1:
        return Layout(shape[0], stride[0])
    return Layout(tuple(shape), tuple(stride))


@settings(max_examples=40, deadline=None)
@given(layout=nested_layouts(), swizzle=st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(3, 4))))
def test_random_layouts_agree(layout, swizzle):
    obj = layout if swizzle is None else ComposedLayout(Swizzle(*swizzle), 0, layout)
    (values,) = _evaluate_in_jit([obj], [range(_size(obj))])
    assert values == [obj(i) for i in range(_size(obj))]
