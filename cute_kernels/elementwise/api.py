"""Torch-facing elementwise ops. `copy` checks its arguments, then runs `VectorCopy`."""

from __future__ import annotations

__all__ = ["copy"]

# The kernel indexes with 32-bit integers; longer tensors are copied in chunks of this many
# elements (a multiple of every tile size, so each chunk starts 16-byte aligned).
_CHUNK_ELEMENTS = 1 << 30


def _bits_dtype(element_bytes: int):
    import torch

    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[element_bytes]


def _check(src, dst) -> None:
    """Shape, dtype and layout first, the device last (so every check can be exercised on CPU)."""
    import torch

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


def copy(src, dst=None, *, config=None):
    """Copy `src` into `dst` (allocated like `src` when None) with the vectorized copy kernel.

    Both tensors must be contiguous CUDA tensors on one device with the same shape and dtype
    (any dtype of 1, 2, 4 or 8 bytes; the bits are copied exactly). Accesses are 16 bytes wide
    when both data pointers are 16-byte aligned, else as wide as their alignment allows.
    Runs on torch's current stream and returns `dst`.
    """
    import torch

    from . import vector_copy as vc
    from cute_kernels.runtime import compile_kernel, current_stream, from_torch

    if dst is None:
        if not isinstance(src, torch.Tensor):
            raise TypeError(f"copy takes torch tensors, got {type(src).__name__}")
        dst = torch.empty_like(src, memory_format=torch.contiguous_format)
    _check(src, dst)
    if src.numel() == 0:
        return dst
    element_bytes = src.element_size()
    base = config if config is not None else vc.CopyConfig()
    vector_bytes = min(base.vector_bytes, _vector_bytes(src, dst))
    config = vc.CopyConfig(base.threads, max(vector_bytes, element_bytes), base.vectors_per_thread)
    config.validate(element_bytes)

    bits = _bits_dtype(element_bytes)
    flat_src = src.view(-1).view(bits)
    flat_dst = dst.view(-1).view(bits)
    kernel = vc.VectorCopy(config, element_bytes)
    stream = current_stream()
    compiled = None
    with torch.cuda.device(src.device):
        for start in range(0, flat_src.numel(), _CHUNK_ELEMENTS):
            s = from_torch(flat_src[start:start + _CHUNK_ELEMENTS], assumed_align=config.vector_bytes, leading_dim=0)
            d = from_torch(flat_dst[start:start + _CHUNK_ELEMENTS], assumed_align=config.vector_bytes, leading_dim=0)
            if compiled is None:
                compiled = compile_kernel(kernel, s, d, stream, key=("elementwise.vector_copy", config, element_bytes))
            compiled(s, d, stream)
    return dst
