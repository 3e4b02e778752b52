"""The fused kernels' functions in plain PyTorch: what `fallback="torch"` computes and what tests
compare against (given float64 inputs they compute in float64).

Each mirrors its kernel entry point's signature and result (shapes, dtypes, None entries) and
computes in fp32 (or the input's precision when wider), rounding to the output dtype once.
"""

from __future__ import annotations

import torch

__all__ = [
    "norm_forward", "norm_backward", "softmax_forward", "softmax_backward", "cross_entropy_forward",
    "cross_entropy_backward", "apply_rotary_", "swiglu_forward", "swiglu_backward", "linear_cross_entropy",
    "linear_cross_entropy_backward",
]


def _acc(*tensors):
    """The compute dtype: float32, or float64 when any input is float64."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def norm_forward(x, weight=None, bias=None, residual=None, *, kind="rms", eps=1e-6, offset=0.0, save_stats=True,
                 out_dtype=None):
    acc = _acc(x, weight, residual)
    s = x.to(acc)
    s_out = None
    if residual is not None:
        s = s + residual.to(acc)
        s_out = s.to(residual.dtype)
    if kind == "layer":
        mean = s.mean(-1, keepdim=True)
        var = (s - mean).square().mean(-1, keepdim=True)
    else:
        mean = torch.zeros_like(s[..., :1])
        var = s.square().mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = (s - mean) * rstd
    if weight is not None:
        y = y * (weight.to(acc) + offset)
    if bias is not None:
        y = y + bias.to(acc)
    stats = (rstd.squeeze(-1).to(acc), mean.squeeze(-1).to(acc) if kind == "layer" else None) if save_stats \
        else (None, None)
    return y.to(out_dtype or x.dtype), s_out, stats[0], stats[1]


def norm_backward(dy, s, weight, rstd, mean=None, *, kind="rms", offset=0.0, dsum=None, has_bias=False,
                  weight_grad=True):
    acc = _acc(dy, s, weight)
    n = s.shape[-1]
    r = rstd.to(acc).unsqueeze(-1)
    mu = mean.to(acc).unsqueeze(-1) if kind == "layer" else 0.0
    xhat = (s.to(acc) - mu) * r
    d = dy.to(acc)
    g = d * (weight.to(acc) + offset) if weight is not None else d
    dx = g - xhat * (g * xhat).sum(-1, keepdim=True) / n
    if kind == "layer":
        dx = dx - g.sum(-1, keepdim=True) / n
    dx = dx * r
    if dsum is not None:
        dx = dx + dsum.to(acc)
    lead = tuple(range(d.dim() - 1))
    dw = (d * xhat).sum(lead).to(weight.dtype) if weight is not None and weight_grad else None
    db = d.sum(lead).to(weight.dtype) if has_bias and weight_grad else None
    return dx.to(s.dtype), dw, db


def softmax_forward(x, *, out_dtype=None):
    return torch.softmax(x.to(_acc(x)), dim=-1).to(out_dtype or x.dtype)


def softmax_backward(y, dy, *, out_dtype=None):
    acc = _acc(y, dy)
    yf, d = y.to(acc), dy.to(acc)
    return (yf * (d - (d * yf).sum(-1, keepdim=True))).to(out_dtype or dy.dtype)


def _ce_parts(logits, labels, ignore_index, label_smoothing, z_loss):
    acc = _acc(logits)
    x = logits.to(acc)
    lse = torch.logsumexp(x, dim=-1)
    v = x.shape[-1]
    valid = labels != ignore_index
    safe = torch.where(valid & (labels >= 0) & (labels < v), labels, torch.zeros_like(labels)).long()
    target = x.gather(-1, safe[:, None]).squeeze(-1)
    in_range = (labels >= 0) & (labels < v)
    target = torch.where(in_range | ~valid, target, torch.full_like(target, float("nan")))
    loss = lse - (1.0 - label_smoothing) * target
    if label_smoothing:
        loss = loss - label_smoothing * x.sum(-1) / v
    if z_loss:
        loss = loss + z_loss * lse * lse
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    return x, lse, valid, safe, loss


def _ce_grad(x, lse, valid, safe, dloss, label_smoothing, z_loss, dtype):
    v = x.shape[-1]
    d = dloss.to(x.dtype).reshape(-1)
    d = d.expand(x.shape[0]) if d.numel() == 1 else d
    d = torch.where(valid, d, torch.zeros_like(d))
    p = torch.exp(x - lse[:, None])
    g = p * (1.0 + 2.0 * z_loss * lse[:, None]) - label_smoothing / v
    g = g * d[:, None]
    g.scatter_add_(-1, safe[:, None], (-(1.0 - label_smoothing) * d)[:, None])
    return g.to(dtype)


def cross_entropy_forward(logits, labels, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, check_labels=True,
                          dloss=None, grad_out=None):
    x, lse, valid, safe, loss = _ce_parts(logits, labels, ignore_index, label_smoothing, z_loss)
    grad = None
    if dloss is not None:
        grad = _ce_grad(x, lse, valid, safe, dloss, label_smoothing, z_loss, logits.dtype)
        if grad_out is not None:
            grad = grad_out.copy_(grad)
    return loss.to(_acc(logits)), lse.to(_acc(logits)), grad


def cross_entropy_backward(logits, labels, lse, dloss, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                           grad_out=None):
    x, _, valid, safe, _ = _ce_parts(logits, labels, ignore_index, label_smoothing, z_loss)
    grad = _ce_grad(x, lse.to(x.dtype), valid, safe, dloss, label_smoothing, z_loss, logits.dtype)
    return grad if grad_out is None else grad_out.copy_(grad)


def _rotate(x, cos, sin, interleaved):
    """x (..., R) rotated by the angles of cos, sin (..., R/2), in the compute dtype."""
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def apply_rotary_(q, k, cos, sin, *, position_ids=None, offset=0, interleaved=False, layout="bshd", inverse=False,
                  check_positions=True):
    qb = q if layout == "bshd" else q.transpose(1, 2)
    kb = k if layout == "bshd" else k.transpose(1, 2)
    b, s = qb.shape[0], qb.shape[1]
    rotary = 2 * cos.shape[1]
    pos = position_ids.long() if position_ids is not None else \
        (torch.arange(s, device=q.device) + offset)[None, :].expand(b, s)
    acc = _acc(q, cos)
    ok = (pos >= 0) & (pos < cos.shape[0])
    c = cos.to(acc)[pos.clamp(0, cos.shape[0] - 1)]  # (B, S, R/2)
    sn = sin.to(acc)[pos.clamp(0, cos.shape[0] - 1)]
    nan = torch.where(ok, 0.0, float("nan")).to(acc)[..., None]
    c, sn = c + nan, sn + nan
    if inverse:
        sn = -sn
    for t in (qb, kb):
        part = t[..., :rotary]
        part.copy_(_rotate(part.to(acc), c[:, :, None, :], sn[:, :, None, :], interleaved).to(t.dtype))
    return q, k


def swiglu_forward(gate, up=None, *, interleaved=False):
    if interleaved:
        gate, up = gate[..., 0::2], gate[..., 1::2]
    acc = _acc(gate)
    g = gate.to(acc)
    return (torch.nn.functional.silu(g) * up.to(acc)).to(gate.dtype)


def swiglu_backward(dout, gate, up=None, *, interleaved=False):
    gu = gate
    if interleaved:
        gate, up = gate[..., 0::2], gate[..., 1::2]
    acc = _acc(gate)
    g, u, d = gate.to(acc), up.to(acc), dout.to(acc)
    sg = torch.sigmoid(g)
    dg = d * u * sg * (1 + g * (1 - sg))
    du = d * g * sg
    if interleaved:
        out = torch.empty(gu.shape, dtype=acc, device=gu.device)
        out[..., 0::2], out[..., 1::2] = dg, du
        return out.to(gu.dtype), None
    return dg.to(gate.dtype), du.to(gate.dtype)


def linear_cross_entropy(x, weight, labels, bias=None, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                         reduction="mean", chunk=None, gemm="torch", need_grad=True, check_labels=True):
    acc = _acc(x)
    logits = x.to(acc) @ weight.to(acc).t()
    if bias is not None:
        logits = logits + bias.to(acc)
    lx, lse, valid, safe, loss_rows = _ce_parts(logits, labels, ignore_index, label_smoothing, z_loss)
    if reduction == "none":
        return loss_rows, None, None, None
    n = valid.sum().to(acc)
    scale = 1.0 / n if reduction == "mean" else torch.ones((), dtype=acc, device=x.device)
    loss = loss_rows.sum() * scale
    if not need_grad:
        return loss, None, None, None
    dl = _ce_grad(lx, lse, valid, safe, scale.reshape(1), label_smoothing, z_loss, acc)
    dx = (dl @ weight.to(acc)).to(x.dtype)
    dw = (dl.t() @ x.to(acc)).to(weight.dtype)
    db = dl.sum(0).to(x.dtype) if bias is not None else None
    return loss, dx, dw, db


def linear_cross_entropy_backward(x, weight, labels, dloss, bias=None, *, ignore_index=-100, label_smoothing=0.0,
                                  z_loss=0.0, chunk=None, gemm="torch"):
    acc = _acc(x)
    logits = x.to(acc) @ weight.to(acc).t()
    if bias is not None:
        logits = logits + bias.to(acc)
    lx, lse, valid, safe, _ = _ce_parts(logits, labels, ignore_index, label_smoothing, z_loss)
    dl = _ce_grad(lx, lse, valid, safe, dloss, label_smoothing, z_loss, acc)
    return ((dl @ weight.to(acc)).to(x.dtype), (dl.t() @ x.to(acc)).to(weight.dtype),
            dl.sum(0).to(x.dtype) if bias is not None else None)
