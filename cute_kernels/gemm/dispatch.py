"""`kernel="auto"`: pick the highest rung of the ladder that can run a problem.

Dispatch knows nothing about kernels beyond the rung interface (see `registry`): it walks the
ladder from the top and returns the first rung whose `min_capability` the device meets and whose
`supports(a, b, out)` answers None. Failing rungs (and rungs whose module cannot be imported)
leave their reason in the error raised when none fits.

What does not depend on the problem's sizes and strides (whether a rung imports, takes the input
dtype, runs on the device's compute capability) is resolved once per (kernel, dtype, device)
for the default registry and cached, so a warm call asks only `supports` of the candidates.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import registry as _registry
from .registry import KERNELS

__all__ = ["device_capability", "choose", "resolve", "clear_cache"]

# (kernel, input dtype, device, capability function) -> the rungs, best first, that pass the
# static checks (import, dtype, arch). Only for the default registry, whose contents are fixed.
_CANDIDATES: dict = {}


def clear_cache() -> None:
    """Forget the cached static checks (after a rung module is added or reloaded), and with
    them every launch plan (`runtime.plan_cache`), which assume the same rung choices."""
    from cute_kernels.runtime.plan_cache import invalidate

    _CANDIDATES.clear()
    invalidate()
    _registry.KERNELS.refresh()  # the registry itself, whatever a test put in its place here


def device_capability(device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (tests replace this to mock one)."""
    import torch

    return tuple(torch.cuda.get_device_capability(device))


def _arch_reason(rung, device) -> str | None:
    need = getattr(rung, "min_capability", None)
    if need is None:
        return None
    have = device_capability(device)
    if tuple(have) < tuple(need):
        return f"needs compute capability {need[0]}.{need[1]}, device has {have[0]}.{have[1]}"
    return None


def _static_reason(rung, dtype, device) -> str | None:
    """Why `rung` can never run inputs of `dtype` on `device`, or None (problem-independent)."""
    if dtype not in tuple(getattr(rung, "dtypes", ())):
        return f"input dtype {dtype} not in {tuple(rung.dtypes)}"
    return _arch_reason(rung, device)


def _why_not(rung, a, b, out) -> str | None:
    return _static_reason(rung, a.dtype, a.device) or rung.supports(a, b, out)


def _ladder_top_first(registry: Mapping):
    """(name, rung or None, import error reason or None) from the top of the ladder down."""
    for name in reversed(list(registry)):
        try:
            yield name, registry[name], None
        except ImportError as err:  # e.g. a rung needing a package this install lacks
            yield name, None, f"cannot be imported ({err})"


def _choose_uncached(a, b, out, registry: Mapping):
    reasons = []
    for name, rung, import_error in _ladder_top_first(registry):
        why = import_error or _why_not(rung, a, b, out)
        if why is None:
            return rung
        reasons.append(f"{name}: {why}")
    shape = f"a {tuple(a.shape)} {a.dtype}, b {tuple(b.shape)}, out {tuple(out.shape)} {out.dtype}"
    detail = "; ".join(reasons) if reasons else "no GEMM kernels are registered"
    raise ValueError(f"no GEMM kernel supports this problem ({shape}): {detail}")


def _auto_candidates(dtype, device) -> tuple:
    key = ("auto", dtype, device, device_capability)
    found = _CANDIDATES.get(key)
    if found is None:
        found = tuple(
            rung for _, rung, import_error in _ladder_top_first(KERNELS)
            if import_error is None and _static_reason(rung, dtype, device) is None
        )
        _CANDIDATES[key] = found
    return found


def choose(a, b, out, *, registry: Mapping = KERNELS):
    """The best rung (highest in ladder order) that supports this problem on this device.

    Raises ValueError listing every rung's reason when none does.
    """
    if registry is KERNELS:
        for rung in _auto_candidates(a.dtype, a.device):
            if rung.supports(a, b, out) is None:
                return rung
    # Another registry, or no rung fits (the error path rebuilds every rung's reason).
    return _choose_uncached(a, b, out, registry)


def _named(kernel: str, dtype, device, registry: Mapping):
    """(rung, static reason or None) for a rung asked for by name; raises for unknown names."""
    if kernel not in registry:
        raise ValueError(f"unknown GEMM kernel {kernel!r}; available: {['auto', *registry]}")
    rung = registry[kernel]
    return rung, _static_reason(rung, dtype, device)


def resolve(kernel: str, a, b, out, *, registry: Mapping = KERNELS):
    """The rung for `kernel` ("auto" or a rung name), checked against the problem.

    A named rung that cannot run the problem raises ValueError with its reason (no fallback:
    asking for a rung by name means wanting that one).
    """
    if kernel == "auto":
        return choose(a, b, out, registry=registry)
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be 'auto' or a rung name (str), got {type(kernel).__name__}")
    if registry is KERNELS:
        key = (kernel, a.dtype, a.device, device_capability)
        named = _CANDIDATES.get(key)
        if named is None:
            named = _CANDIDATES[key] = _named(kernel, a.dtype, a.device, registry)
    else:
        named = _named(kernel, a.dtype, a.device, registry)
    rung, why = named
    if why is None:
        why = rung.supports(a, b, out)
    if why is not None:
        raise ValueError(f"GEMM kernel {kernel!r} cannot run this problem: {why}")
    return rung
