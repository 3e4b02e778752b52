"""The eager direct path of `cute_kernels::linear` (`runtime.eager`): what `cute_kernels.nn.Linear`
and `cute_kernels.nn.functional.linear` call.

    linear(x, weight, bias, activation, rung, fallback)

computes `cute_kernels::linear` with the same arguments. A warm eager call replays `LinearPlan`:
- forward: the GEMM the op's body launched for the key (`gemm.linear_kernel_plan`), on the
  caller's tensors (detached where they require grad): with a fused epilogue, the rung's plan
  writing straight into a (..., out_features) result; else `gemm.matmul`'s plan on the 2-D views
  the body makes, then the body's in-place epilogue (`gemm.unfused_epilogue`);
- backward (inside `runtime.eager.EagerFunction`): `gemm.linear_grads`, the op's own formula,
  each GEMM through `cute_kernels::matmul`'s body (`runtime.eager.op_body`) instead of the op.
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.eager import EagerOp, Plan, op_body, register_autocast

from . import gemm as gemm_ops

__all__ = ["linear", "LinearPlan"]

register_autocast(gemm_ops.linear)
register_autocast(gemm_ops.matmul)


class LinearPlan(Plan):
    """The warm call of one `linear` key (module docstring). `launch`: for a fused epilogue
    the rung's plan `launch(a, b, out, alpha, beta, c, bias, scale_a, scale_b)`, else
    `gemm.matmul`'s plan `plan(a, b, alpha, beta, c) -> (M, N)`; the flags say which caller
    tensors require grad (the key fixes them)."""

    __slots__ = ("launch", "fused", "out_shape", "x2_shape", "dtype", "device", "rx", "rw", "rb")

    def __init__(self, launch, fused: bool, x, weight, bias):
        self.launch, self.fused = launch, fused
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
        if self.fused:
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
        rung, fallback = ctx.rung, ctx.fallback
        return gemm_ops.linear_grads(ctx, grad, lambda a, b: _MATMUL(a, b, None, rung, fallback))

    def backward_op(self, ctx, grad):
        return gemm_ops._linear_backward(ctx, grad)


def _build_linear(x, weight, bias, activation, rung, fallback):
    """The plan of a `linear` call the op just completed, or None: its GEMM kept no plan (a
    padded or split launch, no TVM-FFI, the torch fallback), the input's 2-D view is a copy,
    the input is empty or on another device than the current one."""
    if x.dim() < 1 or x.numel() == 0 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        return None
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        return None  # the op's body switches devices (device_guard); the plan does not
    x2 = x.detach().reshape(-1, x.shape[-1])
    if x2.data_ptr() != x.data_ptr():
        return None  # reshape copied: the GEMM read the copy, not the caller's storage
    b = None if bias is None else bias.detach()
    fused, launch = gemm_ops.linear_kernel_plan(x2, weight.detach().t(), b, activation, rung)
    if launch is None:
        return None
    return LinearPlan(launch, fused, x, weight, bias)


_MATMUL = op_body(gemm_ops.matmul)
linear = EagerOp("linear", gemm_ops.linear, _build_linear)
