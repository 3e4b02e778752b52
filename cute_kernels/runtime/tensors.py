"""Kernel arguments: DSL tensors for torch tensors, fake tensors for compile-only builds,
and torch's current CUDA stream.

One compiled artifact serves every problem size because both kinds of tensor have the same
structure: every size is a dynamic 32-bit value, every stride a dynamic 64-bit value except
the unit-stride ("leading") mode, whose stride is the static constant 1. A static unit
stride is what lets the compiler prove that consecutive elements are contiguous, so copies
vectorize; the base pointer's alignment (`assumed_align`, bytes) completes that proof.
"""

from __future__ import annotations

_ALIGNMENTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _check_align(assumed_align: int) -> None:
    if assumed_align not in _ALIGNMENTS:
        raise ValueError(f"assumed_align must be a power of two in bytes up to 256, got {assumed_align!r}")


def _as_cutlass_dtype(dtype):
    """Accept either a DSL numeric type or a torch dtype."""
    import cutlass

    if isinstance(dtype, type) and issubclass(dtype, cutlass.Numeric):
        return dtype
    from .dtypes import cutlass_dtype

    return cutlass_dtype(dtype)


def leading_dim_of(shape, stride) -> int:
    """The unit-stride mode of a strided tensor.

    The mode with stride 1 and extent > 1; when no mode of extent > 1 has stride 1 but
    some mode has stride 1, the last such mode. Raises ValueError when no mode has
    stride 1 (our kernels require one contiguous mode).
    """
    unit = [i for i, s in enumerate(stride) if s == 1]
    if not unit:
        raise ValueError(f"tensor with shape {tuple(shape)} and strides {tuple(stride)} has no unit-stride dimension")
    big = [i for i in unit if shape[i] > 1]
    return big[0] if len(big) == 1 else unit[-1]


def tma_view(t, leading_modes: tuple = (0, 1)):
    """`t` as a view a TMA descriptor can address, or None when no such view exists.

    A descriptor needs a 16-byte aligned base, one unit-stride ("leading") mode, and every
    other stride a multiple of 16 bytes (0 included). The leading mode is a unit-stride mode
    among `leading_modes`, one of extent > 1 when there is one. Modes of extent 1 are never
    stepped, so their stride is free: a non-leading one whose stride TMA cannot take gets the
    tensor's span rounded up to 16 bytes (a stride of 1 there would also read as a second
    leading mode to a kernel that deduces the major from the strides).

    Post-conditions (result `v` not None): `v` views the same elements at the same addresses
    as `t`; its leading mode has stride 1 and is the only mode of `leading_modes` that does;
    every other stride is a multiple of 16 bytes; `tma_view(v, leading_modes) is v`.
    """
    if t.data_ptr() % 16:
        return None
    shape, stride = tuple(t.shape), list(t.stride())
    es = t.element_size()
    units = [i for i in leading_modes if stride[i] == 1]
    if not units:
        units = [i for i in leading_modes if shape[i] == 1]  # an extent-1 mode can take stride 1
    big = [i for i in units if shape[i] > 1]
    if not units or len(big) > 1:  # no unit stride; or two of extent > 1, which overlap
        return None
    lead = big[0] if big else units[0]
    span = max([1] + [s * e for s, e in zip(stride, shape) if e > 1])
    free = -(-span * es // 16) * 16 // es
    changed = stride[lead] != 1
    stride[lead] = 1
    for i, e in enumerate(shape):
        if i == lead or (stride[i] * es) % 16 == 0:
            continue
        if e != 1:
            return None
        stride[i], changed = free, True
    return t.as_strided(shape, stride) if changed else t


def from_torch(t, *, assumed_align: int = 16, leading_dim: int | None = None, tvm_ffi: bool = False):
    """A DSL tensor viewing torch tensor `t`, with dynamic sizes and strides.

    Post-conditions: the result's layout is `t`'s shape:stride with every size and every
    stride dynamic except the stride of `leading_dim` (default: deduced by
    `leading_dim_of`), which is the static 1. Its pointer is assumed `assumed_align`-byte
    aligned; this is checked, and a misaligned tensor raises ValueError rather than
    letting the kernel read out of alignment. A tensor that requires grad is viewed through
    its detached alias (same storage), since DLPack cannot export it.
    """
    _check_align(assumed_align)
    if t.data_ptr() % assumed_align:
        raise ValueError(
            f"tensor data pointer 0x{t.data_ptr():x} is not {assumed_align}-byte aligned "
            "(pass a smaller assumed_align or make the tensor contiguous)"
        )
    shape, stride = t.shape, t.stride()
    if leading_dim is None:
        leading_dim = leading_dim_of(shape, stride)
    else:
        ndim = t.dim()
        if not -ndim <= leading_dim < ndim:
            raise ValueError(f"leading_dim {leading_dim} out of range for a {ndim}-d tensor")
        leading_dim %= ndim
        if stride[leading_dim] != 1:
            raise ValueError(f"leading_dim {leading_dim} has stride {stride[leading_dim]}, not 1")
    from cutlass.cute.runtime import from_dlpack

    # DLPack refuses tensors that require grad; kernels run under autograd functions whose
    # inputs still carry requires_grad, and a detached view shares the same storage.
    if t.requires_grad:
        t = t.detach()
    return from_dlpack(t, assumed_align=assumed_align, enable_tvm_ffi=tvm_ffi).mark_layout_dynamic(
        leading_dim=leading_dim
    )


def fake_tensor(
    dtype,
    ndim: int,
    *,
    leading_dim: int = -1,
    assumed_align: int = 16,
    stride_divisibility: int = 1,
    shape: tuple | None = None,
):
    """A compile-only stand-in for an `ndim`-d tensor with symbolic sizes.

    `dtype` is a DSL numeric type or a torch dtype. Every size is a fresh dynamic 32-bit
    value unless `shape` gives it (an int there makes that size static; None keeps it
    dynamic); every stride is a dynamic 64-bit value divisible by `stride_divisibility`
    (elements), except mode `leading_dim`, whose stride is the static 1. A kernel compiled
    with it accepts `from_torch(t, assumed_align=...)` of any tensor of that dtype and rank
    whose `leading_dim` has unit stride.
    """
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    _check_align(assumed_align)
    if ndim < 1:
        raise ValueError(f"ndim must be at least 1, got {ndim}")
    if not -ndim <= leading_dim < ndim:
        raise ValueError(f"leading_dim {leading_dim} out of range for ndim {ndim}")
    if stride_divisibility < 1:
        raise ValueError(f"stride_divisibility must be positive, got {stride_divisibility}")
    leading_dim %= ndim
    if shape is None:
        shape = (None,) * ndim
    if len(shape) != ndim:
        raise ValueError(f"shape {shape} does not have {ndim} modes")
    sizes = tuple(cute.sym_int32() if s is None else int(s) for s in shape)
    strides = tuple(
        1 if i == leading_dim else cute.sym_int64(divisibility=stride_divisibility) for i in range(ndim)
    )
    return make_fake_tensor(_as_cutlass_dtype(dtype), sizes, strides, assumed_align=assumed_align)


def fake_stream(*, tvm_ffi_env_stream: bool = False):
    """A compile-only stand-in for a CUDA stream argument.

    With `tvm_ffi_env_stream`, a function compiled with TVM-FFI drops the argument and
    launches on the caller's current torch stream instead.
    """
    from cutlass.cute.runtime import make_fake_stream

    return make_fake_stream(use_tvm_ffi_env_stream=tvm_ffi_env_stream)


def current_stream():
    """torch's current CUDA stream, as the `cuda.CUstream` a compiled function takes.

    Raises RuntimeError without a CUDA device (use `fake_stream()` to compile only).
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("current_stream() needs a CUDA device; use fake_stream() for compile-only builds")
    import cuda.bindings.driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)
