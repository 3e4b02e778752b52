"""SwiGLU and the fused linear + cross-entropy on the GPU against float64.
(Written in a session without a GPU: not yet run.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.fused import linear_cross_entropy, reference, swiglu_backward, swiglu_forward  # noqa: E402

from ._gpu import TOL, assert_close, f64, poison, randn, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# rows, width (I), dtype, layout: "halves" (views of one (rows, 2I) tensor), "separate", "interleaved"
SWIGLU_CASES = [(1, 14336, BF16, "halves"), (257, 11008, F16, "interleaved"), (33, 4096, F32, "separate"),
                (5, 1001, BF16, "separate"), (3, 7, F32, "interleaved")]


@pytest.mark.parametrize("rows, width, dtype, layout", SWIGLU_CASES)
def test_swiglu_forward_backward_match_float64(rows, width, dtype, layout):
    torch.manual_seed(rows + width)
    if layout == "halves":
        gu = randn(rows, 2 * width, dtype=dtype, scale=2.0)
        gate, up, il = gu[:, :width], gu[:, width:], False
    elif layout == "separate":
        gate, up, il = randn(rows, width, dtype=dtype, scale=2.0), randn(rows, width, dtype=dtype), False
    else:
        gate, up, il = randn(rows, 2 * width, dtype=dtype, scale=2.0), None, True
    poison(((rows, width), dtype))
    out = swiglu_forward(gate, up, interleaved=il)
    torch.cuda.synchronize()
    assert_close(out, reference.swiglu_forward(f64(gate), f64(up), interleaved=il), dtype, "out")
    dout = randn(rows, width, dtype=dtype)
    poison(((rows, gate.shape[-1]), dtype), ((rows, width), dtype))
    dg, du = swiglu_backward(dout, gate, up, interleaved=il)
    torch.cuda.synchronize()
    rdg, rdu = reference.swiglu_backward(f64(dout), f64(gate), f64(up), interleaved=il)
    assert_close(dg, rdg, dtype, "dgate", factor=2)
    if il:
        assert du is None
    else:
        assert_close(du, rdu, dtype, "dup", factor=2)


def test_swiglu_nan_inf_as_torch():
    g, u = randn(2, 64, dtype=F32), randn(2, 64, dtype=F32)
    g[0, 1], g[1, 2], u[0, 5] = math.nan, math.inf, math.inf
    out = swiglu_forward(g, u)
    want = torch.nn.functional.silu(g) * u
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(out), torch.isnan(want)) and torch.equal(torch.isinf(out), torch.isinf(want))


@pytest.mark.parametrize("tokens, hidden, vocab, dtype, bias, reduction, smoothing, z_loss, chunk, gemm", [
    (1000, 512, 32000, BF16, False, "mean", 0.0, 0.0, None, "torch"),
    (513, 256, 50257, BF16, True, "sum", 0.1, 1e-4, 128, "torch"),
    (300, 128, 1000, BF16, False, "mean", 0.0, 0.0, 64, "cute_kernels"),  # our GEMMs for the logits and dx
])
def test_linear_cross_entropy_matches_float64(tokens, hidden, vocab, dtype, bias, reduction, smoothing, z_loss,
                                              chunk, gemm):
    torch.manual_seed(tokens)
    x = randn(tokens, hidden, dtype=dtype)
    w = randn(vocab, hidden, dtype=dtype, scale=hidden ** -0.5)
    b = randn(vocab, dtype=dtype) if bias else None
    labels = torch.randint(0, vocab, (tokens,), device="cuda")
    labels[::7] = -100
    kw = dict(ignore_index=-100, label_smoothing=smoothing, z_loss=z_loss, reduction=reduction)
    loss, dx, dw, db = linear_cross_entropy(x, w, labels, b, chunk=chunk, gemm=gemm, **kw)
    torch.cuda.synchronize()
    rloss, rdx, rdw, rdb = reference.linear_cross_entropy(f64(x), f64(w), labels, f64(b), **kw)
    assert abs(float(loss) - float(rloss)) <= 2e-3 * abs(float(rloss)) + 1e-4, (float(loss), float(rloss))
    assert_close(dx, rdx, dtype, "dx", factor=3)
    assert_close(dw, rdw, dtype, "dweight", factor=3)
    if bias:
        assert_close(db, rdb, dtype, "dbias", factor=3)


def test_linear_cross_entropy_module_autograd_and_none_reduction():
    import cute_kernels.nn as cnn

    torch.manual_seed(9)
    head = torch.nn.Linear(256, 5000, bias=False, device="cuda", dtype=BF16)
    loss_fn = cnn.LinearCrossEntropyLoss.from_module(head, reduction="none", chunk=96)
    assert loss_fn.weight is head.weight
    x = randn(3, 100, 256, dtype=BF16).requires_grad_()
    labels = torch.randint(0, 5000, (3, 100), device="cuda")
    labels[0, :10] = -100
    loss = loss_fn(x, labels)
    assert loss.shape == (3, 100)
    g = randn(3, 100, dtype=F32)
    loss.backward(g)
    xd, wd = f64(x).requires_grad_(), f64(head.weight).requires_grad_()
    want = torch.nn.functional.cross_entropy((xd @ wd.t()).view(-1, 5000), labels.view(-1), reduction="none")
    want.backward(f64(g).view(-1))
    assert rel_err(loss.view(-1), want) < 1e-3
    assert_close(x.grad, xd.grad, BF16, "dx", factor=3)
    assert_close(head.weight.grad, wd.grad, BF16, "dweight", factor=3)
    assert TOL[BF16] > 0


def test_wide_chunks_match_float64_as_liger_s_chunks_do():
    """The unverified path `linear_ce_wide_chunk` (chunks of up to 256 MiB of logits): the same
    loss and gradients as Liger's x-sized chunks, within the same float64 bars."""
    from cute_kernels.fused.linear_ce import default_chunk
    from cute_kernels.runtime import unverified

    tokens, hidden, vocab = 2048, 512, 50257
    torch.manual_seed(5)
    x = randn(tokens, hidden, dtype=BF16)
    w = randn(vocab, hidden, dtype=BF16, scale=hidden ** -0.5)
    labels = torch.randint(0, vocab, (tokens,), device="cuda")
    labels[::5] = -100
    rloss, rdx, rdw, _ = reference.linear_cross_entropy(f64(x), f64(w), labels, None)
    chunks = []
    for on in (False, True):
        with unverified.allowing("linear_ce_wide_chunk", on=on):
            chunks.append(default_chunk(tokens, hidden, vocab))
            loss, dx, dw, _ = linear_cross_entropy(x, w, labels)
        torch.cuda.synchronize()
        assert abs(float(loss) - float(rloss)) <= 2e-3 * abs(float(rloss)) + 1e-4, (on, float(loss), float(rloss))
        assert_close(dx, rdx, BF16, "dx", factor=3)
        assert_close(dw, rdw, BF16, "dweight", factor=3)
    assert chunks[1] > chunks[0], chunks
