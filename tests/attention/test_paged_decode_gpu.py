"""paged_decode on the GPU, both split kernels (SIMT and tensor-core): shuffled non-contiguous
block tables, ragged seqlens_k (0, 1, odd, full table), page sizes 16/64/256 (and 24), GQA
ratios 1/4/8/24, head dims 64/128/256, against the float32 reference; outputs
NaN-poisoned first; the split count does not change the answer; NaN in a used page reaches
exactly its sequence's heads, NaN in an unused page reaches nothing."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import paged_decode  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}


def make(seqlens, hq, hkv, d, page, dtype, spare_pages=5):
    width = max(1, -(-max(seqlens) // page))
    pages = len(seqlens) * width + spare_pages
    q = torch.randn(len(seqlens), hq, d, device="cuda", dtype=dtype)
    kc = torch.randn(pages, page, hkv, d, device="cuda", dtype=dtype)
    vc = torch.randn(pages, page, hkv, d, device="cuda", dtype=dtype)
    # Every sequence's pages scattered over the cache in shuffled order.
    table = torch.randperm(pages, device="cuda")[: len(seqlens) * width].reshape(len(seqlens), width)
    seqlens_k = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    return q, kc, vc, table.to(torch.int32).contiguous(), seqlens_k


def run(q, kc, vc, table, seqlens_k, **kw):
    out = torch.full((q.shape[0], q.shape[1], vc.shape[-1]), math.nan, device="cuda", dtype=q.dtype)
    paged_decode(q, kc, vc, table, seqlens_k, out=out, **kw)
    torch.cuda.synchronize()
    return out


CASES = [
    # seqlens, hq, hkv, d, page, dtype: the split kernel is decode.use_mma's choice
    ((1, 700, 0, 33, 1024), 8, 2, 128, 16, torch.bfloat16),     # tensor cores, 4 heads per KV head, 2 pages a block
    ((31, 200, 64, 5), 4, 2, 64, 16, torch.float16),             # tensor cores, 2 heads per KV head, 4 pages a block
    ((300, 1, 4097, 64), 4, 4, 64, 64, torch.float16),           # tensor cores, 1 head per KV head
    ((300, 1, 129, 64), 4, 4, 64, 24, torch.float16),            # SIMT (page size not a multiple of 16)
    ((513, 2, 255, 256), 16, 2, 128, 256, torch.bfloat16),       # tensor cores, 8 heads per KV head
    ((100, 1, 77), 24, 1, 256, 16, torch.bfloat16),              # tensor cores, MQA 24 -> 2 CTAs of 12 heads
    ((100, 49, 3), 16, 2, 128, 24, torch.bfloat16),              # SIMT with GQA (page size not a multiple of 16)
]


@pytest.mark.parametrize("seqlens, hq, hkv, d, page, dtype", CASES)
def test_matches_float32_reference(seqlens, hq, hkv, d, page, dtype):
    torch.manual_seed(sum(seqlens) + page)
    q, kc, vc, table, seqlens_k = make(seqlens, hq, hkv, d, page, dtype)
    out = run(q, kc, vc, table, seqlens_k)
    ref = reference.paged_decode(q.float(), kc.float(), vc.float(), table, seqlens_k)
    assert not out.isnan().any(), "an output element was not written"
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < TOL[dtype], err
    empty = seqlens_k == 0
    assert (out[empty] == 0).all()
    # Forced splits (one page each, and a single split) agree with the heuristic's.
    for splits in (1, table.shape[1]):
        again = run(q, kc, vc, table, seqlens_k, num_splits=splits)
        assert ((again.float() - ref).norm() / ref.norm()).item() < TOL[dtype]


def test_nan_reaches_exactly_the_heads_that_read_it():
    torch.manual_seed(0)
    seqlens = (40, 100, 17)
    q, kc, vc, table, seqlens_k = make(seqlens, 8, 2, 128, 16, torch.bfloat16)
    used = table[1, 1].item()  # sequence 1's keys 16..31
    unused = (set(range(kc.shape[0])) - set(table.flatten().tolist())).pop()
    vc[used, 3, 1, 5] = math.nan  # KV head 1 (query heads 4..7), value channel 5
    kc[unused] = math.nan
    out = run(q, kc, vc, table, seqlens_k)
    # P·V: a NaN in one value channel reaches that output channel of every head that reads it
    # (as in SDPA), and nothing else; a NaN page no sequence maps is never read.
    assert out[1, 4:, 5].isnan().all()
    assert not out[1, 4:, :5].isnan().any() and not out[1, 4:, 6:].isnan().any()
    assert not out[1, :4].isnan().any() and not out[0].isnan().any() and not out[2].isnan().any()
