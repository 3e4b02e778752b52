"""The few `cute_kernels.runtime` entry points the first kernels use, with stand-ins.

The runtime layer (compile cache, `to_cute`, the variant registry) is being written alongside
these kernels. Each name below is taken from `cute_kernels.runtime` when it is there and
otherwise falls back to a minimal equivalent with the same signature, so the kernels are
written against the runtime contract from the start. Once the runtime is complete this
module reduces to re-exports and can be deleted.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

__all__ = [
    "CompileJob",
    "compile_kernel",
    "current_stream",
    "fake_stream",
    "fake_tensor",
    "from_torch",
    "register_variant",
    "to_cute",
]


def _runtime_attr(name: str):
    """`cute_kernels.runtime.<name>`, or None while the runtime does not provide it yet."""
    try:
        runtime = importlib.import_module("cute_kernels.runtime")
        return getattr(runtime, name)
    except (ImportError, AttributeError):
        return None


# ---- tensors and streams (runtime.tensors exists) ------------------------------------------

def from_torch(t, *, assumed_align: int = 16, leading_dim: int | None = None):
    fn = _runtime_attr("from_torch")
    if fn is not None:
        return fn(t, assumed_align=assumed_align, leading_dim=leading_dim)
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=assumed_align).mark_layout_dynamic(leading_dim=leading_dim)


def fake_tensor(dtype, ndim: int, *, leading_dim: int = -1, assumed_align: int = 16):
    fn = _runtime_attr("fake_tensor")
    if fn is not None:
        return fn(dtype, ndim, leading_dim=leading_dim, assumed_align=assumed_align)
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    leading_dim %= ndim
    sizes = tuple(cute.sym_int32() for _ in range(ndim))
    strides = tuple(1 if i == leading_dim else cute.sym_int64() for i in range(ndim))
    return make_fake_tensor(dtype, sizes, strides, assumed_align=assumed_align)


def fake_stream():
    fn = _runtime_attr("fake_stream")
    if fn is not None:
        return fn()
    from cutlass.cute.runtime import make_fake_stream

    return make_fake_stream()


def current_stream():
    fn = _runtime_attr("current_stream")
    if fn is not None:
        return fn()
    import cuda.bindings.driver as cuda
    import torch

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


# ---- layouts at trace time ------------------------------------------------------------------

def to_cute(obj):
    """Inside a @cute.jit function: our `cute_kernels.layouts.Layout` as a static DSL layout."""
    fn = _runtime_attr("to_cute")
    if fn is not None:
        try:
            return fn(obj)
        except ImportError:  # the runtime's converter needs layout types not written yet
            pass
    import cutlass.cute as cute

    return cute.make_layout(obj.shape, stride=obj.stride)


# ---- compiling --------------------------------------------------------------------------------

_MEMORY_CACHE: dict = {}


def compile_kernel(jit_fn, *args, key: tuple, options: str | None = None):
    """`cute.compile(jit_fn, *args)` memoized on `key` (plus arch)."""
    fn = _runtime_attr("compile_kernel")
    if fn is not None:
        return fn(jit_fn, *args, key=key, options=options)
    import cutlass.cute as cute

    from cute_kernels.runtime.arch import target_arch

    full_key = (key, target_arch(), options)
    compiled = _MEMORY_CACHE.get(full_key)
    if compiled is None:
        compiled = cute.compile(jit_fn, *args, options=options) if options else cute.compile(jit_fn, *args)
        _MEMORY_CACHE[full_key] = compiled
    return compiled


# ---- the inspection registry ------------------------------------------------------------------

@dataclass(frozen=True)
class _CompileJob:
    jit_fn: Callable
    args: tuple
    key: tuple
    options: str | None = None


def _compile_job_class():
    cls = _runtime_attr("CompileJob")
    return cls if cls is not None else _CompileJob


def CompileJob(jit_fn, args, key, options=None):  # noqa: N802 - mirrors the runtime's class
    return _compile_job_class()(jit_fn, tuple(args), key, options)


# Variants registered before the runtime registry exists wait here; `register_variant`
# forwards them once it can.
PENDING_VARIANTS: list[tuple[str, Callable, dict[str, Any]]] = []


def register_variant(name: str, build: Callable, *, configs: dict, requires: set, forbids: set | None = None):
    fn = _runtime_attr("register_variant")
    kwargs: dict[str, Any] = {"configs": configs, "requires": set(requires)}
    if forbids is not None:
        kwargs["forbids"] = set(forbids)
    if fn is not None:
        return fn(name, build, **kwargs)
    PENDING_VARIANTS.append((name, build, kwargs))
    return None
