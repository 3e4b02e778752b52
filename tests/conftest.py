"""Shared test configuration: markers, hypothesis profiles, and clean skips.

- `gpu` tests skip with a reason where CUDA is absent.
- `compile` tests skip where the CuTe DSL is not importable; they set CUTE_DSL_ARCH=sm_90a so
  kernels compile for Hopper on a machine without a GPU.
- With CI set, hypothesis runs the derandomized `ci` profile (no deadline); `HYPOTHESIS_PROFILE=deep`
  selects the long `deep` profile (tests/layouts/test_laws.py scales its 21,000-example law set with it).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", deadline=None, max_examples=200)
# For users hunting rare cases: HYPOTHESIS_PROFILE=deep python3 -m pytest tests/layouts (fresh draws every
# run, 25x the dev examples per property; the bulk law set in test_laws.py runs 5x its CI count, 105,000).
settings.register_profile("deep", deadline=None, max_examples=5000, suppress_health_check=[HealthCheck.too_slow],
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _dsl_available() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def pytest_collection_modifyitems(config, items):
    have_cuda = _cuda_available()
    have_dsl = _dsl_available()
    for item in items:
        if "gpu" in item.keywords:
            if not have_cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)"))
            elif not have_dsl:
                item.add_marker(pytest.mark.skip(reason="needs the CuTe DSL (nvidia-cutlass-dsl) importable"))
        if "compile" in item.keywords and not have_dsl:
            item.add_marker(pytest.mark.skip(reason="needs the CuTe DSL (nvidia-cutlass-dsl) to compile for sm_90a"))


def pytest_configure(config):
    # Compile-only builds target Hopper wherever no GPU says otherwise.
    if not _cuda_available():
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    # A private compile/autotune cache: winners a developer stored under ~/.cache must not change
    # which config a test runs.
    if "CUTE_KERNELS_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["CUTE_KERNELS_CACHE_DIR"] = tempfile.mkdtemp(prefix="cute_kernels_test_cache_")


@pytest.fixture
def enqueue_only():
    """`run(fn, calls=100) -> µs of host time per call` of a warm `fn`, the calls made under
    torch's CUDA sync debug mode "error": a call that waits for the device (a synchronize, a
    device-to-host copy, `.item()`, `nonzero`) raises RuntimeError there, so a test of "a warm
    call never waits for the GPU" fails on the wait itself, not on a race between the host and a
    queued GPU spin. The time is for printing only (the `overhead` bench measures it)."""
    import time

    import torch

    def run(fn, calls: int = 100) -> float:
        fn()  # compile or load, allocate the placeholders
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            elapsed = time.perf_counter() - start
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        return elapsed / calls * 1e6

    return run
