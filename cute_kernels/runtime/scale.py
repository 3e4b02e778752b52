"""A minimal kernel that exercises the runtime end to end: `y = alpha * x`, elementwise.

It is the runtime's own test subject (compile cache, dynamic sizes, launch on torch's stream,
TVM-FFI, SASS inspection), not part of the kernel library: its variant is registered only by
`register_variant_for_tests()`.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda

from .cache import TVM_FFI_OPTION, compile_kernel, lookup_kernel, tvm_ffi_available
from .tensors import current_stream
from .registry import CompileJob, register_variant
from .tensors import fake_stream, fake_tensor, from_torch

_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class ScaleConfig:
    """`threads` per block (a multiple of 32, at most 1024) over `dtype` elements."""

    threads: int = 128
    dtype: str = "float32"

    def validate(self) -> None:
        if not (32 <= self.threads <= 1024 and self.threads % 32 == 0):
            raise ValueError(f"ScaleConfig.threads must be a multiple of 32 in [32, 1024], got {self.threads}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"ScaleConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")

    @property
    def cutlass_dtype(self):
        return {"float32": cutlass.Float32, "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[self.dtype]


class ScaleKernel:
    """One thread per element of a 1-D tensor; blocks of `config.threads`."""

    def __init__(self, config: ScaleConfig):
        config.validate()
        self.config = config

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, alpha: cutlass.Float32, stream: cuda.CUstream):
        n = cute.size(x.shape[0])
        threads = self.config.threads
        self.kernel(x, y, alpha).launch(grid=((n + threads - 1) // threads, 1, 1), block=(threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor, alpha: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * self.config.threads + tidx
        if i < cute.size(x.shape[0]):
            y[i] = (x[i].to(cutlass.Float32) * alpha).to(x.element_type)


def compile_job(threads: int = 128, dtype: str = "float32", tvm_ffi: bool = False) -> CompileJob:
    """The compile-only build of `ScaleKernel` (fake tensors of symbolic length)."""
    config = ScaleConfig(threads, dtype)
    kernel = ScaleKernel(config)
    x = fake_tensor(config.cutlass_dtype, 1)
    y = fake_tensor(config.cutlass_dtype, 1)
    return CompileJob(
        kernel,
        (x, y, cutlass.Float32(1.0), fake_stream(tvm_ffi_env_stream=tvm_ffi)),
        key=("runtime.scale", config, tvm_ffi),
        options=TVM_FFI_OPTION if tvm_ffi else None,
    )


_TORCH_DTYPE_NAMES: dict = {}


def scale(x, alpha: float, out=None, *, threads: int = 128, tvm_ffi: bool | None = None):
    """`out = alpha * x` for a contiguous 1-D CUDA tensor `x`, on torch's current stream.

    `tvm_ffi=None` uses TVM-FFI when `tvm_ffi` is importable. Returns `out`. The warm path
    is one dict lookup plus the launch: sizes are dynamic, so any length reuses the
    compiled function.
    """
    import torch

    if x.dim() != 1 or not x.is_cuda or x.stride(0) != 1:
        raise ValueError("scale expects a 1-D contiguous CUDA tensor")
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.stride(0) != 1 or out.device != x.device:
        raise ValueError("out must be a contiguous tensor with x's shape, dtype and device")
    if tvm_ffi is None:
        tvm_ffi = tvm_ffi_available()
    dtype = _TORCH_DTYPE_NAMES.get(x.dtype)
    if dtype is None:
        dtype = _TORCH_DTYPE_NAMES.setdefault(x.dtype, str(x.dtype).removeprefix("torch."))
    key = ("runtime.scale", ScaleConfig(threads, dtype), tvm_ffi)
    options = TVM_FFI_OPTION if tvm_ffi else None
    fn = lookup_kernel(key, options)
    if fn is None:
        job = compile_job(threads, dtype, tvm_ffi)
        fn = compile_kernel(job.jit_fn, *job.args, key=job.key, options=job.options)
    if tvm_ffi:
        fn(x, out, alpha)  # TVM-FFI launches on torch's current stream itself
    else:
        fn(from_torch(x), from_torch(out), alpha, current_stream())
    return out


def register_variant_for_tests() -> None:
    """Register "runtime.scale" (configs "default" and "fp16") in the inspection registry."""
    register_variant(
        "runtime.scale",
        compile_job,
        configs={"default": {}, "fp16": {"dtype": "float16", "threads": 256}},
        requires={"LDG", "STG"},
        forbids={"LDL", "STL"},
    )
