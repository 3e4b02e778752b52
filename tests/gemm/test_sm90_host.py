"""A warm sm90 call only enqueues: the Python + TVM-FFI path never waits for the GPU.

The calls run under torch's CUDA sync debug mode (`enqueue_only` in tests/conftest.py), so
anything in the call path that waits for the device (a synchronization, a blocking copy,
`.item()`) raises. The host time per call is printed beside torch.matmul's; the `overhead`
bench measures it. tests/gemm/test_sm90_call_path.py checks the same path on CPU, call by call.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


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
def test_warm_call_never_waits_for_the_gpu(path, enqueue_only):
    """A warm call only enqueues (a wait for the device raises under `enqueue_only`). The host
    time is printed; the `overhead` bench is where it is measured against torch.matmul."""
    _hopper()
    from cute_kernels.runtime import tvm_ffi_available

    cases = _cases()
    us = enqueue_only(cases[path])
    theirs = enqueue_only(cases["torch.matmul"])
    print(f"\nwarm {path} at 256^3: {us:.1f} us of host time per call (torch.matmul {theirs:.1f} us; "
          f"TVM-FFI available: {tvm_ffi_available()})")
