"""`cute_kernels::sdpa_masked`: attention over a padded or packed batch, as one operator.

Models hand attention a padded batch: q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv)
with a key-padding mask (B, Sk') (True = a real token; Sk' <= Sk, a static cache's valid
prefix), or rows that pack several sequences end to end (segment ids (B, S), equal within a
sequence, as transformers' `find_packed_sequence_indices` makes them). transformers'
FlashAttention backend unpads to the varlen kernel and pads back around every layer in Python,
which splits a compiled graph at each data-dependent step (nonzero, .item()). Here the round
trip is one opaque operator whose outputs have the padded batch's static shapes, so
torch.compile keeps one graph; the data-dependent part, the varlen plan (`_plan`: which rows
are real, cu_seqlens, the longest sequence), is computed inside, once per mask object, and
reused by every layer and by the backward.

Outputs: out (B, Sq, Hq, Dv) contiguous, the layout models reshape into their output
projection; lse (Hq, B * Sq) fp32, not differentiable (rows of padded queries hold -inf). The
plan decides the path: no padding and one sequence per row runs the dense `sdpa` operator; so
does a causal batch padded on the right only (Sq == Sk': each row's real tokens are its prefix,
so under causality a real query sees no padded key, and the dense kernel needs neither the
gathers nor the host reads of unpadding), its padded query rows overwritten after; otherwise
`sdpa_varlen` runs on the real rows. Padded query rows get out 0.

Which queries are real: with causality, a query's position among the real keys decides what it
sees, so queries are unpadded too: by the same mask when Sq == Sk', one per row when Sq == 1
(a decode step), else by the mask's last Sq columns (left padding, as generate pads; what
transformers' FlashAttention backend assumes). Without causality every query is kept and sees
the real keys (a padded query row then holds what PyTorch's SDPA gives it), which is right for
cross-attention too. Causal masks are aligned bottom-right per sequence (the queries are the
sequence's last tokens), windows are FlashAttention's (`window_left/right`, -1 unbounded).

softcap and sinks (Hq,) are passed to the operators below unchanged (`cute_kernels.attention.
features` defines them); the backward returns the sinks' gradient (`features.sinks_gradient`
over the real rows) when they are given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from cute_kernels.attention.features import sinks_gradient
from cute_kernels.runtime.tensor_memo import TensorMemo

from . import attention as attention_ops
from .fallback import check_fallback

__all__ = ["sdpa_masked", "sdpa_masked_backward", "plan_for"]


@dataclass(frozen=True)
class Plan:
    """How a masked batch runs. `dense`: no padding and one sequence per row, so the dense
    operator runs on k, v cut to `keys_used` rows. Otherwise the varlen operator runs on the
    rows `rows_q` / `rows_k` of the flattened (B * S) batch (None: every row, in order),
    delimited by int32 `cu_q` / `cu_k` (B' + 1,). `real_q` (B, Sq) bool: on the dense path
    of a right-padded causal batch, its real query rows (the others get out 0, lse -inf)."""

    dense: bool
    keys_used: int
    rows_q: Optional[Tensor] = None
    rows_k: Optional[Tensor] = None
    cu_q: Optional[Tensor] = None
    cu_k: Optional[Tensor] = None
    max_q: int = 0
    max_k: int = 0
    real_q: Optional[Tensor] = None


# One plan per mask object: every layer of a forward (and the backward) hands the same mask.
_PLANS = TensorMemo("ops.sdpa_masked.plans", 8)


def _cu(lengths: Tensor) -> Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _rows(mask: Tensor):
    """(flat indices of the True entries, int32 cu_seqlens over the rows, longest row)."""
    lengths = mask.sum(-1, dtype=torch.int32)
    return torch.nonzero(mask.reshape(-1)).flatten(), _cu(lengths), int(lengths.max()) if lengths.numel() else 0


def plan_for(key_mask: Optional[Tensor], segments: Optional[Tensor], seqlen_q: int, seqlen_k: int,
             causal: Optional[str]) -> Plan:
    """The plan for a batch (module docstring), cached per mask object."""
    if key_mask is not None and segments is not None:
        raise ValueError("cute_kernels.sdpa_masked: pass a key_mask or segments, not both")
    if segments is not None:
        return _PLANS.get((segments,), (seqlen_q, seqlen_k), lambda: _segments_plan(segments, seqlen_q, seqlen_k))
    if key_mask is None:
        return Plan(True, seqlen_k)
    return _PLANS.get((key_mask,), (seqlen_q, seqlen_k, causal is not None),
                      lambda: _padding_plan(key_mask, seqlen_q, seqlen_k, causal is not None))


def _segments_plan(segments: Tensor, seqlen_q: int, seqlen_k: int) -> Plan:
    b, s = segments.shape
    if not (seqlen_q == seqlen_k == s):
        raise ValueError(f"cute_kernels.sdpa_masked: segments of shape {tuple(segments.shape)} need Sq == Sk == {s}, "
                         f"got Sq={seqlen_q}, Sk={seqlen_k}")
    # Ids made unique across rows, so a sequence never spans two rows.
    ids = segments.to(torch.int64) + torch.arange(b, device=segments.device)[:, None] * (s + 1)
    _, counts = torch.unique_consecutive(ids.reshape(-1), return_counts=True)
    if counts.numel() == b:
        return Plan(True, seqlen_k)
    cu = _cu(counts)
    longest = int(counts.max())
    return Plan(False, seqlen_k, None, None, cu, cu, longest, longest)


def _padding_plan(key_mask: Tensor, seqlen_q: int, seqlen_k: int, causal: bool) -> Plan:
    b, used = key_mask.shape
    if key_mask.dtype != torch.bool:
        raise TypeError(f"cute_kernels.sdpa_masked: key_mask must be bool (True = a real token), got {key_mask.dtype}")
    if used > seqlen_k:
        raise ValueError(f"cute_kernels.sdpa_masked: key_mask covers {used} keys but key has {seqlen_k}")
    if causal and seqlen_q == used:
        # one read of the device answers both: no padding at all, or padding on the right only
        # (every row a prefix of real tokens), which the dense kernel runs as it is
        lengths = key_mask.sum(-1, dtype=torch.int32)
        prefix = key_mask == (torch.arange(used, device=key_mask.device) < lengths[:, None])
        no_padding, right_padded = torch.stack((key_mask.all(), prefix.all())).tolist()
        if no_padding:
            return Plan(True, used)
        if right_padded:
            return Plan(True, used, real_q=key_mask)
    elif bool(key_mask.all()):
        return Plan(True, used)
    rows_k, cu_k, max_k = _rows(key_mask)
    if not causal:
        cu_q = torch.arange(0, (b + 1) * seqlen_q, seqlen_q, dtype=torch.int32, device=key_mask.device)
        return Plan(False, used, None, rows_k, cu_q, cu_k, seqlen_q, max_k)
    if seqlen_q == used:
        return Plan(False, used, rows_k, rows_k, cu_k, cu_k, max_k, max_k)
    if seqlen_q == 1:
        cu_q = torch.arange(b + 1, dtype=torch.int32, device=key_mask.device)
        return Plan(False, used, None, rows_k, cu_q, cu_k, 1, max_k)
    if seqlen_q > used:
        raise ValueError(f"cute_kernels.sdpa_masked: {seqlen_q} causal queries over a key_mask of {used} keys")
    rows_q, cu_q, max_q = _rows(key_mask[:, -seqlen_q:])
    return Plan(False, used, rows_q, rows_k, cu_q, cu_k, max_q, max_k)


# ---- layout helpers ------------------------------------------------------------------------------

def _packed(t: Tensor, rows: Optional[Tensor], used: int) -> Tensor:
    """(B, H, S, D) -> (rows, H, D): the flattened batch's first `used` tokens per row, then
    `rows` of them (None: all)."""
    flat = t.transpose(1, 2)[:, :used].reshape(-1, t.shape[1], t.shape[3])
    return flat if rows is None else flat.index_select(0, rows)


def _scatter(dst: Tensor, rows: Optional[Tensor], src: Tensor) -> Tensor:
    """Write the packed `src` (rows, H, D) into `dst` (B, S, H, D) at `rows` of its flattened
    batch (None: all rows, in order); dst holds zeros elsewhere. Returns dst."""
    flat = dst.view(-1, dst.shape[2], dst.shape[3])
    if rows is None:
        flat.copy_(src)
    else:
        flat.zero_().index_copy_(0, rows, src)
    return dst


def _features(softcap, sinks) -> dict:
    """The score-feature keywords for the operators below, given only when used."""
    extra = {}
    if softcap is not None:
        extra["softcap"] = softcap
    if sinks is not None:
        extra["sinks"] = sinks
    return extra


# ---- the forward ---------------------------------------------------------------------------------

@torch.library.custom_op("cute_kernels::sdpa_masked", mutates_args=(), tags=attention_ops.HOST_READ_TAGS)
def sdpa_masked(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], segments: Optional[Tensor],
                causal: Optional[str] = None, scale: Optional[float] = None, window_left: int = -1,
                window_right: int = -1, softcap: Optional[float] = None, sinks: Optional[Tensor] = None,
                rung: str = "auto", fallback: str = "none") -> tuple[Tensor, Tensor]:
    """(out (B, Sq, Hq, Dv), lse (Hq, B * Sq)) of attention over a padded (key_mask) or
    packed (segments) batch; see the module docstring. Differentiable in q, k, v and sinks."""
    check_fallback("sdpa_masked", fallback)
    attention_ops._check_causal("sdpa_masked", causal)
    b, hq, sq, _ = q.shape
    plan = plan_for(key_mask, segments, sq, k.shape[2], causal)
    features = _features(softcap, sinks)
    if plan.dense:
        ks, vs = k[:, :, :plan.keys_used], v[:, :, :plan.keys_used]
        align = causal if causal is None or ks.shape[2] != sq else "top_left"
        out, lse = attention_ops.sdpa(q, ks, vs, align, scale, hq != k.shape[1], window_left, window_right,
                                      rung=rung, fallback=fallback, **features)
        out, lse = out.transpose(1, 2).contiguous(), lse.permute(1, 0, 2).reshape(hq, b * sq).contiguous()
        if plan.real_q is not None:
            out.masked_fill_(~plan.real_q[:, :, None, None], 0)
            lse.masked_fill_(~plan.real_q.reshape(1, -1), float("-inf"))
        return out, lse
    qp = _packed(q, plan.rows_q, sq)
    kp, vp = _packed(k, plan.rows_k, plan.keys_used), _packed(v, plan.rows_k, plan.keys_used)
    align = None if causal is None else "bottom_right"
    out_p, lse_p = attention_ops.sdpa_varlen(qp, kp, vp, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, align,
                                             scale, window_left, window_right, rung=rung, fallback=fallback,
                                             **features)
    out = _scatter(q.new_empty((b, sq, hq, v.shape[3])), plan.rows_q, out_p)
    lse = lse_p.new_full((hq, b * sq), float("-inf"))
    if plan.rows_q is None:
        lse.copy_(lse_p)
    else:
        lse.index_copy_(1, plan.rows_q, lse_p)
    return out, lse


@sdpa_masked.register_fake
def _sdpa_masked_fake(q, k, v, key_mask, segments, causal=None, scale=None, window_left=-1, window_right=-1,
                      softcap=None, sinks=None, rung="auto", fallback="none"):
    attention_ops._check_causal("sdpa_masked", causal)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"cute_kernels.sdpa_masked: q, k, v must be 4-D (B, H, S, D), got {q.dim()}-D, "
                         f"{k.dim()}-D, {v.dim()}-D")
    b, hq, sq, _ = q.shape
    return q.new_empty((b, sq, hq, v.shape[3])), q.new_empty((hq, b * sq), dtype=torch.float32)


def _setup(ctx, inputs, output):
    q, k, v, key_mask, segments, *options = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # None, not a zeros fill, for lse's gradient
    ctx.save_for_backward(q, k, v, out, lse, key_mask, segments, options[5])
    names = ("causal", "scale", "window_left", "window_right", "softcap", "sinks", "rung", "fallback")
    ctx.options = {n: o for n, o in zip(names, options) if n != "sinks"}


def _grad(ctx, grad_out, _grad_lse):
    if grad_out is None:
        return (None,) * 13
    q, k, v, out, lse, key_mask, segments, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = sdpa_masked_backward(grad_out, q, k, v, out, lse, key_mask, segments, sinks=sinks,
                                              **ctx.options)
    return dq, dk, dv, None, None, None, None, None, None, None, dsinks if sinks is not None else None, None, None


sdpa_masked.register_autograd(_grad, setup_context=_setup)


# ---- the backward --------------------------------------------------------------------------------

@torch.library.custom_op("cute_kernels::sdpa_masked_backward", mutates_args=(), tags=attention_ops.HOST_READ_TAGS)
def sdpa_masked_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                         key_mask: Optional[Tensor], segments: Optional[Tensor], causal: Optional[str] = None,
                         scale: Optional[float] = None, window_left: int = -1, window_right: int = -1,
                         softcap: Optional[float] = None, sinks: Optional[Tensor] = None, rung: str = "auto",
                         fallback: str = "none") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dsinks) of `sdpa_masked`'s out, strided as q, k, v (`torch.empty_like`);
    dsinks is empty (0 elements) without sinks."""
    check_fallback("sdpa_masked_backward", fallback)
    b, hq, sq, _ = q.shape
    plan = plan_for(key_mask, segments, sq, k.shape[2], causal)
    features = _features(softcap, sinks)
    dsinks = q.new_empty(0)
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if plan.dense:
        used = plan.keys_used
        ks, vs = k[:, :, :used], v[:, :, :used]
        align = causal if causal is None or used != sq else "top_left"
        if plan.real_q is not None:
            # the padded query rows' out is a constant 0: no gradient reaches their scores. An
            # lse of +inf gives those rows probabilities of exactly 0 (-inf would give inf * 0).
            grad_out = grad_out.masked_fill(~plan.real_q[:, :, None, None], 0)
            lse = lse.masked_fill(~plan.real_q.reshape(1, -1), float("inf"))
        gq, gk, gv = attention_ops.sdpa_backward(
            grad_out.transpose(1, 2), q, ks, vs, out.transpose(1, 2), lse.view(hq, b, sq).permute(1, 0, 2).contiguous(),
            align, scale, hq != k.shape[1], window_left, window_right, rung=rung, fallback=fallback, **features)
        if sinks is not None:
            flat = lambda t: t.reshape(-1, t.shape[2], t.shape[3])  # noqa: E731
            dsinks = sinks_gradient(flat(grad_out), flat(out), lse, sinks, packed=True)
        dq.copy_(gq)
        dk[:, :, :used].copy_(gk)
        dv[:, :, :used].copy_(gv)
    else:
        flat = lambda t: t.reshape(-1, t.shape[2], t.shape[3])  # noqa: E731 - (B, S, H, D) -> (B*S, H, D)
        rows_q, rows_k, used = plan.rows_q, plan.rows_k, plan.keys_used
        pick = (lambda t: flat(t)) if rows_q is None else (lambda t: flat(t).index_select(0, rows_q))
        lse_p = lse if rows_q is None else lse.index_select(1, rows_q)
        align = None if causal is None else "bottom_right"
        dout_p, out_p, lse_p = pick(grad_out.contiguous()), pick(out), lse_p.contiguous()
        gq, gk, gv = attention_ops.sdpa_varlen_backward(
            dout_p, _packed(q, rows_q, sq), _packed(k, rows_k, used), _packed(v, rows_k, used), out_p, lse_p,
            plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, align, scale, window_left, window_right, rung=rung,
            fallback=fallback, **features)
        if sinks is not None:
            dsinks = sinks_gradient(dout_p, out_p, lse_p, sinks, packed=True)
        _scatter_into(dq, rows_q, gq, sq)
        _scatter_into(dk, rows_k, gk, used)
        _scatter_into(dv, rows_k, gv, used)
    return dq, dk, dv, dsinks


def _scatter_into(dst: Tensor, rows: Optional[Tensor], src: Tensor, used: int) -> None:
    """dst (B, H, S, D) gets the packed gradient src (rows, H, D) at its first `used` tokens of
    each row (`rows` of the flattened batch; None: all), zeros elsewhere."""
    b, h, s, d = dst.shape
    full = src.new_zeros((b * used, h, d)) if rows is not None else src
    if rows is not None:
        full.index_copy_(0, rows, src)
    dst[:, :, :used].copy_(full.view(b, used, h, d).transpose(1, 2))
    if used < s:
        dst[:, :, used:].zero_()


@sdpa_masked_backward.register_fake
def _sdpa_masked_backward_fake(grad_out, q, k, v, out, lse, key_mask, segments, causal=None, scale=None,
                               window_left=-1, window_right=-1, softcap=None, sinks=None, rung="auto",
                               fallback="none"):
    dsinks = q.new_empty(0) if sinks is None else torch.empty_like(sinks)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks
