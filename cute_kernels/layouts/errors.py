"""The exceptions the layout algebra raises for inadmissible input.

Every one is a :class:`LayoutError` (a ``ValueError``), so one ``except LayoutError`` catches
them all; the two refinements are also the built-in exceptions Python code expects: a coordinate
of the wrong type is a ``TypeError``, a negative index an ``IndexError``.
"""

from __future__ import annotations

__all__ = ["LayoutError", "LayoutTypeError", "LayoutIndexError"]


class LayoutError(ValueError):
    """An operation of the layout algebra was asked for outside its domain.

    The message names the condition that failed (for example "stride divisibility" in a
    composition, or "injective" for a complement), and the operands involved.
    """


class LayoutTypeError(LayoutError, TypeError):
    """A layout was given an argument of the wrong type (a string or a float as a coordinate)."""


class LayoutIndexError(LayoutError, IndexError):
    """An index or coordinate outside what a layout accepts (a negative one)."""
