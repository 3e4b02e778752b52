"""sm80_flash on the GPU: against a float32 reference on fresh N(0, 1) inputs, with NaN-poisoned
outputs, over causal alignments, GQA/MQA, head dims and odd sequence lengths."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import attention_forward, scaled_dot_product_attention  # noqa: E402

from ._dense_reference import TOL, randn, reference, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


CASES = [
    # b, hq, hkv, sq, sk, d, causal, dtype
    (1, 2, 2, 1, 1, 64, None, torch.bfloat16),
    (2, 3, 3, 17, 17, 64, "top_left", torch.float16),
    (1, 2, 2, 127, 127, 128, None, torch.bfloat16),
    (1, 2, 2, 1000, 1000, 128, "top_left", torch.bfloat16),
    (2, 8, 2, 127, 1000, 128, "bottom_right", torch.bfloat16),
    (1, 4, 1, 1000, 127, 64, "bottom_right", torch.float16),
    (1, 2, 2, 1000, 17, 128, None, torch.bfloat16),
    (1, 2, 2, 257, 300, 96, "top_left", torch.bfloat16),
    (1, 2, 2, 130, 70, 256, None, torch.bfloat16),
    (1, 2, 1, 64, 65, 192, "bottom_right", torch.float16),
    (1, 2, 2, 33, 65, 32, "top_left", torch.bfloat16),
]


@pytest.mark.parametrize("b, hq, hkv, sq, sk, d, causal, dtype", CASES)
def test_matches_float32_reference(b, hq, hkv, sq, sk, d, causal, dtype):
    torch.manual_seed(sq * 7 + sk + d)
    q, k, v = randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype)
    out = torch.full((b, hq, sq, d), math.nan, device="cuda", dtype=dtype)
    lse = torch.full((b, hq, sq), math.nan, device="cuda", dtype=torch.float32)
    attention_forward(q, k, v, causal=causal, enable_gqa=hq != hkv, kernel="sm80_flash", out=out, lse=lse)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(q, k, v, causal)
    assert not out.isnan().any() and not lse.isnan().any(), "an output element was not written"
    assert rel_err(out, ref_out) < TOL[dtype]
    masked_rows = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), masked_rows)
    assert (out[masked_rows] == 0).all()
    torch.testing.assert_close(lse[~masked_rows], ref_lse[~masked_rows], atol=2e-3, rtol=1e-3)


def test_sdpa_signature_matches_torch_for_both_causal_alignments_and_gqa():
    from torch.nn.attention.bias import causal_lower_right

    torch.manual_seed(0)
    q, k, v = (randn(2, 8, 100, 64, dtype=torch.bfloat16), randn(2, 2, 150, 64, dtype=torch.bfloat16),
               randn(2, 2, 150, 64, dtype=torch.bfloat16))
    ref, _ = reference(q, k, v, "top_left", scale=0.2)
    out = scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2, enable_gqa=True)
    assert out.shape == (2, 8, 100, 64) and rel_err(out, ref) < 1e-2
    ref, _ = reference(q, k, v, "bottom_right")
    out = scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(100, 150), enable_gqa=True)
    assert rel_err(out, ref) < 1e-2


def test_transposed_bshd_views_and_unbatched_inputs():
    torch.manual_seed(1)
    x = randn(2, 77, 4, 128, dtype=torch.float16)  # (B, S, H, D): attention over a (B, H, S, D) view
    q = k = v = x.transpose(1, 2)
    ref, _ = reference(q, k, v, None)
    assert rel_err(scaled_dot_product_attention(q, k, v), ref) < 4e-3
    out3 = scaled_dot_product_attention(q[0], k[0], v[0], is_causal=True)
    ref3, _ = reference(q[:1], k[:1], v[:1], "top_left")
    assert out3.shape == (4, 77, 128) and rel_err(out3, ref3[0]) < 4e-3


def test_nan_and_inf_propagate_like_sdpa():
    torch.manual_seed(2)
    q, k, v = (randn(1, 2, 70, 64, dtype=torch.bfloat16) for _ in range(3))
    q[0, 0, 5, 3] = math.nan   # poisons query row 5 of head 0
    q[0, 0, 9, 1] = math.inf   # row 9's scores are +-inf: inf - inf in its softmax, NaN as in torch
    k[0, 1, 40, 0] = math.nan  # poisons every row of head 1 that sees key 40
    out = scaled_dot_product_attention(q, k, v, is_causal=True)
    ref, _ = reference(q, k, v, "top_left")
    assert torch.equal(out.isnan().any(-1), ref.isnan().any(-1))
    assert out[0, 0, 5].isnan().all() and out[0, 0, 9].isnan().all() and not out[0, 0, :5].isnan().any()
    assert out[0, 1, 40:].isnan().all() and not out[0, 1, :40].isnan().any()


def test_empty_keys_and_no_recompile_for_new_lengths():
    from cute_kernels.runtime import cache

    q, k, v = (randn(1, 2, 9, 64, dtype=torch.bfloat16) for _ in range(3))
    out, lse = attention_forward(q, k[:, :, :0], v[:, :, :0])
    assert (out == 0).all() and torch.isneginf(lse).all()
    scaled_dot_product_attention(q, k, v)
    compiled = cache.stats["compiled"]
    for s in (3, 200):
        q2, k2, v2 = (randn(2, 2, s, 64, dtype=torch.bfloat16) for _ in range(3))
        ref, _ = reference(q2, k2, v2)
        assert rel_err(scaled_dot_product_attention(q2, k2, v2), ref) < 1e-2
    assert cache.stats["compiled"] == compiled
