"""`kernel="auto"`: pick the highest rung of the ladder that can run a problem.

Dispatch knows nothing about kernels beyond the rung interface (see `registry`): it walks the
ladder from the top and returns the first rung whose `min_capability` the device meets and whose
`supports(a, b, out)` answers None. Failing rungs (and rungs whose module cannot be imported)
leave their reason in the error raised when none fits.
"""

from __future__ import annotations

from collections.abc import Mapping

from .registry import KERNELS

__all__ = ["device_capability", "choose", "resolve"]


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


def _why_not(rung, a, b, out) -> str | None:
    if a.dtype not in tuple(getattr(rung, "dtypes", ())):
        return f"input dtype {a.dtype} not in {tuple(rung.dtypes)}"
    return _arch_reason(rung, a.device) or rung.supports(a, b, out)


def choose(a, b, out, *, registry: Mapping = KERNELS):
    """The best rung (highest in ladder order) that supports this problem on this device.

    Raises ValueError listing every rung's reason when none does.
    """
    reasons = []
    for name in reversed(list(registry)):
        try:
            rung = registry[name]
        except ImportError as err:  # e.g. a rung needing a package this install lacks
            reasons.append(f"{name}: cannot be imported ({err})")
            continue
        why = _why_not(rung, a, b, out)
        if why is None:
            return rung
        reasons.append(f"{name}: {why}")
    shape = f"a {tuple(a.shape)} {a.dtype}, b {tuple(b.shape)}, out {tuple(out.shape)} {out.dtype}"
    detail = "; ".join(reasons) if reasons else "no GEMM kernels are registered"
    raise ValueError(f"no GEMM kernel supports this problem ({shape}): {detail}")


def resolve(kernel: str, a, b, out, *, registry: Mapping = KERNELS):
    """The rung for `kernel` ("auto" or a rung name), checked against the problem.

    A named rung that cannot run the problem raises ValueError with its reason (no fallback:
    asking for a rung by name means wanting that one).
    """
    if kernel == "auto":
        return choose(a, b, out, registry=registry)
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be 'auto' or a rung name (str), got {type(kernel).__name__}")
    if kernel not in registry:
        raise ValueError(f"unknown GEMM kernel {kernel!r}; available: {['auto', *registry]}")
    rung = registry[kernel]
    why = _why_not(rung, a, b, out)
    if why is not None:
        raise ValueError(f"GEMM kernel {kernel!r} cannot run this problem: {why}")
    return rung
