"""Divides: split a layout into tiles (given by a tiler) and the layout of those tiles."""

from __future__ import annotations

from typing import Any

from .coalesce import coalesce
from .complement import complement
from .composition import composition
from .errors import LayoutError
from .int_tuple import is_int, is_tuple
from .layout import Layout, make_layout
from .semantics import current_semantics, with_semantics
from .trace import note, tracing

__all__ = ["logical_divide", "zipped_divide", "tiled_divide", "flat_divide", "zip2_by", "tile_unzip"]


def _modes(layout: Layout) -> list[Layout]:
    return list(layout) if is_tuple(layout.shape) else [layout]


def _by_mode(op, layout: Layout, tiler: tuple) -> Layout:
    """Apply ``op`` to the modes that ``tiler`` names; the modes beyond it pass through (CuTe's transform_layout)."""
    modes = _modes(layout)
    if len(tiler) > len(modes):
        raise LayoutError(f"{op.__name__}: tiler {tiler} has more modes than {layout}")
    return make_layout(*(op(m, t) for m, t in zip(modes, tiler)), *modes[len(tiler):])


def _composed(layout: Any, op, tiler: Any) -> Any | None:
    from .composed import ComposedLayout

    if isinstance(layout, ComposedLayout):
        return layout.with_inner(op(layout.inner, tiler))
    return None


@with_semantics
def logical_divide(layout: Any, tiler: Any) -> Any:
    """CuTe's ``logical_divide``: ``composition(layout, make_layout(tiler, complement(tiler, shape(coalesce(layout)))))``.

    For a layout tiler the result is rank 2, ``(tile, rest)``: mode 0 enumerates the elements of
    one tile (``layout o tiler``), mode 1 the tiles. A tuple tiler divides mode by mode
    (``None`` keeps a mode; an int ``n`` means ``n:1``); modes beyond the tiler pass through.
    A :class:`ComposedLayout` divides its inner layout.

    Post-conditions: ``size(result) == size(layout)`` when the tiler's complement is exact
    (``size(tiler)`` divides ``size(layout)``); ``result[0]`` computes ``composition(layout, tiler)``;
    as a function of the index, ``result`` is ``layout`` composed with a bijection of its domain.

    ``semantics`` (``"dsl"`` default, ``"cpp"`` the same rule, or ``"pycute"``; see
    :mod:`~cute_kernels.layouts.semantics`) matters where ``make_layout(tiler, complement)``
    reaches past ``size(layout)`` (a tiler that does not divide the layout): the layout extends by
    :func:`~cute_kernels.layouts.composition.composition`'s rule, and under ``"pycute"`` the
    complement is taken to ``size(layout)`` instead of ``shape(coalesce(layout))``.
    """
    composed = _composed(layout, logical_divide, tiler)
    if composed is not None:
        return composed
    if not isinstance(layout, Layout):
        raise LayoutError(f"logical_divide: expected a Layout, got {type(layout).__name__}")
    if tiler is None:
        return layout
    if is_tuple(tiler):
        return _by_mode(logical_divide, layout, tiler)
    if is_int(tiler):
        tiler = Layout(tiler)
    if not isinstance(tiler, Layout):
        raise LayoutError(f"logical_divide: tiler must be a Layout, int, None or tuple, got {type(tiler).__name__}")
    # pycute completes the tiler to size(layout); CuTe (C++ and the DSL) to the coalesced shape.
    cotarget = layout.size() if current_semantics() == "pycute" else coalesce(layout).shape
    rest = complement(tiler, cotarget)
    if tracing():
        note("tile", f"the tiler {tiler} is completed by its complement to {cotarget}, {rest}: the divide is "
             f"{layout} o {make_layout(tiler, rest)} (mode 0 one tile, mode 1 the tiles)", tiler=tiler, rest=rest)
    return composition(layout, make_layout(tiler, rest))


def zip2_by(t: Any, guide: Any) -> Any:
    """CuTe's ``zip2_by``: gather the rank-2 ``(tile, rest)`` pairs found at the leaves of ``guide``.

    ``zip2_by(((a, x), (b, y), z), (A, B)) == ((a, b), (x, y, z))``.
    """
    if is_tuple(guide):
        if not is_tuple(t) or len(t) < len(guide):
            raise LayoutError(f"zip2_by: {t} does not follow the tiler profile {guide}")
        split = [zip2_by(x, g) for x, g in zip(t, guide)]
        return tuple(s[0] for s in split), tuple(s[1] for s in split) + tuple(t[len(guide):])
    if not is_tuple(t) or len(t) != 2:
        raise LayoutError(f"zip2_by: expected a rank-2 (tile, rest) mode, got {t}")
    return t


def tile_unzip(layout: Layout, tiler: Any) -> Layout:
    """Rearrange a by-mode divide/product ``((t0, r0), (t1, r1), ...)`` into ``((t0, t1, ...), (r0, r1, ...))``."""
    if not is_tuple(tiler):
        return layout
    return Layout(zip2_by(layout.shape, tiler), zip2_by(layout.stride, tiler))


@with_semantics
def zipped_divide(layout: Any, tiler: Any) -> Any:
    """CuTe's ``zipped_divide``: :func:`logical_divide`, then gather ``((tile modes...), (rest modes...))``.

    Post-conditions: rank 2; ``result[0]`` is the tile (``composition(layout, tiler)`` by mode);
    the same function of the index as ``logical_divide(layout, tiler)`` up to reordering modes.
    ``semantics``: as for :func:`logical_divide` (a tiler reaching past the layout extends it by
    the chosen rule).
    """
    composed = _composed(layout, zipped_divide, tiler)
    if composed is not None:
        return composed
    return tile_unzip(logical_divide(layout, tiler), tiler)


def _unpack(layout: Layout, first: bool, second: bool) -> Layout:
    """``layout(_, repeat<R1>(_))`` and friends: splice the sub-modes of mode 0 and/or 1 into the top level."""
    modes = []
    for k, flag in ((0, first), (1, second)):
        m = layout[k]
        if flag and is_tuple(m.shape):
            modes.extend(m)
        else:
            modes.append(m)
    return make_layout(*modes)


@with_semantics
def tiled_divide(layout: Any, tiler: Any) -> Any:
    """CuTe's ``tiled_divide``: ``zipped_divide`` with the rest modes unpacked: ``((tile...), r0, r1, ...)``.

    Post-conditions: ``result[0] == zipped_divide(layout, tiler)[0]``; the same function of the index
    as the zipped divide; ``rank(result) == 1 + rank(zipped[1])``. ``semantics``: as for
    :func:`logical_divide`.
    """
    composed = _composed(layout, tiled_divide, tiler)
    if composed is not None:
        return composed
    return _unpack(zipped_divide(layout, tiler), False, True)


@with_semantics
def flat_divide(layout: Any, tiler: Any) -> Any:
    """CuTe's ``flat_divide``: ``zipped_divide`` with both modes unpacked: ``(t0, t1, ..., r0, r1, ...)``.

    Post-conditions: the same function of the index as the zipped divide;
    ``rank(result) == rank(zipped[0]) + rank(zipped[1])``. ``semantics``: as for :func:`logical_divide`.
    """
    composed = _composed(layout, flat_divide, tiler)
    if composed is not None:
        return composed
    return _unpack(zipped_divide(layout, tiler), True, True)
