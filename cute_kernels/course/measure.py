"""GPU-side helpers of the course's measurements: one timer, checks before timing, device facts.

Every measurement checks the probe's output against its torch reference (`probes.reference`)
on the very inputs it then times, and raises if they disagree: a wrong kernel's speed is not
reported. Times are medians of `triton.testing.do_bench` (CUDA events when triton is absent),
the L2 flushed before every call, as the benchmark harness does (`bench.timing`).
"""

from __future__ import annotations

import functools
import math

__all__ = ["time_ms", "check_close", "check_equal", "sm_count", "device_props", "randn", "run_probe"]


@functools.cache
def _timer():
    from cute_kernels.bench.timing import make_gpu_timer

    return make_gpu_timer(warmup_ms=10.0, rep_ms=40.0)


def time_ms(fn, label: str = "") -> float:
    """Median milliseconds of one call of `fn` (L2 flushed before each call)."""
    return float(_timer()(fn, label))


def check_close(got, ref, what: str, *, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    import torch

    got64, ref64 = got.double(), ref.double().to(got.device)
    if got64.shape != ref64.shape:
        raise AssertionError(f"{what}: shape {tuple(got64.shape)} != reference {tuple(ref64.shape)}")
    if not torch.isfinite(got64).all():
        raise AssertionError(f"{what}: the output holds NaN or Inf")
    err = (got64 - ref64).abs()
    bad = err > atol + rtol * ref64.abs()
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise AssertionError(f"{what}: element {i} is {float(got64.flatten()[i])}, reference "
                             f"{float(ref64.flatten()[i])} ({int(bad.sum())} of {bad.numel()} off)")


def check_equal(got, ref, what: str) -> None:
    import torch

    if not torch.equal(got, ref.to(got.device)):
        raise AssertionError(f"{what}: {int((got != ref).sum())} of {got.numel()} elements differ from the reference")


def device_props():
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device())


def sm_count() -> int:
    return device_props().multi_processor_count


def randn(n: int, *, dtype=None, seed: int = 0):
    """N(0, 1) fp32 (or `dtype`) on the GPU from a seeded generator: never zeros or small integers."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(n, device="cuda", generator=gen, dtype=dtype or torch.float32)


def run_probe(job, *args):
    """Launch a probe's job (see `probes._launch.run`)."""
    from cute_kernels.probes._launch import run

    run(job, *args)


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9 if ms > 0 else math.nan
