"""sm90_flash on an H100/H200: against a float32 reference on fresh N(0, 1) inputs, with
NaN-poisoned outputs, over causal alignments, GQA/MQA, head dims and odd sequence lengths.
(Written in a compile-only session: not yet run on a GPU.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import attention_forward, scaled_dot_product_attention  # noqa: E402

from ._dense_reference import TOL, randn, reference, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _hopper_only():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm90_flash needs a Hopper (sm_90) GPU")


CASES = [
    # b, hq, hkv, sq, sk, d, causal, dtype
    (1, 2, 2, 1, 1, 64, None, torch.bfloat16),
    (2, 3, 3, 17, 17, 64, "top_left", torch.float16),
    (1, 2, 2, 127, 127, 128, None, torch.bfloat16),
    (1, 2, 2, 128, 128, 128, "top_left", torch.bfloat16),      # exactly one tile
    (1, 2, 2, 1000, 1000, 128, "top_left", torch.bfloat16),
    (1, 2, 2, 1000, 1000, 128, None, torch.float16),
    (2, 8, 2, 127, 1000, 128, "bottom_right", torch.bfloat16),  # GQA, Sq < Sk
    (1, 4, 1, 1000, 127, 64, "bottom_right", torch.float16),     # MQA, rows that see no key
    (1, 2, 2, 1000, 17, 128, None, torch.bfloat16),
    (1, 2, 2, 257, 300, 96, "top_left", torch.bfloat16),
    (1, 2, 2, 130, 70, 256, None, torch.bfloat16),
    (1, 2, 2, 600, 600, 256, "top_left", torch.bfloat16),
    (1, 2, 1, 64, 65, 192, "bottom_right", torch.float16),
    (1, 2, 2, 333, 333, 192, None, torch.bfloat16),
]


@pytest.mark.parametrize("b, hq, hkv, sq, sk, d, causal, dtype", CASES)
def test_matches_float32_reference(b, hq, hkv, sq, sk, d, causal, dtype):
    torch.manual_seed(sq * 7 + sk + d)
    q, k, v = randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype)
    out = torch.full((b, hq, sq, d), math.nan, device="cuda", dtype=dtype)
    lse = torch.full((b, hq, sq), math.nan, device="cuda", dtype=torch.float32)
    attention_forward(q, k, v, causal=causal, enable_gqa=hq != hkv, kernel="sm90_flash", out=out, lse=lse)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(q, k, v, causal)
    assert not out.isnan().any() and not lse.isnan().any(), "an output element was not written"
    assert rel_err(out, ref_out) < TOL[dtype]
    masked_rows = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), masked_rows)
    assert (out[masked_rows] == 0).all()
    torch.testing.assert_close(lse[~masked_rows], ref_lse[~masked_rows], atol=2e-3, rtol=1e-3)


def test_rows_past_the_end_are_not_written():
    """The TMA store clips the last tile: memory after out's last row keeps its poison."""
    torch.manual_seed(3)
    q, k, v = (randn(1, 1, 200, 128, dtype=torch.bfloat16) for _ in range(3))
    buf = torch.full((1, 1, 256, 128), math.nan, device="cuda", dtype=torch.bfloat16)
    out = buf[:, :, :200]
    lse = torch.full((1, 1, 200), math.nan, device="cuda", dtype=torch.float32)
    attention_forward(q, k, v, kernel="sm90_flash", out=out, lse=lse)
    torch.cuda.synchronize()
    assert buf[:, :, 200:].isnan().all()
    assert rel_err(out, reference(q, k, v)[0]) < 1e-2


def test_sdpa_signature_for_both_causal_alignments_and_gqa():
    from torch.nn.attention.bias import causal_lower_right

    torch.manual_seed(0)
    q, k, v = (randn(2, 8, 100, 64, dtype=torch.bfloat16), randn(2, 2, 150, 64, dtype=torch.bfloat16),
               randn(2, 2, 150, 64, dtype=torch.bfloat16))
    ref, _ = reference(q, k, v, "top_left", scale=0.2)
    out = scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2, enable_gqa=True, kernel="sm90_flash")
    assert out.shape == (2, 8, 100, 64) and rel_err(out, ref) < 1e-2
    ref, _ = reference(q, k, v, "bottom_right")
    out = scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(100, 150), enable_gqa=True,
                                       kernel="sm90_flash")
    assert rel_err(out, ref) < 1e-2


def test_nan_and_inf_propagate_like_sdpa():
    torch.manual_seed(2)
    q, k, v = (randn(1, 2, 300, 64, dtype=torch.bfloat16) for _ in range(3))
    q[0, 0, 5, 3] = math.nan   # poisons query row 5 of head 0
    q[0, 0, 9, 1] = math.inf   # row 9's scores are +-inf: inf - inf in its softmax, NaN as in torch
    k[0, 1, 140, 0] = math.nan  # poisons every row of head 1 that sees key 140
    out = scaled_dot_product_attention(q, k, v, is_causal=True, kernel="sm90_flash")
    ref, _ = reference(q, k, v, "top_left")
    assert torch.equal(out.isnan().any(-1), ref.isnan().any(-1))
    assert out[0, 0, 5].isnan().all() and out[0, 0, 9].isnan().all() and not out[0, 0, :5].isnan().any()
    assert out[0, 1, 140:].isnan().all() and not out[0, 1, :140].isnan().any()


def test_unsupported_layouts_are_refused_before_launch():
    from cute_kernels.attention import KERNELS

    rung = KERNELS["sm90_flash"]
    q = randn(1, 2, 64, 64, dtype=torch.bfloat16)
    odd = randn(1, 2, 64, 72, dtype=torch.bfloat16)[..., :64]  # row stride 72: fine (16-byte multiple)
    assert rung.supports(q, odd, odd, _problem(q, odd)) is None
    bad = randn(1, 2, 64, 68, dtype=torch.bfloat16)[..., :64]  # row stride 68: not a TMA stride
    assert "multiples of 8" in rung.supports(q, bad, bad, _problem(q, bad))


def _problem(q, k):
    from cute_kernels.attention.api import AttentionProblem

    b, h, sq, d = q.shape
    return AttentionProblem(b, h, k.shape[1], sq, k.shape[2], d, d, q.dtype, None, 1.0 / math.sqrt(d))


def test_no_recompile_for_new_lengths():
    from cute_kernels.runtime import cache

    # one short and one long Q sequence: D = 64 has a tile for each (`sm90_layouts.short_rows`)
    for s in (9, 1100):
        q, k, v = (randn(1, 2, s, 64, dtype=torch.bfloat16) for _ in range(3))
        scaled_dot_product_attention(q, k, v, kernel="sm90_flash")
    compiled = cache.stats["compiled"]
    for s in (3, 200, 1025, 2000):
        q2, k2, v2 = (randn(2, 2, s, 64, dtype=torch.bfloat16) for _ in range(3))
        ref, _ = reference(q2, k2, v2)
        assert rel_err(scaled_dot_product_attention(q2, k2, v2, kernel="sm90_flash"), ref) < 1e-2
    assert cache.stats["compiled"] == compiled
