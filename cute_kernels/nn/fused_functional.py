"""Functional forms of the fused kernels, drop-in for their torch.nn.functional namesakes where
one exists (`rms_norm`, `layer_norm`, `softmax`, `cross_entropy`), plus `fused_add_rms_norm`,
`fused_add_layer_norm`, `linear_cross_entropy`, `rotary_embedding`, `swiglu` and `linear_swiglu`.

Each calls a `cute_kernels::` operator (`cute_kernels.ops.fused`; the norms, softmax and SwiGLU
through its eager direct path, `ops.eager_fused`, which a warm eager call takes instead of the
op), so it compiles to one opaque op, differentiates through the op's backward, and takes
`fallback` ("none": input the kernels do not take raises; "torch": PyTorch computes it, with a
`FallbackWarning`).
"""

from __future__ import annotations

import math

import torch

from cute_kernels.ops import fused as fops
from cute_kernels.ops.gated import linear_swiglu as linear_swiglu_op
from cute_kernels.ops.eager_fused import norm as norm_entry
from cute_kernels.ops.eager_fused import softmax as softmax_entry
from cute_kernels.ops.eager_fused import swiglu as swiglu_entry

__all__ = ["rms_norm", "layer_norm", "fused_add_rms_norm", "fused_add_layer_norm", "softmax", "cross_entropy",
           "linear_cross_entropy", "rotary_embedding", "swiglu", "linear_swiglu", "REDUCTIONS"]

REDUCTIONS = ("mean", "sum", "none")


def _flat_norm_args(x, normalized_shape, weight, bias, op):
    """x, weight, bias with the normalized dims flattened into one last dim (views)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(x.shape[-len(shape):]) != shape:
        raise ValueError(f"{op}: normalized_shape {shape} does not match the trailing dims of input {tuple(x.shape)}")
    if len(shape) == 1:
        return x, weight, bias, None
    n = math.prod(shape)
    flat = lambda t: None if t is None else t.reshape(n)  # noqa: E731
    return x.reshape(*x.shape[:-len(shape)], n), flat(weight), flat(bias), x.shape


def _norm(x, normalized_shape, weight, bias, residual, kind, eps, offset, out_dtype, fallback, op):
    x2, w, b, restore = _flat_norm_args(x, normalized_shape, weight, bias, op)
    r2 = None if residual is None else residual.reshape(x2.shape)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    y, s, _, _ = norm_entry(x2, w, b, r2, kind, float(eps), float(offset), out_dtype, fallback)
    if restore is not None:
        y = y.reshape(restore)
        s = s.reshape(restore) if residual is not None else s
    return y, (s if residual is not None else None)


def rms_norm(input, normalized_shape, weight=None, eps=None, *, offset: float = 0.0, out_dtype=None,
             fallback: str = "none"):
    """torch.nn.functional.rms_norm (eps None: the input dtype's machine epsilon, as torch), plus
    `offset` added to the weight (1.0 for Gemma's (1 + weight)) and `out_dtype`."""
    return _norm(input, normalized_shape, weight, None, None, "rms", eps, offset, out_dtype, fallback,
                 "cute_kernels.nn.functional.rms_norm")[0]


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5, *, out_dtype=None,
               fallback: str = "none"):
    """torch.nn.functional.layer_norm on the fused kernel."""
    return _norm(input, normalized_shape, weight, bias, None, "layer", eps, 0.0, out_dtype, fallback,
                 "cute_kernels.nn.functional.layer_norm")[0]


def fused_add_rms_norm(input, residual, normalized_shape, weight=None, eps=None, *, offset: float = 0.0,
                       out_dtype=None, fallback: str = "none"):
    """(rms_norm(input + residual), input + residual) in one pass (the sum in residual's dtype)."""
    return _norm(input, normalized_shape, weight, None, residual, "rms", eps, offset, out_dtype, fallback,
                 "cute_kernels.nn.functional.fused_add_rms_norm")


def fused_add_layer_norm(input, residual, normalized_shape, weight=None, bias=None, eps: float = 1e-5, *,
                         out_dtype=None, fallback: str = "none"):
    """(layer_norm(input + residual), input + residual) in one pass."""
    return _norm(input, normalized_shape, weight, bias, residual, "layer", eps, 0.0, out_dtype, fallback,
                 "cute_kernels.nn.functional.fused_add_layer_norm")


def softmax(input, dim: int = -1, *, fallback: str = "none"):
    """torch.softmax(input, dim) (fp32 math, the input's dtype)."""
    return softmax_entry(input, dim, fallback)


def _reduce(loss_rows, labels, ignore_index, reduction):
    if reduction == "none":
        return loss_rows
    if reduction == "sum":
        return loss_rows.sum()
    return loss_rows.sum() / (labels != ignore_index).sum()


def cross_entropy(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, *, z_loss: float = 0.0, check_labels: bool = True,
                  fallback: str = "none"):
    """torch.nn.functional.cross_entropy for class-index targets: input (N, C) or (N, C, d1, ...)
    (moved to rows of C), target (N,) / (N, d1, ...); plus z_loss * logsumexp^2 per row. Class
    weights are not supported by the kernel (NotImplementedError, or torch with fallback="torch")."""
    op = "cute_kernels.nn.functional.cross_entropy"
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if weight is not None or target.is_floating_point():
        what = "class weights" if weight is not None else "probability targets"
        if fallback != "torch":
            raise NotImplementedError(f"{op}: {what} are not supported by the kernel; pass fallback='torch'")
        from cute_kernels.ops.fallback import note_fallback

        note_fallback("cross_entropy", what)
        return torch.nn.functional.cross_entropy(input, target, weight, ignore_index=ignore_index,
                                                 reduction=reduction, label_smoothing=label_smoothing)
    logits = input if input.dim() == 2 else input.movedim(1, -1).reshape(-1, input.shape[1])
    labels = target.reshape(-1)
    rows, _ = fops.cross_entropy(logits, labels, ignore_index, float(label_smoothing), float(z_loss), check_labels,
                                 fallback)
    if reduction == "none" and input.dim() != 2:
        rows = rows.reshape(target.shape)
    return _reduce(rows, labels, ignore_index, reduction)


def linear_cross_entropy(input, weight, target, bias=None, *, ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0, z_loss: float = 0.0, chunk: int | None = None,
                         gemm: str = "torch", check_labels: bool = True, fallback: str = "none"):
    """cross_entropy(input @ weight.T + bias, target) without materializing the logits: input
    (..., H), weight (V, H), target (...). The gradients of x, weight and bias are computed in the
    forward (chunk by chunk; `cute_kernels.fused.linear_cross_entropy`) when autograd needs them."""
    x = input.reshape(-1, input.shape[-1])
    labels = target.reshape(-1)
    need = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad))
    loss, _, _, _ = fops.linear_cross_entropy(x, weight, labels, bias, ignore_index, float(label_smoothing),
                                              float(z_loss), reduction, chunk or 0, gemm, need, check_labels,
                                              fallback)
    return loss.reshape(target.shape) if reduction == "none" else loss


def rotary_embedding(q, k, cos, sin, *, position_ids=None, offset: int = 0, interleaved: bool = False,
                     layout: str = "bshd", inplace: bool = False, fallback: str = "none"):
    """(q', k') with rotary embeddings (`cute_kernels.fused.rope`): cos, sin (P, R/2) tables,
    positions `position_ids` (B, S) or offset + s; `inplace` rotates q and k themselves (no autograd)."""
    if inplace:
        fops.rotary_(q, k, cos, sin, position_ids, int(offset), interleaved, layout, False, fallback)
        return q, k
    return fops.rotary(q, k, cos, sin, position_ids, int(offset), interleaved, layout, False, fallback)


def swiglu(gate, up=None, *, interleaved: bool = False, fallback: str = "none"):
    """silu(gate) * up; with `interleaved`, of one (..., 2I) tensor whose columns alternate g, u."""
    return swiglu_entry(gate, up, interleaved, fallback)


def linear_swiglu(input, weight, *, kernel: str = "auto", fallback: str = "none"):
    """silu(input @ Wg^T) * (input @ Wu^T) for an interleaved gate-up weight (2I, K)
    (`cute_kernels.gemm.gated.interleave_gate_up`), from one GEMM that gates in its epilogue on
    sm_90 (`cute_kernels::linear_swiglu`). The product is kept for the backward only when
    autograd records the call. `kernel`: "auto", or a GEMM rung for the product (then gated by
    the elementwise kernel)."""
    need = torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad)
    h, _ = linear_swiglu_op(input, weight, need, kernel, fallback)
    return h
