"""composition: ``R = A o B``, the layout with ``R(c) == A(B(c))`` on the domain of ``B``."""

from __future__ import annotations

from math import gcd
from typing import Any

from .basis import ScaledBasis
from .coalesce import coalesce, coalesce_x
from .errors import LayoutError
from .int_tuple import ceil_div, flatten, is_int, is_tuple
from .layout import Layout, make_layout
from .semantics import current_semantics, with_semantics
from .trace import note, suspended, tracing

__all__ = ["composition", "with_shape", "extended_lhs"]


_VERIFY_LIMIT = 1 << 16  # largest right operand checked element by element when the quick checks fail


class InexactCompositionError(LayoutError):
    """A composition CuTe would carry out, but whose result would not compute ``lhs(rhs(c))``.

    Raised where CuTe's weak divisibility check passes (a stride smaller than the mode it lands
    in) or where the modes of the right operand overlap in the left operand's coordinates, and
    CuTe's result, evaluated element by element, is not ``lhs(rhs(c))``.
    """


def _basis_get(basis: ScaledBasis, t: Any) -> Any:
    path = basis.mode if is_tuple(basis.mode) else (basis.mode,)
    for k in path:
        if not is_tuple(t) or k >= len(t):
            raise LayoutError(f"composition: basis stride {basis} selects a mode that {t} does not have")
        t = t[k]
    return t


def _compose(lhs_shape: Any, lhs_stride: Any, rhs_shape: Any, rhs_stride: Any, lhs: Layout, rhs: Layout,
             strict: bool = True) -> Layout:
    """CuTe's ``composition_impl`` on a coalesced left operand; raises where divisibility fails.

    ``strict=False`` applies only CuTe's own (weak) checks, reproducing what CuTe computes.
    """
    if is_tuple(rhs_shape):
        # Right-distributivity: A o (B0, B1, ...) == (A o B0, A o B1, ...)
        return make_layout(*(_compose(lhs_shape, lhs_stride, s, d, lhs, rhs, strict) for s, d in zip(rhs_shape, rhs_stride)))
    if isinstance(rhs_stride, ScaledBasis):
        return _compose(
            _basis_get(rhs_stride, lhs_shape), _basis_get(rhs_stride, lhs_stride), rhs_shape, rhs_stride.value, lhs, rhs,
            strict,
        )
    if rhs_stride == 0:
        if tracing():
            note("leaf", f"B's mode {rhs_shape}:0 is a broadcast: it stays {rhs_shape}:0", shape=rhs_shape, stride=0, walk=[])
        return Layout(rhs_shape, 0)
    if not is_tuple(lhs_shape):
        if tracing():
            note("leaf", f"B's mode {rhs_shape}:{rhs_stride} on A's single mode (stride {lhs_stride}): "
                 f"{rhs_shape}:{rhs_stride * lhs_stride}", shape=rhs_shape, stride=rhs_stride,
                 walk=[(0, "last", f"{rhs_shape}:{rhs_stride * lhs_stride}")])
        return Layout(rhs_shape, rhs_stride * lhs_stride)

    if any(is_tuple(x) for x in lhs_shape):
        raise LayoutError(
            f"composition {lhs} o {rhs}: an integer stride of the right operand cannot address a left operand "
            "kept in coordinate modes (the right operand mixes basis and integer strides)"
        )
    result_shape: list[int] = []
    result_stride: list[Any] = []
    rest_shape, rest_stride = rhs_shape, rhs_stride
    walk: list[tuple[int, str]] = []  # (mode of A, what happened there), for explain()
    words: list[str] = []
    for m, (curr_shape, curr_stride) in enumerate(zip(lhs_shape[:-1], lhs_stride[:-1])):
        magnitude = abs(rest_stride)
        # Stride divisibility: the stride must step over whole modes of A, or stay inside one
        # mode that it divides (or that it finishes in: then the rest is consumed here).
        next_shape = ceil_div(curr_shape, magnitude)
        next_stride = ceil_div(magnitude, curr_shape) * (1 if rest_stride > 0 else -1)
        weak_ok = magnitude % curr_shape == 0 or magnitude < curr_shape  # CuTe's own check
        strong_ok = weak_ok and (magnitude % curr_shape == 0 or curr_shape % magnitude == 0 or rest_shape <= next_shape)
        if not (strong_ok or (weak_ok and not strict)):
            # CuTe accepts a stride below the mode's extent without checking divisibility (and is wrong
            # unless the rest ends inside this mode): report whether CuTe itself would have refused.
            error = InexactCompositionError if weak_ok else LayoutError
            if tracing():
                note("fail", f"B's mode {rhs_shape}:{rhs_stride} fails at A's mode {m} ({curr_shape}:{curr_stride}): "
                     f"the stride {magnitude} left to walk neither divides nor is a multiple of {curr_shape}"
                     + (" (CuTe's own check, stride < shape, lets it through, but the result would not be A o B)"
                        if weak_ok else ""), shape=rhs_shape, stride=rhs_stride, walk=walk + [(m, "fail", f"stride {magnitude}?")], mode=m)
            raise error(
                f"composition {lhs} o {rhs}: stride divisibility condition fails, stride {magnitude} "
                f"neither divides nor is divided by shape {curr_shape}"
            )
        if next_shape == 1 or rest_shape == 1:
            if tracing():
                walk.append((m, "skip", f"/{curr_shape}"))
                words.append(f"mode {m} ({curr_shape}:{curr_stride}) is stepped over: stride {magnitude} -> {abs(next_stride)}"
                             if rest_shape > 1 else f"mode {m} ({curr_shape}:{curr_stride}): nothing left to place")
            rest_stride = next_stride
            continue
        new_shape = min(next_shape, rest_shape)
        if rest_shape % new_shape != 0:
            if tracing():
                note("fail", f"B's mode {rhs_shape}:{rhs_stride} fails at A's mode {m} ({curr_shape}:{curr_stride}): "
                     f"it takes {new_shape} elements there, which does not divide the {rest_shape} left to place",
                     shape=rhs_shape, stride=rhs_stride, walk=walk + [(m, "fail", f"{new_shape}|{rest_shape}?")], mode=m)
            raise LayoutError(
                f"composition {lhs} o {rhs}: shape divisibility condition fails, {new_shape} does not divide "
                f"the remaining shape {rest_shape}"
            )
        result_shape.append(new_shape)
        result_stride.append(rest_stride * curr_stride)
        if tracing():
            walk.append((m, "take", f"{new_shape}:{rest_stride * curr_stride}"))
            words.append(f"mode {m} ({curr_shape}:{curr_stride}) gives {new_shape}:{rest_stride * curr_stride} "
                         f"({new_shape} elements at stride {magnitude} within it)")
        rest_shape //= new_shape
        rest_stride = next_stride

    if tracing():
        last = len(lhs_shape) - 1
        tail = (f"; the rest, {rest_shape} element(s), continues A's last mode ({lhs_shape[-1]}:{lhs_stride[-1]}) at stride "
                f"{rest_stride}: {rest_shape}:{rest_stride * lhs_stride[-1]}") if rest_shape > 1 else ""
        note("leaf", f"B's mode {rhs_shape}:{rhs_stride} walks A's modes: " + "; ".join(words or ["(no inner mode)"]) + tail,
             shape=rhs_shape, stride=rhs_stride,
             walk=walk + ([(last, "last", f"{rest_shape}:{rest_stride * lhs_stride[-1]}")] if rest_shape > 1 else []))
    if not result_shape:
        return Layout(rest_shape, rest_stride * lhs_stride[-1])
    if rest_shape == 1:
        if len(result_shape) == 1:
            return Layout(result_shape[0], result_stride[0])
        return Layout(tuple(result_shape), tuple(result_stride))
    return Layout(tuple(result_shape) + (rest_shape,), tuple(result_stride) + (rest_stride * lhs_stride[-1],))


def _check_no_carry(flat: Layout, rhs: Layout, lhs: Layout) -> None:
    """Distributing ``A o (B0, B1, ...)`` mode by mode is exact only if the images of B's leaves add
    without carries in A's (coalesced) coordinates: per mode of A, the largest digits the leaves
    reach must sum below its extent. CuTe leaves this as a precondition; we check it."""
    leaves = [(s, d) for s, d in zip(flatten(rhs.shape), flatten(rhs.stride)) if is_int(d) and d != 0 and s > 1]
    if len(leaves) < 2 or not is_tuple(flat.shape) or any(d < 0 for _, d in leaves):
        return
    extents = flat.shape[:-1]  # the last mode of A is unbounded: it never carries
    below = [1]
    for a in extents:
        below.append(below[-1] * a)
    totals = [0] * len(extents)
    for s, d in leaves:
        for m, a in enumerate(extents):
            if (s - 1) * d < below[m + 1]:  # no wrap-around: the digit grows with j
                totals[m] += (s - 1) * d // below[m]
                continue
            # The digit of j*d in mode m repeats with period below[m+1] / gcd(d, below[m+1]).
            period = below[m + 1] // gcd(d, below[m + 1])
            totals[m] += max(((j * d) // below[m]) % a for j in range(min(s, period)))
    for m, (t, a) in enumerate(zip(totals, extents)):
        if t >= a:
            if tracing():
                note("fail", f"B's modes overlap in A's mode {m} (extent {a}): the largest coordinates they reach there "
                     f"add up to {t}, so the sum carries into the next mode and A o B is not a layout", mode=m,
                     walk=[(m, "fail", f"carry {t}>={a}")])
            raise InexactCompositionError(
                f"composition {lhs} o {rhs}: the modes of the right operand overlap in mode {m} of the left "
                f"(coalesced shape {flat.shape}): their images would carry, so A o B is not a layout"
            )


def _coprofile(stride: Any) -> Any:
    """Zeros congruent with the codomain of a layout of this stride (for basis strides, a tuple)."""
    if is_tuple(stride):
        out: Any = 0
        for d in stride:
            out = _merge_profile(out, _coprofile(d))
        return out
    if isinstance(stride, ScaledBasis):
        path = stride.mode if is_tuple(stride.mode) else (stride.mode,)
        out = 0
        for k in reversed(path):
            out = (0,) * k + (out,)
        return out
    return 0


def _merge_profile(a: Any, b: Any) -> Any:
    if not is_tuple(a):
        return b
    if not is_tuple(b):
        return a
    n = max(len(a), len(b))
    a = a + (0,) * (n - len(a))
    b = b + (0,) * (n - len(b))
    return tuple(_merge_profile(x, y) for x, y in zip(a, b))


def extended_lhs(lhs: Layout, rhs: Layout) -> Layout:
    """The flat form of ``lhs`` that composition walks, extended past ``size(lhs)`` by the rule in
    force (see :mod:`~cute_kernels.layouts.semantics`): ``coalesce_x`` under ``"dsl"`` (the last
    leaf as written continues), ``coalesce`` under ``"pycute"`` (the last non-trivial mode does).

    Post-condition: ``extended_lhs(A, B)(i) == A(i)`` for ``0 <= i < size(A)``.
    """
    if current_semantics() == "pycute":
        return coalesce(lhs, _coprofile(rhs.stride))
    return coalesce_x(lhs, _coprofile(rhs.stride))


@with_semantics
def composition(lhs: Any, rhs: Any, *args: Any) -> Any:
    """Functional composition ``R = lhs o rhs`` (CuTe's ``composition``).

    * ``rhs`` a :class:`Layout`: ``R(c) == lhs(rhs(c))`` for every coordinate ``c`` of ``rhs`` and
      ``compatible(rhs.shape, R.shape)`` (R has rhs's shape, possibly refined).
    * ``rhs`` an int ``n``: composition with ``n:1``, the first ``n`` elements of ``lhs``.
    * ``rhs`` a tuple (a tiler): mode by mode, ``R[i] = composition(lhs[i], rhs[i])``; ``None``
      keeps that mode. As CuTe does, modes of ``lhs`` beyond ``len(rhs)`` are dropped (under
      ``semantics="pycute"`` they are kept, as pycute does).
    * ``semantics``: where ``rhs`` reaches beyond ``size(lhs)``, how ``lhs`` extends: ``"dsl"``
      (default, also CuTe C++): its last leaf as written continues, so ``lhs(i)`` past its size is
      what ``lhs`` computes there; ``"pycute"``: ``coalesce(lhs)`` continues (size-1 modes,
      trailing ones included, do not count). See :mod:`~cute_kernels.layouts.semantics`;
      ``with layout_semantics(...)`` sets it for a block.
    * ``lhs`` a :class:`Swizzle`: a :class:`ComposedLayout` ``lhs o 0 o rhs``; ``composition(f, offset, g)``
      builds ``f o offset o g``.
    * ``lhs`` a :class:`ComposedLayout`: composes its inner layout with ``rhs``.

    Post-conditions: ``compatible(rhs.shape, R.shape)`` and ``R(c) == lhs(rhs(c))`` for every
    coordinate ``c`` of ``rhs`` (CuTe's ``@post`` in layout.hpp), ``lhs`` evaluated past its size
    by the semantics' rule (under ``"pycute"``: ``R(c) == coalesce(lhs)(rhs(c))``).

    Admissibility: each stride of ``rhs`` must step over whole modes of ``lhs`` or divide a mode
    (stride divisibility), and each resulting mode must divide what remains of ``rhs``'s shape
    (shape divisibility); otherwise :class:`LayoutError` names the condition that failed.
    """
    from .composed import ComposedLayout
    from .swizzle import Swizzle

    if args:
        if len(args) != 1:
            raise LayoutError("composition takes (lhs, rhs) or (outer, offset, inner)")
        return ComposedLayout(lhs, rhs, args[0])
    if isinstance(lhs, ComposedLayout):
        return lhs.with_inner(composition(lhs.inner, rhs))
    if isinstance(lhs, Swizzle):
        if isinstance(rhs, Swizzle):
            return lhs.compose(rhs)
        if not isinstance(rhs, (Layout, ComposedLayout)):
            rhs = Layout(rhs) if (is_int(rhs) or is_tuple(rhs)) else rhs
        return ComposedLayout(lhs, 0, rhs)
    if not isinstance(lhs, Layout):
        raise LayoutError(f"composition: left operand must be a Layout, Swizzle or ComposedLayout, got {type(lhs).__name__}")
    if isinstance(rhs, ComposedLayout):
        if isinstance(rhs.outer, Layout):
            return ComposedLayout(composition(lhs, rhs.outer), rhs.offset, rhs.inner)
        return ComposedLayout(lhs, 0, rhs)
    if isinstance(rhs, Swizzle):
        return ComposedLayout(lhs, 0, rhs)
    if rhs is None:
        return lhs
    if isinstance(rhs, Layout):
        flat = extended_lhs(lhs, rhs)
        if tracing():
            note("flatten", f"A = {lhs} is walked in its coalesced form {flat} ({current_semantics()} semantics: past its "
                 f"size A continues {'its last leaf as written' if current_semantics() == 'dsl' else 'coalesce(A)'})",
                 lhs=lhs, flat=flat, rhs=rhs)
        try:
            result = _compose(flat.shape, flat.stride, rhs.shape, rhs.stride, lhs, rhs)
            _check_no_carry(flat, rhs, lhs)
            return result
        except InexactCompositionError:
            # CuTe's own refusal (a plain LayoutError) wins where another mode makes CuTe refuse.
            with suspended():
                cute_result = _compose(flat.shape, flat.stride, rhs.shape, rhs.stride, lhs, rhs, strict=False)
            # Our checks are sufficient, not necessary (a stride-0 mode hides carries, a short rest
            # may not reach the wrap): accept CuTe's answer where it is verifiably the composition.
            n = rhs.size()
            if n <= _VERIFY_LIMIT and all(cute_result(i) == flat._offset(rhs(i)) for i in range(n)):
                if tracing():
                    note("verify", f"CuTe's weak checks accept the pair, and its answer {cute_result} is verified element "
                         f"by element to be A o B", result=cute_result)
                return cute_result
            raise
    if is_int(rhs):
        if rhs < 1:
            raise LayoutError(f"composition: an integer tiler must be positive, got {rhs}")
        return composition(lhs, Layout(rhs))  # n:1 (1:0 for n == 1, as the DSL's make_layout gives)
    if is_tuple(rhs):
        modes = list(lhs) if is_tuple(lhs.shape) else [lhs]
        if len(rhs) > len(modes):
            raise LayoutError(f"composition: tiler {rhs} has more modes than {lhs}")
        kept = modes[len(rhs):] if current_semantics() == "pycute" else []
        return make_layout(*(composition(m, t) for m, t in zip(modes, rhs)), *kept)
    raise LayoutError(f"composition: cannot compose a Layout with {type(rhs).__name__}")


@with_semantics
def with_shape(layout: Any, shape: Any) -> Any:
    """``layout`` viewed through the compact column-major ``shape``: ``composition(layout, Layout(shape))``.

    Requires ``product(shape) == size(layout)`` (a reshape, not a restriction).
    Post-condition: ``result.shape`` is compatible with ``shape`` and ``result(i) == layout(i)``.
    ``semantics`` is accepted as by :func:`composition`; a reshape stays inside the domain, where
    the rules agree.
    """
    from .int_tuple import product

    if product(shape) != layout.size():
        raise LayoutError(f"with_shape: shape {shape} has size {product(shape)}, layout {layout} has size {layout.size()}")
    return composition(layout, Layout(shape))
