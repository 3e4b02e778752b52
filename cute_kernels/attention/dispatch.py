"""`kernel="auto"`: the highest rung of the attention ladder that can run a problem.

Dispatch knows only the rung interface (`registry`). The decode rung serves its own entry
point, so "auto" for `scaled_dot_product_attention` skips rungs listed in `NOT_AUTO`.
"""

from __future__ import annotations

from collections.abc import Mapping

from .registry import KERNELS

__all__ = ["NOT_AUTO", "device_capability", "choose", "resolve"]

# sm90_flash stays opt-in (kernel="sm90_flash") until its GPU tests have passed on an H100/H200.
NOT_AUTO = frozenset({"decode", "sm90_flash"})


def device_capability(device) -> tuple[int, int]:
    """(major, minor) of a CUDA device (tests replace this to mock one)."""
    import torch

    return tuple(torch.cuda.get_device_capability(device))


def _why_not(rung, q, k, v, problem) -> str | None:
    if problem.dtype not in tuple(getattr(rung, "dtypes", ())):
        return f"dtype {problem.dtype} not in {tuple(rung.dtypes)}"
    need = getattr(rung, "min_capability", None)
    if need is not None:
        have = device_capability(q.device)
        if tuple(have) < tuple(need):
            return f"needs compute capability {need[0]}.{need[1]}, device has {have[0]}.{have[1]}"
    return rung.supports(q, k, v, problem)


def choose(q, k, v, problem, *, registry: Mapping = KERNELS):
    """The highest rung (ladder order, `NOT_AUTO` skipped) supporting the problem; ValueError
    listing every rung's reason when none does."""
    reasons = []
    for name in reversed(list(registry)):
        if name in NOT_AUTO:
            continue
        rung = registry[name]
        why = _why_not(rung, q, k, v, problem)
        if why is None:
            return rung
        reasons.append(f"{name}: {why}")
    detail = "; ".join(reasons) if reasons else "no attention kernels are registered"
    raise ValueError(f"no attention kernel supports this problem ({problem.describe()}): {detail}")


def resolve(kernel: str, q, k, v, problem, *, registry: Mapping = KERNELS):
    """The rung for `kernel` ("auto" or a rung name); a named rung that cannot run the problem
    raises ValueError with its reason (no fallback)."""
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be 'auto' or a rung name (str), got {type(kernel).__name__}")
    if kernel == "auto":
        return choose(q, k, v, problem, registry=registry)
    if kernel not in registry:
        raise ValueError(f"unknown attention kernel {kernel!r}; available: {['auto', *registry]}")
    rung = registry[kernel]
    why = _why_not(rung, q, k, v, problem)
    if why is not None:
        raise ValueError(f"attention kernel {kernel!r} cannot run this problem: {why}")
    return rung
