"""`cute_kernels.fused.reference` (what fallback="torch" computes and the GPU tests compare with)
against torch's own functions and autograd, in float64 on CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.fused import reference as R  # noqa: E402
from cute_kernels.fused.rope_api import rotary_tables  # noqa: E402

F64 = torch.float64


def _rand(*shape, grad=True):
    return torch.randn(*shape, dtype=F64).requires_grad_(grad)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("residual", [False, True])
def test_norms_match_torch_and_autograd(kind, residual):
    torch.manual_seed(0)
    x, w, b = _rand(5, 9), _rand(9), _rand(9)
    r = _rand(5, 9) if residual else None
    s = x + r if residual else x
    if kind == "rms":
        y = torch.nn.functional.rms_norm(s, (9,), w, eps=1e-6)
    else:
        y = torch.nn.functional.layer_norm(s, (9,), w, b, eps=1e-6)
    gy, gs = torch.randn_like(y), torch.randn_like(y)
    loss = (y * gy).sum() + ((s * gs).sum() if residual else 0)
    loss.backward()
    bias = b.detach() if kind == "layer" else None
    ry, rs, rstd, mean = R.norm_forward(x.detach(), w.detach(), bias, None if r is None else r.detach(), kind=kind)
    assert torch.allclose(ry, y, atol=1e-12) and (rs is None) == (not residual)
    dx, dw, db = R.norm_backward(gy, s.detach() if residual else x.detach(), w.detach(), rstd, mean, kind=kind,
                                 dsum=gs if residual else None, has_bias=kind == "layer")
    assert torch.allclose(dx, x.grad, atol=1e-10) and torch.allclose(dw, w.grad, atol=1e-10)
    if residual:
        assert torch.allclose(dx, r.grad, atol=1e-10)
    if kind == "layer":
        assert torch.allclose(db, b.grad, atol=1e-10)


def test_gemma_offset_and_dtype():
    x, w = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(8)
    y, _, _, _ = R.norm_forward(x, w, offset=1.0, out_dtype=torch.float32)
    xf = x.float()
    want = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)
    assert y.dtype == torch.float32 and torch.allclose(y, want, atol=1e-6)


@pytest.mark.parametrize("smoothing, z_loss", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-3), (0.2, 1e-2)])
def test_cross_entropy_matches_torch_and_autograd(smoothing, z_loss):
    torch.manual_seed(1)
    x = _rand(7, 13)
    labels = torch.tensor([0, 12, -100, 5, 5, -100, 3])
    loss = torch.nn.functional.cross_entropy(x, labels, label_smoothing=smoothing, reduction="none")
    loss = loss + z_loss * torch.logsumexp(x, -1).square() * (labels != -100)
    g = torch.randn(7, dtype=F64)
    (loss * g).sum().backward()
    rl, lse, grad = R.cross_entropy_forward(x.detach(), labels, label_smoothing=smoothing, z_loss=z_loss, dloss=g)
    assert torch.allclose(rl, loss, atol=1e-12) and torch.allclose(grad, x.grad, atol=1e-12)
    assert torch.allclose(R.cross_entropy_backward(x.detach(), labels, lse, g, label_smoothing=smoothing,
                                                   z_loss=z_loss), x.grad, atol=1e-12)


def test_cross_entropy_out_of_range_label_is_nan():
    loss, _, _ = R.cross_entropy_forward(torch.randn(2, 4, dtype=F64), torch.tensor([4, 1]))
    assert torch.isnan(loss[0]) and torch.isfinite(loss[1])


def test_softmax_and_its_backward():
    x = _rand(4, 6)
    y = torch.softmax(x, -1)
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.allclose(R.softmax_forward(x.detach()), y)
    assert torch.allclose(R.softmax_backward(y.detach(), g), x.grad, atol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_rotary_matches_the_textbook_forms(interleaved, layout):
    torch.manual_seed(2)
    cos, sin = rotary_tables(32, 8, dtype=F64)
    q = torch.randn(2, 5, 3, 10, dtype=F64)
    k = torch.randn(2, 5, 1, 10, dtype=F64)
    ids = torch.randint(0, 32, (2, 5))
    qv = q if layout == "bshd" else q.transpose(1, 2).contiguous()
    kv = k if layout == "bshd" else k.transpose(1, 2).contiguous()
    qo, ko = R.apply_rotary_(qv.clone(), kv.clone(), cos, sin, position_ids=ids, interleaved=interleaved,
                             layout=layout)
    if layout == "bhsd":
        qo, ko = qo.transpose(1, 2), ko.transpose(1, 2)
    c, s = cos[ids][:, :, None, :], sin[ids][:, :, None, :]
    x = q[..., :8]
    if interleaved:  # GPT-J: complex multiplication of adjacent pairs
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], 4, 2).contiguous()) * torch.polar(torch.ones_like(c), torch.atan2(s, c))
        want = torch.view_as_real(z).flatten(-2)
    else:  # Llama / GPT-NeoX: rotate_half
        rot = torch.cat((-x[..., 4:], x[..., :4]), -1)
        want = x * torch.cat((c, c), -1) + rot * torch.cat((s, s), -1)
    assert torch.allclose(qo[..., :8], want, atol=1e-12) and torch.equal(qo[..., 8:], q[..., 8:])


def test_swiglu_and_linear_cross_entropy():
    g, u = _rand(3, 8), _rand(3, 8)
    out = torch.nn.functional.silu(g) * u
    d = torch.randn_like(out)
    out.backward(d)
    dg, du = R.swiglu_backward(d, g.detach(), u.detach())
    assert torch.allclose(R.swiglu_forward(g.detach(), u.detach()), out) and torch.allclose(dg, g.grad)
    gu = torch.stack((g.detach(), u.detach()), -1).flatten(-2)
    dgu, none = R.swiglu_backward(d, gu, interleaved=True)
    assert none is None and torch.allclose(dgu[..., 0::2], g.grad) and torch.allclose(dgu[..., 1::2], u.grad)
    x, w, b = _rand(9, 6), _rand(13, 6), _rand(13)
    labels = torch.randint(0, 13, (9,))
    labels[2] = -100
    ref = torch.nn.functional.cross_entropy(x @ w.t() + b, labels, label_smoothing=0.1)
    ref.backward()
    loss, dx, dw, db = R.linear_cross_entropy(x.detach(), w.detach(), labels, b.detach(), label_smoothing=0.1)
    assert torch.allclose(loss, ref) and torch.allclose(dx, x.grad) and torch.allclose(dw, w.grad)
    assert torch.allclose(db, b.grad)
