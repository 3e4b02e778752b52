"""The one exception the layout algebra raises for inadmissible input."""

from __future__ import annotations

__all__ = ["LayoutError"]


class LayoutError(ValueError):
    """An operation of the layout algebra was asked for outside its domain.

    The message names the condition that failed (for example "stride divisibility" in a
    composition, or "injective" for a complement), and the operands involved.
    """
