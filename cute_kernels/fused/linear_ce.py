"""Fused linear + cross-entropy: the loss of `x @ weight.T (+ bias)` against labels, and its
gradients, without ever holding the full (T, V) logits.

The tokens are taken in chunks of `chunk` rows. For each chunk c:

    logits_c = x_c @ weight.T (+ bias)            one (chunk, V) buffer, reused by every chunk
    loss_c, dlogits_c = cross_entropy(logits_c)   one kernel: loss, then the gradient written over
                                                  logits_c (in place), scaled by dloss (1 / n_valid
                                                  on the device for a mean: no host sync)
    dx_c  = dlogits_c @ weight                    written into its rows of dx
    dW   += dlogits_c.T @ x_c                     (the first chunk writes, the others accumulate)
    db   += dlogits_c summed over rows

so the extra memory is one logits buffer (chunk x V in x's dtype) besides dx and dW (which the
caller gets back), and the logits are read twice and written once by the cross-entropy kernel
(`cross_entropy`) between the GEMMs. The default chunk is Liger's rule, next_pow2(T / ceil(V / H)),
which makes the buffer about the size of x (wider under the unverified path `linear_ce_wide_chunk`:
`default_chunk`). With reduction="none" the gradient needs the per-token
dloss of the backward, so the forward computes the loss only and `linear_cross_entropy_backward`
recomputes the logits chunk by chunk.

GEMMs: `gemm="torch"` runs them with torch (cuBLAS; dW accumulates in place with addmm_);
`gemm="cute_kernels"` runs logits and dx on `cute_kernels.gemm.matmul` (dW still accumulates with
torch's addmm_: the GEMM API has no in-place accumulate yet).
"""

from __future__ import annotations

import torch

from .cross_entropy_api import check_labels_in_range, cross_entropy_forward
from .host import check_same_device, check_tensor

__all__ = ["linear_cross_entropy", "linear_cross_entropy_backward", "default_chunk", "REDUCTIONS", "GEMMS"]

REDUCTIONS = ("mean", "sum", "none")
GEMMS = ("torch", "cute_kernels")


# The logits buffer a chunk may fill with wider chunks (unverified path `linear_ce_wide_chunk`):
# 1024 tokens at Llama-3's vocabulary. Why: each chunk's dW GEMM reads and writes the whole
# vocab x hidden gradient, so Liger's 256-token chunks at 8192 x 4096 -> 128256 move 64 GB a
# step (about 15 ms at the copy bandwidth); 1024-token ones 16 GB, for 188 MiB more logits, still
# below the peak of Liger's training step (which copies dW into weight.grad).
WIDE_CHUNK_BYTES = 256 << 20


def _pow2_ceil(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def default_chunk(tokens: int, hidden: int, vocab: int, element_bytes: int = 2) -> int:
    """Liger's chunk: next_pow2(ceil(T / ceil(V / H))), so chunk * V is about T * H; with the path
    `linear_ce_wide_chunk` on, as wide as `WIDE_CHUNK_BYTES` of logits allow, if wider (at most
    the tokens' next power of two)."""
    from cute_kernels.runtime import unverified

    inc = -(-vocab // hidden)
    liger = _pow2_ceil(-(-tokens // inc))
    if not unverified.enabled("linear_ce_wide_chunk"):
        return liger
    fits = max(1, WIDE_CHUNK_BYTES // max(1, vocab * element_bytes))
    return max(liger, min(1 << (fits.bit_length() - 1), _pow2_ceil(tokens)))


def _mm(a, b, gemm: str):
    if gemm == "torch":
        return torch.mm(a, b)
    from cute_kernels.gemm import matmul

    return matmul(a, b)


def _check(op, x, weight, labels, bias, reduction, gemm, chunk, label_smoothing):
    check_tensor(op, "x", x, ndim=2)
    check_tensor(op, "weight", weight, ndim=2)
    if weight.dtype != x.dtype:
        raise TypeError(f"{op}: weight has dtype {weight.dtype} but x has {x.dtype}")
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not compose "
                         "(weight is (vocab, hidden))")
    check_tensor(op, "labels", labels, dtypes=(torch.int64, torch.int32), ndim=1)
    if labels.shape[0] != x.shape[0]:
        raise ValueError(f"{op}: labels have {labels.shape[0]} entries but x has {x.shape[0]} rows")
    if bias is not None:
        check_tensor(op, "bias", bias, ndim=1)
        if bias.shape[0] != weight.shape[0] or bias.dtype != x.dtype:
            raise ValueError(f"{op}: bias must be ({weight.shape[0]},) in {x.dtype}, got {tuple(bias.shape)} {bias.dtype}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if gemm not in GEMMS:
        raise ValueError(f"{op}: gemm must be one of {GEMMS}, got {gemm!r}")
    if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"{op}: chunk must be a positive int or None, got {chunk!r}")
    if not (0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    check_same_device(op, {"x": x, "weight": weight, "labels": labels, "bias": bias})


def _logits(x_c, weight, bias, gemm):
    logits = _mm(x_c, weight.t(), gemm)
    if bias is not None:
        logits.add_(bias)
    return logits


def linear_cross_entropy(x, weight, labels, bias=None, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                         z_loss: float = 0.0, reduction: str = "mean", chunk: int | None = None,
                         gemm: str = "torch", need_grad: bool = True, check_labels: bool = True):
    """(loss, dx, dweight, dbias) for x (T, H), weight (V, H), labels (T,), bias (V,) or None.

    loss: fp32, a scalar for "mean" (over non-ignored tokens) and "sum", (T,) for "none". The
    gradients are those of that loss (None when `need_grad` is False, always for "none", and dbias
    without a bias), in x's dtype; the caller scales them by the loss's incoming gradient.
    """
    op = "cute_kernels.fused.linear_cross_entropy"
    _check(op, x, weight, labels, bias, reduction, gemm, chunk, label_smoothing)
    t, h = x.shape
    v = weight.shape[0]
    if check_labels:
        check_labels_in_range(op, labels, v, ignore_index)
    grads = need_grad and reduction != "none"
    step = chunk or default_chunk(t, h, v, x.element_size())
    loss_rows = torch.empty((t,), dtype=torch.float32, device=x.device)
    if reduction == "mean":
        # 1 / n_valid on the device (inf when every token is ignored: the loss is then NaN, as torch's,
        # and no row's gradient uses it).
        scale = (1.0 / (labels != ignore_index).sum().to(torch.float32)).reshape(1)
    else:
        scale = torch.ones((1,), dtype=torch.float32, device=x.device)
    dx = torch.empty_like(x) if grads else None
    dw = torch.empty_like(weight) if grads else None
    db = torch.zeros((v,), dtype=torch.float32, device=x.device) if grads and bias is not None else None
    for start in range(0, t, step):
        stop = min(t, start + step)
        x_c = x[start:stop]
        logits = _logits(x_c, weight, bias, gemm)
        loss_c, _, dl = cross_entropy_forward(
            logits, labels[start:stop], ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
            check_labels=False, dloss=scale if grads else None, grad_out=logits if grads else None)
        loss_rows[start:stop] = loss_c
        if grads:
            _chunk_grads(dl, x_c, weight, dx[start:stop], dw, db, start == 0, gemm)
        del logits, dl
    if grads and t == 0:
        dw.zero_()
    if reduction == "none":
        loss = loss_rows
    elif reduction == "sum":
        loss = loss_rows.sum()
    else:
        loss = loss_rows.sum() * scale[0]
    return loss, dx, dw, None if db is None else db.to(x.dtype)


def _chunk_grads(dl, x_c, weight, dx_rows, dw, db, first: bool, gemm: str) -> None:
    """One chunk's share of the gradients from its logits' gradient dl: dx_rows = dl W, dW
    (set by the first chunk, accumulated after) += dl^T x_c, db += the column sums of dl."""
    if gemm == "torch":
        torch.mm(dl, weight, out=dx_rows)
    else:
        dx_rows.copy_(_mm(dl, weight, gemm))
    if first:
        torch.mm(dl.t(), x_c, out=dw)
    else:
        dw.addmm_(dl.t(), x_c)
    if db is not None:
        db += dl.sum(0, dtype=torch.float32)


def linear_cross_entropy_backward(x, weight, labels, dloss, bias=None, *, ignore_index: int = -100,
                                  label_smoothing: float = 0.0, z_loss: float = 0.0, chunk: int | None = None,
                                  gemm: str = "torch"):
    """(dx, dweight, dbias) for a per-token dloss (T,) fp32 (reduction="none"): the logits are
    recomputed chunk by chunk, their gradient formed from the lse, as in the forward."""
    op = "cute_kernels.fused.linear_cross_entropy_backward"
    _check(op, x, weight, labels, bias, "none", gemm, chunk, label_smoothing)
    check_tensor(op, "dloss", dloss, dtypes=(torch.float32,), ndim=1)
    t, h = x.shape
    v = weight.shape[0]
    step = chunk or default_chunk(t, h, v, x.element_size())
    dx = torch.empty_like(x)
    dw = torch.empty_like(weight)
    db = torch.zeros((v,), dtype=torch.float32, device=x.device) if bias is not None else None
    d = dloss.contiguous()
    for start in range(0, t, step):
        stop = min(t, start + step)
        x_c = x[start:stop]
        logits = _logits(x_c, weight, bias, gemm)
        _, _, dl = cross_entropy_forward(logits, labels[start:stop], ignore_index=ignore_index,
                                         label_smoothing=label_smoothing, z_loss=z_loss, check_labels=False,
                                         dloss=d[start:stop], grad_out=logits)
        _chunk_grads(dl, x_c, weight, dx[start:stop], dw, db, start == 0, gemm)
        del logits, dl
    if t == 0:
        dw.zero_()
    return dx, dw, None if db is None else db.to(x.dtype)

