"""The eager direct path of `cute_kernels::sdpa` (`runtime.eager`): what
`cute_kernels.nn.functional.scaled_dot_product_attention` calls.

    sdpa(q, k, v, causal, scale, enable_gqa, window_left, window_right, rung, fallback) -> (out, lse)

computes `cute_kernels::sdpa` with the same arguments. A warm eager call replays `SdpaPlan`:
- forward: `attention_forward`'s stored plan for the key (`attention.api.plan_for`: the rung's
  launch with its scalars bound, out and lse allocated) on the caller's q, k, v (detached);
- backward (inside `runtime.eager.EagerFunction`): what the op's autograd formula does
  (`_sdpa_setup` saves the same tensors and options), through this module's entry for
  `cute_kernels::sdpa_backward` (`sdpa_backward`), so a warm backward replays
  `SdpaBackwardPlan` (`attention.api.backward_plan_for`: the chosen rung's backward on the
  recorded problem). The op's body replays the same plan (`runtime.eager.inside`) where a
  compiled backward graph calls the op.
A key with arguments this module does not know (a schema grown by options it cannot hand down)
keeps the op.
"""

from __future__ import annotations

import torch

from cute_kernels.attention import dense_decode as _dense
from cute_kernels.runtime.eager import EagerOp, Plan, register_autocast

from . import attention as attention_ops

__all__ = ["sdpa", "sdpa_backward", "SdpaPlan", "SdpaBackwardPlan"]

register_autocast(attention_ops.sdpa)

# The schema `_build_sdpa` knows: (q, k, v, causal, scale, enable_gqa, window_left,
# window_right, rung, fallback); the op's takes softcap and sinks after them (calls with those
# keep the op: `nn.functional` passes them to it).
_ARGS = 10
_FEATURE_ARGS = 2


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
        # the op's schema ends with softcap and sinks, which the keys this path replays lack
        attention_ops._sdpa_setup(ctx, (*args, *(None,) * _FEATURE_ARGS), (out, lse))
        return out, lse

    def backward(self, ctx, grad_out, grad_lse):
        if grad_out is None:
            return (None,) * _ARGS
        q, k, v, out, lse, _ = ctx.saved_tensors  # the last: sinks, None on this path
        o = ctx.options
        dq, dk, dv = sdpa_backward(grad_out, q, k, v, out, lse, *(o[name] for name in _OPTIONS))
        return (dq, dk, dv) + (None,) * (_ARGS - 3)

    def backward_op(self, ctx, grad_out, grad_lse):
        return attention_ops._sdpa_grad(ctx, grad_out, grad_lse)[:_ARGS]  # the features' gradients: None


# `sdpa_backward`'s options in its schema order (after grad_out, q, k, v, out, lse), as `sdpa` saved them
_OPTIONS = ("causal", "scale", "enable_gqa", "window_left", "window_right", "rung", "fallback")
_deterministic = torch.are_deterministic_algorithms_enabled


class SdpaBackwardPlan(Plan):
    """The warm call of one `sdpa_backward` key: `replay(dout, q, k, v, out, lse) -> (dq, dk,
    dv)`, the attention layer's backward plan, made under one determinism setting (which the key
    does not hold: under the other the call takes the checked path)."""

    __slots__ = ("replay", "deterministic")

    def __init__(self, replay, deterministic: bool):
        self.replay, self.deterministic = replay, deterministic

    def run(self, grad_out, q, k, v, out, lse, *options):
        if _deterministic() != self.deterministic:
            return attention_ops._sdpa_backward(grad_out, q, k, v, out, lse, *options)
        dq, dk, dv = self.replay(grad_out.detach(), q.detach(), k.detach(), v.detach(), out.detach(), lse)
        return attention_ops._grads_stored((dq, dk, dv))  # as the op's body returns them


def _build_sdpa_backward(result, grad_out, q, k, v, out, lse, causal, scale, enable_gqa, window_left, window_right,
                         rung, fallback):
    """The plan `attention_backward` kept for the `sdpa_backward` call the op's body just made,
    or None: the torch fallback, grad mode on with an argument requiring grad (a plan replays no
    autograd), another device than the current one."""
    saved = (grad_out, q, k, v, out, lse)
    if fallback == "torch" and not all(t.is_cuda for t in saved):
        return None  # PyTorch computed it
    if q.is_cuda and q.device.index != torch.cuda.current_device():
        return None  # the op's body switches devices (device_guard); the plan does not
    if torch.is_grad_enabled() and any(t.requires_grad for t in saved):
        return None
    from cute_kernels.attention import api

    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    deterministic = _deterministic()
    replay = api.backward_plan_for(*(t.detach() for t in saved), causal=causal, scale=scale, enable_gqa=enable_gqa,
                                   window_size=window, kernel=rung, deterministic=deterministic)
    return None if replay is None else SdpaBackwardPlan(replay, deterministic)


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


sdpa = EagerOp("sdpa", attention_ops.sdpa, _build_sdpa, family=(_decode_family, _build_decode_family))
sdpa_backward = EagerOp("sdpa_backward", attention_ops.sdpa_backward, _build_sdpa_backward, autocast=False)
