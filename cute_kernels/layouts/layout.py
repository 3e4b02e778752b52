"""The :class:`Layout` (a shape and a stride over hierarchical int tuples) and its core queries.

A layout is a function from coordinates to offsets: coordinate ``c`` (congruent with the shape)
maps to ``sum(c_i * d_i)`` over the leaves. Integers in ``[0, size)`` are coordinates too, decoded
colexicographically, so a layout is also a function from ``[0, size)`` to the integers.
"""

from __future__ import annotations

from typing import Any, Iterator

from . import int_tuple as it
from .basis import ScaledBasis
from .display import Drawable
from .errors import LayoutError, LayoutIndexError, LayoutTypeError
from .int_tuple import IntTuple, flatten, is_int, is_tuple, product

__all__ = [
    "Layout",
    "is_layout",
    "make_layout",
    "size",
    "cosize",
    "rank",
    "depth",
    "shape",
    "stride",
    "get",
    "select",
    "take",
    "append",
    "prepend",
    "replace",
    "group",
    "flatten_layout",
    "make_ordered_layout",
    "make_identity_layout",
    "slice_and_offset",
    "same_function",
]


def _check_shape(s: Any) -> None:
    if is_tuple(s):
        for x in s:
            _check_shape(x)
    elif not is_int(s) or s < 1:
        raise LayoutError(f"shape leaves must be positive ints, got {s!r}")


def _check_stride(d: Any, s: Any) -> None:
    if is_tuple(s):
        if not is_tuple(d) or len(d) != len(s):
            raise LayoutError(f"stride {d!r} is not congruent with shape {s!r}")
        for x, y in zip(d, s):
            _check_stride(x, y)
    elif is_tuple(d):
        raise LayoutError(f"stride {d!r} is not congruent with shape {s!r}")
    elif not (is_int(d) or isinstance(d, ScaledBasis)):
        raise LayoutError(f"stride leaves must be ints or basis elements, got {d!r} for shape {s!r}")


def _freeze(t: Any) -> Any:
    """Lists to tuples, recursively, so that layouts are hashable whatever the caller passed."""
    if isinstance(t, (list, tuple)):
        return tuple(_freeze(x) for x in t)
    return t


def _fmt(t: Any) -> str:
    if is_tuple(t):
        return "(" + ",".join(_fmt(x) for x in t) + ")"
    return str(t)


class Layout(Drawable):
    """``Layout(shape, stride=None)``: CuTe's layout, a function from coordinates to offsets.

    ``shape`` is a positive hierarchical int tuple; ``stride`` is congruent with it and defaults
    to CuTe's compact column-major strides (``prefix_product(shape)``, except that size-1 leaves
    get stride 0, as CuTe's ``make_layout(shape)`` does).

    * ``L(i)`` for an int ``i`` in ``[0, size(L))``: the offset of the ``i``-th colex coordinate.
      Past ``size(L)`` the last leaf continues, as in CuTe (this is how composition extends a
      layout, see :mod:`~cute_kernels.layouts.semantics`); a negative index raises
      :class:`~cute_kernels.layouts.errors.LayoutIndexError` (an ``IndexError``) and a non-integer
      one :class:`~cute_kernels.layouts.errors.LayoutTypeError` (a ``TypeError``).
    * ``L(c)`` / ``L(c0, c1, ...)``: the offset of a coordinate, hierarchical (weakly congruent:
      an int at a tuple mode is decoded colex inside it) or flat (one int per leaf).
    * a coordinate containing ``None`` (CuTe's ``_``) returns the sublayout (``L(None, 3)``);
      :func:`slice_and_offset` gives the offset as well.
    * ``L[i]``: mode ``i`` as a layout. ``len(L)`` is the rank; iteration yields the modes.
    * ``==`` is structural (same shape and stride); see :func:`same_function` for function equality.

    Post-conditions: ``L(c) == crd2idx(c, L.shape, L.stride)`` and ``L(i) == L(idx2crd(i, L.shape))``;
    ``parse_layout(str(L)) == L`` and ``eval(repr(L)) == L``.
    """

    __slots__ = ("shape", "stride")

    def __init__(self, shape: IntTuple, stride: IntTuple | None = None):
        shape = _freeze(shape)
        _check_shape(shape)
        stride = it.compact_col_major(shape) if stride is None else _freeze(stride)
        _check_stride(stride, shape)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "stride", stride)

    def __setattr__(self, name, value):
        raise AttributeError("Layout is immutable")

    # ---- structure -------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.shape == other.shape and self.stride == other.stride

    def __hash__(self) -> int:
        return hash((Layout, self.shape, self.stride))

    def __len__(self) -> int:
        return it.rank(self.shape)

    def __iter__(self) -> Iterator["Layout"]:
        for i in range(len(self)):
            yield self[i]

    def __getitem__(self, i: int) -> "Layout":
        if is_tuple(self.shape):
            try:
                return Layout(self.shape[i], self.stride[i])
            except IndexError:
                raise LayoutError(f"mode {i} out of range for rank-{len(self)} layout {self}") from None
        if i in (0, -1):
            return self
        raise LayoutError(f"mode {i} out of range for rank-1 layout {self}")

    def size(self) -> int:
        return product(self.shape)

    def cosize(self) -> int:
        return cosize(self)

    # ---- evaluation ------------------------------------------------------------------------
    def __call__(self, *args: Any):
        if len(args) == 0:
            raise LayoutError("a layout is called with an index or a coordinate")
        crd = args[0] if len(args) == 1 else tuple(args)
        if type(crd) is not int or crd < 0:
            _check_coordinate(crd, self)
        if it.has_none(crd):
            return slice_and_offset(crd, self)[0]
        return self._offset(crd)

    def _offset(self, crd: Any):
        crd = self._natural(crd)
        return it.crd2idx(crd, self.shape, self.stride)

    def _natural(self, crd: Any) -> Any:
        """Accept a flat coordinate (one int per leaf) where it is not weakly congruent."""
        crd = _freeze(crd)
        if is_tuple(crd) and not it.weakly_congruent(crd, self.shape):
            flat = flatten(self.shape)
            if all(is_int(c) for c in crd) and len(crd) == len(flat):
                return it.unflatten(crd, self.shape)
            raise LayoutError(f"coordinate {crd} does not fit shape {_fmt(self.shape)}")
        return crd

    # ---- printing --------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{_fmt(self.shape)}:{_fmt(self.stride)}"

    def __repr__(self) -> str:
        return f"Layout({self.shape!r}, {self.stride!r})"


    @classmethod
    def parse(cls, text: str) -> "Layout":
        """Read CuTe's printed form ``(4,(2,2)):(2,(1,8))`` back into a layout (see :func:`parse_layout`)."""
        from .parse import parse_layout

        out = parse_layout(text)
        if not isinstance(out, Layout):
            raise LayoutError(f"{text!r} is not a plain layout")
        return out


def _check_coordinate(crd: Any, layout: "Layout") -> None:
    """Raise a clear TypeError for a non-integer coordinate and an IndexError for a negative one."""
    if isinstance(crd, (tuple, list)):
        for c in crd:
            _check_coordinate(c, layout)
        return
    if crd is None:
        return
    if not is_int(crd):
        raise LayoutTypeError(
            f"layout {layout} takes integer indices or coordinates (tuples of ints, None to slice), "
            f"not {type(crd).__name__} {crd!r}"
        )
    if crd < 0:
        raise LayoutIndexError(
            f"index {crd} is out of range for layout {layout}: indices and coordinates are non-negative "
            f"(its domain is 0..{layout.size() - 1})"
        )


def is_layout(x: Any) -> bool:
    """True for a :class:`Layout`."""
    return isinstance(x, Layout)


def _as_layout(x: Any, op: str) -> Layout:
    if isinstance(x, Layout):
        return x
    if is_int(x) or is_tuple(x):
        return Layout(x)
    raise LayoutError(f"{op}: expected a Layout or a shape, got {type(x).__name__}")


def make_layout(*layouts: Layout) -> Layout:
    """Concatenation: the layout whose ``i``-th mode is ``layouts[i]`` (CuTe's ``make_layout(L0, L1, ...)``).

    Post-condition: ``rank(result) == len(layouts)`` and ``result[i] == layouts[i]``.
    A single layout is wrapped into a rank-1 tuple layout.
    """
    ls = [_as_layout(x, "make_layout") for x in layouts]
    return Layout(tuple(x.shape for x in ls), tuple(x.stride for x in ls))


def _mode(layout: Layout, modes: tuple[int, ...]) -> Layout:
    for m in modes:
        layout = layout[m]
    return layout


def size(x: Any, *modes: int) -> int:
    """Number of coordinates (product of the shape) of a layout, shape, or of ``mode`` within it."""
    if hasattr(x, "size") and not isinstance(x, Layout):
        return x.size() if not modes else size(get(x, *modes))
    if isinstance(x, Layout):
        return product(_mode(x, modes).shape)
    t = x
    for m in modes:
        t = t[m] if is_tuple(t) else t
    return product(t)


def cosize(x: Any, *modes: int) -> int:
    """Size of the codomain: ``L(size(L) - 1) + 1`` (CuTe's definition; the max offset + 1 for non-negative strides)."""
    if not isinstance(x, Layout):
        return x.cosize() if not modes else cosize(get(x, *modes))
    layout = _mode(x, modes)
    return layout(layout.size() - 1) + 1


def rank(x: Any, *modes: int) -> int:
    """Number of top-level modes of a layout or int tuple (1 for an int shape)."""
    if isinstance(x, Layout):
        return len(_mode(x, modes))
    if hasattr(x, "rank"):
        return x.rank(*modes)
    return it.rank(x)


def depth(x: Any, *modes: int) -> int:
    """Nesting depth of the shape (0 for an int shape)."""
    if isinstance(x, Layout):
        return it.depth(_mode(x, modes).shape)
    if hasattr(x, "depth"):
        return x.depth(*modes)
    return it.depth(x)


def shape(x: Any, *modes: int) -> IntTuple:
    """The shape of a layout (or of the given mode, nested indices descending)."""
    return _mode(x, modes).shape if isinstance(x, Layout) else x.shape_of(*modes)


def stride(x: Layout, *modes: int) -> IntTuple:
    """The stride of a layout (or of the given mode)."""
    return _mode(x, modes).stride


def get(x: Layout, *modes: int) -> Layout:
    """CuTe's ``get<I, J...>``: the sublayout at a nested mode path. ``get(L, 1, 0) == L[1][0]``."""
    if isinstance(x, Layout):
        return _mode(x, modes)
    return x.get(*modes)


def select(x: Layout, *modes: int) -> Layout:
    """The layout made of the listed top-level modes, in the listed order (CuTe's ``select<I...>``).

    Post-condition: ``result[k] == x[modes[k]]``.
    """
    return make_layout(*(x[m] for m in modes))


def take(x: Layout, begin: int, end: int) -> Layout:
    """Modes ``[begin, end)`` as a layout (CuTe's ``take<B, E>``). Post-condition: ``result[k] == x[begin + k]``."""
    if not 0 <= begin <= end <= len(x):
        raise LayoutError(f"take: range [{begin}, {end}) is not within rank {len(x)}")
    return make_layout(*(x[m] for m in range(begin, end)))


def _modes(x: Layout) -> list[Layout]:
    return list(x) if is_tuple(x.shape) else [x]


def append(x: Layout, y: Layout | None = None, n: int | None = None) -> Layout:
    """Append mode ``y`` (default ``1:0``) to ``x``; with ``n``, pad with ``y`` up to rank ``n``.

    Post-condition: ``result[:rank(x)]`` are the modes of ``x``; with the default ``1:0`` the function is unchanged.
    """
    y = Layout(1, 0) if y is None else _as_layout(y, "append")
    modes = _modes(x)
    if n is None:
        return make_layout(*modes, y)
    if n < len(modes):
        raise LayoutError(f"append: rank {len(modes)} already exceeds {n}")
    return make_layout(*modes, *([y] * (n - len(modes))))


def prepend(x: Layout, y: Layout | None = None, n: int | None = None) -> Layout:
    """Prepend mode ``y`` (default ``1:0``) to ``x``; with ``n``, pad at the front up to rank ``n``.

    Post-condition: the last ``rank(x)`` modes are those of ``x``.
    """
    y = Layout(1, 0) if y is None else _as_layout(y, "prepend")
    modes = _modes(x)
    if n is None:
        return make_layout(y, *modes)
    if n < len(modes):
        raise LayoutError(f"prepend: rank {len(modes)} already exceeds {n}")
    return make_layout(*([y] * (n - len(modes))), *modes)


def replace(x: Layout, i: int, y: Layout) -> Layout:
    """``x`` with mode ``i`` replaced by ``y``. Post-condition: ``result[i] == y``, other modes unchanged."""
    modes = _modes(x)
    if not -len(modes) <= i < len(modes):
        raise LayoutError(f"replace: mode {i} out of range for rank {len(modes)}")
    modes[i] = _as_layout(y, "replace")
    return make_layout(*modes)


def group(x: Layout, begin: int, end: int) -> Layout:
    """Group modes ``[begin, end)`` into a single mode (CuTe's ``group<B, E>``); the function is unchanged."""
    modes = _modes(x)
    if not 0 <= begin <= end <= len(modes):
        raise LayoutError(f"group: range [{begin}, {end}) is not within rank {len(modes)}")
    return make_layout(*modes[:begin], make_layout(*modes[begin:end]), *modes[end:])


def flatten_layout(x: Layout) -> Layout:
    """The layout with the leaves of shape and stride as its modes; same function, depth <= 1."""
    if not is_tuple(x.shape):
        return x
    return Layout(flatten(x.shape), flatten(x.stride))


def make_ordered_layout(shape_: IntTuple, order: IntTuple | None = None) -> Layout:
    """Compact layout of ``shape_`` whose modes are laid out in increasing ``order`` (CuTe's ``make_ordered_layout``).

    The leaf with the smallest order gets stride 1, the next ``shape`` of it, and so on; ties keep
    left-to-right order, and an int order at a tuple mode orders that whole mode column-major. Post-condition: the result is compact (a bijection onto
    ``[0, size)``) and congruent to ``shape_``.
    """
    shape_ = _freeze(shape_)
    flat_shape = flatten(shape_)
    if order is None:
        order = tuple(range(len(flat_shape)))
        order = it.unflatten(order, shape_) if is_tuple(shape_) else 0
    order = _freeze(order)
    if not it.weakly_congruent(order, shape_):
        raise LayoutError(f"make_ordered_layout: order {order} is not (weakly) congruent with shape {shape_}")
    flat_order = _expand(order, shape_)
    strides = [0] * len(flat_shape)
    current = 1
    for i in sorted(range(len(flat_shape)), key=lambda k: (flat_order[k], k)):
        strides[i] = current if flat_shape[i] != 1 else 0  # CuTe: size-1 modes get stride 0
        current *= flat_shape[i]
    return Layout(shape_, it.unflatten(tuple(strides), shape_) if is_tuple(shape_) else strides[0])


def _expand(order: Any, shape_: Any) -> tuple:
    """One order value per leaf of ``shape_``: an int order at a tuple mode applies to all its leaves."""
    if is_tuple(order):
        return tuple(v for o, s in zip(order, shape_) for v in _expand(o, s))
    return (order,) * len(flatten(shape_))


def make_identity_layout(shape_: IntTuple) -> Layout:
    """The layout mapping each coordinate of ``shape_`` to itself: strides are basis elements ``1@i``.

    Strides are CuTe's ``make_basis_like(shape_)``: ``1@0, 1@1`` for a flat shape, ``1@1@0`` for
    leaf 0 of mode 1 and so on. Post-condition: ``L(c) == c`` for every coordinate ``c``
    congruent with ``shape_``, and ``L(i) == idx2crd(i, shape_)``.
    """
    shape_ = _freeze(shape_)
    if not is_tuple(shape_):
        return Layout(shape_, 1)  # CuTe: the basis of an integral shape is the integer 1

    def basis_like(s: IntTuple, path: tuple[int, ...]):
        if is_tuple(s):
            return tuple(basis_like(x, path + (k,)) for k, x in enumerate(s))
        return ScaledBasis(1, path[0] if len(path) == 1 else path)

    # CuTe's make_basis_like: nested modes map to nested coordinates.
    return Layout(shape_, basis_like(shape_, ()))


def slice_and_offset(crd: Any, layout: Layout) -> tuple[Layout, Any]:
    """CuTe's ``slice_and_offset``: the sublayout where ``crd`` is ``None`` and the offset of the rest.

    Post-condition: ``layout(c) == offset + sub(c')`` where ``c'`` are the ``None`` positions of ``c``.
    """
    crd = _freeze(crd)
    if crd is None:
        return layout, 0
    if is_tuple(crd) and not it.weakly_congruent(crd, layout.shape) and len(crd) == len(flatten(layout.shape)):
        crd = it.unflatten(crd, layout.shape)
    sub_shape = it.slice_(crd, layout.shape)
    sub_stride = it.slice_(crd, layout.stride)
    offset = it.crd2idx(crd, layout.shape, layout.stride)
    return Layout(sub_shape, sub_stride), offset


def same_function(a: Any, b: Any) -> bool:
    """Function equality: ``size(a) == size(b)`` and ``a(i) == b(i)`` for every ``i`` in ``[0, size)``.

    Unlike ``==`` this ignores how the domain is factored: ``(2,2):(1,2)`` and ``4:1`` agree.
    """
    n = size(a)
    return n == size(b) and all(a(i) == b(i) for i in range(n))
