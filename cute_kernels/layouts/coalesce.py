"""coalesce and filter: simplify a layout without changing the function it computes."""

from __future__ import annotations

from typing import Any

from .errors import LayoutError
from .int_tuple import IntTuple, flatten, is_tuple
from .layout import Layout, make_layout

__all__ = ["coalesce", "filter", "filter_zeros"]


def _bw_coalesce(shapes: tuple, strides: tuple, new_shape: list, new_stride: list) -> Layout:
    """CuTe's back-to-front merge of flat modes into ``new_shape:new_stride`` (lists, front first).

    Per mode, from the back: a size-1 mode is dropped; a size-1 front is replaced; a mode with
    ``s * d == front stride`` merges into the front (``s * front_shape : d``); otherwise it is
    prepended.
    """
    for s, d in zip(reversed(shapes), reversed(strides)):
        if s == 1:
            continue
        if new_shape[0] == 1:
            new_shape[0], new_stride[0] = s, d
        elif s * d == new_stride[0]:
            new_shape[0], new_stride[0] = s * new_shape[0], d
        else:
            new_shape.insert(0, s)
            new_stride.insert(0, d)
    if len(new_shape) == 1:
        if new_shape[0] == 1:
            return Layout(1, 0)
        return Layout(new_shape[0], new_stride[0])
    return Layout(tuple(new_shape), tuple(new_stride))


def _by_profile(op, layout: Layout, profile: IntTuple) -> Layout:
    """Apply ``op(mode, sub_profile)`` at the modes of a tuple profile; extra modes pass through."""
    modes = list(layout) if is_tuple(layout.shape) else [layout]
    if len(profile) > len(modes):
        raise LayoutError(f"profile {profile} has more modes than layout {layout}")
    out = [op(m, p) for m, p in zip(modes, profile)] + modes[len(profile):]
    return make_layout(*out)


def coalesce(layout: Layout, profile: IntTuple | None = None) -> Layout:
    """Flatten and merge modes while preserving the function on ``[0, size)`` (CuTe's ``coalesce``).

    Adjacent flat modes ``s0:d0, s1:d1`` merge into ``s0*s1:d0`` when ``d1 == s0*d0``; size-1 modes
    vanish. With a tuple ``profile``, mode ``i`` is coalesced by ``profile[i]`` and the result keeps
    the top-level modes of the profile (an int in the profile coalesces that whole mode).

    Post-conditions: ``size(result) == size(layout)``; ``depth(result) <= 1`` (per profile mode);
    ``result(i) == layout(i)`` for all ``0 <= i < size(layout)``.
    """
    if not isinstance(layout, Layout):
        from .composed import ComposedLayout

        if isinstance(layout, ComposedLayout):
            return layout.with_inner(coalesce(layout.inner, profile))
        raise LayoutError(f"coalesce: expected a Layout, got {type(layout).__name__}")
    if profile is not None and is_tuple(profile):
        return _by_profile(coalesce, layout, profile)
    shapes, strides = flatten(layout.shape), flatten(layout.stride)
    if len(shapes) == 0:
        return Layout(1, 0)
    return _bw_coalesce(shapes[:-1], strides[:-1], [shapes[-1]], [strides[-1]])


def coalesce_x(layout: Layout, profile: Any = None) -> Layout:
    """Like :func:`coalesce`, but also preserves the function beyond the domain (CuTe's ``detail::coalesce_x``).

    A trailing size-1 mode is kept as a ``2:d`` mode so that ``result(i) == layout(i)`` for all
    ``i >= 0``, which is what composition needs when its right operand reaches past ``size(layout)``.
    """
    if profile is not None and is_tuple(profile):
        return _by_profile(coalesce_x, layout, profile)
    shapes, strides = flatten(layout.shape), flatten(layout.stride)
    if len(shapes) == 0:
        return Layout(1, 0)
    last = 2 if shapes[-1] == 1 else shapes[-1]
    return _bw_coalesce(shapes[:-1], strides[:-1], [last], [strides[-1]])


def _zero_shapes(stride: Any, shape: Any) -> Any:
    if is_tuple(shape):
        return tuple(_zero_shapes(d, s) for d, s in zip(stride, shape))
    return 1 if (stride == 0 or stride is None) else shape


def filter_zeros(layout: Layout, profile: IntTuple | None = None) -> Layout:
    """Replace the shape of every stride-0 mode by 1 (or, with ``profile``, every mode where the profile is 0).

    Post-condition: ``result(c) == layout(c)`` wherever ``c`` is 0 along the replaced modes.
    """
    key = layout.stride if profile is None else profile
    return Layout(_zero_shapes(key, layout.shape), layout.stride)


def filter(layout: Layout, profile: IntTuple | None = None) -> Layout:
    """Remove stride-0 and size-1 modes, then coalesce (CuTe's ``filter``); ``1:0`` if nothing is left.

    With a tuple ``profile`` it applies mode by mode, like :func:`coalesce`.
    Post-conditions: ``depth(result) <= 1``; the image is unchanged: ``{result(i)} == {layout(j)}``;
    ``result`` is injective when ``layout`` restricted to its non-zero-stride modes is.
    """
    if not isinstance(layout, Layout):
        raise LayoutError(f"filter: expected a Layout, got {type(layout).__name__}")
    if profile is not None and is_tuple(profile):
        return _by_profile(filter, layout, profile)
    return coalesce(filter_zeros(layout))
