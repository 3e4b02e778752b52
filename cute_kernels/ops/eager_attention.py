"""The eager direct path of `cute_kernels::sdpa` (`runtime.eager`): what
`cute_kernels.nn.functional.scaled_dot_product_attention` calls.

    sdpa(q, k, v, causal, scale, enable_gqa, window_left, window_right, rung, fallback) -> (out, lse)

computes `cute_kernels::sdpa` with the same arguments. A warm eager call replays `SdpaPlan`:
- forward: `attention_forward`'s stored plan for the key (`attention.api.plan_for`: the rung's
  launch with its scalars bound, out and lse allocated) on the caller's q, k, v (detached);
- backward (inside `runtime.eager.EagerFunction`): what the op's autograd formula does
  (`_sdpa_setup` saves the same tensors and options), with `cute_kernels::sdpa_backward`'s
  body in place of the op; a warm backward (the same output-gradient layout, the same
  determinism setting) calls the plan that body's entry kept (`attention.api.
  backward_plan_for`: the chosen rung's backward on the recorded problem) directly.
A key with arguments this module does not know (a schema grown by options it cannot hand down)
keeps the op.
"""

from __future__ import annotations

import torch

from cute_kernels.attention import dense_decode as _dense
from cute_kernels.runtime.eager import EagerOp, Plan, op_body, register_autocast

from . import attention as attention_ops

__all__ = ["sdpa", "SdpaPlan"]

register_autocast(attention_ops.sdpa)

# The schema `_build_sdpa` knows: (q, k, v, causal, scale, enable_gqa, window_left,
# window_right, rung, fallback); the op's takes softcap and sinks after them (calls with those
# keep the op: `nn.functional` passes them to it).
_ARGS = 10
_FEATURE_ARGS = 2


class SdpaPlan(Plan):
    """The warm call of one `sdpa` key: `launch(q, k, v) -> (out, lse)`, the attention
    layer's plan; `detach`: whether q, k or v requires grad (the key fixes it)."""

    __slots__ = ("launch", "detach", "grads")

    def __init__(self, launch, detach: bool):
        self.launch, self.detach = launch, detach
        self.grads: dict = {}  # (output-gradient layout, deterministic) -> backward plan or None

    def run(self, q, k, v, *options):
        if self.detach:
            q, k, v = q.detach(), k.detach(), v.detach()
        return self.launch(q, k, v)

    def forward(self, ctx, *args):
        out, lse = self.run(*args)
        # the op's schema ends with softcap and sinks, which the keys this path replays lack
        attention_ops._sdpa_setup(ctx, (*args, *(None,) * _FEATURE_ARGS), (out, lse))
        return out, lse

    def backward(self, ctx, grad_out, grad_lse):
        if grad_out is None:
            return (None,) * _ARGS
        key = (grad_out.shape, grad_out.stride(), grad_out.dtype, grad_out.data_ptr() & 15, _deterministic())
        replay = self.grads.get(key, _UNSEEN)
        q, k, v, out, lse, _ = ctx.saved_tensors  # the last: sinks, None on this path
        if replay is _UNSEEN:
            dq, dk, dv = _SDPA_BACKWARD(grad_out, q, k, v, out, lse, **ctx.options)
            self.grads[key] = _backward_plan(ctx, grad_out)
        elif replay is None:
            dq, dk, dv = _SDPA_BACKWARD(grad_out, q, k, v, out, lse, **ctx.options)
        else:
            dq, dk, dv = replay(grad_out.detach(), q.detach(), k.detach(), v.detach(), out.detach(), lse)
            dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()  # as the op's body returns them
        return (dq, dk, dv) + (None,) * (_ARGS - 3)

    def backward_op(self, ctx, grad_out, grad_lse):
        return attention_ops._sdpa_grad(ctx, grad_out, grad_lse)[:_ARGS]  # the features' gradients: None


_UNSEEN = object()
_deterministic = torch.are_deterministic_algorithms_enabled


def _backward_plan(ctx, grad_out):
    """The plan `attention_backward` kept for the call `sdpa_backward`'s body just made with the
    saved tensors and options (the body's window and detaching, repeated here), or None."""
    from cute_kernels.attention import api

    o = ctx.options
    saved = ctx.saved_tensors[:5]  # q, k, v, out, lse (then sinks: None on this path)
    if o["fallback"] == "torch" and not all(t.is_cuda for t in saved):
        return None
    window = None if (o["window_left"], o["window_right"]) == (-1, -1) else (o["window_left"], o["window_right"])
    q, k, v, out, lse = (t.detach() for t in saved)
    return api.backward_plan_for(grad_out.detach(), q, k, v, out, lse, causal=o["causal"], scale=o["scale"],
                                 enable_gqa=o["enable_gqa"], window_size=window, kernel=o["rung"])


def _build_sdpa(result, *args):
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


def _decode_family(args):
    """The family key of a decode step (`runtime.eager.EagerOp`'s family), or None: a few
    queries over contiguous K and V whose key count the decode rung takes
    (`dense_decode.key_count_admitted`), no window, on CUDA. Its key is the call's less the key
    count (and the strides it sets), so a decode loop whose cache grows a token per step
    replays one plan: the `decode` rung's launch, which reads the key count per call. Every call
    of a family takes the same path: which rung runs (the decode rung's `supports` depends on
    the key count only through `key_count_admitted`) and what it launches."""
    if len(args) != _ARGS:
        return None
    q, k, v, causal, scale, enable_gqa, window_left, window_right, rung, fallback = args
    if (window_left, window_right) != (-1, -1) or q.dim() != 4 or q.shape[2] > _dense.DENSE_MAX_QUERIES:
        return None
    kshape = k.shape
    if kshape != v.shape or not (q.is_cuda and k.is_contiguous() and v.is_contiguous()) \
            or not _dense.key_count_admitted(k, v):
        return None
    return (q.shape, q.stride(), q.dtype, q.get_device(), q.data_ptr() & 15, q.requires_grad, kshape[:2], kshape[3],
            k.dtype, k.get_device(), k.data_ptr() & 15, k.requires_grad, v.dtype, v.get_device(), v.data_ptr() & 15,
            v.requires_grad, causal, scale.__class__, scale, enable_gqa, rung, fallback, torch.cuda.current_device())


def _build_decode_family(result, *args):
    """The family plan of a decode step the op just completed: the stored plan of its forward
    when the rung that ran reads the key count per call (`attention.api`'s `any_seqlen_k`)."""
    q, k, v, causal, scale, enable_gqa, _, _, rung, _ = args
    if q.device.index != torch.cuda.current_device():
        return None
    from cute_kernels.attention import api

    launch = api.plan_for(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale, enable_gqa=enable_gqa,
                          kernel=rung)
    if launch is None or not getattr(launch, "any_seqlen_k", False):
        return None
    return SdpaPlan(launch, q.requires_grad or k.requires_grad or v.requires_grad)


_SDPA_BACKWARD = op_body(attention_ops.sdpa_backward)
sdpa = EagerOp("sdpa", attention_ops.sdpa, _build_sdpa, family=(_decode_family, _build_decode_family))
