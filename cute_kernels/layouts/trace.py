"""A step recorder the algebra writes to while :func:`~cute_kernels.layouts.explain.explain` runs.

Operations call ``if tracing(): note(kind, text, **data)`` at the points worth explaining (each
mode a composition walks, each gap a complement fills); outside an ``explain`` nothing is
recorded and the check is one context-variable read.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterator

__all__ = ["Step", "tracing", "note", "recording", "suspended"]


@dataclass(frozen=True)
class Step:
    """One recorded step: a ``kind`` (``"flatten"``, ``"mode"``, ``"fail"``...), its sentence, and data for pictures."""

    kind: str
    text: str
    data: dict = field(default_factory=dict)


_steps: contextvars.ContextVar[list | None] = contextvars.ContextVar("cute_kernels_layout_trace", default=None)


def tracing() -> bool:
    return _steps.get() is not None


def note(kind: str, text: str, **data: Any) -> None:
    steps = _steps.get()
    if steps is not None:
        steps.append(Step(kind, text, data))


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Record the steps of the operations run inside the block into the yielded list."""
    token = _steps.set([])
    try:
        yield _steps.get()
    finally:
        _steps.reset(token)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Record nothing inside the block (an operation re-running itself, say)."""
    token = _steps.set(None)
    try:
        yield
    finally:
        _steps.reset(token)
