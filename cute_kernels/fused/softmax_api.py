"""Torch entry points of the softmax kernels (last dimension, any width): `softmax_forward` and
`softmax_backward`, checked once per signature, then replayed from a plan (`runtime.plan_cache`)."""

from __future__ import annotations

import torch

from cute_kernels.runtime.plan_cache import PlanCache, plain_tensors, tensor_signature

from .host import check_same_device, check_tensor, compile_tvm_ffi, dtype_name, rows_view, tensor_vec

__all__ = ["softmax_forward", "softmax_backward", "forward_plan_for"]

_FWD = PlanCache("fused.softmax_forward")
_BWD = PlanCache("fused.softmax_backward")
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _config(n, dtype, y_dtype, tensors, backward):
    from .dispatch import softmax_tiling, stash_chunks_for
    from .softmax import SoftmaxConfig

    vec = tensor_vec(n, tensors)
    tiling, streaming = softmax_tiling(n, dtype_name(dtype), backward=backward,
                                       out_dtype=dtype_name(y_dtype), vec=vec)
    stash = stash_chunks_for(n, tiling, dtype_name(dtype)) if streaming and not backward else 0
    return SoftmaxConfig(tiling, dtype_name(dtype), out_dtype=dtype_name(y_dtype), streaming=streaming,
                         stash_chunks=stash)


def softmax_forward(x, *, out_dtype=None):
    """softmax(x) over the last dimension, fp32 math, result in `out_dtype` (default x's)."""
    sig = None
    if plain_tensors(x):
        try:
            sig = (out_dtype, tensor_signature(x))
            plan = _FWD.get(sig)
        except TypeError:
            plan = sig = None
        if plan is not None:
            return plan(x)
    op = "cute_kernels.fused.softmax"
    check_tensor(op, "x", x)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"{op}: x needs a last dimension of at least 1 element, got shape {tuple(x.shape)}")
    if out_dtype is not None and out_dtype not in _FLOATS:
        raise TypeError(f"{op}: out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    check_same_device(op, {"x": x})
    from .softmax import SoftmaxForward, forward_args

    n, y_dtype = x.shape[-1], out_dtype or x.dtype
    probe = torch.empty((0,), dtype=y_dtype, device=x.device)
    config = _config(n, x.dtype, y_dtype, [rows_view(x, n), probe], False)
    fn = compile_tvm_ffi(SoftmaxForward(config), forward_args(config), ("fused.softmax_fwd", config))
    shape, device = x.shape, x.device

    def plan(x):
        y = torch.empty(shape, dtype=y_dtype, device=device)
        if y.numel():
            fn(rows_view(x, n), y.view(-1, n))
        return y

    if sig is not None:
        _FWD.put(sig, plan)
    return plan(x)


def forward_plan_for(x, out_dtype=None):
    """The plan `softmax_forward` stored for a call with these arguments (a checked call made
    first), `plan(x) -> y`, or None: what the eager direct path (`ops.eager_fused`) replays."""
    if not plain_tensors(x):
        return None
    try:
        return _FWD.get((out_dtype, tensor_signature(x)))
    except TypeError:
        return None


def softmax_backward(y, dy, *, out_dtype=None):
    """dx = y * (dy - sum(dy * y)) over the last dimension; dx in `out_dtype` (default dy's)."""
    sig = None
    if plain_tensors(y, dy):
        try:
            sig = (out_dtype, tensor_signature(y), tensor_signature(dy))
            plan = _BWD.get(sig)
        except TypeError:
            plan = sig = None
        if plan is not None:
            return plan(y, dy)
    op = "cute_kernels.fused.softmax_backward"
    check_tensor(op, "y", y)
    check_tensor(op, "dy", dy)
    if y.shape != dy.shape or y.dim() < 1 or y.shape[-1] < 1:
        raise ValueError(f"{op}: y {tuple(y.shape)} and dy {tuple(dy.shape)} must have one shape with a last "
                         "dimension of at least 1 element")
    dx_dtype = out_dtype or dy.dtype
    if dx_dtype != dy.dtype:
        raise TypeError(f"{op}: dx is written in dy's dtype {dy.dtype}, got out_dtype={out_dtype}")
    check_same_device(op, {"y": y, "dy": dy})
    from .softmax import SoftmaxBackward, backward_args

    n = y.shape[-1]
    config = _config(n, dy.dtype, y.dtype, [rows_view(y, n), rows_view(dy, n)], True)
    fn = compile_tvm_ffi(SoftmaxBackward(config), backward_args(config), ("fused.softmax_bwd", config))
    shape, device = y.shape, y.device

    def plan(y, dy):
        dx = torch.empty(shape, dtype=dx_dtype, device=device)
        if dx.numel():
            fn(rows_view(y, n), rows_view(dy, n), dx.view(-1, n))
        return dx

    if sig is not None:
        _BWD.put(sig, plan)
    return plan(y, dy)
