"""The `fallback=` option every operator takes, and how a routed call is made visible.

fallback="none" (the default): input our kernels cannot run (a CPU tensor, a dtype, strides,
shapes, a kernel not written yet) raises the kernel layer's error, which names the problem.
fallback="torch": such input is computed by PyTorch instead. Never silently: each distinct
reason warns once (`FallbackWarning`) and every routed call is counted in `FALLBACK_COUNTS`,
keyed by (operator, reason with its numbers blanked), so tests and users can see what ran where.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections import Counter

import torch

__all__ = [
    "FALLBACKS",
    "FallbackWarning",
    "FALLBACK_COUNTS",
    "UNSUPPORTED",
    "check_fallback",
    "note_fallback",
    "raise_unsupported",
    "on_cuda",
    "device_guard",
]

FALLBACKS = ("none", "torch")

# The exception types the kernel layer raises for input it does not take, always before any
# launch (see cute_kernels.gemm.api and cute_kernels.attention.api). Anything else propagates.
UNSUPPORTED = (ValueError, TypeError, NotImplementedError)


class FallbackWarning(UserWarning):
    """A cute_kernels operator computed a call with PyTorch because fallback="torch" was given."""


FALLBACK_COUNTS: Counter = Counter()
_warned: set = set()
_DIGITS = re.compile(r"\d+")
_SAME_DEVICE = contextlib.nullcontext()  # reusable: entering it does nothing


def check_fallback(op: str, fallback: str) -> None:
    """Raise ValueError unless `fallback` is one of `FALLBACKS`."""
    if fallback not in FALLBACKS:
        raise ValueError(f"cute_kernels.{op}: fallback must be one of {FALLBACKS}, got {fallback!r}")


def on_cuda(*tensors) -> bool:
    """True when every tensor given (None entries skipped) lives on a CUDA device."""
    return all(t is None or t.is_cuda for t in tensors)


def note_fallback(op: str, reason: str) -> None:
    """Record that `op` is computed by PyTorch for `reason`; warn the first time per reason."""
    key = (op, _DIGITS.sub("#", reason))
    FALLBACK_COUNTS[key] += 1
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"cute_kernels.{op}: computed by PyTorch (fallback='torch'): {reason}", FallbackWarning,
                      stacklevel=3)


def raise_unsupported(op: str, err: BaseException):
    """Re-raise `err` (the kernel layer's error) with a note on the fallback option."""
    if hasattr(err, "add_note"):
        err.add_note(f"cute_kernels.{op}: pass fallback='torch' to compute such input with PyTorch instead")
    raise err


def device_guard(t):
    """A context making `t`'s CUDA device current when it is not already (our kernels launch on
    the current device's current stream); a no-op context otherwise."""
    index = t.device.index
    if t.device.type != "cuda" or index is None or index == torch.cuda.current_device():
        return _SAME_DEVICE
    return torch.cuda.device(index)
