"""Torch-facing elementwise ops. `copy` checks its arguments, then runs `VectorCopy`."""

from __future__ import annotations

from cute_kernels.runtime.plan_cache import WarmCache

__all__ = ["copy"]

# The kernel indexes with 32-bit integers; longer tensors are copied in chunks of this many
# elements (a multiple of every tile size, so each chunk starts 16-byte aligned).
_CHUNK_ELEMENTS = 1 << 30


def _check(src, dst, torch) -> None:
    """Shape, dtype and layout first, the device last (so every check can be exercised on CPU)."""
    if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
        raise TypeError(f"copy takes torch tensors, got {type(src).__name__} and {type(dst).__name__}")
    if src.dtype != dst.dtype:
        raise TypeError(f"copy: src has dtype {src.dtype} but dst has dtype {dst.dtype} (no conversion is done)")
    if src.shape != dst.shape:
        raise ValueError(f"copy: src has shape {tuple(src.shape)} but dst has shape {tuple(dst.shape)}")
    if src.element_size() not in (1, 2, 4, 8):
        raise TypeError(f"copy: dtype {src.dtype} has {src.element_size()}-byte elements; supported: 1, 2, 4, 8")
    for name, t in (("src", src), ("dst", dst)):
        if not t.is_contiguous():
            raise ValueError(
                f"copy: {name} is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
                "the vectorized copy needs contiguous tensors (call .contiguous() first)"
            )
    if src.is_cuda and dst.is_cuda and src.device == dst.device:
        return
    for name, t in (("src", src), ("dst", dst)):
        if t.device.type != "cuda":
            raise ValueError(f"copy: {name} is on device '{t.device}', but the kernel runs on CUDA devices only")
    if src.device != dst.device:
        raise ValueError(f"copy: src is on {src.device} but dst is on {dst.device}")


def _vector_bytes(*tensors) -> int:
    """The widest access (<= 16 bytes) at which every tensor's data pointer is aligned."""
    width = 16
    for t in tensors:
        while t.data_ptr() % width:
            width //= 2
    return width


# Per-process state, filled on first use (torch, the kernel module, the default config, the
# TVM-FFI decision), and the warm-path cache (`runtime.plan_cache`) of (config asked for,
# vector bytes, element bytes) -> TVM-FFI function.
_state: dict = {}
_compiled = WarmCache("elementwise.copy.tvm_ffi")


def _init():
    import torch

    from cute_kernels.runtime import tvm_ffi_available

    from . import vector_copy

    _state.update(
        torch=torch,
        vc=vector_copy,
        default=vector_copy.CopyConfig(),
        # element bytes -> the integer dtype whose bits the kernel moves
        bits={1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64},
        tvm_ffi=tvm_ffi_available(),
    )
    return _state


def _compile_tvm_ffi(vc, config, element_bytes: int):
    """The TVM-FFI copy for `element_bytes`-wide elements under `config` (compiled from fake
    tensors: every length is a runtime value, the alignment is `config.vector_bytes`)."""
    from cute_kernels.runtime import TVM_FFI_OPTION, compile_kernel, fake_stream, fake_tensor

    dtype = vc.ELEMENT_TYPES[element_bytes]
    args = [fake_tensor(dtype, 1, leading_dim=0, assumed_align=config.vector_bytes) for _ in range(2)]
    return compile_kernel(
        vc.VectorCopy(config, element_bytes), *args, fake_stream(tvm_ffi_env_stream=True),
        key=("elementwise.vector_copy", "tvm_ffi", config, element_bytes), options=TVM_FFI_OPTION,
    )


def copy(src, dst=None, *, config=None):
    """Copy `src` into `dst` (allocated like `src` when None) with the vectorized copy kernel.

    Both tensors must be contiguous CUDA tensors on one device with the same shape and dtype
    (any dtype of 1, 2, 4 or 8 bytes; the bits are copied exactly). Accesses are 16 bytes wide
    when both data pointers are 16-byte aligned, else as wide as their alignment allows.
    Runs on torch's current stream and returns `dst`.
    """
    state = _state or _init()
    torch = state["torch"]
    if dst is None:
        if not isinstance(src, torch.Tensor):
            raise TypeError(f"copy takes torch tensors, got {type(src).__name__}")
        dst = torch.empty_like(src, memory_format=torch.contiguous_format)
    _check(src, dst, torch)
    numel = src.numel()
    if numel == 0:
        return dst
    element_bytes = src.element_size()
    base = state["default"] if config is None else config
    vector_bytes = max(min(base.vector_bytes, _vector_bytes(src, dst)), element_bytes)
    bits = state["bits"][element_bytes]
    flat_src = src.view(-1) if src.dtype == bits else src.view(-1).view(bits)
    flat_dst = dst.view(-1) if dst.dtype == bits else dst.view(-1).view(bits)
    if state["tvm_ffi"]:
        key = (config, vector_bytes, element_bytes)  # config None (the default) hashes fastest
        entry = _compiled.get(key)
        if entry is None:
            vc = state["vc"]
            cfg = vc.CopyConfig(base.threads, vector_bytes, base.vectors_per_thread).validate(element_bytes)
            entry = _compiled[key] = _compile_tvm_ffi(vc, cfg, element_bytes)
        # The function launches on the current stream of the tensors' device.
        if numel <= _CHUNK_ELEMENTS:
            entry(flat_src, flat_dst)
        else:
            for start in range(0, numel, _CHUNK_ELEMENTS):
                entry(flat_src[start:start + _CHUNK_ELEMENTS], flat_dst[start:start + _CHUNK_ELEMENTS])
        return dst

    from cute_kernels.runtime import compile_kernel, current_stream, from_torch

    vc = state["vc"]
    config = vc.CopyConfig(base.threads, vector_bytes, base.vectors_per_thread)
    config.validate(element_bytes)
    kernel = vc.VectorCopy(config, element_bytes)
    with torch.cuda.device(src.device):
        stream = current_stream()
        compiled = None
        for start in range(0, numel, _CHUNK_ELEMENTS):
            s = from_torch(flat_src[start:start + _CHUNK_ELEMENTS], assumed_align=config.vector_bytes, leading_dim=0)
            d = from_torch(flat_dst[start:start + _CHUNK_ELEMENTS], assumed_align=config.vector_bytes, leading_dim=0)
            if compiled is None:
                compiled = compile_kernel(kernel, s, d, stream, key=("elementwise.vector_copy", config, element_bytes))
            compiled(s, d, stream)
    return dst
