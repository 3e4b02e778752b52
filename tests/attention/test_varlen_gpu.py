"""attention_varlen_forward on the GPU: packed ragged batches (lengths 0, 1, odd, longer than a
tile) against the float32 reference, causal both ways, GQA; outputs NaN-poisoned first; NaN in
one sequence's keys stays in that sequence. Few compiles: one per (head dim, dtype, causal)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import attention_varlen_forward  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}


def make(lengths_q, lengths_k, hq, hkv, d, dtype):
    cu = lambda ls: torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_q, cu_k = cu(lengths_q), cu(lengths_k)
    q = torch.randn(sum(lengths_q), hq, d, device="cuda", dtype=dtype)
    k = torch.randn(sum(lengths_k), hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(sum(lengths_k), hkv, d, device="cuda", dtype=dtype)
    return q, k, v, cu_q, cu_k


def run(q, k, v, cu_q, cu_k, lengths_q, lengths_k, causal):
    out = torch.full((q.shape[0], q.shape[1], v.shape[2]), math.nan, device="cuda", dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, device="cuda", dtype=torch.float32)
    attention_varlen_forward(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                             kernel="sm80_flash", out=out, lse=lse)
    torch.cuda.synchronize()
    return out, lse


CASES = [
    # lengths_q, lengths_k, hq, hkv, d, causal, dtype
    ((1, 37, 0, 130, 5), (1, 37, 9, 130, 200), 4, 2, 64, None, torch.bfloat16),
    ((17, 1, 129, 64), (17, 300, 129, 3), 8, 2, 128, "bottom_right", torch.float16),
    ((17, 1, 129, 64), (33, 300, 129, 0), 2, 2, 128, "top_left", torch.float16),
    ((200, 3), (70, 3), 4, 1, 128, "bottom_right", torch.float16),
]


@pytest.mark.parametrize("lengths_q, lengths_k, hq, hkv, d, causal, dtype", CASES)
def test_matches_float32_reference_per_sequence(lengths_q, lengths_k, hq, hkv, d, causal, dtype):
    torch.manual_seed(sum(lengths_q) + d)
    q, k, v, cu_q, cu_k = make(lengths_q, lengths_k, hq, hkv, d, dtype)
    out, lse = run(q, k, v, cu_q, cu_k, lengths_q, lengths_k, causal)
    ref_out, ref_lse = reference.varlen_forward(q.float(), k.float(), v.float(), cu_q, cu_k, causal)
    assert not out.isnan().any() and not lse.isnan().any(), "an output element was not written"
    err = ((out.float() - ref_out).norm() / ref_out.norm()).item()
    assert err < TOL[dtype], err
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert (out.transpose(0, 1)[empty] == 0).all()
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=2e-3, rtol=1e-3)


def test_each_sequence_is_attended_alone_and_nan_stays_in_its_sequence():
    lengths_q, lengths_k = (5, 70, 33), (9, 70, 65)
    torch.manual_seed(3)
    q, k, v, cu_q, cu_k = make(lengths_q, lengths_k, 4, 2, 64, torch.bfloat16)
    k[9 + 20, 1, 7] = math.nan  # sequence 1, key 20, KV head 1 (query heads 2, 3)
    out, lse = run(q, k, v, cu_q, cu_k, lengths_q, lengths_k, None)
    seq1 = slice(5, 75)
    assert out[seq1, 2:].isnan().all() and lse[2:, seq1].isnan().all()
    assert not out[seq1, :2].isnan().any()
    assert not out[:5].isnan().any() and not out[75:].isnan().any()
    # Sequence 2 alone through the fixed-length path agrees with its packed result.
    from cute_kernels.attention import attention_forward

    q2, k2, v2 = (t[a:b].transpose(0, 1).unsqueeze(0) for t, (a, b) in ((q, (75, 108)), (k, (79, 144)), (v, (79, 144))))
    alone, _ = attention_forward(q2, k2, v2, enable_gqa=True, kernel="sm80_flash")
    torch.testing.assert_close(out[75:108], alone[0].transpose(0, 1))
