"""The F2 view: a layout whose shapes are powers of two as a linear map over GF(2), and back.

With power-of-two shapes, the bits of a layout's index are the bits of its coordinates, mode by
mode (colexicographic), and ``L(i)`` adds one *column* per set index bit: ``d << j`` for bit ``j``
of a leaf ``s:d``. When no two columns share an output bit, that sum never carries, so it is an
XOR and ``L`` is linear over GF(2): ``L(x ^ y) == L(x) ^ L(y)``. A swizzle
``x ^ ((x & Y) >> S)`` is linear too, so a swizzled layout ``Sw o 0 o L`` is the product of two bit
matrices. This is the view Triton's linear layouts take; here it sits next to CuTe's algebra:

* :func:`f2` gives an :class:`F2Layout` (its columns, the bit matrix, named input bits per mode
  such as ``m0 m1 n0 ...``, output bits ``o0 o1 ...``) for a :class:`Layout`, a :class:`Swizzle`
  or a :class:`ComposedLayout`; with ``dtype``, a swizzle acts on byte addresses (the smem
  convention of :mod:`~cute_kernels.layouts.analysis`). A layout whose columns overlap is refused,
  naming the two input bits that carry into each other.
* :meth:`F2Layout.compose` and :meth:`F2Layout.inverse` are matrix product and inversion (Gaussian
  elimination); they agree with :func:`composition` and :func:`right_inverse` (property-tested).
* :meth:`F2Layout.to_cute` goes back: a :class:`Layout` when the columns are disjoint, else
  ``Swizzle o 0 o Layout`` for the smallest swizzle that makes them so, else a
  :class:`LayoutError` saying no CuTe layout computes this map.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .display import Drawable
from .errors import LayoutError
from .int_tuple import flatten, is_int, is_tuple
from .layout import Layout, make_layout

__all__ = ["F2Layout", "f2", "f2_swizzle"]

DEFAULT_NAMES = ("m", "n", "k", "l", "p", "q", "r", "s")


def _log2(n: int) -> int | None:
    return n.bit_length() - 1 if n > 0 and n & (n - 1) == 0 else None


@dataclass(frozen=True)
class F2Layout(Drawable):
    """A linear map over GF(2) from ``len(columns)`` input bits to ``out_bits`` output bits.

    ``columns[b]`` is the image of input bit ``b`` (an int whose set bits are output bits);
    ``in_names[b]`` names it; ``modes`` groups the input bits by the layout mode they came from,
    ``(name, (first bit, bit count))`` each, so :meth:`to_cute` can rebuild those modes.
    Post-condition: ``F(x) == XOR of columns[b] for the set bits b of x``.
    """

    columns: tuple[int, ...]
    out_bits: int
    in_names: tuple[str, ...]
    modes: tuple[tuple[str, tuple[int, int]], ...]

    def __post_init__(self):
        if len(self.in_names) != len(self.columns):
            raise LayoutError(f"F2Layout: {len(self.in_names)} names for {len(self.columns)} input bits")
        if any(c < 0 or c >> self.out_bits for c in self.columns):
            raise LayoutError(f"F2Layout: a column does not fit in {self.out_bits} output bits")

    # ---- the map ------------------------------------------------------------------------------
    @property
    def in_bits(self) -> int:
        return len(self.columns)

    def size(self) -> int:
        return 1 << self.in_bits

    def __call__(self, x: int) -> int:
        if not is_int(x) or x < 0 or x >> self.in_bits:
            raise LayoutError(f"an F2 layout of {self.in_bits} input bits takes 0 <= x < {1 << self.in_bits}, not {x!r}")
        out, b = 0, 0
        while x:
            if x & 1:
                out ^= self.columns[b]
            x >>= 1
            b += 1
        return out

    def matrix(self) -> list[list[int]]:
        """The bit matrix: ``matrix()[o][b]`` is 1 when input bit ``b`` sets output bit ``o``."""
        return [[(c >> o) & 1 for c in self.columns] for o in range(self.out_bits)]

    def rank(self) -> int:
        """The dimension of the image (Gaussian elimination over GF(2))."""
        return len(_basis(self.columns))

    def is_injective(self) -> bool:
        return self.rank() == self.in_bits

    def is_linear_layout(self) -> bool:
        """True when no two columns share an output bit: the integer sum is the XOR, a plain CuTe layout."""
        return _disjoint(self.columns)

    # ---- algebra ------------------------------------------------------------------------------
    def compose(self, inner: "F2Layout") -> "F2Layout":
        """``self o inner``: ``inner``'s output bits are ``self``'s input bits (extra output bits of
        ``inner`` beyond ``self.in_bits`` must be unused)."""
        if any(c >> self.in_bits for c in inner.columns):
            raise LayoutError(f"F2 composition: the inner map reaches output bit {max(c.bit_length() for c in inner.columns) - 1}, "
                              f"past the {self.in_bits} input bits of the outer one")
        return F2Layout(tuple(self(c) for c in inner.columns), self.out_bits, inner.in_names, inner.modes)

    def inverse(self) -> "F2Layout":
        """The inverse of a bijection (as many output as input bits, full rank): the matrix
        inverse, by Gauss-Jordan elimination. Its input bits are this map's output bits."""
        n = self.in_bits
        if self.out_bits != n or not self.is_injective():
            raise LayoutError(f"F2 inverse: the map is {n} -> {self.out_bits} bits of rank {self.rank()}; only a "
                              "bijection (square, full rank) has an inverse")
        # Row-reduce [columns as rows | identity]: each row is (image, preimage) over GF(2).
        rows = [(self.columns[b], 1 << b) for b in range(n)]
        for bit in range(n):
            pivot = next(i for i in range(bit, n) if (rows[i][0] >> bit) & 1)
            rows[bit], rows[pivot] = rows[pivot], rows[bit]
            for i in range(n):
                if i != bit and (rows[i][0] >> bit) & 1:
                    rows[i] = (rows[i][0] ^ rows[bit][0], rows[i][1] ^ rows[bit][1])
        columns = tuple(rows[bit][1] for bit in range(n))  # the preimage of output bit `bit`
        return F2Layout(columns, n, tuple(f"o{b}" for b in range(n)), (("o", (0, n)),))

    # ---- back to CuTe -------------------------------------------------------------------------
    def to_layout(self) -> Layout:
        """The plain CuTe layout computing this map, with this map's modes; requires disjoint
        columns (:meth:`is_linear_layout`), else :class:`LayoutError`."""
        if not self.is_linear_layout():
            raise LayoutError(f"{self._brief()}: two columns share an output bit, so no plain layout computes it "
                              "(try to_cute(), which also looks for a swizzle)")
        modes = []
        for _, (first, count) in self.modes:
            leaves: list[tuple[int, int]] = []
            for b in range(first, first + count):
                c = self.columns[b]
                if leaves and leaves[-1][1] * leaves[-1][0] == c and leaves[-1][1] != 0:
                    leaves[-1] = (leaves[-1][0] * 2, leaves[-1][1])  # bit b continues the leaf
                elif leaves and c == 0 and leaves[-1][1] == 0:
                    leaves[-1] = (leaves[-1][0] * 2, 0)
                else:
                    leaves.append((2, c))
            if not leaves:
                modes.append(Layout(1, 0))
            elif len(leaves) == 1:
                modes.append(Layout(*leaves[0]))
            else:
                modes.append(Layout(tuple(s for s, _ in leaves), tuple(d for _, d in leaves)))
        return modes[0] if len(modes) == 1 else make_layout(*modes)

    def to_cute(self, dtype: Any = None) -> Any:
        """A CuTe layout computing this map: :meth:`to_layout` when it is one, else
        ``Swizzle o 0 o Layout`` with the smallest swizzle (fewest bits, then shortest shift) that
        turns it into one. With ``dtype`` the swizzle is given on byte addresses (smem
        convention). Raises :class:`LayoutError` when no single swizzle does."""
        if self.is_linear_layout():
            return self.to_layout()
        from .composed import ComposedLayout

        for sw in _swizzle_candidates(self.out_bits):
            columns = tuple(sw(c) for c in self.columns)  # a swizzle is its own inverse
            if _disjoint(columns):
                width = max(self.out_bits, max(c.bit_length() for c in columns))
                inner = F2Layout(columns, width, self.in_names, self.modes).to_layout()
                if dtype is not None:
                    from .atoms import dtype_bits

                    k = _log2(dtype_bits(dtype) // 8) if dtype_bits(dtype) >= 8 else None
                    if k is None:
                        raise LayoutError(f"a byte-address swizzle needs whole, power-of-two byte elements, not {dtype}")
                    from .swizzle import Swizzle

                    sw = Swizzle(sw.bits, sw.base + k, sw.shift)
                return ComposedLayout(sw, 0, inner)
        raise LayoutError(f"{self._brief()}: neither a layout nor one swizzle of a layout computes this map")

    # ---- printing -----------------------------------------------------------------------------
    def _brief(self) -> str:
        return f"F2 map of {self.in_bits} input bits to {self.out_bits} output bits"

    def __str__(self) -> str:
        names = list(self.in_names)
        w = max([len(n) for n in names] + [1])
        ow = len(f"o{max(self.out_bits - 1, 0)}")
        head = " " * (ow + 3) + " ".join(f"{n:>{w}}" for n in names)
        lines = [f"{self._brief()}" + (f" ({', '.join(n for n, _ in self.modes)})" if self.modes else ""), head]
        for o in range(self.out_bits):
            row = " ".join(f"{'1' if (c >> o) & 1 else '.':>{w}}" for c in self.columns)
            lines.append(f"{'o' + str(o):>{ow}}  [{row} ]")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def picture(self):
        """The bit matrix as a picture: output bits down, input bits across, ones filled."""
        from .render import _Panel, _Picture

        def cell(r: int, c: int):
            on = (self.columns[c] >> r) & 1
            return ("1" if on else ""), "", ("#4575b4" if on else "#ffffff")

        panel = _Panel(0, 0, self.out_bits, self.in_bits, cell, col_names=list(self.in_names),
                       row_names=[f"o{o}" for o in range(self.out_bits)])
        return _Picture([panel], self._brief())


def _disjoint(columns: Sequence[int]) -> bool:
    seen = 0
    for c in columns:
        if c & seen:
            return False
        seen |= c
    return True


def _basis(columns: Sequence[int]) -> list[int]:
    """A row-echelon basis of the span of ``columns`` (each kept with a distinct leading bit)."""
    basis: list[int] = []
    for c in columns:
        for b in basis:
            c = min(c, c ^ b)
        if c:
            basis.append(c)
    return basis


def _swizzle_candidates(out_bits: int):
    from .swizzle import Swizzle

    for bits in range(1, out_bits // 2 + 1):
        for shift in range(bits, out_bits):
            for sign in (1, -1):
                for base in range(0, out_bits - bits - shift + 1):
                    yield Swizzle(bits, base, sign * shift)


def f2_swizzle(sw: Any, out_bits: int | None = None) -> F2Layout:
    """The F2 map of a :class:`Swizzle` on the low ``out_bits`` bits (default: every bit it reads)."""
    n = out_bits if out_bits is not None else sw.base + sw.bits + abs(sw.shift)
    columns = tuple(sw(1 << b) for b in range(n))
    if any(c >> n for c in columns):
        raise LayoutError(f"{sw} moves a bit past the {n} bits of this F2 view; widen it")
    return F2Layout(columns, n, tuple(f"o{b}" for b in range(n)), (("o", (0, n)),))


def _layout_columns(layout: Layout, names: Sequence[str] | None) -> F2Layout:
    if not all(is_int(d) for d in flatten(layout.stride)):
        raise LayoutError(f"{layout}: an F2 view needs integer strides")
    modes = list(layout) if is_tuple(layout.shape) else [layout]
    names = list(names) if names is not None else list(DEFAULT_NAMES[: len(modes)]) or ["i"]
    if len(names) < len(modes):
        raise LayoutError(f"{layout} has {len(modes)} modes; {len(names)} names given")
    columns: list[int] = []
    in_names: list[str] = []
    groups = []
    for name, mode in zip(names, modes):
        first = len(columns)
        for s, d in zip(flatten(mode.shape), flatten(mode.stride)):
            k = _log2(s)
            if k is None:
                raise LayoutError(f"{layout}: shape {s} is not a power of two; an F2 view needs power-of-two shapes")
            if d < 0:
                raise LayoutError(f"{layout}: stride {d} is negative; an F2 view maps to non-negative offsets")
            for j in range(k):
                in_names.append(f"{name}{len(columns) - first}")
                columns.append(d << j)
        groups.append((name, (first, len(columns) - first)))
    seen: dict[int, int] = {}
    for b, c in enumerate(columns):
        for o in range(c.bit_length()):
            if (c >> o) & 1:
                if o in seen:
                    a = seen[o]
                    raise LayoutError(
                        f"{layout} is not linear over F2: input bits {in_names[a]} and {in_names[b]} both set output "
                        f"bit o{o} (columns {columns[a]:#b} and {c:#b}), so their images add with a carry"
                    )
                seen[o] = b
    out_bits = max((c.bit_length() for c in columns), default=0)
    return F2Layout(tuple(columns), out_bits, tuple(in_names), tuple(groups))


def _index_map(layout: Any) -> F2Layout:
    """The F2 map of a layout read as a function of its flat index (one input mode, bits o0...):
    how an outer layout sees the offsets an inner one produces."""
    if isinstance(layout, Layout):
        return _layout_columns(make_layout(layout) if is_tuple(layout.shape) else layout, ("o",))
    return f2(layout)


def f2(layout: Any, *, names: Sequence[str] | None = None, dtype: Any = None) -> F2Layout:
    """The F2 view of ``layout`` (a :class:`Layout`, :class:`Swizzle`, :class:`ComposedLayout`, or
    its text): see the module docstring. ``names`` name the top-level modes' input bits (default
    ``m, n, k, ...``; ``("t", "v")`` suits a TV layout). With ``dtype`` an outer swizzle acts on
    byte addresses, as CuTe's shared-memory layouts do.

    Post-condition: ``f2(L)(i) == L(i)`` for every index ``i`` (the byte convention applied).
    Raises :class:`LayoutError` for a shape that is not a power of two, a negative or non-integer
    stride, a non-zero offset (an affine map), or columns that carry into each other.
    """
    from .composed import ComposedLayout
    from .parse import as_layout
    from .swizzle import Swizzle

    layout = as_layout(layout)
    if hasattr(layout, "element_layout"):  # a GMMA smem atom: its element form is exact
        layout, dtype = layout.element_layout, None
    if isinstance(layout, Swizzle):
        return f2_swizzle(layout)
    if isinstance(layout, Layout):
        return _layout_columns(layout, names)
    if isinstance(layout, ComposedLayout):
        if layout.offset != 0:
            raise LayoutError(f"{layout}: offset {layout.offset} makes the map affine, not linear; slice it to offset 0")
        outer = layout.outer
        if isinstance(outer, Swizzle) and dtype is not None:
            from .atoms import dtype_bits

            k = _log2(dtype_bits(dtype) // 8) if dtype_bits(dtype) >= 8 else None
            if k is None or (outer.bits and outer.base < k):
                raise LayoutError(f"{outer} on byte addresses splits a {dtype} element; no element-wise F2 view")
            outer = Swizzle(outer.bits, max(0, outer.base - k), outer.shift)
        if isinstance(layout.inner, Swizzle):  # a layout after a swizzle (a right inverse): L o Sw
            outer_map = _index_map(outer)
            return outer_map.compose(f2_swizzle(layout.inner, outer_map.in_bits))
        inner = f2(layout.inner, names=names)
        if isinstance(outer, Swizzle):
            return f2_swizzle(outer, max(inner.out_bits, outer.base + outer.bits + abs(outer.shift))).compose(inner)
        return _index_map(outer).compose(inner)
    raise LayoutError(f"no F2 view of {type(layout).__name__}")
