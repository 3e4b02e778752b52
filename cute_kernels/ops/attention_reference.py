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
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cute_kernels.attention.mask_rule import canonical_window, dense_mask

__all__ = ["forward", "backward", "varlen_forward", "varlen_backward", "paged_decode"]

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


def _probabilities(q: Tensor, k: Tensor, causal, scale: float, window_size=None):
    """(p, lse): softmax of the masked, scaled scores and its log-normalizer, in q's dtype."""
    if causal not in _CAUSAL:
        raise ValueError(f"attention: causal must be one of {_CAUSAL}, got {causal!r}")
    causal, left, right = canonical_window(window_size, causal, "attention")
    s = (q @ k.transpose(-1, -2)) * scale
    if causal is not None or left is not None or right is not None:
        keep = dense_mask(s.shape[-2], s.shape[-1], causal=causal is not None, align=causal or "top_left",
                          window_left=left, window_right=right, device=s.device)
        s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    # A row with no visible key has lse = -inf; its probabilities are 0, not NaN.
    p = torch.where(torch.isinf(lse) & (lse < 0), torch.zeros_like(s), torch.exp(s - lse))
    return p, lse.squeeze(-1)


def _acc(t: Tensor) -> Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def forward(q: Tensor, k: Tensor, v: Tensor, causal=None, scale=None, enable_gqa: bool = False, window_size=None):
    """(out, lse) of attention by definition; out in q's dtype, lse fp32, both contiguous."""
    hq = q.shape[-3]
    if k.shape[-3] != hq and not enable_gqa:
        raise ValueError(f"attention: query has {hq} heads but key/value have {k.shape[-3]}; pass enable_gqa=True")
    qf, kf, vf = _acc(q), _expand_heads(_acc(k), hq), _expand_heads(_acc(v), hq)
    p, lse = _probabilities(qf, kf, causal, _scale(scale, q.shape[-1]), window_size)
    return (p @ vf).to(q.dtype).contiguous(), lse.to(torch.float32).contiguous()


def backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, causal=None, scale=None, enable_gqa: bool = False,
             window_size=None):
    """(dq, dk, dv) of `forward`'s out by definition (recomputing the probabilities in the
    accumulation precision): dV = Pᵀ dO, dS = P ∘ (dO Vᵀ - rowsum(dO ∘ O)), dQ = s·dS K,
    dK = s·dSᵀ Q, with key/value gradients summed over the query heads sharing them."""
    hq, hk = q.shape[-3], k.shape[-3]
    scale = _scale(scale, q.shape[-1])
    qf, kf, vf = _acc(q), _expand_heads(_acc(k), hq), _expand_heads(_acc(v), hq)
    do = grad_out.to(qf.dtype)
    p, _ = _probabilities(qf, kf, causal, scale, window_size)
    o = p @ vf
    dv = p.transpose(-1, -2) @ do
    ds = p * (do @ vf.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    dq = (ds @ kf) * scale
    dk = (ds.transpose(-1, -2) @ qf) * scale
    if hk != hq:
        dk = dk.unflatten(-3, (hk, hq // hk)).sum(-3)
        dv = dv.unflatten(-3, (hk, hq // hk)).sum(-3)
    return dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous()


def _sequences(q: Tensor, k: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor):
    """[(q rows, k rows)] slices of each packed sequence, the offsets checked."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if len(cq) != len(ck) or len(cq) < 1:
        raise ValueError(f"attention: cu_seqlens_q ({len(cq)}) and cu_seqlens_k ({len(ck)}) must have the same "
                         "length, at least 1")
    if cq[0] != 0 or ck[0] != 0 or cq[-1] != q.shape[0] or ck[-1] != k.shape[0]:
        raise ValueError(f"attention: cu_seqlens must start at 0 and end at the total lengths ({q.shape[0]}, "
                         f"{k.shape[0]}), got {cq} and {ck}")
    return [(slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])) for b in range(len(cq) - 1)]


def varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, causal=None,
                   scale=None, window_size=None):
    """(out (Tq, Hq, Dv), lse (Hq, Tq) fp32) for sequences packed along dim 0: sequence b holds
    rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k, v;
    masks and windows apply to each sequence on its own (its own Sq_b, Sk_b)."""
    out = q.new_zeros((q.shape[0], q.shape[1], v.shape[2]))
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    for rows, keys in _sequences(q, k, cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs = (t.transpose(0, 1) for t in (q[rows], k[keys], v[keys]))
        o, l = forward(qs, ks, vs, causal, scale, enable_gqa=True, window_size=window_size)
        out[rows] = o.transpose(0, 1)
        lse[:, rows] = l
    return out, lse


def varlen_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                    causal=None, scale=None, window_size=None):
    """(dq, dk, dv) of `varlen_forward`'s out for grad_out (Tq, Hq, Dv): `backward` on each
    sequence on its own; shaped and typed as q, k, v, contiguous."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for rows, keys in _sequences(q, k, cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs, gs = (t.transpose(0, 1) for t in (q[rows], k[keys], v[keys], grad_out[rows]))
        g = backward(gs, qs, ks, vs, causal, scale, enable_gqa=True, window_size=window_size)
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
