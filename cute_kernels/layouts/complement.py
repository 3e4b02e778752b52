"""complement: the layout that fills in the offsets a layout does not reach, in order."""

from __future__ import annotations

from typing import Any

from .coalesce import coalesce, filter
from .errors import LayoutError
from .int_tuple import ceil_div, flatten, is_int, is_tuple
from .layout import Layout
from .trace import note, tracing

__all__ = ["complement"]


def _ceil_div_shape(a: Any, b: int) -> int:
    """CuTe's ``ceil_div(shape, int)`` followed by ``coalesce``: modes absorb ``b`` from the left."""
    if is_tuple(a):
        total = 1
        for x in flatten(a):
            total *= ceil_div(x, b)
            b = ceil_div(b, x)
        return total
    return ceil_div(a, b)


def complement(layout: Layout, cotarget: Any = None) -> Layout:
    """CuTe's ``complement(layout, cotarget)``: an ordered layout of the offsets ``layout`` skips.

    ``cotarget`` (an int or a shape; default ``cosize(layout)``) is the codomain to cover.
    Definition: with the non-trivial modes ``s_i:d_i`` of ``filter(layout)`` sorted by stride,
    the result is ``(d_0, d_1/(s_0 d_0), ..., ceil(cotarget/(s_n d_n))) : (1, s_0 d_0, ..., s_n d_n)``,
    coalesced.

    Post-conditions: ``result`` is ordered (``result(i-1) < result(i)``); disjoint from ``layout``
    (``result(i) != layout(j)`` unless both are 0); ``make_layout(layout, result)`` is injective and
    its image covers ``[0, cotarget)`` when ``layout`` is injective.

    Admissibility: ``layout`` must be injective on its non-zero-stride modes with non-negative
    strides, each stride divisible by the extent of the modes below it; otherwise :class:`LayoutError`.
    """
    if not isinstance(layout, Layout):
        if is_int(layout) or is_tuple(layout):
            layout = Layout(layout)
        else:
            raise LayoutError(f"complement: expected a Layout, got {type(layout).__name__}")
    flat = filter(layout)
    if cotarget is None:
        cotarget = flat.cosize()
    elif isinstance(cotarget, Layout):
        cotarget = cotarget.shape
    shapes, strides = flatten(flat.shape), flatten(flat.stride)
    if any(not is_int(d) for d in strides):
        raise LayoutError(f"complement: {layout} has non-integer strides")
    if any(d < 0 for d in strides):
        raise LayoutError(f"complement: {layout} has a negative stride; complement needs non-negative strides")
    if tracing():
        note("filter", f"the modes of {layout} that reach offsets (filter: no size-1 or stride-0 modes), by stride: "
             + ", ".join(f"{s}:{d}" for d, s in sorted(zip(strides, shapes))) + f"; the codomain to cover is {cotarget}",
             layout=layout, modes=sorted(zip(strides, shapes)), cotarget=cotarget)
    if strides == (0,):
        if tracing():
            note("rest", f"{layout} reaches only offset 0: the complement is all of {cotarget}")
        return Layout(_ceil_div_shape(cotarget, 1))

    result_shape: list[int] = []
    result_stride: list[int] = [1]
    for d, s in sorted(zip(strides, shapes), key=lambda ds: ds[0]):
        current = result_stride[-1]
        if d < current:
            if tracing():
                note("fail", f"mode {s}:{d} starts inside the {current} offsets the smaller modes already span: "
                     f"{layout} is not injective, and its complement is undefined", mode=(s, d))
            raise LayoutError(f"complement: {layout} is not injective (stride {d} overlaps the modes below it, extent {current})")
        if d % current != 0:
            if tracing():
                note("fail", f"mode {s}:{d}: its stride is not a multiple of {current}, the extent of the modes below it, "
                     "so the gap before it is not a whole number of copies", mode=(s, d))
            raise LayoutError(
                f"complement: stride divisibility fails for {layout}, stride {d} is not a multiple of {current}, "
                "the extent of the modes below it"
            )
        if tracing():
            note("gap", f"mode {s}:{d} starts where the smaller modes end ({current}): no gap" if d == current else
                 f"below mode {s}:{d} the smaller modes span {current} offset(s): the complement fills the gap "
                 f"with {d // current}:{current}", mode=(s, d), gap=(d // current, current))
        result_shape.append(d // current)
        result_stride.append(d * s)
    rest = _ceil_div_shape(cotarget, result_stride[-1])
    if tracing():
        note("rest", f"above everything (extent {result_stride[-1]}) the complement repeats up to the codomain {cotarget}: "
             f"{rest}:{result_stride[-1]}", rest=(rest, result_stride[-1]))
    result_shape.append(rest)
    return coalesce(Layout(tuple(result_shape), tuple(result_stride)))
