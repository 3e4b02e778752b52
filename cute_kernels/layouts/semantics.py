"""Which CuTe the algebra follows where NVIDIA's implementations disagree: composing with a right
operand that reaches beyond the left operand's domain.

``composition(A, B)`` is defined on B's domain; where B's image goes past ``size(A)``, A must be
*extended*, and the implementations extend it differently:

* ``"dsl"`` (the default): the CuTe DSL 4.8.1, and CuTe C++ since CUTLASS 3.5, whose
  ``composition`` runs on ``detail::coalesce_x(A, coprofile(B))``. Beyond its domain A continues
  its **last leaf as written**, a trailing size-1 mode included: ``(8,1):(1,1)`` continues with
  stride 1, so ``composition(Layout((8,1),(1,1)), Layout((8,1,2),(2,32,1)))`` is
  ``((4,2),1,2):((2,1),4,1)``, and ``composition(Layout(1,1), Layout(2,1))`` is ``2:1``. This is
  also what ``A(i)`` computes for ``i >= size(A)``. ``"cpp"`` names the same rule: compiling
  those two cases against CuTe's C++ headers (nvidia-cutlass 4.2) prints exactly these layouts.
* ``"pycute"``: NVIDIA's pycute (``python/pycute``, nvidia-cutlass 4.2), which composes against
  ``coalesce(A)`` (here: coalesced against B's coprofile). Size-1 modes vanish first, so A
  continues its **last non-trivial mode**, and a layout of size 1 is ``1:0``: the same two cases give
  ``(8,1,2):(2,32,1)`` and ``2:0``. Two more pycute rules come with it: ``logical_divide``
  completes the tiler to ``size(A)`` (``complement(tiler, size(A))``) rather than to
  ``shape(coalesce(A))``, and a tuple tiler keeps A's modes beyond the tiler instead of dropping
  them.

Inside A's domain the two agree. Everything that composes follows the chosen rule: the divides,
the products (whose right operand stays within the complement, so they agree in practice),
``tile_to_shape``, ``with_shape``. Choose it per call, ``composition(A, B, semantics="pycute")``,
or for a block of code::

    with layout_semantics("pycute"):
        tiles = zipped_divide(A, tiler)

Post-conditions (property-tested, and cross-checked against the DSL and pycute on random pairs
that reach beyond A): under ``"dsl"``, ``R(c) == A(B(c))`` for every coordinate ``c`` of B, A
evaluated past its size by its own formula; under ``"pycute"``, ``R(c) == coalesce(A)(B(c))``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, Iterator

from .errors import LayoutError

__all__ = ["SEMANTICS", "layout_semantics", "current_semantics", "resolve_semantics", "with_semantics"]

SEMANTICS = ("dsl", "cpp", "pycute")
_ALIASES = {"dsl": "dsl", "cpp": "dsl", "c++": "dsl", "cute": "dsl", "pycute": "pycute"}

_current: contextvars.ContextVar[str] = contextvars.ContextVar("cute_kernels_layout_semantics", default="dsl")


def resolve_semantics(semantics: Any) -> str:
    """The canonical rule (``"dsl"`` or ``"pycute"``) for a name; ``None`` is the current one."""
    if semantics is None:
        return _current.get()
    rule = _ALIASES.get(semantics.lower() if isinstance(semantics, str) else semantics)
    if rule is None:
        raise LayoutError(f"unknown layout semantics {semantics!r}; use one of {', '.join(SEMANTICS)}")
    return rule


def current_semantics() -> str:
    """The rule in force: ``"dsl"`` unless a :func:`layout_semantics` block says otherwise."""
    return _current.get()


@contextlib.contextmanager
def layout_semantics(semantics: str) -> Iterator[str]:
    """Run a block under ``semantics`` (``"dsl"``, ``"cpp"`` or ``"pycute"``); nests and is
    thread- and task-local (a :class:`contextvars.ContextVar`)."""
    token = _current.set(resolve_semantics(semantics))
    try:
        yield _current.get()
    finally:
        _current.reset(token)


def with_semantics(fn: Callable) -> Callable:
    """Give ``fn`` a keyword-only ``semantics=None`` argument that runs it under that rule."""

    @functools.wraps(fn)
    def run(*args: Any, semantics: str | None = None, **kwargs: Any) -> Any:
        if semantics is None:
            return fn(*args, **kwargs)
        with layout_semantics(semantics):
            return fn(*args, **kwargs)

    return run
