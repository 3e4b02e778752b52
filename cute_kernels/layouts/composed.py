"""ComposedLayout: ``outer o offset o inner``, the function ``c -> outer(offset + inner(c))``.

CuTe uses it for swizzled shared-memory layouts, ``Sw<3,4,3> o 0 o (8,64):(64,1)``: the inner
layout maps coordinates to offsets, the swizzle permutes those offsets. Shape-level operations
(slicing, composition with a tiler, divides, products, tile_to_shape) act on the inner layout.
"""

from __future__ import annotations

from typing import Any

from .display import Drawable
from .errors import LayoutError
from .int_tuple import has_none, is_int
from .layout import Layout, slice_and_offset
from .swizzle import Swizzle

__all__ = ["ComposedLayout", "make_swizzle_layout"]


class ComposedLayout(Drawable):
    """``ComposedLayout(outer, offset, inner)``: evaluates ``outer(offset + inner(c))``.

    ``outer`` and ``inner`` are each a :class:`Layout` or a :class:`Swizzle`; ``offset`` is an int.
    Its shape, size and rank are the inner layout's (a swizzle inner has an integer domain).
    Equality is structural; ``str`` is CuTe's ``outer o offset o inner``.
    Post-condition: ``C(c) == outer(offset + inner(c))`` for every coordinate ``c``; slicing with
    ``None`` keeps that identity, folding the fixed part into ``offset``.
    """

    __slots__ = ("outer", "offset", "inner")

    def __init__(self, outer: Any, offset: int, inner: Any):
        for name, f in (("outer", outer), ("inner", inner)):
            if not isinstance(f, (Layout, Swizzle, ComposedLayout)):
                raise LayoutError(f"ComposedLayout: {name} must be a Layout or Swizzle, got {type(f).__name__}")
        if not is_int(offset):
            raise LayoutError(f"ComposedLayout: offset must be an int, got {offset!r}")
        object.__setattr__(self, "outer", outer)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "inner", inner)

    def __setattr__(self, name, value):
        raise AttributeError("ComposedLayout is immutable")

    def with_inner(self, inner: Any) -> "ComposedLayout":
        """The same outer function and offset over a new inner layout."""
        return ComposedLayout(self.outer, self.offset, inner)

    # ---- the Layout-like interface, all through the inner layout ---------------------------
    @property
    def shape(self):
        return self.inner.shape if isinstance(self.inner, Layout) else self.outer.shape

    @property
    def stride(self):
        raise LayoutError("a ComposedLayout has no single stride; use .inner.stride")

    def size(self) -> int:
        return self.inner.size() if isinstance(self.inner, Layout) else self.outer.size()

    def cosize(self) -> int:
        """Codomain extent: ``max(self(i)) + 1`` over the domain (enumerated, up to
        :data:`~cute_kernels.layouts.budget.ELEMENTS` elements)."""
        from . import budget

        budget.check(self.size(), budget.ELEMENTS, f"cosize of {self}", "a swizzled layout's cosize is enumerated")
        return max(self(i) for i in range(self.size())) + 1

    def __len__(self) -> int:
        return len(self.inner) if isinstance(self.inner, Layout) else 1

    def __getitem__(self, i: int) -> "ComposedLayout":
        return self.with_inner(self.inner[i])

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def rank(self, *modes: int) -> int:
        from .layout import rank

        return rank(self.inner, *modes)

    def depth(self, *modes: int) -> int:
        from .layout import depth

        return depth(self.inner, *modes)

    def shape_of(self, *modes: int):
        from .layout import shape

        return shape(self.inner, *modes)

    def get(self, *modes: int) -> "ComposedLayout":
        from .layout import get

        return self.with_inner(get(self.inner, *modes))

    def __call__(self, *args: Any):
        crd = args[0] if len(args) == 1 else tuple(args)
        if has_none(crd):
            sub, off = slice_and_offset(crd, self.inner)
            # Fold the sliced-away part into the offset: outer(offset + off + sub(c')) is exact.
            return ComposedLayout(self.outer, self.offset + off, sub)
        return self.outer(self.offset + self.inner(crd))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ComposedLayout)
            and (self.outer, self.offset, self.inner) == (other.outer, other.offset, other.inner)
        )

    def __hash__(self) -> int:
        return hash((ComposedLayout, self.outer, self.offset, self.inner))

    def __str__(self) -> str:
        return f"{self.outer} o {self.offset} o {self.inner}"

    def __repr__(self) -> str:
        return f"ComposedLayout({self.outer!r}, {self.offset!r}, {self.inner!r})"


    @classmethod
    def parse(cls, text: str) -> "ComposedLayout":
        """Read CuTe's printed form ``Sw<3,4,3> o 0 o (8,64):(64,1)`` back."""
        from .parse import parse_layout

        out = parse_layout(text)
        if not isinstance(out, ComposedLayout):
            raise LayoutError(f"{text!r} is not a composed layout")
        return out


def make_swizzle_layout(swizzle: Swizzle, layout: Layout, offset: int = 0) -> ComposedLayout:
    """``swizzle o offset o layout``: a swizzled layout (CuTe's ``composition(Swizzle, Layout)``).

    Post-condition: ``result(c) == swizzle(offset + layout(c))`` for every coordinate ``c``.
    """
    return ComposedLayout(swizzle, offset, layout)
