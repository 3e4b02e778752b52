"""Paged keys for the varlen forward (`attention.paged_prefill`) without a GPU: the gather takes
exactly each sequence's keys from a shuffled paged cache, every bad argument raises before any
launch naming the argument, and the entry point composes (it reaches the CUDA-only check)."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import attention_varlen_backward, attention_varlen_forward  # noqa: E402
from cute_kernels.attention.paged_prefill import check_page_table, packed_keys  # noqa: E402


def paged(lengths, page_size, hkv=2, d=16, dv=8, spare=3, seed=0, max_pages=None, fill=None):
    """(k_cache, v_cache, page_table, the sequences' own keys (k, v) packed): each sequence's
    keys written into pages drawn at random from a cache with `spare` pages nobody uses (filled
    with `fill` when given), its page_table row padded with -1 past the pages it uses."""
    rng = random.Random(seed)
    need = [-(-n // page_size) for n in lengths]
    max_pages = max_pages or max(need + [1])
    num_pages = sum(need) + spare
    order = list(range(num_pages))
    rng.shuffle(order)
    k_cache = torch.randn(num_pages, page_size, hkv, d)
    v_cache = torch.randn(num_pages, page_size, hkv, dv)
    if fill is not None:
        k_cache.fill_(fill)
        v_cache.fill_(fill)
    table = torch.full((len(lengths), max_pages), -1, dtype=torch.int32)
    ks, vs = [], []
    for b, n in enumerate(lengths):
        k, v = torch.randn(n, hkv, d), torch.randn(n, hkv, dv)
        ks.append(k)
        vs.append(v)
        for j in range(need[b]):
            page = order.pop()
            table[b, j] = page
            rows = slice(j * page_size, min(n, (j + 1) * page_size))
            k_cache[page, : rows.stop - rows.start] = k[rows]
            v_cache[page, : rows.stop - rows.start] = v[rows]
    return k_cache, v_cache, table, torch.cat(ks), torch.cat(vs)


@pytest.mark.parametrize("lengths, page_size", [((5, 0, 33, 16), 16), ((1, 7, 24), 24), ((3, 2, 9), 1),
                                                ((64, 65), 64), ((0,), 8)])
def test_packed_keys_are_each_sequences_own_keys(lengths, page_size):
    k_cache, v_cache, table, k_want, v_want = paged(lengths, page_size, fill=float("nan"))
    used = torch.tensor(lengths, dtype=torch.int32)
    got = check_page_table(table, k_cache, v_cache, len(lengths), used, "t")
    assert got == list(lengths)
    k, v, cu = packed_keys(k_cache, v_cache, table, got)
    assert torch.equal(k, k_want) and torch.equal(v, v_want)  # and no NaN from a slot nobody uses
    assert cu.dtype == torch.int32 and cu.tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]


def test_without_seqused_k_every_sequence_uses_its_whole_row():
    k_cache, v_cache, table, k_want, _ = paged((16, 32), 16, max_pages=2)
    table[0, 1] = 0  # the first sequence's second page: any page inside the cache
    lengths = check_page_table(table, k_cache, v_cache, 2, None, "t")
    assert lengths == [32, 32]
    k, _, _ = packed_keys(k_cache, v_cache, table, lengths)
    assert torch.equal(k[:16], k_want[:16]) and torch.equal(k[16:32], k_cache[0]) and torch.equal(k[32:], k_want[16:])


def test_the_gather_is_differentiable_in_the_cache():
    k_cache, v_cache, table, _, _ = paged((5, 20), 8)
    k_cache.requires_grad_(True)
    k, _, _ = packed_keys(k_cache, v_cache, table, [5, 20])
    k.sum().backward()
    used = torch.zeros(k_cache.shape[:2])
    for b, n in enumerate((5, 20)):
        for t in range(n):
            used[table[b, t // 8], t % 8] = 1
    assert torch.equal(k_cache.grad, used[:, :, None, None].expand_as(k_cache))


def _call(k_cache, v_cache, table, seqused, **kw):
    """Two sequences of 3 and 4 queries over the paged keys."""
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    q = torch.randn(7, 4, k_cache.shape[-1])
    args = dict(max_seqlen_q=4, max_seqlen_k=64, causal="bottom_right", seqused_k=seqused, page_table=table)
    args.update(kw)
    cu_k = args.pop("cu_seqlens_k", None)
    return attention_varlen_forward(q, k_cache, v_cache, cu_q, cu_k, **args)


def test_the_entry_point_checks_then_runs_the_packed_path():
    k_cache, v_cache, table, _, _ = paged((10, 40), 16)
    used = torch.tensor([10, 40], dtype=torch.int32)
    with pytest.raises(ValueError, match="on 'cpu'.*CUDA"):  # every check passed: the packed path's last one
        _call(k_cache, v_cache, table, used)


@pytest.mark.parametrize("change, error, pattern", [
    (dict(cu_seqlens_k=torch.tensor([0, 10, 50], dtype=torch.int32)), ValueError, "pass cu_seqlens_k=None"),
    (dict(max_seqlen_k=39), ValueError, "max_seqlen_k = 39 but sequence 1 uses 40 keys"),
    (dict(table=lambda t: t.long()), ValueError, r"page_table must be a \(2, max_pages\) int32"),
    (dict(table=lambda t: t[:1]), ValueError, r"page_table must be a \(2, max_pages\) int32"),
    (dict(table=lambda t: t.index_fill(1, torch.tensor([0]), 99)), ValueError,
     r"page_table\[0, 0\] = 99 is outside the cache's \d+ pages"),
    (dict(table=lambda t: t.index_fill(1, torch.tensor([2]), -1)), ValueError,
     r"page_table\[1, 2\] = -1 is outside"),
    (dict(seqused=torch.tensor([10, 49], dtype=torch.int32)), ValueError,
     "seqused_k\\[1\\] = 49 but a sequence's 3 pages"),
    (dict(seqused=torch.tensor([10, 40], dtype=torch.int64)), ValueError, r"seqused_k must be a \(2,\) int32"),
    (dict(k_cache=lambda k: k[:, :, 0]), ValueError, "must be the 4-D paged cache"),
    (dict(v_cache=lambda v: v[:, :8]), ValueError, "differ in pages, page size or heads"),
])
def test_bad_paged_arguments_raise_before_any_launch(change, error, pattern):
    k_cache, v_cache, table, _, _ = paged((10, 40), 16)
    args = dict(k_cache=k_cache, v_cache=v_cache, table=table, seqused=torch.tensor([10, 40], dtype=torch.int32))
    kw = {}
    for name, value in change.items():
        if name in args:
            args[name] = value(args[name]) if callable(value) else value
        else:
            kw[name] = value
    with pytest.raises(error, match=pattern):
        _call(args["k_cache"], args["v_cache"], args["table"], args["seqused"], **kw)


def test_pages_past_a_sequence_are_never_checked_or_read():
    """Columns past a sequence's keys may hold anything (-1 here): only used pages are checked."""
    k_cache, v_cache, table, _, _ = paged((10, 40), 16, max_pages=5)
    assert (table[:, 3:] == -1).all()
    assert check_page_table(table, k_cache, v_cache, 2, torch.tensor([10, 40], dtype=torch.int32), "t") == [10, 40]


def test_the_backward_says_paged_keys_are_not_taken():
    with pytest.raises(NotImplementedError, match="page_table: the paged-KV backward is not implemented"):
        attention_varlen_backward(*([None] * 8), 4, 64, page_table=torch.zeros(2, 3, dtype=torch.int32))
