"""Bad input to every fused entry point raises a clear error naming the problem before any
launch (checked on CPU tensors: the device check comes last, so every other check runs here)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cute_kernels.fused as F  # noqa: E402

BF16 = torch.bfloat16


def t(*shape, dtype=BF16):
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize("call, error, match", [
    (lambda: F.norm_forward(t(4, 8), t(7)), ValueError, "weight has shape"),
    (lambda: F.norm_forward(t(4, 8), t(8), t(8)), ValueError, "bias is LayerNorm's"),
    (lambda: F.norm_forward(t(4, 8), t(8), t(8, dtype=torch.float32), kind="layer"), TypeError, "same dtype"),
    (lambda: F.norm_forward(t(4, 8), residual=t(4, 9)), ValueError, "residual has shape"),
    (lambda: F.norm_forward(t(4, 8), offset=1.0), ValueError, "needs a weight"),
    (lambda: F.norm_forward(t(4, 8), kind="batch"), ValueError, "kind must be"),
    (lambda: F.norm_forward(t(4, 0)), ValueError, "at least 1"),
    (lambda: F.norm_forward(torch.ones(4, 8, dtype=torch.int64)), TypeError, "dtype torch.int64"),
    (lambda: F.norm_forward(t(4, 8)), ValueError, "device 'cpu'"),
    (lambda: F.norm_backward(t(4, 8), t(4, 9), None, t(4, dtype=torch.float32)), ValueError, "dy has shape"),
    (lambda: F.norm_backward(t(4, 8), t(4, 8), None, t(4)), TypeError, "rstd has dtype"),
    (lambda: F.norm_backward(t(4, 8), t(4, 8), None, t(4, dtype=torch.float32), kind="layer"), ValueError,
     "mean"),
    (lambda: F.softmax_forward(torch.ones(3, dtype=torch.int32)), TypeError, "int32"),
    (lambda: F.softmax_backward(t(3, 4), t(3, 5)), ValueError, "one shape"),
    (lambda: F.cross_entropy_forward(t(4, 10), torch.zeros(3, dtype=torch.int64)), ValueError, "3 entries"),
    (lambda: F.cross_entropy_forward(t(4, 10), torch.zeros(4)), TypeError, "labels has dtype"),
    (lambda: F.cross_entropy_forward(t(4, 10, 2), torch.zeros(4, dtype=torch.int64)), ValueError, "2-D"),
    (lambda: F.cross_entropy_forward(t(4, 10), torch.zeros(4, dtype=torch.int64), label_smoothing=1.5), ValueError,
     "label_smoothing"),
    (lambda: F.cross_entropy_backward(t(4, 10), torch.zeros(4, dtype=torch.int64), t(4, dtype=torch.float32),
                                      t(3, dtype=torch.float32)), ValueError, "dloss must be"),
    (lambda: F.swiglu_forward(t(4, 8), t(4, 9)), ValueError, "must match"),
    (lambda: F.swiglu_forward(t(4, 7), interleaved=True), ValueError, "even last dimension"),
    (lambda: F.swiglu_forward(t(4, 8)), ValueError, "up is required"),
    (lambda: F.swiglu_backward(t(4, 5), t(4, 8), t(4, 8)), ValueError, "dout must have shape"),
    (lambda: F.rotary(t(2, 3, 4, 8), t(2, 3, 2, 8, dtype=torch.float16), *F.rotary_tables(8, 8)), TypeError,
     "k has"),
    (lambda: F.rotary(t(2, 3, 4, 8), t(2, 4, 2, 8), *F.rotary_tables(8, 8)), ValueError, "must share"),
    (lambda: F.rotary(t(2, 3, 4, 8), t(2, 3, 2, 8), *F.rotary_tables(8, 16)), ValueError, "do not fit head dim"),
    (lambda: F.rotary(t(2, 3, 4, 8), t(2, 3, 2, 8), *F.rotary_tables(8, 8), layout="sbhd"), ValueError, "layout"),
    (lambda: F.rotary(t(2, 3, 4, 8), t(2, 3, 2, 8), *F.rotary_tables(8, 8), position_ids=torch.zeros(2, 4,
                      dtype=torch.int64)), ValueError, "position_ids has shape"),
    (lambda: F.rotary(t(2, 3, 4, 8), t(2, 3, 2, 8), *F.rotary_tables(8, 8, dtype=torch.float16)), TypeError,
     "tables must be"),
    (lambda: F.linear_cross_entropy(t(4, 8), t(10, 7), torch.zeros(4, dtype=torch.int64)), ValueError,
     "do not compose"),
    (lambda: F.linear_cross_entropy(t(4, 8), t(10, 8, dtype=torch.float32), torch.zeros(4, dtype=torch.int64)),
     TypeError, "weight has dtype"),
    (lambda: F.linear_cross_entropy(t(4, 8), t(10, 8), torch.zeros(4, dtype=torch.int64), reduction="avg"),
     ValueError, "reduction"),
    (lambda: F.linear_cross_entropy(t(4, 8), t(10, 8), torch.zeros(4, dtype=torch.int64), gemm="cublas"),
     ValueError, "gemm"),
])
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("reduction, bias, chunk", [("mean", True, 7), ("sum", False, 64), ("mean", False, None)])
def test_linear_ce_chunks_add_up_to_the_whole(monkeypatch, reduction, bias, chunk):
    """The chunked host loop of `linear_cross_entropy` (and its backward), with the per-chunk
    cross-entropy kernel replaced by its torch reference: loss and every gradient equal the
    unchunked reference's, however the tokens are cut."""
    from cute_kernels.fused import linear_ce, reference

    monkeypatch.setattr(linear_ce, "check_same_device", lambda op, tensors: None)
    monkeypatch.setattr(linear_ce, "cross_entropy_forward", reference.cross_entropy_forward)
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(30, 16, generator=g), torch.randn(50, 16, generator=g)
    b = torch.randn(50, generator=g) if bias else None
    labels = torch.randint(0, 50, (30,), generator=g)
    labels[::5] = -100
    kw = dict(label_smoothing=0.1, z_loss=1e-3, reduction=reduction)
    got = linear_ce.linear_cross_entropy(x, w, labels, b, chunk=chunk, check_labels=False, **kw)
    want = reference.linear_cross_entropy(x, w, labels, b, **kw)
    for a, r in zip(got, want):
        assert (a is None) == (r is None)
        if a is not None:
            torch.testing.assert_close(a, r)
    d = torch.rand(30, generator=g, dtype=torch.float32)
    back = linear_ce.linear_cross_entropy_backward(x, w, labels, d, b, chunk=chunk, label_smoothing=0.1, z_loss=1e-3)
    want_back = reference.linear_cross_entropy_backward(x, w, labels, d, b, label_smoothing=0.1, z_loss=1e-3)
    for a, r in zip(back, want_back):
        if r is not None:
            torch.testing.assert_close(a, r)


def test_the_default_chunk_is_liger_s_unless_wide_chunks_are_on():
    from cute_kernels.fused.linear_ce import WIDE_CHUNK_BYTES, default_chunk
    from cute_kernels.runtime import unverified

    with unverified.allowing("linear_ce_wide_chunk", on=False):
        assert default_chunk(8192, 4096, 128256) == 256  # Liger's: the logits about x's size
        assert default_chunk(1, 4096, 128256) == 1
    with unverified.allowing("linear_ce_wide_chunk"):
        assert default_chunk(8192, 4096, 128256) == 1024  # 1024 x 128256 x 2 bytes <= 256 MiB
        assert 1024 * 128256 * 2 <= WIDE_CHUNK_BYTES < 2048 * 128256 * 2
        assert default_chunk(8192, 4096, 128256, 4) == 512  # fp32 logits
        assert default_chunk(1000, 512, 32000) == 1024  # every token in one chunk
        assert default_chunk(65536, 8192, 128256) == 4096  # never below Liger's (4096 here)
