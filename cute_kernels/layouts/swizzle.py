"""Swizzle functors (CuTe's ``Swizzle<B, M, S>``): XOR bit permutations of integer offsets."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LayoutError
from .int_tuple import is_int

__all__ = ["Swizzle", "make_swizzle"]


def _shiftr(x: int, s: int) -> int:
    return x >> s if s >= 0 else x << -s


@dataclass(frozen=True)
class Swizzle:
    """``Swizzle(B, M, S)``: ``offset ^ ((offset & yyy_mask) >> S)`` (a left shift for negative ``S``).

    The ``B`` bits at ``M + max(0, S)`` (the Y bits) are XORed into the ``B`` bits at
    ``M - min(0, S)`` (the Z bits); the lowest ``M`` bits pass through. Requires ``B >= 0``,
    ``M >= 0`` and ``|S| >= B`` (so Y and Z do not overlap).

    Post-conditions: an involution, ``sw(sw(x)) == x`` for all ``x >= 0``, and a bijection on
    every aligned block ``[k * 2**n, (k+1) * 2**n)`` with ``n >= M + B + |S|``.
    """

    bits: int
    base: int
    shift: int

    def __post_init__(self):
        for name, v in (("B", self.bits), ("M", self.base), ("S", self.shift)):
            if not is_int(v):
                raise LayoutError(f"Swizzle: {name} must be an int, got {v!r}")
        if self.bits < 0 or self.base < 0:
            raise LayoutError(f"Swizzle<{self.bits},{self.base},{self.shift}>: B and M must be non-negative")
        if abs(self.shift) < self.bits:
            raise LayoutError(f"Swizzle<{self.bits},{self.base},{self.shift}>: |S| >= B is required (Y and Z bits overlap)")

    @property
    def bit_mask(self) -> int:
        return (1 << self.bits) - 1

    @property
    def yyy_mask(self) -> int:
        """The source bits: ``B`` bits at ``M + max(0, S)``."""
        return self.bit_mask << (self.base + max(0, self.shift))

    @property
    def zzz_mask(self) -> int:
        """The target bits: ``B`` bits at ``M - min(0, S)``."""
        return self.bit_mask << (self.base - min(0, self.shift))

    def __call__(self, offset: int) -> int:
        if not is_int(offset):
            raise LayoutError(f"{self} applies to integer offsets, got {offset!r}")
        return offset ^ _shiftr(offset & self.yyy_mask, self.shift)

    def size(self) -> int:
        """Extent of the smallest block the swizzle permutes onto itself: ``2**(M + B + |S|)``."""
        return 1 << (self.base + self.bits + abs(self.shift))

    def cosize(self) -> int:
        return self.size()

    def compose(self, other: "Swizzle") -> "Swizzle":
        """CuTe's ``composition(Swizzle, Swizzle)`` for equal shifts: XOR the masks into one swizzle."""
        if self.shift != other.shift:
            raise LayoutError(f"composition {self} o {other}: only swizzles with the same shift merge")
        return make_swizzle(self.yyy_mask ^ other.yyy_mask, self.zzz_mask ^ other.zzz_mask)

    def __str__(self) -> str:
        return f"Sw<{self.bits},{self.base},{self.shift}>"

    def __repr__(self) -> str:
        return f"Swizzle({self.bits}, {self.base}, {self.shift})"


def make_swizzle(yyy_mask: int, zzz_mask: int) -> Swizzle:
    """The swizzle with the given Y (source) and Z (target) masks (CuTe's ``make_swizzle<Y, Z>``).

    Both masks must be runs of the same number of contiguous bits.
    """
    by, bz = bin(yyy_mask).count("1"), bin(zzz_mask).count("1")
    if by != bz:
        raise LayoutError(f"make_swizzle: Y mask {yyy_mask:#x} and Z mask {zzz_mask:#x} have different bit counts")
    if by == 0:
        return Swizzle(0, 0, 0)
    tz_y = (yyy_mask & -yyy_mask).bit_length() - 1
    tz_z = (zzz_mask & -zzz_mask).bit_length() - 1
    sw = Swizzle(by, min(tz_y, tz_z), tz_y - tz_z)
    if (sw.yyy_mask | sw.zzz_mask) != (yyy_mask | zzz_mask):
        raise LayoutError(f"make_swizzle: masks {yyy_mask:#x}, {zzz_mask:#x} are not contiguous runs a Swizzle can express")
    return sw
