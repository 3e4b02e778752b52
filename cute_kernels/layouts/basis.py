"""Scaled basis elements (CuTe's ``E<i>`` / ``ScaledBasis``): strides that map into coordinates.

An identity layout maps a coordinate to itself; CuTe writes it with strides ``1@0, 1@1, ...``
where ``1@k`` is the unit vector along mode ``k``. Evaluating such a layout sums scaled unit
vectors, giving an :class:`ArithTuple`, a tuple that adds elementwise.
"""

from __future__ import annotations

from .int_tuple import is_int

__all__ = ["ScaledBasis", "ArithTuple", "E"]


class ArithTuple(tuple):
    """A tuple of ints that adds elementwise (shorter operands pad with 0) and scales by ints.

    It compares equal to the plain tuple with the same entries.
    """

    def __add__(self, other):
        if isinstance(other, ScaledBasis):
            other = other.as_tuple()
        if is_int(other) and other == 0:
            return self
        if not isinstance(other, tuple):
            return NotImplemented
        n = max(len(self), len(other))
        a = tuple(self) + (0,) * (n - len(self))
        b = tuple(other) + (0,) * (n - len(other))
        return ArithTuple(_add(x, y) for x, y in zip(a, b))

    __radd__ = __add__

    def __mul__(self, k):
        if not is_int(k):
            return NotImplemented
        return ArithTuple(_mul(x, k) for x in self)

    __rmul__ = __mul__

    def __repr__(self):
        return repr(tuple(self))


def _add(x, y):
    if isinstance(x, tuple) or isinstance(y, tuple):
        return ArithTuple(x if isinstance(x, tuple) else ()) + (y if isinstance(y, tuple) else ((y,) if y else ()))
    return x + y


def _mul(x, k):
    return ArithTuple(x) * k if isinstance(x, tuple) else x * k


class ScaledBasis:
    """``value @ mode``: ``value`` times the unit vector along ``mode`` (an int, or a path tuple for nested modes).

    Post-condition: ``ScaledBasis(v, m) * k == ScaledBasis(v * k, m)``, and the sum of basis
    elements is the :class:`ArithTuple` with those entries.
    """

    __slots__ = ("value", "mode")

    def __init__(self, value: int, mode):
        self.value = value
        self.mode = mode

    def as_tuple(self) -> ArithTuple:
        path = self.mode if isinstance(self.mode, tuple) else (self.mode,)
        out = self.value
        for k in reversed(path):
            out = ArithTuple((0,) * k + (out,))
        return out

    def __mul__(self, k):
        if is_int(k):
            return ScaledBasis(self.value * k, self.mode)
        return NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, k):
        if is_int(k):
            return ScaledBasis(self.value // k, self.mode)
        return NotImplemented

    def __add__(self, other):
        if is_int(other) and other == 0:
            return self
        return self.as_tuple() + other

    __radd__ = __add__

    def __eq__(self, other):
        return isinstance(other, ScaledBasis) and (self.value, self.mode) == (other.value, other.mode)

    def __hash__(self):
        return hash((ScaledBasis, self.value, self.mode))

    def __str__(self):
        # CuTe prints the innermost index first: mode (1, 0) (leaf 0 of mode 1) is "1@0@1".
        path = self.mode if isinstance(self.mode, tuple) else (self.mode,)
        return f"{self.value}@" + "@".join(str(m) for m in reversed(path))

    def __repr__(self):
        return f"E({self.mode!r}, {self.value})" if self.value != 1 else f"E({self.mode!r})"


def E(mode, value: int = 1) -> ScaledBasis:
    """The basis element ``value@mode`` (CuTe's ``E<mode>{} * value``)."""
    return ScaledBasis(value, mode)
