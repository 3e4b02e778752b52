"""Attention by its definition in PyTorch: what `fallback="torch"` computes, and what tests
compare against. Not fast: it materializes the (Sq, Sk) score matrix, in fp32 (fp64 for fp64
input).

Conventions (those of `cute_kernels.attention.attention_forward`): q (..., Hq, Sq, D),
k (..., Hkv, Sk, D), v (..., Hkv, Sk, Dv); query head h reads key/value head h // (Hq / Hkv);
causal None, "top_left" (key j visible to row i when j <= i) or "bottom_right"
(j <= i + Sk - Sq); window_size None or (left, right), FlashAttention's sliding window with -1
for an unbounded side: also i + base - left <= j <= i + base + right, base the diagonal's offset
(0 top-left causal, else Sk - Sq; `cute_kernels.attention.mask_rule`, whose DSL-free definition
of the mask this module uses); lse = logsumexp over visible keys of the scaled scores, fp32,
natural log; a row that sees no key has out 0 and lse -inf.

Score features (`cute_kernels.attention.features` defines them): softcap c turns the scaled
scores into c * tanh(s / c) before the mask; sinks (Hq,) join each row's softmax denominator
(lse includes them; a row with no visible key then has lse = sink); varlen's seqused_k (B,)
keeps the first seqused_k[b] keys of each sequence. `masked_attention` is the definition with a
dense attn_mask too (what the functional form's fallback computes when PyTorch's SDPA cannot
take a feature); it is differentiable by autograd.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cute_kernels.attention.mask_rule import canonical_window, dense_mask

__all__ = ["forward", "backward", "varlen_forward", "varlen_backward", "paged_decode", "masked_attention"]

_CAUSAL = (None, "top_left", "bottom_right")


def _scale(scale, d: int) -> float:
    return (1.0 / math.sqrt(d) if d > 0 else 1.0) if scale is None else float(scale)


def _expand_heads(t: Tensor, hq: int) -> Tensor:
    hk = t.shape[-3]
    if hk == hq:
        return t
    if hk == 0 or hq % hk:
        raise ValueError(f"attention: query heads ({hq}) must be a multiple of key/value heads ({hk})")
    return t.repeat_interleave(hq // hk, dim=-3)


def _capped(s: Tensor, softcap):
    """(scores, tanh) after the soft cap: softcap * tanh(s / softcap), or (s, None) without one."""
    if softcap is None:
        return s, None
    t = torch.tanh(s / softcap)
    return softcap * t, t


def _softmax(s: Tensor, sinks=None):
    """(p, lse) of masked scores s (..., H, Sq, Sk), the sinks (H,) in the denominator."""
    if sinks is None:
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
    else:
        sink = sinks.to(s.dtype)[:, None, None].expand(*s.shape[:-1], 1)
        lse = torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1, keepdim=True)
    # A row with no visible key (and no sink) has lse = -inf; its probabilities are 0, not NaN.
    p = torch.where(torch.isinf(lse) & (lse < 0), torch.zeros_like(s), torch.exp(s - lse))
    return p, lse.squeeze(-1)


def _probabilities(q: Tensor, k: Tensor, causal, scale: float, window_size=None, softcap=None, sinks=None):
    """(p, lse, tanh or None): softmax of the masked, scaled (soft-capped) scores, its
    log-normalizer (sinks included) and the soft cap's tanh, in q's dtype."""
    if causal not in _CAUSAL:
        raise ValueError(f"attention: causal must be one of {_CAUSAL}, got {causal!r}")
    causal, left, right = canonical_window(window_size, causal, "attention")
    s, t = _capped((q @ k.transpose(-1, -2)) * scale, softcap)
    if causal is not None or left is not None or right is not None:
        keep = dense_mask(s.shape[-2], s.shape[-1], causal=causal is not None, align=causal or "top_left",
                          window_left=left, window_right=right, device=s.device)
        s = s.masked_fill(~keep, -math.inf)
    p, lse = _softmax(s, sinks)
    return p, lse, t


def _acc(t: Tensor) -> Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def forward(q: Tensor, k: Tensor, v: Tensor, causal=None, scale=None, enable_gqa: bool = False, window_size=None,
            softcap=None, sinks=None):
    """(out, lse) of attention by definition; out in q's dtype, lse fp32, both contiguous."""
    hq = q.shape[-3]
    if k.shape[-3] != hq and not enable_gqa:
        raise ValueError(f"attention: query has {hq} heads but key/value have {k.shape[-3]}; pass enable_gqa=True")
    qf, kf, vf = _acc(q), _expand_heads(_acc(k), hq), _expand_heads(_acc(v), hq)
    p, lse, _ = _probabilities(qf, kf, causal, _scale(scale, q.shape[-1]), window_size, softcap, sinks)
    return (p @ vf).to(q.dtype).contiguous(), lse.to(torch.float32).contiguous()


def backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, causal=None, scale=None, enable_gqa: bool = False,
             window_size=None, softcap=None, sinks=None):
    """(dq, dk, dv) of `forward`'s out by definition (recomputing the probabilities in the
    accumulation precision): dV = Pᵀ dO, dS = P ∘ (dO Vᵀ - rowsum(dO ∘ O)), times (1 - tanh²)
    under a soft cap, dQ = s·dS K, dK = s·dSᵀ Q, with key/value gradients summed over the query
    heads sharing them. The sinks enter through P only; their own gradient is
    `cute_kernels.attention.features.sinks_gradient`."""
    hq, hk = q.shape[-3], k.shape[-3]
    scale = _scale(scale, q.shape[-1])
    qf, kf, vf = _acc(q), _expand_heads(_acc(k), hq), _expand_heads(_acc(v), hq)
    do = grad_out.to(qf.dtype)
    p, _, t = _probabilities(qf, kf, causal, scale, window_size, softcap, sinks)
    o = p @ vf
    dv = p.transpose(-1, -2) @ do
    ds = p * (do @ vf.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    if t is not None:
        ds = ds * (1 - t * t)
    dq = (ds @ kf) * scale
    dk = (ds.transpose(-1, -2) @ qf) * scale
    if hk != hq:
        dk = dk.unflatten(-3, (hk, hq // hk)).sum(-3)
        dv = dv.unflatten(-3, (hk, hq // hk)).sum(-3)
    return dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous()


def _sequences(q: Tensor, k: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k=None):
    """[(q rows, k rows)] slices of each packed sequence, the offsets checked (k rows cut to
    seqused_k[b] when given)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if len(cq) != len(ck) or len(cq) < 1:
        raise ValueError(f"attention: cu_seqlens_q ({len(cq)}) and cu_seqlens_k ({len(ck)}) must have the same "
                         "length, at least 1")
    if cq[0] != 0 or ck[0] != 0 or cq[-1] != q.shape[0] or ck[-1] != k.shape[0]:
        raise ValueError(f"attention: cu_seqlens must start at 0 and end at the total lengths ({q.shape[0]}, "
                         f"{k.shape[0]}), got {cq} and {ck}")
    for name, c in (("cu_seqlens_q", cq), ("cu_seqlens_k", ck)):
        bad = [i for i in range(1, len(c)) if c[i] < c[i - 1]]
        if bad:
            raise ValueError(f"attention: {name} decreases at index {bad[0]}: {c[bad[0] - 1]} -> {c[bad[0]]}")
    used = None if seqused_k is None else seqused_k.tolist()
    if used is not None and len(used) != len(ck) - 1:
        raise ValueError(f"attention: seqused_k has {len(used)} entries for {len(ck) - 1} sequences")
    spans = []
    for b in range(len(cq) - 1):
        end = ck[b + 1]
        if used is not None:
            if not 0 <= used[b] <= ck[b + 1] - ck[b]:
                raise ValueError(f"attention: seqused_k[{b}] = {used[b]} but sequence {b} has {ck[b + 1] - ck[b]} keys")
            end = ck[b] + used[b]
        spans.append((slice(cq[b], cq[b + 1]), slice(ck[b], end)))
    return spans


def varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, causal=None,
                   scale=None, window_size=None, softcap=None, sinks=None, seqused_k=None):
    """(out (Tq, Hq, Dv), lse (Hq, Tq) fp32) for sequences packed along dim 0: sequence b holds
    rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k, v
    (its first seqused_k[b] key rows when given); masks and windows apply to each sequence on
    its own (its own Sq_b, Sk_b)."""
    out = q.new_zeros((q.shape[0], q.shape[1], v.shape[2]))
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    for rows, keys in _sequences(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k):
        qs, ks, vs = (t.transpose(0, 1) for t in (q[rows], k[keys], v[keys]))
        o, l = forward(qs, ks, vs, causal, scale, enable_gqa=True, window_size=window_size, softcap=softcap,
                       sinks=sinks)
        out[rows] = o.transpose(0, 1)
        lse[:, rows] = l
    return out, lse


def varlen_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                    causal=None, scale=None, window_size=None, softcap=None, sinks=None, seqused_k=None):
    """(dq, dk, dv) of `varlen_forward`'s out for grad_out (Tq, Hq, Dv): `backward` on each
    sequence on its own; shaped and typed as q, k, v, contiguous (zero for unused key rows)."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for rows, keys in _sequences(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k):
        qs, ks, vs, gs = (t.transpose(0, 1) for t in (q[rows], k[keys], v[keys], grad_out[rows]))
        g = backward(gs, qs, ks, vs, causal, scale, enable_gqa=True, window_size=window_size, softcap=softcap,
                     sinks=sinks)
        for total, part, index in ((dq, g[0], rows), (dk, g[1], keys), (dv, g[2], keys)):
            total[index] = part.transpose(0, 1)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


def paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seqlens_k: Tensor, scale=None):
    """out (B, Hq, Dv): one query token per sequence attending to its cached keys, where
    sequence b's key t lives in page block_table[b, t // page_size], slot t % page_size of
    k_cache (num_pages, page_size, Hkv, D) / v_cache (num_pages, page_size, Hkv, Dv)."""
    page = k_cache.shape[1]
    out = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1]))
    for b, n in enumerate(seqlens_k.tolist()):
        pages = block_table[b, : -(-n // page)].long()
        ks = k_cache[pages].flatten(0, 1)[:n].transpose(0, 1)
        vs = v_cache[pages].flatten(0, 1)[:n].transpose(0, 1)
        o, _ = forward(q[b].unsqueeze(1), ks, vs, None, scale, enable_gqa=True)
        out[b] = o[:, 0]
    return out


def masked_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask=None, dropout_p: float = 0.0, causal=None,
                     scale=None, enable_gqa: bool = False, window_size=None, softcap=None, sinks=None):
    """(out, lse) of attention by definition with PyTorch SDPA's dense `attn_mask` too (boolean:
    True attends; floating: added to the scores after the soft cap), `dropout_p` on the
    probabilities (as SDPA: dropped and rescaled by 1 / (1 - p); lse is before dropout), and
    every option of `forward`. Differentiable by autograd in every tensor argument; out in q's
    dtype, lse fp32."""
    hq = q.shape[-3]
    if k.shape[-3] != hq and not enable_gqa:
        raise ValueError(f"attention: query has {hq} heads but key/value have {k.shape[-3]}; pass enable_gqa=True")
    if causal not in _CAUSAL:
        raise ValueError(f"attention: causal must be one of {_CAUSAL}, got {causal!r}")
    qf, kf, vf = _acc(q), _expand_heads(_acc(k), hq), _expand_heads(_acc(v), hq)
    causal, left, right = canonical_window(window_size, causal, "attention")
    s, _ = _capped((qf @ kf.transpose(-1, -2)) * _scale(scale, q.shape[-1]), softcap)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, -math.inf)
        else:
            s = s + attn_mask.to(s.dtype)
    if causal is not None or left is not None or right is not None:
        keep = dense_mask(s.shape[-2], s.shape[-1], causal=causal is not None, align=causal or "top_left",
                          window_left=left, window_right=right, device=s.device)
        s = s.masked_fill(~keep, -math.inf)
    p, lse = _softmax(s, sinks)
    if dropout_p:
        p = torch.nn.functional.dropout(p, dropout_p)
    return (p @ vf).to(q.dtype), lse.to(torch.float32)
