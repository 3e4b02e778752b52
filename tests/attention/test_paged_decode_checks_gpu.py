"""paged_decode's device-side index checks on the GPU: the default call never synchronizes or
reads the indices on the host, so it can be captured in a CUDA graph; bad block-table entries
and lengths are clamped (no read leaves the caches: run this file under `compute-sanitizer
--tool memcheck` to see no error) and surface as `PagedDecodeIndexError` from
`raise_paged_decode_errors()`, which then resets; sequences with good indices are unaffected."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import PagedDecodeIndexError, paged_decode, raise_paged_decode_errors  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _clean():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("needs an sm_80+ GPU")
    raise_paged_decode_errors_quietly()
    yield
    raise_paged_decode_errors_quietly()


def raise_paged_decode_errors_quietly():
    try:
        raise_paged_decode_errors()
    except PagedDecodeIndexError:
        pass


def make(seqlens, page, hq=8, hkv=2, d=128, dtype=torch.bfloat16):
    width = -(-max(seqlens) // page)
    pages = len(seqlens) * width
    q = torch.randn(len(seqlens), hq, d, device="cuda", dtype=dtype)
    # The caches hold exactly the pages in use: any read past a clamped index would leave them.
    kc, vc = (torch.randn(pages, page, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    table = torch.randperm(pages, device="cuda").reshape(len(seqlens), width).to(torch.int32).contiguous()
    return q, kc, vc, table, torch.tensor(seqlens, dtype=torch.int32, device="cuda")


def check_good_rows(out, q, kc, vc, table, seqlens, good):
    ref = reference.paged_decode(q.float(), kc.float(), vc.float(), table, seqlens)
    for b in good:
        err = ((out[b].float() - ref[b]).norm() / ref[b].norm()).item()
        assert err < 1e-2, f"sequence {b}: relative error {err:.3g}"


@pytest.mark.parametrize("page", [16, 64, 24])  # the tensor-core kernel (16, 64), the SIMT one (24)
@pytest.mark.parametrize("bad", ["page_high", "page_negative", "length_high", "length_negative"])
def test_bad_indices_are_clamped_and_reported(page, bad):
    torch.manual_seed(page)
    seqlens = [300, 77, 1000, 5]
    q, kc, vc, table, lens = make(seqlens, page)
    good_table, good_lens = table.clone(), lens.clone()
    if bad == "page_high":
        table[1, 1] = kc.shape[0] + 1000  # sequence 1 (77 keys) uses column 1 at every page size here
    elif bad == "page_negative":
        table[1, 0] = -5
    elif bad == "length_high":
        lens[1] = table.shape[1] * page + 100
    else:
        lens[1] = -3
    out = torch.full((4, 8, 128), math.nan, device="cuda", dtype=q.dtype)
    paged_decode(q, kc, vc, table, lens, out=out)  # no host read of the indices: no error here
    with pytest.raises(PagedDecodeIndexError, match=r"block_table\[1, |seqlens_k\[1\]"):
        raise_paged_decode_errors()
    raise_paged_decode_errors()  # the record was cleared
    assert torch.isfinite(out).all(), "a clamped read must still read cache memory"
    check_good_rows(out, q, kc, vc, good_table, good_lens, [0, 2, 3])
    # With good indices nothing is reported.
    paged_decode(q, kc, vc, good_table, good_lens, out=out)
    raise_paged_decode_errors()


def test_host_check_still_raises_before_the_launch():
    q, kc, vc, table, lens = make([300, 77], 16)
    table[1, 0] = 10**6
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] = 1000000"):
        paged_decode(q, kc, vc, table, lens, check_indices="host")
    raise_paged_decode_errors()  # nothing launched


def test_default_call_is_captured_in_a_cuda_graph():
    """The default path in a CUDA graph: replays match the reference, and a bad entry written
    into the captured table between replays is reported after the replay."""
    torch.manual_seed(0)
    q, kc, vc, table, lens = make([500, 33, 2048], 64)
    out = torch.empty(3, 8, 128, device="cuda", dtype=q.dtype)
    paged_decode(q, kc, vc, table, lens, out=out, num_splits=4)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode(q, kc, vc, table, lens, out=out, num_splits=4)
    out.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    check_good_rows(out, q, kc, vc, table, lens, [0, 1, 2])
    raise_paged_decode_errors()
    saved = table[2, 3].item()
    table[2, 3] = -1
    graph.replay()
    with pytest.raises(PagedDecodeIndexError, match=r"block_table\[2, 3\] = -1"):
        raise_paged_decode_errors()
    table[2, 3] = saved
