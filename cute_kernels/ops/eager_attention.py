"""The eager direct path of `cute_kernels::sdpa` (`runtime.eager`): what
`cute_kernels.nn.functional.scaled_dot_product_attention` calls.

    sdpa(q, k, v, causal, scale, enable_gqa, window_left, window_right, rung, fallback) -> (out, lse)

computes `cute_kernels::sdpa` with the same arguments. A warm eager call replays `SdpaPlan`:
- forward: `attention_forward`'s stored plan for the key (`attention.api.plan_for`: the rung's
  launch with its scalars bound, out and lse allocated) on the caller's q, k, v (detached);
- backward (inside `runtime.eager.EagerFunction`): what the op's autograd formula does
  (`_sdpa_setup` saves the same tensors and options), with `cute_kernels::sdpa_backward`'s
  body in place of the op, whose kernel entry replays its own plan
  (`attention.api.attention_backward`).
A key with arguments this module does not know (a schema grown by options it cannot hand down)
keeps the op.
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.eager import EagerOp, Plan, op_body, register_autocast

from . import attention as attention_ops

__all__ = ["sdpa", "SdpaPlan"]

register_autocast(attention_ops.sdpa)

# The schema `_build_sdpa` knows: (q, k, v, causal, scale, enable_gqa, window_left,
# window_right, rung, fallback).
_ARGS = 10


class SdpaPlan(Plan):
    """The warm call of one `sdpa` key: `launch(q, k, v) -> (out, lse)`, the attention
    layer's plan; `detach`: whether q, k or v requires grad (the key fixes it)."""

    __slots__ = ("launch", "detach")

    def __init__(self, launch, detach: bool):
        self.launch, self.detach = launch, detach

    def run(self, q, k, v, *options):
        if self.detach:
            q, k, v = q.detach(), k.detach(), v.detach()
        return self.launch(q, k, v)

    def forward(self, ctx, *args):
        out, lse = self.run(*args)
        ctx.set_materialize_grads(False)  # lse has no gradient: no zeros made for it
        attention_ops._sdpa_setup(ctx, args, (out, lse))
        return out, lse

    def backward(self, ctx, grad_out, grad_lse):
        if grad_out is None:
            return (None,) * _ARGS
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _SDPA_BACKWARD(grad_out, q, k, v, out, lse, **ctx.options)
        return (dq, dk, dv) + (None,) * (_ARGS - 3)

    def backward_op(self, ctx, grad_out, grad_lse):
        if grad_out is None:
            grad_out = torch.zeros_like(ctx.saved_tensors[3])
        return attention_ops._sdpa_grad(ctx, grad_out, grad_lse)


def _build_sdpa(*args):
    """The plan of an `sdpa` call the op just completed, or None: the forward kept no plan (no
    TVM-FFI, the torch fallback, an empty problem), the inputs are on another device than the
    current one, or the call has arguments beyond the ones this module knows."""
    if len(args) != _ARGS:
        return None
    q, k, v, causal, scale, enable_gqa, window_left, window_right, rung, fallback = args
    if q.is_cuda and q.device.index != torch.cuda.current_device():
        return None  # the op's body switches devices (device_guard); the plan does not
    from cute_kernels.attention import api

    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    launch = api.plan_for(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale, enable_gqa=enable_gqa,
                          kernel=rung, window_size=window)
    if launch is None:
        return None
    return SdpaPlan(launch, q.requires_grad or k.requires_grad or v.requires_grad)


_SDPA_BACKWARD = op_body(attention_ops.sdpa_backward)
sdpa = EagerOp("sdpa", attention_ops.sdpa, _build_sdpa)
