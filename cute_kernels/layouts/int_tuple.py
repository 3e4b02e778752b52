"""Hierarchical integer tuples (CuTe's ``IntTuple``): the shapes, strides and coordinates of layouts.

An int tuple is an ``int`` or a ``tuple`` of int tuples. Every function here recurses on that
structure the way the math is written; none of them mutates its input.

Coordinates are colexicographic (column-major, leftmost mode fastest), as in CuTe.
"""

from __future__ import annotations

from functools import reduce
from typing import Any, Union

from .errors import LayoutError

__all__ = [
    "IntTuple",
    "is_int",
    "is_tuple",
    "flatten",
    "product",
    "inner_product",
    "prefix_product",
    "suffix_product",
    "compact_col_major",
    "compact_row_major",
    "shape_div",
    "shape_mod",
    "ceil_div",
    "crd2idx",
    "idx2crd",
    "crd2crd",
    "rank",
    "depth",
    "congruent",
    "weakly_congruent",
    "compatible",
    "weakly_compatible",
    "elem_scale",
    "tuple_max",
    "has_none",
    "slice_",
    "dice",
    "unflatten",
    "to_tuple",
]

IntTuple = Union[int, tuple]


def is_int(x: Any) -> bool:
    """True for an integer (``bool`` excluded): a leaf of an int tuple."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_tuple(x: Any) -> bool:
    """True for a tuple: an interior node of an int tuple."""
    return isinstance(x, tuple)


def to_tuple(x: IntTuple) -> tuple:
    """``x`` if it is a tuple, else ``(x,)``: view a leaf as a rank-1 tuple."""
    return x if is_tuple(x) else (x,)


def flatten(t: Any) -> tuple:
    """The leaves of ``t`` in order, as a flat tuple. ``flatten(5) == (5,)``."""
    if is_tuple(t):
        return tuple(leaf for child in t for leaf in flatten(child))
    return (t,)


def unflatten(flat: tuple, profile: IntTuple) -> IntTuple:
    """Inverse of :func:`flatten`: reshape the flat tuple ``flat`` into the nesting of ``profile``.

    Post-condition: ``flatten(unflatten(f, p)) == f`` and the result is congruent to ``p``.
    """
    flat = tuple(flat)
    if len(flat) != len(flatten(profile)):
        raise LayoutError(f"unflatten: {len(flat)} leaves do not fit profile {profile}")

    def build(p: IntTuple, pos: int) -> tuple[IntTuple, int]:
        if is_tuple(p):
            out = []
            for child in p:
                sub, pos = build(child, pos)
                out.append(sub)
            return tuple(out), pos
        return flat[pos], pos + 1

    return build(profile, 0)[0]


def rank(t: IntTuple) -> int:
    """Number of top-level modes: ``len(t)`` for a tuple, 1 for an int."""
    return len(t) if is_tuple(t) else 1


def depth(t: IntTuple) -> int:
    """Nesting depth: 0 for an int, 1 + max depth of the children for a tuple."""
    if is_tuple(t):
        return 1 + max((depth(x) for x in t), default=0)
    return 0


def product(t: IntTuple) -> int:
    """Product of all leaves (1 for the empty tuple): the size of a shape."""
    if is_tuple(t):
        return reduce(lambda acc, x: acc * product(x), t, 1)
    return t


def inner_product(a: IntTuple, b: IntTuple):
    """Sum of leafwise products of two congruent int tuples."""
    if is_tuple(a):
        if not is_tuple(b) or len(a) != len(b):
            raise LayoutError(f"inner_product: {a} and {b} are not congruent")
        total = 0
        for x, y in zip(a, b):
            total = total + inner_product(x, y)
        return total
    if is_tuple(b):
        raise LayoutError(f"inner_product: {a} and {b} are not congruent")
    return a * b


def prefix_product(a: IntTuple, init: IntTuple = 1) -> IntTuple:
    """Exclusive prefix product of ``a`` in colex order: CuTe's compact column-major strides.

    ``prefix_product((2, (3, 4))) == (1, (2, 6))``. Post-condition: the result is congruent to ``a``.
    """
    if is_tuple(a):
        if is_tuple(init):
            if len(a) != len(init):
                raise LayoutError(f"prefix_product: {a} and init {init} are not congruent")
            return tuple(prefix_product(x, i) for x, i in zip(a, init))
        out = []
        for v in a:
            out.append(prefix_product(v, init))
            init = init * product(v)
        return tuple(out)
    if is_tuple(init):
        raise LayoutError(f"prefix_product: int {a} with tuple init {init}")
    return init


def compact_col_major(shape: IntTuple, current: int = 1) -> IntTuple:
    """CuTe's ``compact_major<LayoutLeft>``: column-major strides, with stride 0 for every size-1 leaf.

    ``compact_col_major((4, 1, 3)) == (1, 0, 4)``; this is the default stride of ``Layout(shape)``
    (as in CuTe, where a static size-1 mode gets stride ``_0``).
    """
    if is_tuple(shape):
        out = []
        for v in shape:
            out.append(compact_col_major(v, current))
            current = current * product(v)
        return tuple(out)
    return 0 if shape == 1 else current


def compact_row_major(shape: IntTuple, current: int = 1) -> IntTuple:
    """CuTe's ``compact_major<LayoutRight>``: row-major strides (rightmost mode fastest), 0 for size-1 leaves."""
    if is_tuple(shape):
        out = []
        for v in reversed(shape):
            out.append(compact_row_major(v, current))
            current = current * product(v)
        return tuple(reversed(out))
    return 0 if shape == 1 else current


def suffix_product(a: IntTuple, init: IntTuple = 1) -> IntTuple:
    """Exclusive suffix product of ``a`` (rightmost mode fastest): compact row-major strides."""
    if is_tuple(a):
        if is_tuple(init):
            if len(a) != len(init):
                raise LayoutError(f"suffix_product: {a} and init {init} are not congruent")
            return tuple(suffix_product(x, i) for x, i in zip(a, init))
        out = []
        for v in reversed(a):
            out.append(suffix_product(v, init))
            init = init * product(v)
        return tuple(reversed(out))
    if is_tuple(init):
        raise LayoutError(f"suffix_product: int {a} with tuple init {init}")
    return init


def ceil_div(a: int, b: int) -> int:
    """Ceiling of ``a / b`` for positive ``b``."""
    return -(-a // b)


def shape_div(a: IntTuple, b: IntTuple) -> IntTuple:
    """CuTe's ``shape_div``: divide shape ``a`` by ``b``, consuming ``b`` from the left of ``a``.

    For ints, one must divide the other (``a % b == 0 or b % a == 0``); the result is ``a // b``,
    or 1 when ``b`` is the larger. A tuple ``a`` is divided mode by mode, passing on what each mode
    did not absorb: ``shape_div((4, 6), 8) == (1, 3)``.
    """
    if is_tuple(a):
        if is_tuple(b):
            if len(a) != len(b):
                raise LayoutError(f"shape_div: {a} and {b} are not congruent")
            return tuple(shape_div(x, y) for x, y in zip(a, b))
        out = []
        for v in a:
            out.append(shape_div(v, b))
            b = shape_div(b, product(v))
        return tuple(out)
    if is_tuple(b):
        return shape_div(a, product(b))
    if b == 0 or (a % b != 0 and b % a != 0):
        raise LayoutError(f"shape_div: divisibility condition fails, neither of {a} and {b} divides the other")
    return a // b if a % b == 0 else (1 if a * b > 0 else -1)


def shape_mod(a: IntTuple, b: int) -> IntTuple:
    """CuTe's ``shape_mod``: the first ``b`` elements of shape ``a``, consumed from the left.

    ``shape_mod((4, 6), 8) == (4, 2)``. Each int step requires divisibility one way or the other.
    """
    if is_tuple(a):
        out = []
        for v in a:
            out.append(shape_mod(v, b))
            b = shape_div(b, product(v))
        return tuple(out)
    if is_tuple(b):
        return shape_mod(a, product(b))
    if b == 0 or (a % b != 0 and b % a != 0):
        raise LayoutError(f"shape_mod: divisibility condition fails, neither of {a} and {b} divides the other")
    return b if a % b == 0 else a


def idx2crd(idx: IntTuple, shape: IntTuple, stride: IntTuple | None = None) -> IntTuple:
    """The coordinate of index ``idx`` in ``shape``, colexicographic (leftmost mode fastest).

    With ``stride`` given, the coordinate along each leaf is ``(idx // stride) % extent``; by
    default stride is ``prefix_product(shape)``. A tuple ``idx`` is decoded mode by mode.
    Post-condition: the result is congruent to ``shape`` and ``crd2idx(result, shape) == idx``
    for ``0 <= idx < product(shape)``.
    """
    if stride is None:
        stride = prefix_product(shape)
    if is_tuple(idx):
        if not is_tuple(shape) or len(idx) != len(shape):
            raise LayoutError(f"idx2crd: coordinate {idx} is not congruent with shape {shape}")
        return tuple(idx2crd(i, s, d) for i, s, d in zip(idx, shape, stride))
    if is_tuple(shape):
        return tuple(idx2crd(idx, s, d) for s, d in zip(shape, stride))
    return (idx // stride) % shape


def crd2idx(crd: IntTuple | None, shape: IntTuple, stride: IntTuple | None = None):
    """The index of coordinate ``crd`` in ``shape`` with ``stride`` (default column-major).

    ``crd`` may be weakly congruent with ``shape``: an int at a tuple mode is first decoded into
    that mode colexicographically (CuTe's natural coordinates). ``None`` counts as 0.
    Post-condition: ``crd2idx(idx2crd(i, s), s) == i``.
    """
    if stride is None:
        stride = prefix_product(shape)
    if crd is None:
        return 0
    if is_tuple(crd):
        if not is_tuple(shape) or len(crd) != len(shape):
            raise LayoutError(f"crd2idx: coordinate {crd} is not congruent with shape {shape}")
        total = 0
        for c, s, d in zip(crd, shape, stride):
            total = total + crd2idx(c, s, d)
        return total
    if is_tuple(shape):
        if len(shape) == 0:
            return 0
        total = 0
        for s, d in zip(shape[:-1], stride[:-1]):
            extent = product(s)
            total = total + crd2idx(crd % extent, s, d)
            crd = crd // extent
        return total + crd2idx(crd, shape[-1], stride[-1])
    return crd * stride


def crd2crd(crd: IntTuple, dst_shape: IntTuple, src_shape: IntTuple | None = None) -> IntTuple:
    """Transform ``crd`` from ``src_shape`` into the coordinate of the same index in ``dst_shape``."""
    if is_tuple(crd):
        if is_tuple(dst_shape):
            if len(crd) != len(dst_shape):
                raise LayoutError(f"crd2crd: {crd} and {dst_shape} are not congruent")
            return tuple(crd2crd(c, d, s) for c, d, s in zip(crd, dst_shape, src_shape or (None,) * len(crd)))
        if src_shape is None:
            raise LayoutError("crd2crd: src_shape is needed to flatten a tuple coordinate")
        return crd2idx(crd, src_shape)
    if is_tuple(dst_shape):
        return idx2crd(crd, dst_shape)
    return crd


def congruent(a: IntTuple, b: IntTuple) -> bool:
    """True when ``a`` and ``b`` have the same nesting (profile)."""
    if is_tuple(a) and is_tuple(b):
        return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b))
    return not is_tuple(a) and not is_tuple(b)


def weakly_congruent(a: IntTuple, b: IntTuple) -> bool:
    """True when ``a``'s profile is a coarsening of ``b``'s: an int in ``a`` may stand for any subtree of ``b``."""
    if not is_tuple(a):
        return True
    if not is_tuple(b):
        return False
    return len(a) == len(b) and all(weakly_congruent(x, y) for x, y in zip(a, b))


def compatible(a: IntTuple, b: IntTuple) -> bool:
    """CuTe's shape compatibility ``a <= b``: every coordinate of ``a`` is a valid coordinate of ``b``.

    That holds when ``size(a) == size(b)`` and each int of ``a`` stands for a subtree of ``b``
    of the same size (an int ``a`` is compatible with any ``b`` of equal size).
    """
    if is_tuple(a):
        return is_tuple(b) and len(a) == len(b) and all(compatible(x, y) for x, y in zip(a, b))
    return a == product(b)


def weakly_compatible(a: IntTuple, b: IntTuple) -> bool:
    """CuTe's weak compatibility: ``a`` divides ``b`` mode by mode (an int of ``a`` divides the size of the subtree)."""
    if is_tuple(a):
        return is_tuple(b) and len(a) == len(b) and all(weakly_compatible(x, y) for x, y in zip(a, b))
    return product(b) % a == 0


def elem_scale(a: IntTuple, b: IntTuple) -> IntTuple:
    """``a`` scaled elementwise by ``b``; an int ``a`` scales by the size of ``b``."""
    if is_tuple(a):
        if not is_tuple(b) or len(a) != len(b):
            raise LayoutError(f"elem_scale: {a} and {b} are not congruent")
        return tuple(elem_scale(x, y) for x, y in zip(a, b))
    return a * product(b)


def tuple_max(a: IntTuple) -> int:
    """Largest leaf of ``a``."""
    return max(flatten(a))


def has_none(a: Any) -> bool:
    """True when ``a`` contains ``None`` (CuTe's ``_``) anywhere."""
    if is_tuple(a):
        return any(has_none(x) for x in a)
    return a is None


def slice_(crd: Any, trg: Any) -> Any:
    """Keep the parts of ``trg`` where ``crd`` is ``None`` (CuTe's ``slice``); result is flattened one level.

    ``slice_((None, 3), (4, 8)) == (4,)``; ``slice_(None, x) == x``.
    """
    if is_tuple(crd):
        if not is_tuple(trg) or len(crd) != len(trg):
            raise LayoutError(f"slice: coordinate {crd} is not congruent with {trg}")
        out = []
        for c, t in zip(crd, trg):
            if c is None:
                out.append(t)
            elif is_tuple(c):
                out.extend(slice_(c, t))
        return tuple(out)
    return trg if crd is None else ()


def dice(crd: Any, trg: Any) -> Any:
    """Keep the parts of ``trg`` where ``crd`` is an integer (CuTe's ``dice``, complement of slice)."""
    if is_tuple(crd):
        if not is_tuple(trg) or len(crd) != len(trg):
            raise LayoutError(f"dice: coordinate {crd} is not congruent with {trg}")
        out = []
        for c, t in zip(crd, trg):
            if is_int(c):
                out.append(t)
            elif is_tuple(c):
                out.extend(dice(c, t))
        return tuple(out)
    return () if crd is None else trg
