"""Read CuTe's printed notation back: ``(4,(2,2)):(2,(1,8))``, ``Sw<3,4,3>``, ``Sw<3,4,3> o 0 o 64:1``.

Accepted: integers (optionally CuTe's static ``_4`` spelling), nested parenthesised tuples,
basis strides ``1@0`` / ``1@0@1`` (innermost index first, as CuTe prints), swizzles as ``Sw<B,M,S>``
(C++) or ``S<B,M,S>`` (the DSL), and whitespace anywhere between tokens.
"""

from __future__ import annotations

import re
from typing import Any

from .basis import ScaledBasis
from .errors import LayoutError

__all__ = ["parse_layout", "parse_int_tuple", "as_layout"]

_TOKEN = re.compile(r"\s*(?:(?P<int>-?_?\d+)|(?P<sym>[():,<>@])|(?P<sw>Sw?(?=<))|(?P<o>o(?![A-Za-z0-9_])))")


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise LayoutError(f"cannot parse layout {text!r}: unexpected text at column {pos}: {text[pos:pos + 10]!r}")
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
            want = value or kind
            got = "end of input" if tok is None else repr(tok[1])
            raise LayoutError(f"cannot parse layout {self.text!r}: expected {want!r}, got {got}")
        self.i += 1
        return tok[1]

    def integer(self) -> int:
        return int(self.take(kind="int").replace("_", ""))

    def leaf(self, allow_basis: bool) -> Any:
        value = self.integer()
        if allow_basis and self.peek() == ("sym", "@"):
            path = []
            while self.peek() == ("sym", "@"):
                self.take("@")
                path.append(self.integer())
            # CuTe prints the innermost index first ("1@0@1" is leaf 0 of mode 1).
            return ScaledBasis(value, path[0] if len(path) == 1 else tuple(reversed(path)))
        return value

    def int_tuple(self, allow_basis: bool = False) -> Any:
        if self.peek() == ("sym", "("):
            self.take("(")
            if self.peek() == ("sym", ")"):  # the empty tuple, as in "():()"
                self.take(")")
                return ()
            items = [self.int_tuple(allow_basis)]
            while self.peek() == ("sym", ","):
                self.take(",")
                items.append(self.int_tuple(allow_basis))
            self.take(")")
            return tuple(items)
        return self.leaf(allow_basis)

    def function(self) -> Any:
        from .layout import Layout
        from .swizzle import Swizzle

        if self.peek() is not None and self.peek()[0] == "sw":
            self.take(kind="sw")
            self.take("<")
            b = self.integer()
            self.take(",")
            m = self.integer()
            self.take(",")
            s = self.integer()
            # The CuTe DSL 4.8 prints a negative shift without the closing '>' ("S<2,0,-3"): accept it.
            if self.peek() == ("sym", ">") or not (s < 0 and (self.peek() is None or self.peek()[0] == "o")):
                self.take(">")
            return Swizzle(b, m, s)
        shape = self.int_tuple()
        self.take(":")
        stride = self.int_tuple(allow_basis=True)
        return Layout(shape, stride)

    def composed(self) -> Any:
        from .composed import ComposedLayout

        first = self.function()
        if self.peek() is None:
            return first
        self.take("o")
        offset = self.integer()
        self.take("o")
        rest = self.composed()
        return ComposedLayout(first, offset, rest)


def parse_layout(text: str) -> Any:
    """Parse CuTe's printed form into a :class:`Layout`, :class:`Swizzle` or :class:`ComposedLayout`.

    Post-condition: ``parse_layout(str(x)) == x`` for every layout, swizzle and composed layout ``x``.
    Malformed text raises :class:`LayoutError` naming the position.
    """
    if not isinstance(text, str):
        raise LayoutError(f"parse_layout expects a string, got {type(text).__name__}")
    p = _Parser(text)
    out = p.composed()
    if p.peek() is not None:
        raise LayoutError(f"cannot parse layout {text!r}: trailing {p.peek()[1]!r}")
    return out


def parse_int_tuple(text: str) -> Any:
    """Parse a printed int tuple such as ``(4,(2,2))`` or ``8``."""
    p = _Parser(text)
    out = p.int_tuple()
    if p.peek() is not None:
        raise LayoutError(f"cannot parse int tuple {text!r}: trailing {p.peek()[1]!r}")
    return out


def as_layout(x: Any) -> Any:
    """Whatever names a layout, as the object the workbench works on (the one coercion the CLI
    and the Python API share):

    * a :class:`Layout`, :class:`ComposedLayout`, :class:`Swizzle` or GMMA smem atom: itself;
    * CuTe's printed notation, ``"(8,64):(64,1)"`` or ``"Sw<3,4,3> o 0 o (8,64):(64,1)"``;
    * a bare shape, ``"(8,64)"``, ``(8, 64)`` or ``8``: the compact column-major layout of it;
    * a GMMA smem atom's name, ``"GMMA::Layout_K_SW128_Atom<bf16>"``.

    Anything else raises :class:`LayoutError` naming what was given.
    """
    from .composed import ComposedLayout
    from .int_tuple import is_int, is_tuple
    from .layout import Layout
    from .swizzle import Swizzle

    if isinstance(x, (Layout, ComposedLayout, Swizzle)) or hasattr(x, "element_layout"):
        return x
    if is_int(x) or (is_tuple(x) and x):
        return Layout(x)
    if not isinstance(x, str):
        raise LayoutError(f"expected a layout or its text such as '(8,64):(64,1)', got {type(x).__name__}")
    text = x.strip()
    if "Layout_" in text and "_Atom<" in text:
        from .smem_atoms import smem_atom

        return smem_atom(text)
    try:
        return parse_layout(text)
    except LayoutError:
        if ":" in text or "Sw" in text or "S<" in text:
            raise
        try:
            return Layout(parse_int_tuple(text))
        except LayoutError:
            raise LayoutError(
                f"cannot read a layout from {x!r}: expected CuTe's notation such as '(8,64):(64,1)', "
                "a shape such as '(8,64)', or a GMMA atom name such as 'GMMA::Layout_K_SW128_Atom<bf16>'"
            ) from None
