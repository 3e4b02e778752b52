"""sm80_flash backward on the GPU: dQ, dK, dV against float32 autograd on fresh N(0, 1) inputs.

The kernels allocate their gradients, so each test first fills the CUDA caching allocator's free
memory with NaN (`poison_allocator`): an element the kernels fail to write stays NaN."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import attention_backward, attention_forward, scaled_dot_product_attention  # noqa: E402
from cute_kernels.attention.mask import dense_mask  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}


def poison_allocator(numel: int = 1 << 26):
    torch.empty(numel, device="cuda").fill_(math.nan)
    torch.cuda.synchronize()


def reference_grads(q, k, v, dout, causal=None, scale=None):
    """float32 autograd of softmax(q k^T * scale + mask) v; rows with no key contribute 0."""
    hq, hk = q.shape[1], k.shape[1]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    kr, vr = (kf, vf) if hq == hk else (kf.repeat_interleave(hq // hk, 1), vf.repeat_interleave(hq // hk, 1))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (qf @ kr.transpose(-1, -2)) * scale
    if causal is not None:
        keep = dense_mask(q.shape[2], k.shape[2], causal=True, align=causal, device=q.device)
        has = keep.any(-1)
        s = torch.where(has[:, None], s.masked_fill(~keep, -math.inf), torch.zeros_like(s))
        p = torch.softmax(s, -1) * has[:, None]
    else:
        p = torch.softmax(s, -1)
    out = p @ vr
    out.backward(dout.float())
    return qf.grad, kf.grad, vf.grad


def rel_err(x, ref, floor=1e-30):
    """Error relative to the reference's norm, or to `floor` where the reference vanishes."""
    return ((x.float() - ref).norm() / ref.norm().clamp_min(floor)).item()


CASES = [
    # b, hq, hkv, sq, sk, d, causal, dtype
    (1, 2, 2, 127, 127, 64, None, torch.float16),
    (2, 4, 2, 100, 130, 128, "bottom_right", torch.bfloat16),
    (1, 2, 2, 300, 300, 128, "top_left", torch.bfloat16),
    (1, 2, 1, 130, 70, 64, "bottom_right", torch.float16),
    (1, 1, 1, 17, 1, 96, None, torch.bfloat16),
]


@pytest.mark.parametrize("b, hq, hkv, sq, sk, d, causal, dtype", CASES)
def test_gradients_match_float32_autograd(b, hq, hkv, sq, sk, d, causal, dtype):
    torch.manual_seed(sq + sk + d)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    dout = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    out, lse = attention_forward(q, k, v, causal=causal, enable_gqa=hq != hkv)
    poison_allocator()
    dq, dk, dv = attention_backward(dout, q, k, v, out, lse, causal=causal, enable_gqa=hq != hkv)
    torch.cuda.synchronize()
    ref = reference_grads(q, k, v, dout, causal)
    # With one key the softmax is constant, so dQ vanishes identically and its rounding noise
    # (~1e-8 here) must be measured against the gradient's natural scale, not against zero.
    floor = 1e-3 * dout.float().norm()
    for name, got, want in (("dq", dq, ref[0]), ("dk", dk, ref[1]), ("dv", dv, ref[2])):
        assert got.shape == want.shape and got.dtype == dtype
        assert not got.isnan().any(), f"{name} has unwritten (NaN) elements"
        err = rel_err(got, want, floor)
        assert err < TOL[dtype], f"{name}: relative error {err:.3g}"


def test_autograd_through_sdpa_matches_torch():
    torch.manual_seed(3)
    x = torch.randn(2, 77, 4, 64, device="cuda", dtype=torch.bfloat16)  # (B, S, H, D) viewed as (B, H, S, D)
    q = x.transpose(1, 2).detach().requires_grad_()
    k = torch.randn(2, 4, 77, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 4, 77, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(2, 4, 77, 64, device="cuda", dtype=torch.bfloat16)
    scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)
    ref = reference_grads(q, k, v, dout, "top_left")
    for got, want in zip((q.grad, k.grad, v.grad), ref):
        assert rel_err(got, want) < TOL[torch.bfloat16]


def test_unsupported_backward_is_refused_before_launch():
    # Above D = 128 the backward splits the head dim over two warp groups, in 32-column steps.
    q = torch.randn(1, 2, 8, 144, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="multiples of 32"):
        scaled_dot_product_attention(q, q, q, kernel="sm80_flash")
