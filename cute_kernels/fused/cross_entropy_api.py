"""Torch entry points of the cross-entropy kernel: `cross_entropy_forward` (loss and lse, and the
logits' gradient in the same launch when asked) and `cross_entropy_backward` (the gradient from
a saved lse).

Labels are checked on the device before launch (one reduction and a host sync; `check_labels=False`
skips it, and it is skipped while a CUDA graph is being captured): a label outside [0, V) that is
not `ignore_index` raises ValueError. Unchecked, such a label gives a NaN loss (never a read out
of bounds).
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.plan_cache import PlanCache, plain_tensors, tensor_signature

from .host import check_same_device, check_tensor, compile_tvm_ffi, dtype_name, nograd, tensor_vec

__all__ = ["cross_entropy_forward", "cross_entropy_backward", "check_labels_in_range"]

_PLANS = PlanCache("fused.cross_entropy")
_LABELS = (torch.int64, torch.int32)


def check_labels_in_range(op: str, labels, vocab: int, ignore_index: int) -> None:
    """ValueError when a label is outside [0, vocab) and not ignore_index (syncs the device)."""
    if labels.numel() == 0 or (labels.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    bad = ((labels < 0) | (labels >= vocab)) & (labels != ignore_index)
    if bool(bad.any()):
        first = labels[bad].flatten()[0].item()
        raise ValueError(f"{op}: label {first} is outside [0, {vocab}) and is not ignore_index={ignore_index}")


def _check(op, logits, labels, dloss=None, lse=None):
    check_tensor(op, "logits", logits, ndim=2)
    check_tensor(op, "labels", labels, dtypes=_LABELS, ndim=1)
    m, v = logits.shape
    if v < 1:
        raise ValueError(f"{op}: logits need at least one class, got shape {tuple(logits.shape)}")
    if labels.shape[0] != m:
        raise ValueError(f"{op}: labels have {labels.shape[0]} entries but logits have {m} rows")
    if lse is not None:
        check_tensor(op, "lse", lse, dtypes=(torch.float32,), ndim=1)
        if lse.shape[0] != m:
            raise ValueError(f"{op}: lse has {lse.shape[0]} entries but logits have {m} rows")
    if dloss is not None:
        check_tensor(op, "dloss", dloss, dtypes=(torch.float32,))
        if dloss.numel() not in (1, m) or dloss.dim() > 1:
            raise ValueError(f"{op}: dloss must be fp32 of shape ({m},) or one element, got {tuple(dloss.shape)}")
    check_same_device(op, {"logits": logits, "labels": labels, "lse": lse, "dloss": dloss})


def _plan(logits, labels, dloss, grad_out, forward, grad, smoothing, z_loss):
    from .cross_entropy import CrossEntropy, CrossEntropyConfig, kernel_args
    from .dispatch import cross_entropy_tiling, stash_chunks_for

    v, dtype = logits.shape[1], dtype_name(logits.dtype)
    vec = tensor_vec(v, [logits, grad_out])
    fused = forward and grad
    tiling = cross_entropy_tiling(v, dtype, vec=vec, fused=fused)
    stash = stash_chunks_for(v, tiling, dtype) if fused and tiling.rows_per_cta == 1 else 0
    config = CrossEntropyConfig(tiling, dtype, label_dtype=str(labels.dtype).removeprefix("torch."), forward=forward,
                                grad=grad, smoothing=smoothing, z_loss=z_loss,
                                dloss_per_row=dloss is not None and dloss.numel() != 1, stash_chunks=stash)
    return compile_tvm_ffi(CrossEntropy(config), kernel_args(config), ("fused.cross_entropy", config))


def _contiguous_rows(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def cross_entropy_forward(logits, labels, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                          z_loss: float = 0.0, check_labels: bool = True, dloss=None, grad_out=None):
    """(loss, lse, grad): per-row fp32 loss and log-sum-exp of logits (M, V) for integer labels (M,)
    (`cute_kernels.fused.cross_entropy` for the formula). With `dloss` (fp32, (M,) or one element:
    the loss's gradient, e.g. 1 / n_valid for a mean) the logits' gradient is computed in the same
    launch into `grad_out` (default: a new tensor like logits; pass `logits` itself to overwrite
    them); grad is None otherwise."""
    grad = dloss is not None
    sig = None
    if plain_tensors(logits, labels, dloss, grad_out):
        try:
            sig = ("fwd", int(ignore_index), label_smoothing != 0.0, z_loss != 0.0, bool(check_labels),
                   tensor_signature(logits), tensor_signature(labels),
                   None if dloss is None else tensor_signature(dloss),
                   None if grad_out is None else (tensor_signature(grad_out), grad_out.data_ptr() == logits.data_ptr()))
            plan = _PLANS.get(sig)
        except TypeError:
            plan = sig = None
        if plan is not None:
            return plan(logits, labels, dloss, grad_out, label_smoothing, z_loss)
    op = "cute_kernels.fused.cross_entropy"
    if not (0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    _check(op, logits, labels, dloss)
    if grad_out is not None:
        if grad_out.shape != logits.shape or grad_out.dtype != logits.dtype:
            raise ValueError(f"{op}: grad_out must match logits ({tuple(logits.shape)}, {logits.dtype}), got "
                             f"{tuple(grad_out.shape)}, {grad_out.dtype}")
        if grad_out.stride(-1) != 1:
            raise ValueError(f"{op}: grad_out's last dimension must be contiguous (stride 1)")
    in_place = grad_out is not None and grad_out.data_ptr() == logits.data_ptr()
    if in_place and logits.stride() != grad_out.stride():
        raise ValueError(f"{op}: grad_out overlaps logits with different strides")
    x = logits if in_place else _contiguous_rows(logits)
    fn = _plan(x, labels, dloss, grad_out if grad_out is not None else (x if grad else None), True, grad,
               label_smoothing != 0.0, z_loss != 0.0)
    m, v = logits.shape
    device = logits.device
    do_check = bool(check_labels)

    def plan(logits, labels, dloss, grad_out, label_smoothing, z_loss):
        if do_check:
            check_labels_in_range(op, labels, v, ignore_index)
        x = nograd(logits if logits.stride(-1) == 1 else logits.contiguous())
        lab = labels if labels.stride(0) == 1 else labels.contiguous()
        loss = torch.empty((m,), dtype=torch.float32, device=device)
        lse = torch.empty((m,), dtype=torch.float32, device=device)
        g = None
        if grad:
            g = grad_out if grad_out is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
        if m:
            fn(x, lab, loss, lse, None if dloss is None else nograd(dloss).reshape(-1), nograd(g), int(ignore_index),
               float(label_smoothing), float(z_loss))
        return loss, lse, g

    if sig is not None:
        _PLANS.put(sig, plan)
    return plan(logits, labels, dloss, grad_out, label_smoothing, z_loss)


def cross_entropy_backward(logits, labels, lse, dloss, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                           z_loss: float = 0.0, grad_out=None):
    """The logits' gradient (M, V) from the forward's lse and the loss's gradient dloss (fp32, (M,)
    or one element); written to `grad_out` when given (may be `logits` itself)."""
    sig = None
    if plain_tensors(logits, labels, lse, dloss, grad_out):
        try:
            sig = ("bwd", int(ignore_index), label_smoothing != 0.0, z_loss != 0.0, tensor_signature(logits),
                   tensor_signature(labels), tensor_signature(lse), tensor_signature(dloss),
                   None if grad_out is None else tensor_signature(grad_out))
            plan = _PLANS.get(sig)
        except TypeError:
            plan = sig = None
        if plan is not None:
            return plan(logits, labels, lse, dloss, grad_out, label_smoothing, z_loss)
    op = "cute_kernels.fused.cross_entropy_backward"
    if dloss is None:
        raise ValueError(f"{op}: dloss is required")
    _check(op, logits, labels, dloss, lse)
    if grad_out is not None and (grad_out.shape != logits.shape or grad_out.dtype != logits.dtype
                                 or grad_out.stride(-1) != 1):
        raise ValueError(f"{op}: grad_out must match logits' shape and dtype with a contiguous last dimension")
    x = _contiguous_rows(logits)
    fn = _plan(x, labels, dloss, grad_out if grad_out is not None else x, False, True,
               label_smoothing != 0.0, z_loss != 0.0)
    m = logits.shape[0]

    def plan(logits, labels, lse, dloss, grad_out, label_smoothing, z_loss):
        x = nograd(logits if logits.stride(-1) == 1 else logits.contiguous())
        lab = labels if labels.stride(0) == 1 else labels.contiguous()
        g = grad_out if grad_out is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
        if m:
            fn(x, lab, None, nograd(lse if lse.stride(0) == 1 else lse.contiguous()), nograd(dloss).reshape(-1), nograd(g),
               int(ignore_index), float(label_smoothing), float(z_loss))
        return g

    if sig is not None:
        _PLANS.put(sig, plan)
    return plan(logits, labels, lse, dloss, grad_out, label_smoothing, z_loss)
