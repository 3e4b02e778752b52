"""Inverses and kernels of layouts: right_inverse, left_inverse, max_common_*, nullspace."""

from __future__ import annotations

from typing import Any

from .coalesce import coalesce
from .composition import InexactCompositionError, composition
from .errors import LayoutError
from .int_tuple import flatten, is_int, is_tuple, prefix_product, to_tuple
from .layout import Layout

__all__ = ["right_inverse", "left_inverse", "max_common_layout", "max_common_vector", "nullspace"]


def _coalesced_modes(layout: Layout) -> tuple[tuple, tuple, tuple]:
    flat = coalesce(layout)
    shapes, strides = to_tuple(flat.shape), to_tuple(flat.stride)
    if any(not is_int(d) for d in strides):
        raise LayoutError(f"{layout} has non-integer strides; inverses need integer strides")
    prefix = (1,)
    for s in shapes:
        prefix += (prefix[-1] * s,)
    return shapes, strides, prefix


def right_inverse(layout: Any) -> Any:
    """CuTe's ``right_inverse``: the largest compact ``R`` with ``layout(R(i)) == i`` for ``i < size(R)``.

    Definition: on ``coalesce(layout)``, take modes in increasing stride order while each stride
    equals the extent reached so far (1, then ``s_0 d_0``, ...); ``R`` maps the ``i``-th offset back to
    its index. Modes that cannot continue the contiguous run are skipped, as in CuTe.
    Post-conditions: ``layout(R(i)) == i`` for all ``0 <= i < size(R)``; ``composition(layout, R)``
    computes the identity ``size(R):1``. For a :class:`ComposedLayout` ``sw o off o L`` it returns
    ``R_L o -off o sw`` (CuTe's pass-through of the swizzle, which is its own inverse).
    """
    from .composed import ComposedLayout
    from .swizzle import Swizzle

    if isinstance(layout, Swizzle):
        return layout
    if isinstance(layout, ComposedLayout):
        return ComposedLayout(right_inverse(layout.inner), -layout.offset, right_inverse(layout.outer))
    if layout is None:
        return None
    shapes, strides, prefix = _coalesced_modes(layout)
    result_shape, result_stride, current = [1], [0], 1
    for i in sorted(range(len(strides)), key=lambda k: strides[k]):
        if strides[i] == current:
            result_shape.append(shapes[i])
            result_stride.append(prefix[i])
            current = shapes[i] * strides[i]
    return coalesce(Layout(tuple(result_shape), tuple(result_stride)))


def left_inverse(layout: Any) -> Any:
    """CuTe's ``left_inverse`` (a quasi-inverse): ``L`` with ``layout(L(layout(i))) == layout(i)``.

    Post-condition: when ``layout`` is injective, ``L(layout(i)) == i`` for all ``i < size(layout)``, i.e.
    ``composition(L, layout)`` is the identity on the domain. Definition: on ``coalesce(layout)``,
    modes sorted by stride; each non-zero stride must be divisible by the extent of the modes
    below it (the left-inverse divisibility condition; :class:`LayoutError` otherwise).
    For a :class:`ComposedLayout` ``sw o off o L`` it returns ``L⁻¹ o -off o sw``.
    A layout whose strides are all 0 gets ``1:0``, as the DSL gives (CuTe C++ returns its last
    mode with stride 0; both map the only offset, 0, back to index 0).
    """
    from .composed import ComposedLayout
    from .swizzle import Swizzle

    if isinstance(layout, Swizzle):
        return layout
    if isinstance(layout, ComposedLayout):
        return ComposedLayout(left_inverse(layout.inner), -layout.offset, left_inverse(layout.outer))
    if layout is None:
        return None
    shapes, strides, prefix = _coalesced_modes(layout)
    if any(d < 0 for d in strides):
        raise LayoutError(f"left_inverse: {layout} has a negative stride; the left inverse needs non-negative strides")
    if all(d == 0 for d in strides):
        # A constant layout (image {0}): the DSL 4.8.1 returns 1:0; CuTe C++ returns the last
        # mode's shape with stride 0 (3:0 for 3:0). Both map 0 back to 0; we follow the DSL.
        return Layout(1, 0)
    order = sorted(range(len(strides)), key=lambda k: strides[k])
    result_shape: list[int] = []
    result_stride: list[int] = [0]
    extent = 1
    for i in order:
        d = strides[i]
        if d == 0:
            continue
        if d % extent != 0:
            raise LayoutError(
                f"left_inverse: divisibility condition fails for {layout}, stride {d} is not a multiple of "
                f"{extent}, the extent of the modes below it"
            )
        result_shape.append(d // extent)
        result_stride.append(prefix[i])
        extent *= d // extent
    result_shape.append(shapes[order[-1]])
    return coalesce(Layout(tuple(result_shape), tuple(result_stride)))


def max_common_layout(a: Layout, b: Layout) -> Layout:
    """CuTe's ``max_common_layout``: the largest contiguous layout ``R`` on which ``a`` and ``b`` agree.

    Post-condition: ``a(R(i)) == i`` and ``b(R(i)) == i`` for all ``0 <= i < size(R)``; ``1:0`` if
    even element 0 is not shared with stride 1.
    """
    inv_b = right_inverse(b)
    common = _common(a, inv_b)
    if common[0].stride == 1:
        return composition(inv_b, common[0])
    return Layout(1, 0)


def max_common_vector(a: Layout, b: Layout) -> int:
    """CuTe's ``max_common_vector``: the largest ``N`` such that ``a`` and ``b`` map the first ``N``
    indices of ``right_inverse(b)`` to the same contiguous offsets ``0..N-1`` (at least 1).

    This is the widest vector that can be copied between tensors laid out as ``a`` and ``b``.
    Post-condition: ``N == size(max_common_layout(a, b))`` (or 1), and for ``R = right_inverse(b)``,
    ``a(R(i)) == b(R(i)) == i`` for all ``i < N``.
    """
    common = _common(a, right_inverse(b))
    return common[0].shape if common[0].stride == 1 else 1


def _common(a: Layout, inv_b: Layout) -> Layout:
    """``coalesce(a o inv_b)``; where that composition is no layout, its leading identity run."""
    try:
        return coalesce(composition(a, inv_b))
    except InexactCompositionError:
        pass  # CuTe computes a (non-)layout here whose leading mode is still right; we find that mode directly
    # Only the leading stride-1 run matters: find where a(inv_b(i)) == i stops, on inv_b's mode boundaries.
    n = 1
    for mode in (inv_b if is_tuple(inv_b.shape) else [inv_b]):
        m = n * mode.size()
        if any(a(inv_b(i)) != i for i in range(n, m)):
            break
        n = m
    return Layout(n, 1) if n > 1 else Layout(1, 0)


def nullspace(layout: Layout) -> Layout:
    """CuTe's ``nullspace``: the layout over the stride-0 leaves of ``layout``, in index space.

    Post-conditions: ``layout(R(i)) == layout(0)`` for all ``i < size(R)`` (for index-space
    layouts: ``== 0``); ``size(R) == size(layout) // size(filter(layout))``; ``1:0`` when no stride is 0.
    """
    shapes, strides = flatten(layout.shape), flatten(layout.stride)
    compact = flatten(prefix_product(layout.shape)) if is_tuple(layout.shape) else (1,)
    keep = [i for i, d in enumerate(strides) if is_int(d) and d == 0]
    if not keep:
        return Layout(1, 0)
    if len(keep) == 1:
        return Layout(shapes[keep[0]], compact[keep[0]])
    return Layout(tuple(shapes[i] for i in keep), tuple(compact[i] for i in keep))

