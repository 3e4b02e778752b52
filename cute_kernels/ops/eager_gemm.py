"""The eager direct path of `cute_kernels::linear` and `cute_kernels::linear_backward`
(`runtime.eager`): what `cute_kernels.nn.Linear` and `cute_kernels.nn.functional.linear` call.

    linear(x, weight, bias, activation, rung, fallback)

computes `cute_kernels::linear` with the same arguments. A warm eager call replays `LinearPlan`:
- forward: the GEMM the op's body launched for the key (`gemm.linear_kernel_plan`), on the
  caller's tensors (detached where they require grad): with a fused epilogue, the rung's build
  that takes (x, weight, out, bias) as they are and forms the kernel's views in compiled host
  code, writing a fresh (..., out_features) result (or, where the rung has no such build, its
  plan, which forms them with `as_strided`); else `gemm.matmul`'s plan on the 2-D views the
  body makes, then the body's in-place epilogue (`gemm.unfused_epilogue`);
- backward (inside `runtime.eager.EagerFunction`): `gemm.linear_grads`, the op's own formula,
  whose one call of `cute_kernels::linear_backward` goes through this module's entry for it
  (`linear_backward`), so a warm backward without activation replays `GradPlan`: `gemm.matmul`'s
  plans of dX = G W and dW = Gᵀ X on views of the caller's tensors, and db = G.sum(0). The
  op's body replays the same plan (`runtime.eager.inside`) where a compiled backward graph
  calls the op.
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.eager import EagerOp, Plan, register_autocast

from . import gemm as gemm_ops

__all__ = ["linear", "linear_backward", "LinearPlan", "GradPlan"]

register_autocast(gemm_ops.linear)
register_autocast(gemm_ops.matmul)


class LinearPlan(Plan):
    """The warm call of one `linear` key (module docstring): `kind` and `launch` as
    `gemm.linear_kernel_plan` returns them; the flags say which caller tensors require grad
    (the key fixes them)."""

    __slots__ = ("launch", "kind", "out_shape", "x2_shape", "dtype", "device", "rx", "rw", "rb")

    def __init__(self, launch, kind: str, x, weight, bias):
        self.launch, self.kind = launch, kind
        self.out_shape = (*x.shape[:-1], weight.shape[0])
        self.x2_shape = (x.numel() // x.shape[-1], x.shape[-1])
        self.dtype, self.device = x.dtype, x.device
        self.rx, self.rw = x.requires_grad, weight.requires_grad
        self.rb = bias is not None and bias.requires_grad

    def run(self, x, weight, bias, activation, rung, fallback):
        if self.rx:
            x = x.detach()
        if self.rw:
            weight = weight.detach()
        if self.rb:
            bias = bias.detach()
        kind = self.kind
        if kind == "direct":
            out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
            if bias is None:
                self.launch(x, weight, out, 1.0, 0.0)
            else:
                self.launch(x, weight, out, bias, 1.0, 0.0)
            return out
        if kind == "fused":
            out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
            self.launch(x, weight, out, 1.0, 0.0, None, bias, None, None)
            return out
        y = self.launch(x.view(self.x2_shape), weight.t(), 1.0, 0.0, None)
        return gemm_ops.as_output(gemm_ops.unfused_epilogue(y, bias, activation), self.out_shape)

    def forward(self, ctx, *args):
        out = self.run(*args)
        gemm_ops._linear_setup(ctx, args, out)  # what the op saves, the same way
        return out

    def backward(self, ctx, grad):
        return gemm_ops.linear_grads(ctx, grad, linear_backward)

    def backward_op(self, ctx, grad):
        return gemm_ops._linear_backward(ctx, grad)


class GradPlan(Plan):
    """The warm call of one `linear_backward` key without activation: dX = G·W and dW = Gᵀ·X
    through the plans `gemm.matmul` kept for the same operands (on views of the caller's
    tensors with the recorded layouts), db = G.sum(0); empty tensors for gradients not asked."""

    __slots__ = ("dx", "dw", "g2_shape", "x2_shape", "x_shape")

    def __init__(self, dx, dw, grad, x, weight):
        self.dx, self.dw = dx, dw
        n, k = weight.shape
        self.g2_shape, self.x2_shape, self.x_shape = (grad.numel() // n, n), (x.numel() // k, k), x.shape

    def run(self, grad, x, weight, bias, out, activation, input_grad, weight_grad, bias_grad, rung, fallback):
        g = grad.detach().view(self.g2_shape)
        x = x.detach()
        # the op's placeholders for gradients not asked: distinct empty tensors (outputs may not alias)
        empty = x.new_empty
        dx = empty((0,)) if self.dx is None else self.dx(g, weight.detach(), 1.0, 0.0, None).view(self.x_shape)
        dw = empty((0,)) if self.dw is None else self.dw(g.mT, x.view(self.x2_shape), 1.0, 0.0, None)
        return dx, dw, g.sum(0) if bias_grad else empty((0,))


def _build_linear_backward(result, grad, x, weight, bias, out, activation, input_grad, weight_grad, bias_grad, rung,
                           fallback):
    """The `GradPlan` of the `linear_backward` call just computed, or None: an activation (its
    derivative is not replayed), a GEMM that kept no plan, a 2-D view that was a copy, grad mode
    on with an argument requiring grad (a plan replays no autograd), another device than the
    current one."""
    from cute_kernels.gemm import api

    if activation is not None or weight.dim() != 2 or x.dim() < 1 or x.numel() == 0:
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (grad, x, weight, bias)):
        return None
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        return None
    n, k = weight.shape
    g2 = grad.detach().reshape(-1, n)
    if g2.data_ptr() != grad.data_ptr() or gemm_ops._gemm_ready(g2) is not g2:
        return None
    dx = dw = None
    if input_grad:
        dx = api.plan_for(g2, weight.detach(), kernel=rung)
        if dx is None:
            return None
    if weight_grad:
        x2 = x.detach().reshape(-1, k)
        if x2.data_ptr() != x.data_ptr() or gemm_ops._gemm_ready(x2) is not x2:
            return None
        dw = api.plan_for(g2.mT, x2, kernel=rung)
        if dw is None:
            return None
    return GradPlan(dx, dw, grad, x, weight)


def _build_linear(result, x, weight, bias, activation, rung, fallback):
    """The plan of a `linear` call the op just completed (returning `result`), or None: its
    GEMM kept no plan (a padded or split launch, no TVM-FFI, the torch fallback), the input's
    2-D view is a copy, the input is empty or on another device than the current one."""
    if x.dim() < 1 or x.numel() == 0 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        return None
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        return None  # the op's body switches devices (device_guard); the plan does not
    x2 = x.detach().reshape(-1, x.shape[-1])
    if x2.data_ptr() != x.data_ptr():
        return None  # reshape copied: the GEMM read the copy, not the caller's storage
    b = None if bias is None else bias.detach()
    w = weight.detach()
    kind, launch = gemm_ops.linear_kernel_plan(x2, w.t(), b, activation, rung, callers=(x.detach(), w, result))
    if launch is None:
        return None
    return LinearPlan(launch, kind, x, weight, bias)


linear = EagerOp("linear", gemm_ops.linear, _build_linear)
linear_backward = EagerOp("linear_backward", gemm_ops.linear_backward, _build_linear_backward, autocast=False)
