"""Sliding windows through the operators on the GPU: `cute_kernels::sdpa` (forward and
gradients) and `cute_kernels::sdpa_varlen` (forward and gradients, through
`sdpa_varlen_backward`) with `window_left/window_right`, against the PyTorch reference
(`attention_reference`, fp32 on the same inputs), on the `sm80_flash` rung and on "auto".

Fresh N(0, 1) bf16 inputs, outputs poisoned before each run, and a NaN planted in one key: it
must reach exactly the rows whose window holds that key (every other row stays finite), which
a kernel skipping or over-reading blocks at the window's edges fails."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels import ops  # noqa: E402
from cute_kernels.attention.mask_rule import canonical_window, dense_mask  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
KERNELS = ("sm80_flash", "auto")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def randn(*shape, grad=False):
    return torch.randn(*shape, dtype=BF16, device="cuda").requires_grad_(grad)


def poison(shape, dtype=BF16):
    """A NaN-filled block where the op's output will most likely be allocated next."""
    torch.full(shape, math.nan, dtype=dtype, device="cuda")


def rel(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).norm() / ref.norm())


def _f32(*tensors):
    return tuple(t.detach().float() for t in tensors)


CASES = [  # (B, Hq, Hkv, Sq, Sk, D, causal, window)
    (2, 4, 2, 256, 256, 64, None, (64, 32)),
    (1, 4, 4, 200, 328, 128, "bottom_right", (100, 0)),
    (1, 2, 2, 256, 192, 64, "top_left", (48, -1)),
    (1, 4, 4, 192, 256, 64, None, (-1, 17)),
    (1, 2, 1, 130, 384, 128, None, (0, 0)),  # each row sees one key (bottom-right diagonal)
    (1, 2, 2, 320, 128, 64, None, (40, 8)),  # Sq > Sk: the first rows see no key
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("b, hq, hk, sq, sk, d, causal, window", CASES)
def test_windowed_sdpa_forward_matches_reference(kernel, b, hq, hk, sq, sk, d, causal, window):
    q, k, v = randn(b, hq, sq, d), randn(b, hk, sk, d), randn(b, hk, sk, d)
    poison((b, hq, sq, d))
    out, lse = ops.sdpa(q, k, v, causal, None, hk != hq, *window, rung=kernel)
    want_out, want_lse = reference.forward(*_f32(q, k, v), causal, None, hk != hq, window)
    empty = torch.isneginf(want_lse)
    assert out.dtype == BF16 and torch.isfinite(out).all()
    assert torch.equal(torch.isneginf(lse), empty) and torch.all(out[empty] == 0)
    assert rel(out, want_out) < 1e-2
    assert torch.allclose(lse[~empty], want_lse[~empty], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("b, hq, hk, sq, sk, d, causal, window", [CASES[0], CASES[1], CASES[3], CASES[5]])
def test_windowed_sdpa_gradients_match_reference(kernel, b, hq, hk, sq, sk, d, causal, window):
    q, k, v = randn(b, hq, sq, d, grad=True), randn(b, hk, sk, d, grad=True), randn(b, hk, sk, d, grad=True)
    g = randn(b, hq, sq, d)
    out, _ = ops.sdpa(q, k, v, causal, None, hk != hq, *window, rung=kernel)
    poison((b, hq, sq, d))
    got = torch.autograd.grad(out, (q, k, v), g)
    want = reference.backward(*_f32(g, q, k, v), causal, None, hk != hq, window)
    for name, a, r in zip(("dq", "dk", "dv"), got, want):
        assert a.shape == r.shape and a.dtype == BF16 and torch.isfinite(a).all(), name
        assert rel(a, r) < 2e-2, name


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_nan_key_reaches_exactly_the_rows_whose_window_holds_it(kernel):
    sq, sk, window, nan_key = 256, 256, (40, 24), 150
    q, k, v = randn(1, 2, sq, 64), randn(1, 2, sk, 64), randn(1, 2, sk, 64)
    k[0, 1, nan_key, 5] = math.nan
    out, _ = ops.sdpa(q, k, v, None, None, False, *window, rung=kernel)
    causal, left, right = canonical_window(window, None, "test")
    sees = dense_mask(sq, sk, window_left=left, window_right=right, device="cuda")[:, nan_key]
    assert sees.any() and not sees.all()
    assert torch.isnan(out[0, 1][sees]).all(dim=-1).all()
    assert torch.isfinite(out[0, 1][~sees]).all() and torch.isfinite(out[0, 0]).all()


def _packed(lengths_q, lengths_k, hq, hk, d, grad=False):
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = randn(sum(lengths_q), hq, d, grad=grad)
    k, v = randn(sum(lengths_k), hk, d, grad=grad), randn(sum(lengths_k), hk, d, grad=grad)
    return q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k)


VARLEN_CASES = [  # (lengths_q, lengths_k, causal, window)
    ((130, 7, 256), (200, 64, 256), None, (32, 16)),
    ((64, 190), (64, 150), "bottom_right", (50, 0)),
    ((100, 33), (80, 300), "top_left", (20, -1)),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("lengths_q, lengths_k, causal, window", VARLEN_CASES)
def test_windowed_varlen_forward_and_gradients_match_reference(kernel, lengths_q, lengths_k, causal, window):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed(lengths_q, lengths_k, 4, 2, 64, grad=True)
    poison((q.shape[0], 4, 64))
    out, lse = ops.sdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, None, *window, rung=kernel)
    want_out, want_lse = reference.varlen_forward(*_f32(q, k, v), cu_q, cu_k, causal, None, window)
    empty = torch.isneginf(want_lse)
    assert torch.isfinite(out).all() and torch.equal(torch.isneginf(lse), empty)
    assert rel(out, want_out) < 1e-2
    assert torch.allclose(lse[~empty], want_lse[~empty], rtol=1e-3, atol=1e-3)
    g = randn(*out.shape)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = reference.varlen_backward(*_f32(g, q, k, v), cu_q, cu_k, causal, None, window)
    for name, a, r in zip(("dq", "dk", "dv"), got, want):
        assert a.shape == r.shape and torch.isfinite(a).all(), name
        assert rel(a, r) < 2e-2, name
