"""The eager direct path of the fused norms (`runtime.eager`): what `cute_kernels.nn.RMSNorm`,
`nn.LayerNorm` and their functional forms call.

    norm(x, weight, bias, residual, kind, eps, offset, out_dtype, fallback) -> (y, s, rstd, mean)

computes `cute_kernels::norm` with the same arguments. A norm is a short memory-bound kernel
(12-30 µs at a ViT's or Llama's rows), so the tens of µs the op's dispatch costs per call decide
whether a model with a norm every half layer is host-bound in eager mode. A warm eager call
replays `NormPlan`:
- forward: the plan `fused.norm_api.norm_forward` stored for the key (`forward_plan_for`: the
  outputs allocated, the compiled TVM-FFI function called), on the caller's tensors (detached
  where they require grad), with the op's empty placeholders for the outputs the call has not;
- backward (inside `runtime.eager.EagerFunction`): the op's formula (`ops.fused.norm_grads`,
  saving what `_norm_setup` saves) with `cute_kernels::norm_backward`'s body in place of the op
  (the kernel layer's backward keeps its own plans).
Autocast is not applied: the op registers no autocast rule, so neither path casts.
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.eager import EagerOp, Plan, op_body

from . import fused as fused_ops

__all__ = ["norm", "NormPlan"]


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
        return fused_ops.norm_grads(ctx, dy, ds, _NORM_BACKWARD)

    def backward_op(self, ctx, dy, ds, drstd, dmean):
        return fused_ops.norm_grads(ctx, dy, ds, fused_ops.norm_backward)


def _build_norm(result, x, weight, bias, residual, kind, eps, offset, out_dtype, fallback):
    """The plan of a `norm` call the op just completed, or None: the kernel layer kept no plan
    (the torch fallback, tensors that get none) or the input is on another device than the
    current one (the op's body switches devices; the plan does not)."""
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        return None
    from cute_kernels.fused import norm_api

    d = [None if t is None else t.detach() for t in (x, weight, bias, residual)]
    launch = norm_api.forward_plan_for(*d, kind=kind, offset=offset, save_stats=True, out_dtype=out_dtype)
    if launch is None:
        return None
    return NormPlan(launch, any(t is not None and t.requires_grad for t in (x, weight, bias, residual)))


_NORM_BACKWARD = op_body(fused_ops.norm_backward)
norm = EagerOp("norm", fused_ops.norm, _build_norm, autocast=False)
