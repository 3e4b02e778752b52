"""paged_decode without a GPU: its signature (the one cute_kernels.ops calls), the argument and
index checks that run before any launch, the split heuristic's post-conditions, the decode
kernel's layouts and its compiled SASS (128-bit K/V loads, no local memory)."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from cute_kernels.attention import KERNELS, paged_decode  # noqa: E402
from cute_kernels.attention.paged import check_paged_inputs  # noqa: E402


def paged(b=3, hq=8, hkv=2, d=64, pages=10, page=16, width=4, dtype=torch.bfloat16):
    q = torch.randn(b, hq, d, dtype=dtype)
    kc = torch.randn(pages, page, hkv, d, dtype=dtype)
    vc = torch.randn(pages, page, hkv, d, dtype=dtype)
    table = torch.randperm(pages)[: b * width].reshape(b, width).to(torch.int32) if b * width <= pages else \
        torch.randint(0, pages, (b, width), dtype=torch.int32)
    seqlens = torch.tensor([min(width * page, 5 + 17 * i) for i in range(b)], dtype=torch.int32)
    return q, kc, vc, table, seqlens


def test_signature_is_the_one_the_ops_layer_calls():
    params = inspect.signature(paged_decode).parameters
    assert list(params)[:5] == ["q", "k_cache", "v_cache", "block_table", "seqlens_k"]
    for name in ("scale", "kernel"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_decode_rung_takes_few_queries_over_long_caches_only():
    """Its `supports` for dense problems (`dense_decode`): a few queries over a long cache, no
    window; everything else declined with the reason."""
    import torch

    from cute_kernels.attention.api import AttentionProblem
    from cute_kernels.attention.dense_decode import DENSE_MAX_QUERIES, DENSE_MIN_KEYS

    assert "decode" in KERNELS
    rung = KERNELS["decode"]

    def problem(sq, sk, d=128, hq=8, hkv=2, **kw):
        q = torch.randn(2, hq, sq, d, dtype=torch.bfloat16)
        k = torch.randn(2, hkv, sk, d, dtype=torch.bfloat16)
        return q, k, k, AttentionProblem(2, hq, hkv, sq, sk, d, d, torch.bfloat16, kw.pop("causal", None),
                                         d ** -0.5, **kw)

    assert rung.supports(*problem(1, 4096)) is None
    assert rung.supports(*problem(DENSE_MAX_QUERIES, DENSE_MIN_KEYS, causal="bottom_right", softcap=30.0,
                                  sinks=True)) is None
    assert "at most 8" in rung.supports(*problem(DENSE_MAX_QUERIES + 1, 4096))
    assert "starts at 512" in rung.supports(*problem(1, DENSE_MIN_KEYS - 1))
    assert "sliding windows" in rung.supports(*problem(1, 4096, window_left=128))
    assert "head dim 72" in rung.supports(*problem(1, 4096, d=72))
    q, k, v, p = problem(1, 4096)
    odd = torch.randn(2, 2, 4096, 132, dtype=torch.bfloat16)[..., :128]  # row stride 132: not 16-byte rows
    assert "strides" in rung.supports(q, odd, odd, p)
    assert "different strides" in rung.supports(q, k, odd.contiguous().transpose(1, 2).contiguous().transpose(1, 2), p)
    assert "1 query per head over 4096 keys: split-KV decode" in rung.route_reason(p)


def test_cpu_tensors_are_rejected_after_the_checks():
    with pytest.raises(ValueError, match="on 'cpu'.*CUDA"):
        paged_decode(*paged())


def _with(args, **changes):
    names = ["q", "kc", "vc", "table", "seqlens"]
    d = dict(zip(names, args))
    d.update(changes)
    return [d[n] for n in names]


@pytest.mark.parametrize("change, kwargs, error, pattern", [
    ({"q": torch.randn(3, 1, 8, 64, dtype=torch.bfloat16)}, {}, ValueError, "q must be 3-D"),
    ({"kc": torch.randn(10, 16, 2, 32, dtype=torch.bfloat16)}, {}, ValueError, "q head dim 64 differs"),
    ({"vc": torch.randn(10, 8, 2, 64, dtype=torch.bfloat16)}, {}, ValueError, "differ in pages, page size or heads"),
    ({"q": torch.randn(3, 8, 64)}, {}, TypeError, "share a floating dtype"),
    ({"table": torch.zeros(3, 4, dtype=torch.int64)}, {}, TypeError, "block_table must be int32"),
    ({"seqlens": torch.zeros(3, dtype=torch.int64)}, {}, TypeError, "seqlens_k must be int32"),
    ({"table": torch.zeros(2, 4, dtype=torch.int32)}, {}, ValueError, "block_table has 2 rows"),
    ({"q": torch.randn(3, 7, 64, dtype=torch.bfloat16)}, {}, ValueError, r"query heads \(7\) must be a multiple"),
    ({"seqlens": torch.tensor([5, 65, 3], dtype=torch.int32)}, {"check_indices": "host"}, ValueError,
     "room for 4 pages x 16 = 64 keys"),
    ({"seqlens": torch.tensor([5, -1, 3], dtype=torch.int32)}, {"check_indices": True}, ValueError,
     "negative length -1"),
    ({"table": torch.tensor([[0, 1, 2, 3], [4, 10, 6, 7], [8, 9, 0, 0]], dtype=torch.int32),
      "seqlens": torch.tensor([5, 17, 3], dtype=torch.int32)}, {"check_indices": "host"}, ValueError,
     r"block_table\[1, 1\] = 10"),
    ({}, {"check_indices": "always"}, ValueError, "check_indices must be"),
    ({"q": torch.randn(3, 8, 128, dtype=torch.bfloat16)[..., ::2]}, {}, ValueError, "contiguous head dim"),
    ({}, {"scale": "big"}, TypeError, "scale must be a real number"),
])
def test_bad_arguments_are_named(change, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        paged_decode(*_with(paged(), **change), **kwargs)


def test_unused_table_entries_are_not_checked():
    q, kc, vc, table, _ = paged()
    table[:, 1:] = -7  # past each sequence's end: never read
    # The index checks pass: the first error is the device one, which comes last.
    with pytest.raises(ValueError, match="on 'cpu'"):
        check_paged_inputs(q, kc, vc, table, torch.tensor([16, 0, 9], dtype=torch.int32), scale=None,
                           check_indices=True)
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = -7"):
        check_paged_inputs(q, kc, vc, table, torch.tensor([17, 0, 9], dtype=torch.int32), scale=None,
                           check_indices=True)


def test_the_default_checks_indices_on_the_device_without_a_host_sync(monkeypatch):
    """By default the indices are not read on the host (no device-to-host copy, capturable):
    a bad table gets past the host checks, and only the device check (not reachable on CPU)
    sees it; check_indices=False is the same."""
    from cute_kernels.attention import paged as paged_mod

    monkeypatch.setattr(paged_mod, "_check_indices", lambda *a: pytest.fail("host index check on the default path"))
    q, kc, vc, table, _ = paged()
    table[0, 0] = 10**6
    for kwargs in ({}, {"check_indices": False}, {"check_indices": "device"}):
        with pytest.raises(ValueError, match="on 'cpu'"):
            paged_decode(q, kc, vc, table, torch.tensor([16, 0, 9], dtype=torch.int32), **kwargs)


def test_num_splits_and_kernel_arguments_are_checked():
    with pytest.raises(ValueError, match="num_splits must be an int"):
        paged_decode(*paged(), num_splits=0)
    with pytest.raises(ValueError, match="unknown kernel 'sm80_flash'"):
        paged_decode(*paged(), kernel="sm80_flash")


@given(batch=st.integers(1, 300), head_blocks=st.integers(1, 64), max_pages=st.integers(0, 5000),
       page=st.sampled_from([1, 16, 64, 256]), sms=st.sampled_from([1, 108, 132]))
def test_split_heuristic_covers_the_table(batch, head_blocks, max_pages, page, sms):
    pytest.importorskip("cutlass")
    from cute_kernels.attention.decode import num_splits_for

    splits, per = num_splits_for(batch, head_blocks, max_pages, page, sms)
    assert splits >= 1 and per >= 1
    assert splits * per >= max_pages
    assert (splits - 1) * per < max(max_pages, 1)  # no split starts past the table
    # Splits are no shorter than 256 keys unless that would leave too few of them to fill the GPU.
    min_pages = -(-256 // page)
    assert splits <= max(1, -(-max_pages // min_pages))


def test_heads_per_cta_divides_the_group():
    pytest.importorskip("cutlass")
    from cute_kernels.attention.decode import MAX_HEADS_PER_CTA, heads_per_cta_for

    for g in range(1, 65):
        h = heads_per_cta_for(g)
        assert g % h == 0 and 1 <= h <= MAX_HEADS_PER_CTA
    assert [heads_per_cta_for(g) for g in (1, 4, 8, 12, 16)] == [1, 4, 8, 6, 8]


@pytest.mark.parametrize("d, warps, rows", [(64, 4, 4), (128, 4, 4), (256, 2, 2)])
def test_decode_layouts_cover_each_thread_and_step_row_once(d, warps, rows):
    pytest.importorskip("cutlass")
    from cute_kernels.attention.decode import DecodeConfig, DecodeLayouts

    c = DecodeConfig(head_dim=d, num_warps=warps, rows_per_thread=rows)
    lay = DecodeLayouts(c)
    lanes, rpw = c.lanes_per_row, c.rows_per_warp
    thr = [lay.thread_layout((ch, r, w)) for w in range(warps) for r in range(rpw) for ch in range(lanes)]
    assert sorted(thr) == list(range(c.threads))
    # The kernel's idx2crd inverse: thread t is (t % lanes, (t // lanes) % rows_per_warp, t // 32).
    assert all(lay.thread_layout((t % lanes, (t // lanes) % rpw, t // 32)) == t for t in range(c.threads))
    rows_ = [lay.step_row_layout((r, w, u)) for u in range(rows) for w in range(warps) for r in range(rpw)]
    assert sorted(rows_) == list(range(c.rows_per_step))
    acc = {lay.smem_acc_layout((e, h, w)) for e in range(d) for h in range(c.heads_per_cta) for w in range(warps)}
    assert acc == set(range(d * c.heads_per_cta * warps))


def test_decode_config_validation_names_the_field():
    pytest.importorskip("cutlass")
    from cute_kernels.attention.decode import DecodeConfig

    with pytest.raises(ValueError, match="head_dim must be one of"):
        DecodeConfig(head_dim=96).validate()
    with pytest.raises(ValueError, match="heads_per_cta must be in"):
        DecodeConfig(heads_per_cta=9).validate()
    with pytest.raises(ValueError, match="page_size must be a positive int"):
        DecodeConfig(page_size=0).validate()


@pytest.mark.compile
@pytest.mark.parametrize("config", ["d128_bf16_page16_g8", "d64_fp16_page256_g1"])
def test_split_kernel_streams_kv_with_128_bit_loads_and_no_spills(config):
    pytest.importorskip("cutlass")
    from cute_kernels.attention.decode import DecodeConfig, VARIANT_CONFIGS
    from cute_kernels.runtime.registry import check_variant, compile_variant, get_variant

    report = compile_variant("attention.decode", config)
    assert check_variant(report, get_variant("attention.decode")) == []
    c = DecodeConfig(**VARIANT_CONFIGS[config])
    # K and V rows of a step (2 * rows_per_thread) plus each head's q chunk: all 16-byte loads.
    assert report.opcodes.get("LDG.E.128", 0) == 2 * c.rows_per_thread + c.heads_per_cta
    assert not any(op.startswith(("LDG.E.U16", "LDG.E.16")) for op in report.opcodes)
    assert report.registers <= 255


def test_kernel_choice_rule():
    pytest.importorskip("cutlass")
    from cute_kernels.attention.decode import use_mma
    from cute_kernels.attention.decode_mma import block_n_for

    assert use_mma(128, 16, 1) == 1  # one head per KV head: tensor cores too (measured faster)
    assert use_mma(128, 24, 8) is None  # a page is not a whole number of 16-key blocks
    assert [use_mma(128, 16, g) for g in (2, 4, 8, 16, 24, 32)] == [2, 4, 8, 16, 12, 16]
    assert use_mma(80, 64, 4) == 4 and use_mma(72, 64, 4) is None
    assert [block_n_for(p, head_dim=64) for p in (16, 32, 48, 64, 256, 8, 40)] == [64, 64, 16, 64, 64, None, None]
    assert [block_n_for(p) for p in (16, 48, 64, 256)] == [32, 16, 32, 32]
    assert block_n_for(256, head_dim=256) == block_n_for(16, head_dim=256) == 16
    for page in range(16, 1025, 16):
        for d in (64, 128, 256):
            n = block_n_for(page, d)
            assert page % n == 0 or n % page == 0  # within one page, or whole pages


@pytest.mark.compile
def test_tensor_core_split_kernel_runs_hmma_on_cp_async_tiles():
    pytest.importorskip("cutlass")
    from cute_kernels.runtime.registry import check_variant, compile_variant, get_variant

    report = compile_variant("attention.decode_mma", "d128_bf16_page16_g8")
    assert check_variant(report, get_variant("attention.decode_mma")) == []
    assert report.opcodes.get("HMMA.16816.F32.BF16", 0) > 0
    assert report.opcodes.get("LDGSTS.E.BYPASS.LTC128B.128", 0) > 0


@given(b=st.integers(1, 4), hkv=st.integers(1, 4), sq=st.integers(1, 8), sk=st.integers(512, 1100),
       d=st.sampled_from([64, 128]), layout=st.sampled_from(["bhsd", "bshd", "padded"]),
       causal=st.sampled_from([None, "top_left", "bottom_right"]))
def test_dense_route_tables_address_every_key_of_every_row(b, hkv, sq, sk, d, layout, causal):
    """The dense route's block table (built on the device, `dense_decode._tables`): page p of
    query row r starts at key p * PAGE of batch r // Sq, and every page the row reads lies
    inside the declared paged view; lengths follow the causal alignment."""
    from cute_kernels.attention import dense_decode as dd

    if layout == "bhsd":
        k = torch.empty(b, hkv, sk, d, dtype=torch.bfloat16)
    elif layout == "bshd":
        k = torch.empty(b, sk, hkv, d, dtype=torch.bfloat16).transpose(1, 2)
    else:  # a slice of a longer preallocated cache
        k = torch.empty(b, hkv, sk + 40, d, dtype=torch.bfloat16)[:, :, :sk]
    dd._TABLES.clear()
    table, lens, g, declared = dd._tables(k, b, sq, sk, causal)
    pages = -(-sk // dd.PAGE)
    assert table.dtype == lens.dtype == torch.int32 and tuple(table.shape) == (b * sq, pages)
    bs, ts = k.stride(0), k.stride(2)
    for r in range(b * sq):
        i, batch = r % sq, r // sq
        want = {None: sk, "bottom_right": sk - sq + 1 + i, "top_left": i + 1}[causal]
        assert int(lens[r]) == min(max(want, 0), sk)
        for p in range(pages):
            assert int(table[r, p]) * g == batch * bs + p * dd.PAGE * ts
            if p * dd.PAGE < int(lens[r]):  # a page the row reads starts inside the view
                assert 0 <= int(table[r, p]) < declared or p == pages - 1
    assert dd._tables(k, b, sq, sk, causal)[0] is table  # kept per signature
