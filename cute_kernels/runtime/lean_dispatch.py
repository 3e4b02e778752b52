"""A leaner Autograd kernel for our `torch.library.custom_op`s: a call that records no autograd
enters the op's body from the dispatcher's Autograd kernel.

Why: `custom_op`'s own Autograd kernel, for a call without gradients, builds a Metadata object,
redispatches below autograd through Python, and its backend kernel then checks the result for
aliasing, on every call: 12.6 µs a call of a toy op on CI's CPU, 4.7 µs through this kernel
(`tests/runtime/test_lean_dispatch.py` shows the how, not the timing). Compiled graphs call our
ops exactly so (AOTAutograd's graphs run without grad mode): a few hundred calls a training
step of a patched ViT-B/16, each on a GPU that idles while the host dispatches.

    install(op)     op: a CustomOpDef of ours that mutates nothing; idempotent
    using(on)       a context in which installed kernels take the lean path (on) or custom_op's
                    for every call (to compare the two)

A call runs the body (`op._init_fn`, under `_AutoDispatchBelowAutograd` as custom_op runs it)
only when no tensor argument requires grad while grad mode is on, and the highest dispatch key
below autograd is a dense CPU or CUDA backend: a FakeTensor or any TorchDispatchMode (the Python
key), functionalization, Meta and every other key redispatch as before. Calls that record
autograd take custom_op's own kernel (a fresh `make_autograd_impl` of the same op, which reads
the formulas `register_autograd` set, whenever it set them). What it skips is only the aliasing
check, which our ops' outputs (fresh tensors) never fail; `torch.library.opcheck` still runs it
(its checks run under dispatch modes, which redispatch).

`cute_kernels.ops` installs it for its ops at import (the default since 2026-12-05, when its GPU
tests passed on an H100 and a compiled ViT-B/16 training step with it and the backward as one op
a layer measured 29.7 ms against 49.0 ms without).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings

import torch

__all__ = ["install", "installed", "using"]

_C = torch._C
_BACKENDS = frozenset({_C.DispatchKey.CPU, _C.DispatchKey.CUDA})
_INSTALLED: dict = {}  # qualname -> the Library holding the kernel (kept alive)
_LEAN = [True]  # whether installed kernels take the lean path (`using`)


@contextlib.contextmanager
def using(on: bool = True):
    """Within: installed kernels take the lean path (on) or custom_op's own for every call."""
    before = _LEAN[0]
    _LEAN[0] = bool(on)
    try:
        yield
    finally:
        _LEAN[0] = before


def installed(op) -> bool:
    """Whether `install(op)` registered the lean kernel for `op`."""
    return getattr(op, "_qualname", None) in _INSTALLED


def install(op) -> bool:
    """Register the lean Autograd kernel for custom op `op` (module docstring); False, leaving
    custom_op's kernel, for an op that mutates an argument or where this torch lacks what the
    kernel uses."""
    qualname = op._qualname
    if qualname in _INSTALLED:
        return True
    overload = op._opoverload
    if overload._schema.is_mutable:
        return False
    try:
        from torch._library.autograd import make_autograd_impl

        after_autograd = _C._after_autograd_keyset
        below_autograd = _C._AutoDispatchBelowAutograd
        any_requires_grad = _C._any_requires_grad
        grad_on = _C.is_grad_enabled
        body = op._init_fn
        after_autograd.highestPriorityTypeId  # the keyset method the kernel asks (present since torch 2.1)
    except (ImportError, AttributeError):
        return False
    with_grad = make_autograd_impl(overload, op)
    redispatch = overload.redispatch
    backends, lean = _BACKENDS, _LEAN

    def kernel(keyset, *args, **kwargs):
        if not lean[0] or (grad_on() and any_requires_grad(*args)):
            return with_grad(keyset, *args, **kwargs)
        below = keyset & after_autograd
        with below_autograd():
            if below.highestPriorityTypeId() in backends:
                return body(*args, **kwargs)
            return redispatch(below, *args, **kwargs)

    namespace, name = qualname.split("::")
    lib = torch.library.Library(namespace, "FRAGMENT")
    # custom_op registered its Autograd kernel from Python: replacing it needs allow_override,
    # which torch 2.11 (the H200's) defaults to False and later versions to True
    override = {"allow_override": True} if "allow_override" in inspect.signature(lib.impl).parameters else {}
    with warnings.catch_warnings():  # the dispatcher warns that a kernel replaces custom_op's
        warnings.simplefilter("ignore")
        lib.impl(name, kernel, "Autograd", with_keyset=True, **override)
    _INSTALLED[qualname] = lib
    return True
