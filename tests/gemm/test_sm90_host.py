"""Host cost of a warm sm90 call: the Python + TVM-FFI path must enqueue in well under 40 µs.

Measured as the wall time of N back-to-back calls at 256³ while a long GPU spin queued first
keeps the device busy: the calls only enqueue, so GPU time cannot count, and anything in the
call path that waits for the GPU (a synchronization, a blocking host-to-device copy, `.item()`)
waits for the whole spin, which the test sees as the spin having finished before the calls
were all enqueued. 40 µs is about twice torch.matmul's host cost on the H200 host; the
DSL-tensor path (no TVM-FFI) costs ~100 µs and fails it. tests/gemm/test_sm90_call_path.py
checks the same path on CPU, call by call.
"""

import time

import pytest
import torch

pytestmark = pytest.mark.gpu

CALLS = 100
SPIN_CYCLES = 200_000_000  # ~0.1 s at H200 clocks: far longer than CALLS warm calls take to enqueue


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


def _host_us_per_call(fn) -> tuple[float, bool]:
    """(mean µs of host time per call of `fn`, whether the GPU was still busy after the last)."""
    fn()  # compile or load, allocate the placeholders
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN_CYCLES)
    spin_done = torch.cuda.Event()
    spin_done.record()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    elapsed = time.perf_counter() - start
    busy = not spin_done.query()
    torch.cuda.synchronize()
    return elapsed / CALLS * 1e6, busy


def _cases():
    from cute_kernels.gemm.epilogue_api import matmul_epilogue, scaled_mm
    from cute_kernels.gemm.sm90_persistent import rung

    dev = "cuda"
    a = torch.randn(1, 256, 256, device=dev, dtype=torch.bfloat16)
    w = torch.randn(1, 256, 256, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(256, device=dev, dtype=torch.bfloat16)
    out = torch.empty(1, 256, 256, device=dev, dtype=torch.bfloat16)
    a8, w8 = a[0].to(torch.float8_e4m3fn), w[0].to(torch.float8_e4m3fn)
    sa, sb = torch.rand(1, device=dev) + 0.5, torch.rand(1, device=dev) + 0.5
    return {
        "rung": lambda: rung(a, w.transpose(1, 2), out),
        "rung+bias+gelu": lambda: rung(a, w.transpose(1, 2), out, bias=bias, activation="gelu_tanh"),
        "matmul_epilogue": lambda: matmul_epilogue(a[0], w[0].t(), bias=bias, activation="gelu_tanh"),
        "scaled_mm": lambda: scaled_mm(a8, w8.t(), sa, sb),
        "torch.matmul": lambda: torch.matmul(a[0], w[0].t()),
    }


@pytest.mark.parametrize("path", ["rung", "rung+bias+gelu", "matmul_epilogue", "scaled_mm"])
def test_warm_call_never_waits_for_the_gpu(path):
    """A warm call only enqueues: the GPU, given a long spin first, is still busy after many
    calls (a sync in the path would wait for the spin). The host time is printed; the
    `overhead` bench is where it is measured against torch.matmul."""
    _hopper()
    from cute_kernels.runtime import tvm_ffi_available

    cases = _cases()
    us, busy = _host_us_per_call(cases[path])
    theirs, _ = _host_us_per_call(cases["torch.matmul"])
    print(f"\nwarm {path} at 256^3: {us:.1f} us of host time per call (torch.matmul {theirs:.1f} us)")
    assert busy, (f"a warm {path} call waited for the GPU (the queued spin finished during {CALLS} calls; "
                  f"TVM-FFI available: {tvm_ffi_available()})")
