"""The float32 reference and tolerances the dense-attention GPU tests of every rung compare to."""

from __future__ import annotations

import math

import torch

from cute_kernels.attention.mask import dense_mask

TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}


def reference(q, k, v, causal=None, scale=None, window=(None, None)):
    """(out, lse) in float32: rows with no allowed key give 0 and -inf (the kernels' convention).
    window: (window_left, window_right), None for an unbounded side (`mask.window_offsets`)."""
    hq, hk = q.shape[1], k.shape[1]
    qf, kf, vf = q.float(), k.float(), v.float()
    if hq != hk:
        kf, vf = kf.repeat_interleave(hq // hk, dim=1), vf.repeat_interleave(hq // hk, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (qf @ kf.transpose(-1, -2)) * scale
    if causal is not None or window != (None, None):
        keep = dense_mask(q.shape[2], k.shape[2], causal=causal is not None, align=causal or "top_left",
                          window_left=window[0], window_right=window[1], device=q.device)
        s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    p = torch.where(torch.isneginf(lse)[..., None], torch.zeros_like(p), p)
    return p @ vf, lse


def check_forward(out, lse, ref_out, ref_lse, dtype):
    """A NaN-poisoned forward's out and lse against the reference: everything written, out
    within TOL, the same rows empty (lse -inf, out 0), lse close elsewhere."""
    assert not out.isnan().any() and not lse.isnan().any(), "an output element was not written"
    assert rel_err(out, ref_out) < TOL[dtype]
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert (out[empty] == 0).all()
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=2e-3, rtol=1e-3)


def rel_err(x, ref):
    return ((x.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def randn(*shape, dtype):
    return torch.randn(*shape, device="cuda", dtype=dtype)
