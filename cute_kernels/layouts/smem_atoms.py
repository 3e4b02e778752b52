"""The GMMA shared-memory layout atoms (CuTe's ``GMMA::Layout_{K,MN}_{INTER,SW32,SW64,SW128}_Atom<T>``).

A wgmma operand in shared memory is tiled from one of eight atoms: K-major or MN-major, with no
swizzle ("interleaved") or a 32-, 64- or 128-byte swizzle. Each atom is 8 rows of one *swizzle
width* (16, 32, 64 or 128 bytes) of contiguous elements:

* K-major:  ``Sw<B,4,3> o 0 o (8, W):(W, 1)``   (W = swizzle bytes / element bytes)
* MN-major: ``Sw<B,4,3> o 0 o (W, 8):(1, W)``

with ``B = 0, 1, 2, 3`` for INTER, SW32, SW64, SW128. As in CuTe and the DSL, the swizzle acts
on *byte* addresses (bits 4-6 of the address XOR bits 7-9 for SW128), which is why it is the same
``Sw<B,4,3>`` for every element width. :attr:`SmemAtom.layout` is that form (what CuTe prints and
what the DSL's ``make_smem_layout_atom`` returns); :attr:`SmemAtom.element_layout` is the same
function on element offsets, ``Sw<B, 4 - log2(bytes), 3>``, a pure layout you can evaluate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .atoms import dtype_bits, dtype_name
from .errors import LayoutError
from .layout import Layout

__all__ = ["SmemAtom", "gmma_smem_atom", "smem_atom", "SMEM_ATOM_KINDS"]

_SWIZZLE_BITS = {"INTER": 0, "SW32": 1, "SW64": 2, "SW128": 3}
SMEM_ATOM_KINDS = tuple(f"{major}_{sw}" for major in ("K", "MN") for sw in _SWIZZLE_BITS)


@dataclass(frozen=True)
class SmemAtom:
    """A GMMA shared-memory layout atom for one element type (see the module docstring)."""

    name: str
    kind: str
    dtype: str
    major: str
    swizzle_bytes: int
    swizzle_bits: int
    layout: object
    element_layout: object

    @property
    def shape(self):
        return self.layout.shape

    def size(self) -> int:
        return self.layout.size()

    def __str__(self) -> str:
        return (
            f"{self.name}: {self.layout}\n"
            f"  {self.major}-major, {self.swizzle_bytes}-byte rows"
            f"{', no swizzle' if self.swizzle_bits == 0 else f', {self.swizzle_bytes}B swizzle'}"
            f" (swizzle on byte addresses)\n"
            f"  on element offsets: {self.element_layout}"
        )

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def to_svg(self, **kw) -> str:
        from .render import layout_svg

        kw.setdefault("dtype", self.dtype)
        kw.setdefault("title", f"{self.name}  {self.layout}")
        return layout_svg(self.element_layout, swizzle_unit="elements", **kw)

    def _repr_svg_(self) -> str | None:
        from .render import repr_svg

        return repr_svg(self)

    def to_latex(self, **kw) -> str:
        from .render import layout_latex

        kw.setdefault("dtype", self.dtype)
        return layout_latex(self.element_layout, swizzle_unit="elements", **kw)


def gmma_smem_atom(kind: str, dtype) -> SmemAtom:
    """The atom ``kind`` (``"K_SW128"``, ``"MN_INTER"``...) for elements of ``dtype`` (8, 16 or
    32 bits, the widths wgmma reads from shared memory).

    Post-conditions: ``size == 8 * swizzle_bytes * 8 / bits``; ``layout`` with its swizzle applied
    to byte addresses equals ``element_layout`` on element offsets, at every coordinate.
    """
    from .composed import ComposedLayout
    from .swizzle import Swizzle

    kind = kind.upper()
    if kind not in SMEM_ATOM_KINDS:
        raise LayoutError(f"unknown GMMA smem atom kind {kind!r}; one of {', '.join(SMEM_ATOM_KINDS)}")
    name_t = dtype_name(dtype)
    bits = dtype_bits(name_t)
    if bits not in (8, 16, 32):
        raise LayoutError(f"GMMA smem atoms hold 8-, 16- or 32-bit elements, not {name_t} ({bits} bits)")
    major, sw = kind.split("_")
    b = _SWIZZLE_BITS[sw]
    row_bytes = 16 << b
    w = row_bytes * 8 // bits
    inner = Layout((8, w), (w, 1)) if major == "K" else Layout((w, 8), (1, w))
    log2_bytes = {8: 0, 16: 1, 32: 2}[bits]
    return SmemAtom(
        name=f"GMMA::Layout_{kind}_Atom<{name_t}>",
        kind=kind,
        dtype=name_t,
        major=major,
        swizzle_bytes=row_bytes,
        swizzle_bits=b,
        layout=ComposedLayout(Swizzle(b, 4, 3), 0, inner),
        element_layout=ComposedLayout(Swizzle(b, 4 - log2_bytes, 3), 0, inner),
    )


_NAME = re.compile(r"(?:GMMA::)?Layout_(K|MN)_(INTER|SW32|SW64|SW128)_Atom<(\w+)>\Z")


def smem_atom(name: str) -> SmemAtom:
    """Look an atom up by CuTe's spelling, ``"GMMA::Layout_K_SW128_Atom<bf16>"`` (the ``GMMA::``
    prefix is optional; the element type is any name :func:`dtype_name` knows)."""
    m = _NAME.match(name.strip())
    if not m:
        raise LayoutError(f"{name!r} is not a GMMA smem atom name like 'GMMA::Layout_K_SW128_Atom<bf16>'")
    return gmma_smem_atom(f"{m.group(1)}_{m.group(2)}", m.group(3))
