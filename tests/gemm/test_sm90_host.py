"""Host cost of a warm sm90 call: the Python + TVM-FFI path must enqueue well under the kernel.

The 2026-11-30 device run measured a whole `rung(...)` call at ~0.2 ms for 50 µs kernels and
~0.2 ms slower than the same kernel launched from a prebuilt launcher on a 1.3 ms GEMM, which
points at a synchronization or a slow step in the call path (the Python part alone costs
~20 µs on a CPU). With a 4096³ GEMM (~0.17 ms of GPU time) queued back to back, the median
enqueue time of a call is its host cost if nothing waits for the GPU, and at least the kernel
time if something does.
"""

import time

import pytest
import torch

pytestmark = pytest.mark.gpu


def _median_enqueue_us(fn, calls: int = 51) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return sorted(times)[calls // 2] * 1e6


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


@pytest.mark.parametrize("path", ["rung", "matmul_epilogue"])
def test_warm_call_does_not_wait_for_the_gpu(path):
    _hopper()
    from cute_kernels.gemm.epilogue_api import matmul_epilogue
    from cute_kernels.gemm.sm90_persistent import rung

    a = torch.randn(1, 4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1, 4096, 4096, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1, 4096, 4096, device="cuda", dtype=torch.bfloat16)
    if path == "rung":
        fn = lambda: rung(a, w.transpose(1, 2), out)  # noqa: E731
    else:
        fn = lambda: matmul_epilogue(a[0], w[0].t(), bias=bias, activation="gelu_tanh")  # noqa: E731
    fn()
    torch.cuda.synchronize()
    us = _median_enqueue_us(fn)
    assert us < 80, f"a warm {path} call takes {us:.0f} µs of host time (kernel ~170 µs): something waits"
