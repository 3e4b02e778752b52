"""`kernel="auto"`: the highest rung of the attention ladder that can run a problem.

Dispatch knows only the rung interface (`registry`). The `decode` rung is the highest: its
`supports` takes the dense problems its split-KV kernels serve best (a few queries over a long
cache, `dense_decode`) and declines the rest with its reason, so "auto" routes those there
and everything else to the flash rungs. `NOT_AUTO` lists rungs "auto" never picks (none now).
`explain` says which rung "auto" picks for a problem and why, with every higher rung's reason
for declining.

What does not depend on the problem's sizes and strides (whether a rung is present, takes the
dtype, runs on the device's compute capability) is resolved once per (kernel, dtype, device)
for the default registry and cached, so a warm call asks only `supports` of the candidates and
never queries the device.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import registry as _registry
from .registry import KERNELS

__all__ = ["NOT_AUTO", "device_capability", "choose", "resolve", "clear_cache", "explain"]

# Rungs "auto" never picks.
NOT_AUTO: frozenset = frozenset()

# (kernel, dtype, device, capability function) -> the auto candidates, best first, or (rung,
# static reason) for a named rung. Only for the default registry, whose contents are fixed; the
# capability function is part of the key so a test replacing it never sees a stale answer.
_CANDIDATES: dict = {}


def clear_cache() -> None:
    """Forget the cached static checks (after a rung module is added or reloaded), and with
    them every launch plan (`runtime.plan_cache`), which assume the same rung choices."""
    from cute_kernels.runtime.plan_cache import invalidate

    _CANDIDATES.clear()
    invalidate()
    _registry.KERNELS.refresh()  # the registry itself, whatever a test put in its place here


def device_capability(device) -> tuple[int, int]:
    """(major, minor) of a CUDA device (tests replace this to mock one)."""
    import torch

    return tuple(torch.cuda.get_device_capability(device))


def _static_reason(rung, dtype, device) -> str | None:
    """Why `rung` can never run `dtype` on `device`, or None (independent of the problem)."""
    if dtype not in tuple(getattr(rung, "dtypes", ())):
        return f"dtype {dtype} not in {tuple(rung.dtypes)}"
    need = getattr(rung, "min_capability", None)
    if need is not None:
        have = device_capability(device)
        if tuple(have) < tuple(need):
            return f"needs compute capability {need[0]}.{need[1]}, device has {have[0]}.{have[1]}"
    return None


def _why_not(rung, q, k, v, problem) -> str | None:
    return _static_reason(rung, problem.dtype, q.device) or rung.supports(q, k, v, problem)


def _choose_uncached(q, k, v, problem, registry: Mapping):
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


def _auto_candidates(dtype, device) -> tuple:
    key = ("auto", dtype, device, device_capability)
    found = _CANDIDATES.get(key)
    if found is None:
        found = tuple(
            KERNELS[name] for name in reversed(list(KERNELS))
            if name not in NOT_AUTO and _static_reason(KERNELS[name], dtype, device) is None
        )
        _CANDIDATES[key] = found
    return found


def choose(q, k, v, problem, *, registry: Mapping = KERNELS):
    """The highest rung (ladder order, `NOT_AUTO` skipped) supporting the problem; ValueError
    listing every rung's reason when none does."""
    if registry is KERNELS:
        for rung in _auto_candidates(problem.dtype, q.device):
            if rung.supports(q, k, v, problem) is None:
                return rung
    # Another registry, or no rung fits (the error path rebuilds every rung's reason).
    return _choose_uncached(q, k, v, problem, registry)


def _named(kernel: str, dtype, device, registry: Mapping):
    """(rung, static reason or None) for a rung asked for by name; raises for unknown names."""
    if kernel not in registry:
        raise ValueError(f"unknown attention kernel {kernel!r}; available: {['auto', *registry]}")
    rung = registry[kernel]
    return rung, _static_reason(rung, dtype, device)


def resolve(kernel: str, q, k, v, problem, *, registry: Mapping = KERNELS):
    """The rung for `kernel` ("auto" or a rung name); a named rung that cannot run the problem
    raises ValueError with its reason (no fallback)."""
    if kernel == "auto":
        return choose(q, k, v, problem, registry=registry)
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be 'auto' or a rung name (str), got {type(kernel).__name__}")
    if registry is KERNELS:
        key = (kernel, problem.dtype, q.device, device_capability)
        named = _CANDIDATES.get(key)
        if named is None:
            named = _CANDIDATES[key] = _named(kernel, problem.dtype, q.device, registry)
    else:
        named = _named(kernel, problem.dtype, q.device, registry)
    rung, why = named
    if why is None:
        why = rung.supports(q, k, v, problem)
    if why is not None:
        raise ValueError(f"attention kernel {kernel!r} cannot run this problem: {why}")
    return rung


def explain(q, k, v, problem, *, registry: Mapping = KERNELS) -> str:
    """Why "auto" picks the rung it picks for this problem: each rung from the top of the ladder
    with its reason for declining, then the chosen one with its `route_reason` (when it has
    one). Raises ValueError as `choose` does when no rung supports the problem."""
    lines = []
    for name in reversed(list(registry)):
        if name in NOT_AUTO:
            continue
        rung = registry[name]
        why = _why_not(rung, q, k, v, problem)
        if why is None:
            reason = getattr(rung, "route_reason", None)
            lines.append(f"{name}: chosen" + (f" ({reason(problem)})" if reason is not None else ""))
            return "; ".join(lines)
        lines.append(f"{name}: {why}")
    raise ValueError(f"no attention kernel supports this problem ({problem.describe()}): {'; '.join(lines)}")
