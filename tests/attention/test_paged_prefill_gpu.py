"""attention_varlen_forward over a paged KV cache (`page_table`, prefill and chunked prefill) on
the GPU: bit-identical to the same call with the keys packed, against the float32 reference,
with the cache's unused pages and slots NaN (never read), random page order, page sizes 1 to
256, ragged lengths (a chunk of queries bottom-right over a longer prefix), GQA, windows."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import attention_varlen_forward  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402

from .test_paged_prefill import paged  # noqa: E402

pytestmark = pytest.mark.gpu


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


CASES = [
    # lengths_q, lengths_k, hq, hkv, d, page_size, causal, window
    ((1, 17, 300, 64), (1, 1000, 300, 4096), 8, 2, 128, 16, "bottom_right", None),
    ((5, 0, 129), (5, 7, 513), 4, 4, 64, 1, "bottom_right", None),
    ((130, 33), (130, 2049), 4, 1, 128, 256, "bottom_right", (256, 0)),
    ((64, 64), (64, 200), 2, 2, 128, 64, None, None),
]


@pytest.mark.parametrize("lengths_q, lengths_k, hq, hkv, d, page_size, causal, window", CASES)
def test_paged_keys_equal_packed_keys_and_the_reference(lengths_q, lengths_k, hq, hkv, d, page_size, causal, window):
    torch.manual_seed(sum(lengths_k) + page_size)
    k_cache, v_cache, table, k, v = paged(lengths_k, page_size, hkv=hkv, d=d, dv=d, seed=page_size, fill=math.nan)
    dt = torch.bfloat16
    k_cache, v_cache, k, v = (t.to("cuda", dt) for t in (k_cache, v_cache, k, v))
    table = table.cuda()
    used = torch.tensor(lengths_k, dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lengths_q), hq, d, device="cuda", dtype=dt)
    cu_q, cu_k = _cu(lengths_q), _cu(lengths_k)
    mq, mk = max(lengths_q), max(lengths_k)
    kw = dict(causal=causal, window_size=window)
    out, lse = attention_varlen_forward(q, k_cache, v_cache, cu_q, None, mq, mk, seqused_k=used, page_table=table,
                                        **kw)
    want_out, want_lse = attention_varlen_forward(q, k, v, cu_q, cu_k, mq, mk, **kw)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    assert not out.isnan().any(), "a NaN slot of the cache was read"
    if window is None:
        ref_out, _ = reference.varlen_forward(q.float(), k.float(), v.float(), cu_q, cu_k, causal)
        assert ((out.float() - ref_out).norm() / ref_out.norm()).item() < 1e-2
