"""Attention on the layouts models hand it: q, k, v sliced out of one packed qkv projection
(timm's ViT: (B, S, 3, H, D) permuted to three (B, H, S, D) views), the output stored
(B, S, H, D) (`attention.api.new_out`) so that the model's transpose + reshape is a view, and
an output gradient in either storage order. Forward and backward against float64 on fresh
N(0, 1) inputs, for each dense rung; the allocator is NaN-poisoned first, so an element a
kernel fails to write shows."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels import ops  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2}


def _needs(capability):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < capability:
        pytest.skip(f"needs a GPU of compute capability {capability} or newer")


def _poison(numel: int = 1 << 26):
    torch.empty(numel, device="cuda").fill_(math.nan)


def _heads(qkv, b, s, h, d):
    """timm's split of a packed (B, S, 3 H D) projection into q, k, v (B, H, S, D) views."""
    return qkv.reshape(b, s, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)


def _reference(q, k, v, g, causal):
    qf, kf, vf = (t.detach().double().requires_grad_() for t in (q, k, v))
    scores = (qf @ kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    out = torch.softmax(scores, -1) @ vf
    out.backward(g.double())
    return out.detach(), qf.grad, kf.grad, vf.grad


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("rung,capability", [("sm90_flash", (9, 0)), ("sm80_flash", (8, 0))])
@pytest.mark.parametrize("b,s,h,d,causal", [(4, 197, 12, 64, False), (2, 333, 5, 128, True), (3, 64, 2, 64, False)])
@pytest.mark.parametrize("grad_storage", ["bshd", "bhsd"])
def test_packed_qkv_forward_backward_match_float64(rung, capability, b, s, h, d, causal, grad_storage):
    _needs(capability)
    torch.manual_seed(s * h + d)
    dtype = torch.bfloat16
    qkv = torch.randn(b, s, 3 * h * d, device="cuda", dtype=dtype, requires_grad=True)
    q, k, v = _heads(qkv, b, s, h, d)
    g = torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2) if grad_storage == "bshd" else \
        torch.randn(b, h, s, d, device="cuda", dtype=dtype)
    _poison()
    out, lse = ops.sdpa(q, k, v, "top_left" if causal else None, rung=rung)
    # stored (B, S, H, D): the model's out.transpose(1, 2).reshape(B, S, H * D) is a view
    assert out.transpose(1, 2).is_contiguous() and lse.is_contiguous()
    assert out.transpose(1, 2).reshape(b, s, h * d).data_ptr() == out.data_ptr()
    (dqkv,) = torch.autograd.grad(out, qkv, g)
    dq, dk, dv = _heads(dqkv, b, s, h, d)
    ref_out, ref_dq, ref_dk, ref_dv = _reference(q, k, v, g, causal)
    assert not out.isnan().any() and not dqkv.isnan().any()
    tol = TOL[dtype]
    assert _rel(out, ref_out) < tol
    for name, x, ref in (("dq", dq, ref_dq), ("dk", dk, ref_dk), ("dv", dv, ref_dv)):
        assert _rel(x, ref) < 2 * tol, name


def test_unbatched_output_is_stored_sequence_major():
    """A 3-D (H, S, D) call returns the (H, S, D) view of (S, H, D) storage, values as float64."""
    _needs((8, 0))
    torch.manual_seed(0)
    q, k, v = (torch.randn(6, 77, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out, _ = ops.sdpa(q, k, v)
    assert out.shape == (6, 77, 64) and out.transpose(0, 1).is_contiguous()
    ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) / 8.0, -1) @ v.double()
    assert _rel(out, ref) < TOL[torch.float16]
