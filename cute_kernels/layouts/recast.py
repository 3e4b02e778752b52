"""Recasting: the same bytes seen as wider (upcast) or narrower (downcast) elements."""

from __future__ import annotations

from math import gcd
from typing import Any

from .errors import LayoutError
from .int_tuple import ceil_div, flatten, is_int, is_tuple
from .layout import Layout

__all__ = ["upcast", "downcast", "recast_layout"]


def _map_leaves(f, shape: Any, stride: Any) -> tuple[Any, Any]:
    if is_tuple(shape):
        pairs = [_map_leaves(f, s, d) for s, d in zip(shape, stride)]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    return f(shape, stride)


def upcast(layout: Any, n: int) -> Any:
    """CuTe's ``upcast<N>``: view ``N`` consecutive elements as one.

    Per leaf ``s:d``: stride 0 stays; otherwise ``d`` and ``N`` must divide one another and the
    leaf becomes ``ceil(s / ceil(N/|d|)) : sign(d) * ceil(|d|/N)`` (the stride-1 mode shrinks by
    ``N``, other strides divide by ``N``). Post-condition: for a layout of element offsets whose
    stride-1 mode is divisible by ``N``, ``N * result(c) == layout(c')`` where ``c'`` is the first
    element of each group. Swizzles and composed layouts recast too (``Sw<B,M,S>`` -> ``Sw<B,M-log2 N,S>``).
    """
    from .composed import ComposedLayout
    from .swizzle import Swizzle

    _check_factor(n, "upcast")
    if isinstance(layout, Swizzle):
        log2n = _log2(n, "upcast")
        m = layout.base - log2n
        return Swizzle(layout.bits, m, layout.shift) if m >= 0 else Swizzle(max(layout.bits + m, 0), 0, layout.shift)
    if isinstance(layout, ComposedLayout):
        return ComposedLayout(upcast(layout.outer, n), layout.offset // n, upcast(layout.inner, n))

    def leaf(s: int, d: Any):
        if d == 0:
            return s, d
        if not is_int(d):
            raise LayoutError(f"upcast: {layout} has a non-integer stride {d}")
        if d % n != 0 and n % d != 0:
            raise LayoutError(f"upcast<{n}>: divisibility condition fails for stride {d} of {layout}")
        sign = 1 if d > 0 else -1
        return ceil_div(s, ceil_div(n, abs(d))), sign * ceil_div(abs(d), n)

    return Layout(*_map_leaves(leaf, layout.shape, layout.stride))


def downcast(layout: Any, n: int) -> Any:
    """CuTe's ``downcast<N>``: view each element as ``N`` consecutive narrower ones.

    Per leaf ``s:d``: a stride ``±1`` mode grows to ``s*N``; every other stride is multiplied by ``N``.
    Requires a stride-1 (or -1) mode ("downcast requires adjacent elements") unless the layout
    has a single element (then, as in the CuTe DSL, it is returned with its strides scaled).
    Post-condition: ``upcast(downcast(L, N), N) == L`` for layouts whose stride-1 leaf is unique.
    """
    from .composed import ComposedLayout
    from .swizzle import Swizzle

    _check_factor(n, "downcast")
    if isinstance(layout, Swizzle):
        return Swizzle(layout.bits, layout.base + _log2(n, "downcast"), layout.shift)
    if isinstance(layout, ComposedLayout):
        return ComposedLayout(downcast(layout.outer, n), layout.offset * n, downcast(layout.inner, n))
    if layout.size() > 1 and not any(d in (1, -1) for d in flatten(layout.stride) if is_int(d)):
        raise LayoutError(f"downcast<{n}>: {layout} has no stride-1 mode (downcast requires adjacent elements)")

    def leaf(s: int, d: Any):
        return (s * n, d) if d in (1, -1) else (s, d * n)

    return Layout(*_map_leaves(leaf, layout.shape, layout.stride))


def recast_layout(layout: Any, old_bits: int, new_bits: int) -> Any:
    """CuTe's ``recast_layout<OldType, NewType>`` with element widths in bits.

    With ``new_bits / old_bits = num / den`` in lowest terms: ``den == 1`` upcasts by ``num``,
    ``num == 1`` downcasts by ``den``, otherwise ``downcast(upcast(layout, num), den)``.
    Post-condition: ``recast_layout(recast_layout(L, a, b), b, a) == L`` for a compact ``L`` when
    the widths divide each other and ``L``'s contiguous mode is a multiple of the ratio (and larger
    than it, so that no second mode becomes contiguous).
    """
    for name, v in (("old_bits", old_bits), ("new_bits", new_bits)):
        if not is_int(v) or v < 1:
            raise LayoutError(f"recast_layout: {name} must be a positive int, got {v!r}")
    g = gcd(new_bits, old_bits)
    num, den = new_bits // g, old_bits // g
    if num == 1 and den == 1:
        return layout
    if num == 1:
        return downcast(layout, den)
    if den == 1:
        return upcast(layout, num)
    return downcast(upcast(layout, num), den)


def _check_factor(n: Any, op: str) -> None:
    if not is_int(n) or n < 1:
        raise LayoutError(f"{op}: the factor must be a positive int, got {n!r}")


def _log2(n: int, op: str) -> int:
    if n & (n - 1):
        raise LayoutError(f"{op} of a swizzle: the factor must be a power of two, got {n}")
    return n.bit_length() - 1
