"""The eager direct path of the fused kernels (`runtime.eager`): what `cute_kernels.nn.RMSNorm`,
`nn.LayerNorm` and the functional forms (`nn.fused_functional`) call.

    norm(x, weight, bias, residual, kind, eps, offset, out_dtype, fallback) -> (y, s, rstd, mean)
    softmax(x, dim, fallback) -> y
    swiglu(gate, up, interleaved, fallback) -> out

compute `cute_kernels::norm`, `::softmax` and `::swiglu` with the same arguments. A norm is a
short memory-bound kernel (12-30 µs at a ViT's or Llama's rows), so the tens of µs the op's
dispatch costs per call decide whether a model with a norm every half layer is host-bound in
eager mode. A warm eager call
replays `NormPlan`:
- forward: the plan `fused.norm_api.norm_forward` stored for the key (`forward_plan_for`: the
  outputs allocated, the compiled TVM-FFI function called), on the caller's tensors (detached
  where they require grad), with the op's empty placeholders for the outputs the call has not;
- backward (inside `runtime.eager.EagerFunction`): the op's formula (`ops.fused.norm_grads`,
  saving what `_norm_setup` saves) with the kernel layer's backward entry
  (`fused.norm_backward`, which keeps its own plans) in place of `cute_kernels::norm_backward`.
Softmax and SwiGLU replay the kernel layer's stored forward plan the same way (softmax over the
last dimension only: another `dim` keeps the op, which moves it last); their backward calls the
kernel layer's backward entry straight (`fused.softmax_backward`, `fused.swiglu_backward`, which
keep their own plans), not the op's body: the forward ran on the kernel, so its gradient does too.
Measured on the H200 (`scripts/fused_sweep.py --profile`, 16384 x 4096 bf16, host time a warm
call): softmax forward 72 µs through the op, 32 µs on this path (quack: 31 µs); its backward
through `autograd.grad` 195 -> 140 µs (eager PyTorch: 100 µs); SwiGLU's backward 318 -> 220 µs.
Autocast is not applied: the ops register no autocast rule, so neither path casts.
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.eager import EagerOp, Plan, detached

from . import fused as fused_ops

__all__ = ["norm", "NormPlan", "softmax", "SoftmaxPlan", "swiglu", "SwigluPlan"]


def _same_device(t) -> bool:
    """False for a CUDA tensor on another device than the current one (the op's body switches
    devices; a plan does not)."""
    return not (t.is_cuda and t.device.index != torch.cuda.current_device())


class NormPlan(Plan):
    """The warm call of one `norm` key: `launch(x, weight, bias, residual, eps) -> (y, s, rstd,
    mean)`, the kernel layer's plan; `detach`: whether a tensor argument requires grad."""

    __slots__ = ("launch", "detach")

    def __init__(self, launch, detach: bool):
        self.launch, self.detach = launch, detach

    def run(self, x, weight, bias, residual, kind, eps, offset, out_dtype, fallback):
        if self.detach:
            x, weight, bias, residual = (None if t is None else t.detach() for t in (x, weight, bias, residual))
        y, s, rstd, mean = self.launch(x, weight, bias, residual, eps)
        # the op's placeholders: empty tensors for s without a residual and mean for RMSNorm
        return y, x.new_empty((0,)) if s is None else s, rstd, rstd.new_empty((0,)) if mean is None else mean

    def forward(self, ctx, *args):
        out = self.run(*args)
        fused_ops._norm_setup(ctx, args, out)
        return out

    def backward(self, ctx, dy, ds, drstd, dmean):
        return fused_ops.norm_grads(ctx, dy, ds, _norm_backward_kernel)

    def backward_op(self, ctx, dy, ds, drstd, dmean):
        return fused_ops.norm_grads(ctx, dy, ds, fused_ops.norm_backward)


def _build_norm(result, x, weight, bias, residual, kind, eps, offset, out_dtype, fallback):
    """The plan of a `norm` call the op just completed, or None: the kernel layer kept no plan
    (the torch fallback, tensors that get none) or the input is on another device than the
    current one (the op's body switches devices; the plan does not)."""
    if not _same_device(x):
        return None
    from cute_kernels.fused import norm_api

    d = [None if t is None else t.detach() for t in (x, weight, bias, residual)]
    launch = norm_api.forward_plan_for(*d, kind=kind, offset=offset, save_stats=True, out_dtype=out_dtype)
    if launch is None:
        return None
    return NormPlan(launch, any(t is not None and t.requires_grad for t in (x, weight, bias, residual)))


def _norm_backward_kernel(dy, s, weight, rstd, mean, dsum, kind, offset, has_bias, weight_grad, fallback):
    """`cute_kernels::norm_backward`'s arguments, straight to the kernel layer (the forward ran on
    the kernel, so its gradient does too)."""
    from cute_kernels.fused import norm_backward

    dy, s, weight, rstd, mean, dsum = detached(dy, s, weight, rstd, mean, dsum)
    return norm_backward(dy, s, weight, rstd, mean, kind=kind, offset=offset, dsum=dsum, has_bias=has_bias,
                         weight_grad=weight_grad)


norm = EagerOp("norm", fused_ops.norm, _build_norm, autocast=False)


# ---- softmax and SwiGLU ------------------------------------------------------------------------


class SoftmaxPlan(Plan):
    """The warm call of one `softmax` key: `launch(x) -> y`, the kernel layer's plan."""

    __slots__ = ("launch",)

    def __init__(self, launch):
        self.launch = launch

    def run(self, x, dim, fallback):
        return self.launch(x)  # the kernel layer's plan passes x to the kernel detached

    def forward(self, ctx, *args):
        y = self.run(*args)
        fused_ops._softmax_setup(ctx, args, y)
        return y

    def backward(self, ctx, dy):
        from cute_kernels.fused import softmax_backward

        y, dy = detached(*ctx.saved_tensors, dy)
        return softmax_backward(y, dy if dy.dtype == y.dtype else dy.to(y.dtype)), None, None

    def backward_op(self, ctx, dy):
        return fused_ops._softmax_grad(ctx, dy)


def _build_softmax(result, x, dim, fallback):
    """The plan of a `softmax` call the op just completed over x's last dimension, or None."""
    if x.dim() < 1 or dim % x.dim() != x.dim() - 1 or not _same_device(x):
        return None
    from cute_kernels.fused import softmax_api

    launch = softmax_api.forward_plan_for(x.detach())
    return None if launch is None else SoftmaxPlan(launch)


class SwigluPlan(Plan):
    """The warm call of one `swiglu` key: `launch(gate, up) -> out`, the kernel layer's plan."""

    __slots__ = ("launch",)

    def __init__(self, launch):
        self.launch = launch

    def run(self, gate, up, interleaved, fallback):
        return self.launch(gate, up)  # the kernel layer's plan passes them to the kernel detached

    def forward(self, ctx, *args):
        out = self.run(*args)
        fused_ops._swiglu_setup(ctx, args, out)
        return out

    def backward(self, ctx, dout):
        from cute_kernels.fused import swiglu_backward

        gate, up, dout = detached(*ctx.saved_tensors, dout)
        dg, du = swiglu_backward(dout if dout.dtype == gate.dtype else dout.to(gate.dtype), gate, up,
                                 interleaved=ctx.interleaved)
        return dg, (None if ctx.interleaved else du), None, None

    def backward_op(self, ctx, dout):
        return fused_ops._swiglu_grad(ctx, dout)


def _build_swiglu(result, gate, up, interleaved, fallback):
    """The plan of a `swiglu` call the op just completed, or None."""
    if not _same_device(gate):
        return None
    from cute_kernels.fused import swiglu_api

    launch = swiglu_api.forward_plan_for(gate.detach(), None if up is None else up.detach(), interleaved=interleaved)
    return None if launch is None else SwigluPlan(launch)


softmax = EagerOp("softmax", fused_ops.softmax, _build_softmax, autocast=False)
swiglu = EagerOp("swiglu", fused_ops.swiglu, _build_swiglu, autocast=False)
