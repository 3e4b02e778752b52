"""Host-side pieces every fused kernel's torch entry point shares: argument checks that name the
problem, the vector width the tensors allow, flattening to (rows, width) views, the SM count,
and the TVM-FFI compile of a kernel from its fake arguments (cached by `runtime.compile_kernel`
per config).

Kernels launch through TVM-FFI only (the function takes torch tensors and launches on torch's
current stream); without apache-tvm-ffi a call raises RuntimeError saying so.
"""

from __future__ import annotations

import torch

__all__ = ["DTYPE_NAMES", "dtype_name", "check_tensor", "check_same_device", "rows_view", "tensor_vec",
           "compile_tvm_ffi", "nograd"]

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def dtype_name(dtype) -> str:
    return DTYPE_NAMES[dtype]


def check_tensor(op: str, name: str, t, *, dtypes=tuple(DTYPE_NAMES), ndim=None) -> None:
    """TypeError unless `t` is a torch tensor of one of `dtypes` (and `ndim` dimensions)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; supported: {', '.join(str(d) for d in dtypes)}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {tuple(t.shape)}")


def check_same_device(op: str, tensors: dict) -> None:
    """ValueError unless every tensor (None entries skipped) is on one CUDA device; checked last,
    so that every other check can be exercised with CPU tensors."""
    first_name, first = None, None
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device.type != "cuda":
            raise ValueError(f"{op}: {name} is on device '{t.device}', but the kernel runs on CUDA devices only")
        if first is None:
            first_name, first = name, t
        elif t.device != first.device:
            raise ValueError(f"{op}: {name} is on {t.device} but {first_name} is on {first.device}")


def nograd(t):
    """`t` without autograd history (the same storage): the kernels' TVM-FFI calls take tensors
    through DLPack, which refuses tensors that require grad."""
    return t.detach() if t is not None and t.requires_grad else t


def rows_view(t, width: int):
    """`t` (..., width) as a (rows, width) tensor whose last stride is 1: a view when the leading
    dimensions merge into one stride, else a contiguous copy (documented: non-mergeable or
    column-strided inputs are copied once). Never requires grad (`nograd`)."""
    if t.requires_grad:
        t = t.detach()
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.stride(-1) != 1 and width > 1:
        t = t.contiguous()
    rows = t.numel() // width if width else 0
    try:
        return t.view(rows, width)
    except RuntimeError:
        return t.reshape(rows, width)


def tensor_vec(width: int, tensors) -> int:
    """The widest vector (elements, 16 bytes of the narrowest dtype at most) every tensor allows:
    it divides the width, every row stride, and every data pointer's alignment (bytes: at least
    min(16, vec * element size)). `tensors`: 2-D (rows, width) or 1-D (width,) tensors, or None."""
    present = [t for t in tensors if t is not None]
    vec = 16 // min(t.element_size() for t in present)
    while vec > 1 and width % vec:
        vec //= 2
    for t in present:
        if t.dim() == 2:  # the compiled kernel assumes the row stride divisible by vec, even for one row
            while vec > 1 and t.stride(0) % vec:
                vec //= 2
        while vec > 1 and t.data_ptr() % min(16, vec * t.element_size()):
            vec //= 2
    return vec




def compile_tvm_ffi(kernel, fake_args: tuple, key: tuple):
    """The TVM-FFI function of `kernel` compiled from `fake_args` (its last argument the stream,
    made with `fake_stream(tvm_ffi_env_stream=True)`), cached by `key`."""
    from cute_kernels.runtime import TVM_FFI_OPTION, compile_kernel, tvm_ffi_available

    if not tvm_ffi_available():
        raise RuntimeError("cute_kernels.fused launches through TVM-FFI: install apache-tvm-ffi (the 'gpu' extra) "
                           "and leave CUTE_KERNELS_NO_TVM_FFI unset")
    return compile_kernel(kernel, *fake_args, key=key, options=TVM_FFI_OPTION)
