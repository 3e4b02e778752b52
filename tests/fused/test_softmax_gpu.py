"""Softmax kernels on the GPU against float64: the register-resident and streaming forms, rows of
1, odd widths, non-contiguous rows, the gradient, NaN/Inf as torch's, any dim through the op.
(Written in a session without a GPU: not yet run.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.fused import softmax_backward, softmax_forward  # noqa: E402

from ._gpu import assert_close, f64, poison, randn  # noqa: E402

pytestmark = pytest.mark.gpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# rows, width, dtype, row_pad: resident widths, then streaming ones (past 32k fp32 / 16k 16-bit values)
CASES = [
    (1, 4096, BF16, 0), (300, 4096, BF16, 128), (7, 1000, F16, 0), (5, 33, F32, 0), (129, 128, F32, 0),
    (3, 16384, BF16, 0),
    (2, 131072, F32, 0), (3, 128256, BF16, 0), (1, 200003, F16, 0),  # streaming; odd: scalar access
    (4, 40000, BF16, 64),  # streaming, the whole row stashed in shared memory
]


@pytest.mark.parametrize("rows, width, dtype, row_pad", CASES)
def test_forward_and_backward_match_float64(rows, width, dtype, row_pad):
    torch.manual_seed(rows + width)
    x = randn(rows, width, dtype=dtype, row_pad=row_pad, scale=3.0)
    poison(((rows, width), dtype))
    y = softmax_forward(x)
    torch.cuda.synchronize()
    ref = torch.softmax(f64(x), dim=-1)
    assert y.dtype == dtype and not y.isnan().any()
    assert_close(y, ref, dtype, "softmax")
    dy = randn(rows, width, dtype=dtype, row_pad=row_pad)
    poison(((rows, width), dtype))
    dx = softmax_backward(y, dy)
    torch.cuda.synchronize()
    yd = ref
    want = yd * (f64(dy) - (f64(dy) * yd).sum(-1, keepdim=True))
    assert_close(dx, want, dtype, "dx", factor=2)


@pytest.mark.parametrize("width", [1024, 100000])
def test_nan_and_inf_rows_as_torch(width):
    torch.manual_seed(0)
    x = randn(6, width, dtype=F32)
    x[1, 5] = math.nan
    x[2, 7] = math.inf
    x[3, :] = -math.inf
    x[4, 9] = -math.inf
    y = softmax_forward(x)
    want = torch.softmax(x, dim=-1)
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.allclose(y[ok], want[ok], rtol=1e-5, atol=1e-7)


def test_op_any_dim_and_autograd():
    import cute_kernels.ops as ops

    torch.manual_seed(2)
    x = randn(4, 300, 6, dtype=BF16).requires_grad_()
    y = ops.softmax(x, 1)
    g = randn(4, 300, 6, dtype=BF16)
    y.backward(g)
    xd = f64(x).requires_grad_()
    yd = torch.softmax(xd, 1)
    yd.backward(f64(g))
    assert_close(y, yd, BF16, "y")
    assert_close(x.grad, xd.grad, BF16, "dx", factor=2)


def test_bad_input_raises_before_launch():
    with pytest.raises(TypeError, match="dtype torch.int64"):
        softmax_forward(torch.ones(3, 4, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="must have one shape"):
        softmax_backward(randn(3, 4), randn(3, 5))
