"""`cute_kernels::sdpa_masked` on the GPU kernels: a right-padded causal batch (the dense kernel
on the whole batch, padded query rows zeroed) and a left-padded one (unpadded to varlen), forward
and backward against the float64 definition, the padded rows' outputs handed a gradient too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cute_kernels import ops  # noqa: E402

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_causal_batch_matches_the_definition(side):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("needs an sm_80+ GPU")
    b, hq, hkv, s, d = 3, 8, 2, 300, 128
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (hq, hkv, hkv))
    lengths = torch.tensor([300, 171, 9], device="cuda")
    pos = torch.arange(s, device="cuda")
    key_mask = pos < lengths[:, None] if side == "right" else pos >= s - lengths[:, None]
    out, _ = ops.sdpa_masked(q, k, v, key_mask, None, "bottom_right")
    # the definition: each row's real tokens alone, causal among themselves
    real = key_mask[:, None, :, None] & key_mask[:, None, None, :]
    idx = key_mask.cumsum(-1)
    keep = real & (idx[:, None, None, :] <= idx[:, None, :, None])
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    kr, vr = kd.repeat_interleave(hq // hkv, 1), vd.repeat_interleave(hq // hkv, 1)
    scores = (qd @ kr.transpose(-1, -2) / d ** 0.5).masked_fill(~keep, float("-inf"))
    want = torch.nan_to_num(torch.softmax(scores, -1)) @ vr
    want = want.transpose(1, 2).masked_fill(~key_mask[:, :, None, None], 0)
    assert torch.isfinite(out).all() and torch.all(out[~key_mask] == 0)
    assert _rel(out, want) < 2e-2
    seed = torch.randn_like(out)  # the padded rows' share reaches nothing
    got = torch.autograd.grad(out, (q, k, v), seed)
    ref = torch.autograd.grad(want, (qd, kd, vd), seed.double())
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert torch.isfinite(g).all(), name
        assert _rel(g, r) < 3e-2, name
