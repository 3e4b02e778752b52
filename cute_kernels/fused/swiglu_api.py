"""Torch entry points of the SwiGLU kernels: `swiglu_forward(gate, up)` and `swiglu_backward`.

gate and up are (..., I) with their own strides (e.g. the two halves of one gate-up projection,
as views: no copy), or with `interleaved=True` one (..., 2I) tensor whose columns alternate
(g0, u0, g1, u1, ...). The last dimension must be contiguous; leading dimensions that do not
merge into one stride are copied once.
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.plan_cache import PlanCache, plain_tensors, tensor_signature

from .host import check_same_device, check_tensor, compile_tvm_ffi, dtype_name, rows_view, tensor_vec

__all__ = ["swiglu_forward", "swiglu_backward", "forward_plan_for"]

_PLANS = PlanCache("fused.swiglu")


def _check(op, gate, up, interleaved, dout=None):
    check_tensor(op, "gate", gate)
    if gate.dim() < 1:
        raise ValueError(f"{op}: gate must have at least one dimension")
    if interleaved:
        if up is not None:
            raise ValueError(f"{op}: interleaved=True takes one gate-up tensor; pass up=None")
        if gate.shape[-1] % 2:
            raise ValueError(f"{op}: an interleaved gate-up tensor needs an even last dimension, got {gate.shape[-1]}")
        out_shape = (*gate.shape[:-1], gate.shape[-1] // 2)
    else:
        if up is None:
            raise ValueError(f"{op}: up is required (or pass interleaved=True with one gate-up tensor)")
        check_tensor(op, "up", up)
        if up.shape != gate.shape or up.dtype != gate.dtype:
            raise ValueError(f"{op}: gate ({tuple(gate.shape)}, {gate.dtype}) and up ({tuple(up.shape)}, {up.dtype}) "
                             "must match")
        out_shape = tuple(gate.shape)
    if dout is not None:
        check_tensor(op, "dout", dout)
        if tuple(dout.shape) != out_shape or dout.dtype != gate.dtype:
            raise ValueError(f"{op}: dout must have shape {out_shape} and dtype {gate.dtype}, got "
                             f"{tuple(dout.shape)}, {dout.dtype}")
    check_same_device(op, {"gate": gate, "up": up, "dout": dout})
    return out_shape


def _config(width, dtype, interleaved, backward, pair_tensors, plain_tensors):
    """The config for these tensors: with `interleaved`, `pair_tensors` (gate-up inputs and
    outputs) move vectors of 2 vec elements and `plain_tensors` vectors of vec; otherwise all of
    them move vec elements."""
    from .dispatch import swiglu_tiling
    from .swiglu import SwigluConfig

    if not interleaved:
        vec = tensor_vec(width, pair_tensors + plain_tensors)
    else:
        vec = 16 // pair_tensors[0].element_size()
        while vec > 1 and width % vec:
            vec //= 2
        for per, group in ((2, pair_tensors), (1, plain_tensors)):
            for t in group:
                while vec > 1 and ((t.dim() == 2 and t.shape[0] > 1 and t.stride(0) % (per * vec))
                                   or t.data_ptr() % min(16, per * vec * t.element_size())):
                    vec //= 2
    return SwigluConfig(swiglu_tiling(width, dtype_name(dtype), interleaved=interleaved, backward=backward, vec=vec),
                        dtype_name(dtype), interleaved)


def swiglu_forward(gate, up=None, *, interleaved: bool = False):
    """silu(gate) * up, fp32 math, in gate's dtype, shape of gate (or (..., I) interleaved)."""
    sig = None
    if plain_tensors(gate, up):
        try:
            sig = ("fwd", bool(interleaved), tensor_signature(gate), None if up is None else tensor_signature(up))
            plan = _PLANS.get(sig)
        except TypeError:
            plan = sig = None
        if plan is not None:
            return plan(gate, up)
    op = "cute_kernels.fused.swiglu"
    out_shape = _check(op, gate, up, interleaved)
    from .swiglu import SwigluForward, forward_args

    width = out_shape[-1]
    gw = gate.shape[-1]
    probe = torch.empty((0,), dtype=gate.dtype, device=gate.device)
    inputs = [rows_view(gate, gw)] + ([] if up is None else [rows_view(up, gw)])
    config = _config(width, gate.dtype, interleaved, False, inputs, [probe])
    fn = compile_tvm_ffi(SwigluForward(config), forward_args(config), ("fused.swiglu_fwd", config))
    device = gate.device

    def plan(gate, up):
        out = torch.empty(out_shape, dtype=gate.dtype, device=device)
        if out.numel():
            fn(rows_view(gate, gw), None if up is None else rows_view(up, gw), out.view(-1, width))
        return out

    if sig is not None:
        _PLANS.put(sig, plan)
    return plan(gate, up)


def forward_plan_for(gate, up=None, *, interleaved: bool = False):
    """The plan `swiglu_forward` stored for a call with these arguments (a checked call made
    first), `plan(gate, up) -> out`, or None: what the eager direct path (`ops.eager_fused`) replays."""
    if not plain_tensors(gate, up):
        return None
    try:
        return _PLANS.get(("fwd", bool(interleaved), tensor_signature(gate),
                           None if up is None else tensor_signature(up)))
    except TypeError:
        return None


def swiglu_backward(dout, gate, up=None, *, interleaved: bool = False, out=None):
    """(dgate, dup) of `swiglu_forward`, or one interleaved (..., 2I) gradient (dup None) when
    `interleaved`. `out`: (dgate, dup) tensors to write instead (shaped and typed as gate, last
    dimension contiguous, other strides free: e.g. the gate and up blocks of one gradient), not
    with `interleaved`."""
    sig = None
    outs = () if out is None else tuple(out)
    if plain_tensors(dout, gate, up, *outs):
        try:
            sig = ("bwd", bool(interleaved), tensor_signature(dout), tensor_signature(gate),
                   None if up is None else tensor_signature(up), *(tensor_signature(t) for t in outs))
            plan = _PLANS.get(sig)
        except TypeError:
            plan = sig = None
        if plan is not None:
            return plan(dout, gate, up, *outs)
    op = "cute_kernels.fused.swiglu_backward"
    out_shape = _check(op, gate, up, interleaved, dout)
    if out is not None:
        if interleaved or len(outs) != 2:
            raise ValueError(f"{op}: out takes (dgate, dup) and not the interleaved layout")
        for name, t in zip(("dgate", "dup"), outs):
            check_tensor(op, f"out {name}", t)
            if tuple(t.shape) != tuple(gate.shape) or t.dtype != gate.dtype or t.device != gate.device or \
                    (t.numel() and t.stride(-1) != 1):
                raise ValueError(f"{op}: out {name} must be shaped {tuple(gate.shape)}, {gate.dtype} on "
                                 f"{gate.device} with a contiguous last dimension, got {tuple(t.shape)} "
                                 f"{t.dtype} strides {tuple(t.stride())}")
    from .swiglu import SwigluBackward, backward_args

    width = out_shape[-1]
    gw = gate.shape[-1]
    probe = torch.empty((0,), dtype=gate.dtype, device=gate.device)
    inputs = [rows_view(gate, gw)] + ([] if up is None else [rows_view(up, gw)])
    given = [_out_rows(t, gw) for t in outs]
    config = _config(width, gate.dtype, interleaved, True, inputs + (given or [probe]), [rows_view(dout, width)])
    fn = compile_tvm_ffi(SwigluBackward(config), backward_args(config), ("fused.swiglu_bwd", config))
    gshape, device = tuple(gate.shape), gate.device

    def plan(dout, gate, up, *outs):
        if outs:
            dg, du = outs
        else:
            dg = torch.empty(gshape, dtype=gate.dtype, device=device)
            du = None if interleaved else torch.empty(gshape, dtype=gate.dtype, device=device)
        if dg.numel():
            fn(rows_view(dout, width), rows_view(gate, gw), None if up is None else rows_view(up, gw),
               _out_rows(dg, gw), None if du is None else _out_rows(du, gw))
        return dg, du

    if sig is not None:
        _PLANS.put(sig, plan)
    return plan(dout, gate, up, *outs)


def _out_rows(t, width: int):
    """An output (..., width) as (rows, width) rows it writes in place: a view, never a copy
    (rows_view would copy a layout whose leading dimensions do not merge)."""
    if t.dim() == 2:
        return t
    rows = t.numel() // width if width else 0
    try:
        return t.view(rows, width)
    except RuntimeError:
        raise ValueError(f"cute_kernels.fused.swiglu_backward: an out tensor of shape {tuple(t.shape)} and strides "
                         f"{tuple(t.stride())} is not one (rows, {width}) view") from None
