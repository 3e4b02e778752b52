"""Fused memory-bound operators under `cute_kernels::`, with fakes and autograd.

| op | returns | backward op |
| --- | --- | --- |
| `norm(x, weight, bias, residual, kind, eps, offset, out_dtype)` | (y, s, rstd, mean) | `norm_backward` |
| `softmax(x, dim)` | y | `softmax_backward` |
| `cross_entropy(logits, labels, ignore_index, label_smoothing, z_loss, check_labels)` | (loss per row, lse) | `cross_entropy_backward` |
| `rotary(q, k, cos, sin, position_ids, offset, interleaved, qk_layout, inverse)` | (q', k') | `rotary` with inverse |
| `rotary_(...)` (in place, no autograd) | - | - |
| `swiglu(gate, up, interleaved)` | out | `swiglu_backward` |
| `linear_cross_entropy(x, weight, labels, bias, ...)` | (loss, dx, dweight, dbias) | scales them; `linear_cross_entropy_backward` for "none" |

Outputs that a call does not produce are empty tensors (0 elements): s without a residual, mean
for RMSNorm, dweight / dbias without a weight / bias, dup in the interleaved SwiGLU. Statistics
(rstd, mean, lse) are not differentiable. Every op takes `fallback` (`cute_kernels.ops.fallback`):
"torch" computes input the kernels do not take with `cute_kernels.fused.reference`, visibly.
The kernel layer is imported on first use, so registering the ops loads neither the DSL nor the
kernels.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from cute_kernels.fused import reference
from cute_kernels.runtime import eager

from .fallback import UNSUPPORTED, check_fallback, device_guard, note_fallback, on_cuda, raise_unsupported

__all__ = ["norm", "norm_backward", "softmax", "softmax_backward", "cross_entropy", "cross_entropy_backward",
           "rotary", "rotary_", "swiglu", "swiglu_backward", "linear_cross_entropy", "linear_cross_entropy_backward"]


def _kernels():
    import cute_kernels.fused as fused

    return fused


def _run(op: str, fallback: str, tensors, kernel_call, torch_call):
    """The kernel's result, or torch's when fallback="torch" and the kernel does not take the input."""
    check_fallback(op, fallback)
    if fallback == "torch" and not on_cuda(*tensors):
        note_fallback(op, "inputs on " + "/".join(sorted({str(t.device) for t in tensors if t is not None})))
        return torch_call()
    try:
        with device_guard(tensors[0]):
            return kernel_call(_kernels())
    except UNSUPPORTED as err:
        if fallback != "torch":
            raise_unsupported(op, err)
        note_fallback(op, str(err))
        return torch_call()


def _d(t):
    return None if t is None else t.detach()


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


def _or_empty(t, like: Tensor) -> Tensor:
    return _empty(like) if t is None else t


def _none_if_empty(t):
    return None if t is None or (t.numel() == 0 and t.dim() == 1) else t


# ---- norms ---------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::norm", mutates_args=())
def norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], residual: Optional[Tensor], kind: str = "rms",
         eps: float = 1e-6, offset: float = 0.0, out_dtype: Optional[torch.dtype] = None,
         fallback: str = "none") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """RMSNorm (kind="rms") or LayerNorm (kind="layer") of x (+ residual) over the last dim:
    (y, s = x + residual or empty, rstd fp32, mean fp32 or empty)."""
    return eager.inside("norm", _norm, (x, weight, bias, residual, kind, eps, offset, out_dtype, fallback))


def _norm(x, weight, bias, residual, kind, eps, offset, out_dtype, fallback):
    """`norm`'s checked path (`runtime.eager.inside` replays a recorded call instead)."""
    args = (_d(x), _d(weight), _d(bias), _d(residual))
    kw = dict(kind=kind, eps=eps, offset=offset, out_dtype=out_dtype)

    def kernel(fused):
        return fused.norm_forward(*args, save_stats=True, **kw)

    y, s, rstd, mean = _run("norm", fallback, args, kernel, lambda: reference.norm_forward(*args, save_stats=True, **kw))
    return y, _or_empty(s, x), rstd.float(), _or_empty(mean, rstd).float()


@norm.register_fake
def _norm_fake(x, weight, bias, residual, kind="rms", eps=1e-6, offset=0.0, out_dtype=None, fallback="none"):
    if kind not in ("rms", "layer"):
        raise ValueError(f"cute_kernels.norm: kind must be 'rms' or 'layer', got {kind!r}")
    y = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    s = residual.new_empty(x.shape) if residual is not None else x.new_empty((0,))
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)
    mean = x.new_empty(x.shape[:-1], dtype=torch.float32) if kind == "layer" else x.new_empty((0,), dtype=torch.float32)
    return y, s, rstd, mean


def _norm_setup(ctx, inputs, output):
    x, weight, bias, residual, kind, eps, offset, out_dtype, fallback = inputs
    y, s, rstd, mean = output
    ctx.mark_non_differentiable(rstd, mean)
    ctx.set_materialize_grads(False)  # None, not a zeros fill, for outputs without a gradient
    ctx.save_for_backward(s if residual is not None else x, weight, rstd, mean if kind == "layer" else None)
    ctx.kind, ctx.offset, ctx.fallback = kind, offset, fallback
    ctx.has_bias, ctx.has_residual = bias is not None, residual is not None
    ctx.dtypes = (x.dtype, None if residual is None else residual.dtype)


def _norm_grad(ctx, dy, ds_out, drstd, dmean):
    return norm_grads(ctx, dy, ds_out, norm_backward)


def norm_grads(ctx, dy, ds_out, backward):
    """The gradients of `norm`'s 9 inputs from what `_norm_setup` saved, with `backward` (the
    `norm_backward` op, or its body on the eager direct path) computing them."""
    s, weight, rstd, mean = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(s)
    dsum = ds_out if ctx.has_residual and ds_out is not None else None
    want_w = bool(ctx.needs_input_grad[1] or ctx.needs_input_grad[2])
    dx, dw, db = backward(dy.to(s.dtype) if dy.dtype != s.dtype else dy, s, weight, rstd, mean, dsum, ctx.kind,
                          ctx.offset, ctx.has_bias, want_w, ctx.fallback)
    dw, db = _none_if_empty(dw), _none_if_empty(db)
    x_dtype, r_dtype = ctx.dtypes
    # ds is the gradient of both x and the residual (each in its own dtype).
    return (dx.to(x_dtype) if ctx.needs_input_grad[0] else None, dw if ctx.needs_input_grad[1] else None,
            db if ctx.needs_input_grad[2] else None,
            dx.to(r_dtype) if ctx.has_residual and ctx.needs_input_grad[3] else None, None, None, None, None, None)


@torch.library.custom_op("cute_kernels::norm_backward", mutates_args=())
def norm_backward(dy: Tensor, s: Tensor, weight: Optional[Tensor], rstd: Tensor, mean: Optional[Tensor],
                  dsum: Optional[Tensor], kind: str = "rms", offset: float = 0.0, has_bias: bool = False,
                  weight_grad: bool = True, fallback: str = "none") -> tuple[Tensor, Tensor, Tensor]:
    """(ds, dweight or empty, dbias or empty) of `norm` (ds: the gradient of x and of the residual)."""
    args = (_d(dy), _d(s), _d(weight), _d(rstd), _d(mean))
    kw = dict(kind=kind, offset=offset, dsum=_d(dsum), has_bias=has_bias, weight_grad=weight_grad)
    dx, dw, db = _run("norm_backward", fallback, args + (_d(dsum),),
                      lambda fused: fused.norm_backward(*args, **kw), lambda: reference.norm_backward(*args, **kw))
    return dx, _or_empty(dw, dx), _or_empty(db, dx)


@norm_backward.register_fake
def _norm_backward_fake(dy, s, weight, rstd, mean, dsum, kind="rms", offset=0.0, has_bias=False, weight_grad=True,
                        fallback="none"):
    dw = weight.new_empty(weight.shape) if weight is not None and weight_grad else s.new_empty((0,))
    db = weight.new_empty(weight.shape) if has_bias and weight_grad else s.new_empty((0,))
    return s.new_empty(s.shape), dw, db


norm.register_autograd(_norm_grad, setup_context=_norm_setup)


# ---- softmax -------------------------------------------------------------------------------------------


def _last(t: Tensor, dim: int) -> Tensor:
    """t with `dim` moved last (a contiguous copy unless it already is last)."""
    d = dim % t.dim() if t.dim() else 0
    return t if d == t.dim() - 1 else t.movedim(d, -1).contiguous()


def _back(t: Tensor, dim: int, ndim: int) -> Tensor:
    d = dim % ndim if ndim else 0
    return t if d == ndim - 1 else t.movedim(-1, d).contiguous()


@torch.library.custom_op("cute_kernels::softmax", mutates_args=())
def softmax(x: Tensor, dim: int = -1, fallback: str = "none") -> Tensor:
    """torch.softmax(x, dim) (fp32 math, x's dtype); a dim other than the last is moved last
    (one copy in, one out)."""
    return eager.inside("softmax", _softmax, (x, dim, fallback))


def _softmax(x, dim, fallback):
    """`softmax`'s checked path (`runtime.eager.inside` replays a recorded call instead)."""
    xl = _last(x.detach(), dim)
    y = _run("softmax", fallback, (xl,), lambda fused: fused.softmax_forward(xl),
             lambda: reference.softmax_forward(xl))
    return _back(y, dim, x.dim()).contiguous()


@softmax.register_fake
def _softmax_fake(x, dim=-1, fallback="none"):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("cute_kernels::softmax_backward", mutates_args=())
def softmax_backward(y: Tensor, dy: Tensor, dim: int = -1, fallback: str = "none") -> Tensor:
    """dx = y * (dy - sum(dy * y, dim)), in dy's dtype."""
    yl, dyl = _last(y.detach(), dim), _last(dy.detach(), dim)
    dx = _run("softmax_backward", fallback, (yl, dyl), lambda fused: fused.softmax_backward(yl, dyl),
              lambda: reference.softmax_backward(yl, dyl))
    return _back(dx, dim, y.dim()).contiguous()


@softmax_backward.register_fake
def _softmax_backward_fake(y, dy, dim=-1, fallback="none"):
    return torch.empty_like(dy, memory_format=torch.contiguous_format)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.dim, ctx.fallback = inputs[1], inputs[2]


def _softmax_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return softmax_backward(y, dy.to(y.dtype), ctx.dim, ctx.fallback), None, None


softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup)


# ---- cross-entropy -------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::cross_entropy", mutates_args=())
def cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
                  z_loss: float = 0.0, check_labels: bool = True, fallback: str = "none") -> tuple[Tensor, Tensor]:
    """(loss per row fp32, lse fp32) of logits (M, V) against labels (M,): torch's cross-entropy
    with label smoothing, plus z_loss * lse^2; 0 for ignored rows."""
    args = (logits.detach(), labels)
    kw = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss, check_labels=check_labels)

    def kernel(fused):
        loss, lse, _ = fused.cross_entropy_forward(*args, **kw)
        return loss, lse

    def torch_call():
        loss, lse, _ = reference.cross_entropy_forward(*args, **kw)
        return loss.float(), lse.float()

    return _run("cross_entropy", fallback, args, kernel, torch_call)


@cross_entropy.register_fake
def _cross_entropy_fake(logits, labels, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, check_labels=True,
                        fallback="none"):
    if logits.dim() != 2:
        raise ValueError(f"cute_kernels.cross_entropy: logits must be 2-D (rows, classes), got {logits.dim()}-D")
    rows = logits.new_empty((logits.shape[0],), dtype=torch.float32)
    return rows, torch.empty_like(rows)


@torch.library.custom_op("cute_kernels::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(logits: Tensor, labels: Tensor, lse: Tensor, dloss: Tensor, ignore_index: int = -100,
                           label_smoothing: float = 0.0, z_loss: float = 0.0, fallback: str = "none") -> Tensor:
    """The logits' gradient for the per-row loss gradient dloss (fp32, (M,) or one element)."""
    d = dloss.detach().float()
    if d.dim() == 1 and d.numel() > 1 and d.stride(0) == 0:
        d = d[:1]  # a broadcast gradient (a sum or mean of the rows): one value for all rows
    elif d.dim() != 1 or d.stride(0) != 1:
        d = d.reshape(-1).contiguous()
    args = (logits.detach(), labels, lse.detach(), d)
    kw = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss)
    return _run("cross_entropy_backward", fallback, args, lambda fused: fused.cross_entropy_backward(*args, **kw),
                lambda: reference.cross_entropy_backward(*args, **kw))


@cross_entropy_backward.register_fake
def _cross_entropy_backward_fake(logits, labels, lse, dloss, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                                 fallback="none"):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _ce_setup(ctx, inputs, output):
    logits, labels, ignore_index, label_smoothing, z_loss, check_labels, fallback = inputs
    loss, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # None, not a zeros fill, for outputs without a gradient
    ctx.save_for_backward(logits, labels, lse)
    ctx.opts = (ignore_index, label_smoothing, z_loss, fallback)


def _ce_grad(ctx, dloss, dlse):
    if dloss is None:
        return (None,) * 7
    logits, labels, lse = ctx.saved_tensors
    ignore_index, label_smoothing, z_loss, fallback = ctx.opts
    g = cross_entropy_backward(logits, labels, lse, dloss, ignore_index, label_smoothing, z_loss, fallback)
    return g, None, None, None, None, None, None


cross_entropy.register_autograd(_ce_grad, setup_context=_ce_setup)


# ---- RoPE ----------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::rotary", mutates_args=())
def rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Optional[Tensor] = None, offset: int = 0,
           interleaved: bool = False, qk_layout: str = "bshd", inverse: bool = False,
           fallback: str = "none") -> tuple[Tensor, Tensor]:
    """(q', k'): q and k with rotary embeddings applied (new tensors; `cute_kernels.fused.rope`).
    qk_layout: "bshd" or "bhsd" (the schema cannot name an argument `layout`)."""
    args = (q.detach(), k.detach(), cos, sin)
    kw = dict(position_ids=position_ids, offset=offset, interleaved=interleaved, layout=qk_layout, inverse=inverse)

    def torch_call():
        qo, ko = q.detach().clone(), k.detach().clone()
        return reference.apply_rotary_(qo, ko, cos, sin, **kw)

    return _run("rotary", fallback, args + (position_ids,), lambda fused: fused.rotary(*args, **kw), torch_call)


@rotary.register_fake
def _rotary_fake(q, k, cos, sin, position_ids=None, offset=0, interleaved=False, qk_layout="bshd", inverse=False,
                 fallback="none"):
    return torch.empty_like(q), torch.empty_like(k)


def _rotary_setup(ctx, inputs, output):
    q, k, cos, sin, position_ids, offset, interleaved, qk_layout, inverse, fallback = inputs
    ctx.set_materialize_grads(False)  # None, not a zeros fill, for outputs without a gradient
    ctx.save_for_backward(cos, sin, position_ids)
    ctx.opts = (offset, interleaved, qk_layout, inverse, fallback)
    ctx.shapes, ctx.dtype = (q.shape, k.shape), q.dtype


def _rotary_grad(ctx, dq, dk):
    cos, sin, position_ids = ctx.saved_tensors
    offset, interleaved, qk_layout, inverse, fallback = ctx.opts
    # An output without a gradient (only q' or k' used) contributes zeros.
    dq = torch.zeros(ctx.shapes[0], dtype=ctx.dtype, device=cos.device) if dq is None else dq
    dk = torch.zeros(ctx.shapes[1], dtype=ctx.dtype, device=cos.device) if dk is None else dk
    dq = dq if dq.stride(-1) == 1 else dq.contiguous()
    dk = dk if dk.stride(-1) == 1 else dk.contiguous()
    gq, gk = rotary(dq, dk, cos, sin, position_ids, offset, interleaved, qk_layout, not inverse, fallback)
    return gq, gk, None, None, None, None, None, None, None, None


rotary.register_autograd(_rotary_grad, setup_context=_rotary_setup)


@torch.library.custom_op("cute_kernels::rotary_", mutates_args=("q", "k"))
def rotary_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Optional[Tensor] = None, offset: int = 0,
            interleaved: bool = False, qk_layout: str = "bshd", inverse: bool = False, fallback: str = "none") -> None:
    """`rotary` in place on q and k (inference; no autograd)."""
    kw = dict(position_ids=position_ids, offset=offset, interleaved=interleaved, layout=qk_layout, inverse=inverse)
    _run("rotary_", fallback, (q, k, cos, sin, position_ids), lambda fused: fused.apply_rotary_(q, k, cos, sin, **kw),
         lambda: reference.apply_rotary_(q, k, cos, sin, **kw))


@rotary_.register_fake
def _rotary_inplace_fake(q, k, cos, sin, position_ids=None, offset=0, interleaved=False, qk_layout="bshd",
                         inverse=False, fallback="none"):
    return None


# ---- SwiGLU --------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::swiglu", mutates_args=())
def swiglu(gate: Tensor, up: Optional[Tensor] = None, interleaved: bool = False, fallback: str = "none") -> Tensor:
    """silu(gate) * up (or of the interleaved gate-up tensor's pairs)."""
    return eager.inside("swiglu", _swiglu, (gate, up, interleaved, fallback))


def _swiglu(gate, up, interleaved, fallback):
    """`swiglu`'s checked path (`runtime.eager.inside` replays a recorded call instead)."""
    args = (gate.detach(), _d(up))
    return _run("swiglu", fallback, args, lambda fused: fused.swiglu_forward(*args, interleaved=interleaved),
                lambda: reference.swiglu_forward(*args, interleaved=interleaved))


@swiglu.register_fake
def _swiglu_fake(gate, up=None, interleaved=False, fallback="none"):
    if interleaved:
        return gate.new_empty((*gate.shape[:-1], gate.shape[-1] // 2))
    return gate.new_empty(gate.shape)


@torch.library.custom_op("cute_kernels::swiglu_backward", mutates_args=())
def swiglu_backward(dout: Tensor, gate: Tensor, up: Optional[Tensor] = None, interleaved: bool = False,
                    fallback: str = "none") -> tuple[Tensor, Tensor]:
    """(dgate, dup), or (the interleaved gate-up gradient, empty)."""
    args = (dout.detach(), gate.detach(), _d(up))
    dg, du = _run("swiglu_backward", fallback, args,
                  lambda fused: fused.swiglu_backward(*args, interleaved=interleaved),
                  lambda: reference.swiglu_backward(*args, interleaved=interleaved))
    return dg, _or_empty(du, dg)


@swiglu_backward.register_fake
def _swiglu_backward_fake(dout, gate, up=None, interleaved=False, fallback="none"):
    return gate.new_empty(gate.shape), gate.new_empty((0,)) if interleaved else gate.new_empty(gate.shape)


def _swiglu_setup(ctx, inputs, output):
    gate, up, interleaved, fallback = inputs
    ctx.save_for_backward(gate, up)
    ctx.interleaved, ctx.fallback = interleaved, fallback


def _swiglu_grad(ctx, dout):
    gate, up = ctx.saved_tensors
    dg, du = swiglu_backward(dout.to(gate.dtype), gate, up, ctx.interleaved, ctx.fallback)
    return dg, (None if ctx.interleaved else du), None, None


swiglu.register_autograd(_swiglu_grad, setup_context=_swiglu_setup)


# ---- linear + cross-entropy ----------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(x: Tensor, weight: Tensor, labels: Tensor, bias: Optional[Tensor] = None,
                         ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0,
                         reduction: str = "mean", chunk: int = 0, gemm: str = "torch", need_grad: bool = True,
                         check_labels: bool = True, fallback: str = "none") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, dx, dweight, dbias) of cross_entropy(x @ weight.T + bias, labels) without the full
    logits (`cute_kernels.fused.linear_cross_entropy`); gradients empty when not computed. chunk
    0 picks the default."""
    args = (x.detach(), weight.detach(), labels, _d(bias))
    kw = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss, reduction=reduction,
              chunk=chunk or None, gemm=gemm, need_grad=need_grad, check_labels=check_labels)

    def torch_call():
        loss, dx, dw, db = reference.linear_cross_entropy(*args, **kw)
        return loss.float(), dx, dw, db

    loss, dx, dw, db = _run("linear_cross_entropy", fallback, args,
                            lambda fused: fused.linear_cross_entropy(*args, **kw), torch_call)
    return loss, _or_empty(dx, x), _or_empty(dw, weight), _or_empty(db, weight)


@linear_cross_entropy.register_fake
def _lce_fake(x, weight, labels, bias=None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, reduction="mean",
              chunk=0, gemm="torch", need_grad=True, check_labels=True, fallback="none"):
    loss = x.new_empty((x.shape[0],) if reduction == "none" else (), dtype=torch.float32)
    grads = need_grad and reduction != "none"
    dx = x.new_empty(x.shape) if grads else x.new_empty((0,))
    dw = weight.new_empty(weight.shape) if grads else weight.new_empty((0,))
    db = weight.new_empty((weight.shape[0],)) if grads and bias is not None else weight.new_empty((0,))
    return loss, dx, dw, db


@torch.library.custom_op("cute_kernels::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward(x: Tensor, weight: Tensor, labels: Tensor, dloss: Tensor,
                                  bias: Optional[Tensor] = None, ignore_index: int = -100,
                                  label_smoothing: float = 0.0, z_loss: float = 0.0, chunk: int = 0,
                                  gemm: str = "torch", fallback: str = "none") -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias or empty) for a per-token dloss (reduction "none")."""
    args = (x.detach(), weight.detach(), labels, dloss.detach().float().contiguous(), _d(bias))
    kw = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss, chunk=chunk or None, gemm=gemm)
    dx, dw, db = _run("linear_cross_entropy_backward", fallback, args,
                      lambda fused: fused.linear_cross_entropy_backward(*args, **kw),
                      lambda: reference.linear_cross_entropy_backward(*args, **kw))
    return dx, dw, _or_empty(db, weight)


@linear_cross_entropy_backward.register_fake
def _lce_backward_fake(x, weight, labels, dloss, bias=None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                       chunk=0, gemm="torch", fallback="none"):
    db = weight.new_empty((weight.shape[0],)) if bias is not None else weight.new_empty((0,))
    return x.new_empty(x.shape), weight.new_empty(weight.shape), db


def _lce_setup(ctx, inputs, output):
    x, weight, labels, bias, ignore_index, label_smoothing, z_loss, reduction, chunk, gemm, need_grad, check_labels, \
        fallback = inputs
    loss, dx, dw, db = output
    ctx.mark_non_differentiable(dx, dw, db)
    # None, not zeros, for the outputs without a gradient: autograd's default would fill a dx- and a
    # dweight-sized (vocab x hidden) tensor with zeros on every backward
    ctx.set_materialize_grads(False)
    ctx.reduction = reduction
    if reduction == "none":
        ctx.save_for_backward(x, weight, labels, bias)
        ctx.opts = (ignore_index, label_smoothing, z_loss, chunk, gemm, fallback)
    else:
        # Held as a plain attribute and given up by the backward, not saved: a saved tensor stays
        # referenced by the graph, so autograd's AccumulateGrad copies it into weight.grad (a
        # vocab x hidden copy, 1 GB at Llama-3's vocabulary, every training step); handed over
        # alone, it becomes weight.grad itself.
        ctx.grads = (dx, dw, db)
    ctx.has_bias = bias is not None


def _scaled(g, grad):
    """grad * g for a scalar g, skipping the multiply when g is 1: a host read, made only for a
    plain eager tensor (not while tracing or capturing a CUDA graph)."""
    if grad.numel() == 0:
        return None
    eager = g.__class__ is torch.Tensor and not (g.is_cuda and torch.cuda.is_current_stream_capturing())
    if eager and g.numel() == 1 and float(g) == 1.0:
        return grad
    return grad * g.to(grad.dtype)


def _take_grads(ctx):
    """The forward's gradients, given up by ctx (`_lce_setup` says why); a second backward
    through the same graph (retain_graph=True) finds them gone and says so."""
    grads = getattr(ctx, "grads", None)
    if grads is None:
        raise RuntimeError("cute_kernels.linear_cross_entropy: a second backward through the same graph "
                           "(retain_graph=True): the gradients were computed in the forward and handed to the first "
                           "backward; compute the loss again for another backward, or use reduction='none'")
    ctx.grads = None
    return grads


def _lce_grad(ctx, dloss, ddx, ddw, ddb):
    if dloss is None:
        return (None,) * 13
    if ctx.reduction == "none":
        x, weight, labels, bias = ctx.saved_tensors
        ignore_index, label_smoothing, z_loss, chunk, gemm, fallback = ctx.opts
        dx, dw, db = linear_cross_entropy_backward(x, weight, labels, dloss, bias, ignore_index, label_smoothing,
                                                   z_loss, chunk, gemm, fallback)
        db = db if ctx.has_bias else None
    else:
        dx, dw, db = _take_grads(ctx)
        if dx.numel() == 0 and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            raise RuntimeError("cute_kernels.linear_cross_entropy: the forward ran with need_grad=False; "
                               "call it with gradients enabled to differentiate it")
        dx, dw, db = _scaled(dloss, dx), _scaled(dloss, dw), _scaled(dloss, db) if ctx.has_bias else None
    return (dx if ctx.needs_input_grad[0] else None, dw if ctx.needs_input_grad[1] else None, None,
            db if ctx.has_bias and ctx.needs_input_grad[3] else None) + (None,) * 9


linear_cross_entropy.register_autograd(_lce_grad, setup_context=_lce_setup)
