"""Cross-entropy kernel on the GPU against float64: narrow (one chunk, several rows a CTA) and
large vocabularies, every option (label smoothing, ignore_index, z-loss), int32 and int64 labels,
the gradient in the same launch (in place over the logits) and from the saved lse, the op's
autograd, NaN/Inf as torch's, label checks. (Written in a session without a GPU: not yet run.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.fused import cross_entropy_backward, cross_entropy_forward, reference  # noqa: E402

from ._gpu import assert_close, f64, poison, randn, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# rows, vocab, dtype, smoothing, z_loss, label dtype, row_pad
CASES = [
    (1, 128256, BF16, 0.0, 0.0, torch.int64, 0),
    (64, 128256, BF16, 0.1, 1e-4, torch.int64, 0),
    (37, 32000, F32, 0.0, 1e-3, torch.int32, 8),
    (200, 1000, F16, 0.2, 0.0, torch.int64, 0),      # one chunk, several rows a CTA
    (9, 50257, BF16, 0.0, 0.0, torch.int64, 0),      # odd vocab: scalar access
    (5, 256000, BF16, 0.05, 0.0, torch.int32, 0),
    (17, 40000, BF16, 0.0, 1e-4, torch.int64, 16),   # the fused mode stashes the whole row
]


def _labels(rows, vocab, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    labels = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    labels[::3] = -100 if rows > 2 else labels[::3]  # every third row ignored
    labels[rows // 2] = vocab - 1                    # the last class
    return labels.to(dtype)


@pytest.mark.parametrize("rows, vocab, dtype, smoothing, z_loss, label_dtype, row_pad", CASES)
def test_loss_lse_and_gradients_match_float64(rows, vocab, dtype, smoothing, z_loss, label_dtype, row_pad):
    torch.manual_seed(rows + vocab)
    x = randn(rows, vocab, dtype=dtype, row_pad=row_pad, scale=2.0)
    labels = _labels(rows, vocab, label_dtype, rows)
    kw = dict(ignore_index=-100, label_smoothing=smoothing, z_loss=z_loss)
    poison(((rows,), F32), ((rows,), F32))
    loss, lse, grad = cross_entropy_forward(x, labels, **kw)
    torch.cuda.synchronize()
    assert grad is None
    rloss, rlse, _ = reference.cross_entropy_forward(f64(x), labels, **kw)
    assert torch.allclose(lse.double(), rlse, rtol=1e-6, atol=1e-5), "lse"
    assert torch.allclose(loss.double(), rloss, rtol=1e-5, atol=1e-4), "loss"
    assert (loss[labels == -100] == 0).all()

    dloss = randn(rows, dtype=F32)
    _, _, rgrad = reference.cross_entropy_forward(f64(x), labels, dloss=f64(dloss), **kw)
    # the backward from the saved lse
    poison(((rows, vocab), dtype))
    g = cross_entropy_backward(x, labels, lse, dloss, **kw)
    torch.cuda.synchronize()
    assert_close(g, rgrad, dtype, "grad (backward)", factor=2)
    assert (g[labels == -100] == 0).all()
    # the forward with the gradient in the same launch, in place over a copy of the logits
    logits = x.clone()
    loss2, lse2, g2 = cross_entropy_forward(logits, labels, dloss=dloss, grad_out=logits, **kw)
    torch.cuda.synchronize()
    assert g2.data_ptr() == logits.data_ptr()
    assert torch.allclose(loss2, loss, rtol=1e-6, atol=1e-6) and torch.allclose(lse2, lse, rtol=1e-6, atol=1e-6)
    assert_close(g2, rgrad, dtype, "grad (fused, in place)", factor=2)
    # one dloss for all rows (a mean's 1 / n_valid, on the device)
    scale = torch.full((1,), 0.25, device="cuda")
    _, _, g3 = cross_entropy_forward(x, labels, dloss=scale, **kw)
    _, _, rg3 = reference.cross_entropy_forward(f64(x), labels, dloss=f64(scale), **kw)
    assert_close(g3, rg3, dtype, "grad (scalar dloss)", factor=2)


def test_op_mean_matches_torch_cross_entropy_and_its_gradient():
    import cute_kernels.nn.fused_functional as ff

    torch.manual_seed(3)
    x = randn(300, 32768, dtype=BF16, scale=2.0).requires_grad_()
    labels = _labels(300, 32768, torch.int64, 3)
    loss = ff.cross_entropy(x, labels, label_smoothing=0.1)
    loss.backward()
    xd = f64(x).requires_grad_()
    want = torch.nn.functional.cross_entropy(xd, labels, label_smoothing=0.1)
    want.backward()
    assert abs(float(loss) - float(want)) <= 1e-5 * abs(float(want)) + 1e-6
    assert_close(x.grad, xd.grad, BF16, "dlogits", factor=2)


def test_nan_and_inf_as_torch():
    x = randn(5, 4096, dtype=F32)
    labels = torch.tensor([1, 2, 3, 4, 5], device="cuda")
    x[0, 7] = math.nan                   # NaN anywhere: NaN loss
    x[1, 2] = -math.inf                  # the target at -inf: inf loss
    x[2, 9] = -math.inf                  # elsewhere: finite
    x[3, 100] = math.inf                 # +inf: NaN
    loss, _, _ = cross_entropy_forward(x, labels)
    want = torch.nn.functional.cross_entropy(x, labels, reduction="none")
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(loss), torch.isnan(want)) and torch.equal(torch.isinf(loss), torch.isinf(want))
    ok = torch.isfinite(want)
    assert torch.allclose(loss[ok], want[ok], rtol=1e-5, atol=1e-5)


def test_labels_out_of_range_raise_or_give_nan():
    x = randn(4, 100, dtype=BF16)
    bad = torch.tensor([0, 100, 3, -100], device="cuda")
    with pytest.raises(ValueError, match="label 100 is outside"):
        cross_entropy_forward(x, bad)
    loss, _, _ = cross_entropy_forward(x, bad, check_labels=False)
    torch.cuda.synchronize()
    assert math.isnan(float(loss[1])) and float(loss[3]) == 0.0 and math.isfinite(float(loss[0]))
    with pytest.raises(ValueError, match="labels have 3 entries"):
        cross_entropy_forward(x, bad[:3])
    with pytest.raises(TypeError, match="labels has dtype"):
        cross_entropy_forward(x, bad.float())
    assert rel_err(x, x) == 0.0
