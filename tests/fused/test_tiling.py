"""The fused kernels' row tiling, in pure Python: the TV layout's laws (a bijection, contiguous
vectors, coalesced lanes), what `layouts.coalescing` says of one access, and the heuristics'
guarantees (the tile covers the row, values fit the register budget, rows share 128 threads)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cute_kernels.fused import dispatch
from cute_kernels.fused import tiling as tiling_mod
from cute_kernels.fused.tiling import (RowTiling, chunked_tiling, row_tiling, row_tv_layout, value_budget,
                                       vector_access_layout, vector_elements)
from cute_kernels.layouts import Layout, coalescing

pow2 = lambda lo, hi: st.sampled_from([1 << k for k in range(lo, hi + 1)])  # noqa: E731


@st.composite
def tilings(draw):
    vec = draw(pow2(0, 3))
    tpr = draw(pow2(0, 6))
    rows = draw(st.sampled_from([r for r in (1, 2, 4, 8, 16, 32) if (tpr * r) % 32 == 0 and tpr * r <= 128]))
    return RowTiling(vec, tpr, rows, draw(st.integers(1, 3)))


@settings(max_examples=40)
@given(tilings())
def test_row_tv_layout_is_a_bijection_of_contiguous_coalesced_vectors(t):
    tv = row_tv_layout(t)
    rows, tpr, vec, vpt = t.rows_per_cta, t.threads_per_row, t.vec, t.vecs_per_thread
    seen = {}
    for r in range(rows):
        for lane in range(tpr):
            for j in range(vpt):
                idx = [tv(((lane, r), (e, j))) for e in range(vec)]
                cols = [i // rows for i in idx]
                assert all(i % rows == r for i in idx)  # a thread's vector lies in its own row
                assert cols == list(range(cols[0], cols[0] + vec)) and cols[0] % vec == 0
                assert cols[0] == (j * tpr + lane) * vec  # lanes of a row read consecutive vectors
                for i in idx:
                    seen[i] = seen.get(i, 0) + 1
    assert sorted(seen) == list(range(rows * t.capacity)) and set(seen.values()) == {1}


@pytest.mark.parametrize("width, vec, dtype", [(4096, 8, "bf16"), (64, 8, "bf16"), (128, 4, "f32"),
                                               (1000, 8, "f16"), (24, 8, "bf16"), (32000, 4, "f32")])
def test_each_vector_access_is_whole_sectors(width, vec, dtype):
    t = row_tiling(width, vec)
    tile = Layout(t.tile_shape, (t.capacity + 64, 1))  # rows further apart than the tile (128-byte aligned)
    report = coalescing(tile, dtype, access=vector_access_layout(t))
    assert report.efficiency == 1.0, str(report)


def test_one_thread_a_row_would_waste_half_of_each_sector():
    # Why the heuristic gives a row at least 4 lanes: the analysis sees the waste.
    t = RowTiling(8, 1, 128, 8)
    report = coalescing(Layout(t.tile_shape, (t.capacity, 1)), "bf16", access=vector_access_layout(t))
    assert report.efficiency == 0.5


@given(st.integers(1, 1 << 16), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1.0, 1.5, 3.0]))
def test_row_tiling_covers_the_row_within_the_register_budget(width, vec, arrays):
    width = width - width % vec or vec
    t = row_tiling(width, vec, arrays=arrays)
    if t is None:
        # Too wide: even 1024 threads would hold more than the budget.
        assert width // vec > 1024 or (width // vec / 1024) * vec * arrays > value_budget(1024) / 2
        return
    assert t.capacity >= width and t.vec == vec
    assert t.values_per_thread * arrays <= value_budget(t.threads)
    assert t.threads % 32 == 0 and (t.rows_per_cta == 1 or t.threads == 128)
    assert t.threads_per_row >= min(4, width // vec) or t.threads_per_row * 8 >= width // vec
    assert t.capacity < 2 * width or t.threads_per_row <= 4


def test_validate_names_the_problem():
    with pytest.raises(ValueError, match="vec"):
        RowTiling(3, 32).validate()
    with pytest.raises(ValueError, match="threads_per_row"):
        RowTiling(8, 48).validate()
    with pytest.raises(ValueError, match="multiple of 32"):
        RowTiling(8, 4, 3, 1).validate()
    with pytest.raises(ValueError, match="16-byte"):
        RowTiling(8, 32).validate(element_bytes=4)
    with pytest.raises(ValueError, match="vecs_per_thread"):
        RowTiling(8, 32, 1, 0).validate()


def test_vector_elements_divides_everything():
    assert vector_elements(2, 4096, 4096 * 3, 0) == 8
    assert vector_elements(2, 4100) == 4
    assert vector_elements(4, 4096, 6) == 2
    assert vector_elements(2, 4097) == 1


def test_norm_limits_and_errors():
    assert dispatch.max_norm_width("bfloat16", "bfloat16") >= 16384
    assert dispatch.max_norm_width("bfloat16", "bfloat16", backward=True, residual=True) >= 8192
    with pytest.raises(NotImplementedError, match="widest supported row"):
        dispatch.norm_tiling(1 << 20, "bfloat16", "bfloat16")


@pytest.mark.parametrize("width, streaming", [(4096, False), (16384, False), (128256, True), (262144, True)])
def test_softmax_picks_streaming_only_for_rows_past_the_registers(width, streaming):
    t, s = dispatch.softmax_tiling(width, "bfloat16")
    assert s == streaming
    assert (t.capacity >= width) != s
    if s:  # the forward stashes its row: a wider CTA; the backward does not
        assert t == chunked_tiling(8, threads=dispatch.STASH_THREADS, values=32)
        assert dispatch.softmax_tiling(width, "bfloat16", backward=True)[0] == chunked_tiling(8, threads=256, values=32)


def test_cross_entropy_tiles():
    small = dispatch.cross_entropy_tiling(1000, "float16")
    assert small.capacity >= 1000 and small.rows_per_cta > 1
    big = dispatch.cross_entropy_tiling(128256, "bfloat16")
    assert big.rows_per_cta == 1 and big.threads == 256 and big.vec == 8
    fused = dispatch.cross_entropy_tiling(128256, "bfloat16", fused=True)
    assert fused.rows_per_cta == 1 and fused.threads == dispatch.STASH_THREADS


@pytest.mark.parametrize("width, dtype, chunks", [
    (128256, "bfloat16", 3),   # 3 chunks of 32768 (64 KiB each) in 224 KiB: 77% of the row
    (40000, "bfloat16", 2),    # the whole row: 2 chunks
    (131072, "float32", 1),    # 128 KiB chunks
    (50257, "bfloat16", 0),    # odd: 2-byte vectors, under what cp.async copies
])
def test_stash_holds_what_fits(width, dtype, chunks):
    t, streaming = dispatch.softmax_tiling(width, dtype)
    assert streaming
    got = dispatch.stash_chunks_for(width, t, dtype)
    assert got == chunks
    assert got * t.capacity * (2 if dtype == "bfloat16" else 4) <= tiling_mod.MAX_STASH_BYTES


def test_stash_configs_refuse_what_cannot_hold_one():
    from cute_kernels.fused.cross_entropy import CrossEntropyConfig
    from cute_kernels.fused.softmax import SoftmaxConfig

    t = chunked_tiling(8, threads=512, values=32)
    with pytest.raises(ValueError, match="more than"):
        SoftmaxConfig(t, "bfloat16", streaming=True, stash_chunks=8).validate()
    with pytest.raises(ValueError, match="only a streaming"):
        SoftmaxConfig(dispatch.softmax_tiling(4096, "bfloat16")[0], "bfloat16", stash_chunks=1).validate()
    with pytest.raises(ValueError, match="only a streaming"):  # the forward-only mode has no second pass
        CrossEntropyConfig(t, "bfloat16", forward=True, grad=False, stash_chunks=1).validate()
    with pytest.raises(ValueError, match="cp.async"):
        SoftmaxConfig(chunked_tiling(1, threads=512, values=32), "bfloat16", streaming=True, stash_chunks=1).validate()
    with pytest.raises(ValueError, match="non-negative"):
        SoftmaxConfig(t, "bfloat16", streaming=True, stash_chunks=-1).validate()
    assert SoftmaxConfig(t, "bfloat16", streaming=True, stash_chunks=7).validate().stash_chunks == 7


def test_rope_and_swiglu_tiles():
    t = dispatch.rope_tiling(128, "bfloat16")
    assert t.capacity >= 64 and 64 % t.vec == 0 and t.vec * 2 == 16
    assert dispatch.rope_tiling(64, "float32", interleaved=True).vec == 4
    with pytest.raises(ValueError, match="even"):
        dispatch.rope_tiling(7, "bfloat16")
    fwd = dispatch.swiglu_tiling(14336, "bfloat16")
    bwd = dispatch.swiglu_tiling(14336, "bfloat16", backward=True)
    assert fwd == bwd and fwd.values_per_thread == 16 and fwd.threads == 256


def test_the_prefetching_norm_backward_keeps_the_tiling_or_stays_off():
    """`norm_backward_prefetch` admits a tiling only where the next row block's raw values fit the
    register budget beside everything else, so prefetching never changes the tiling; it is on for
    the common bf16 rows and off where a row already fills the registers (fp32 RMSNorm rows)."""
    from cute_kernels.fused.dispatch import _norm_arrays, norm_backward_prefetch, norm_tiling
    from cute_kernels.fused.tiling import row_tiling, value_budget

    for width in (768, 2048, 4096, 8192):
        t = norm_tiling(width, "bfloat16", "bfloat16", backward=True)
        assert norm_backward_prefetch(t, "bfloat16", "bfloat16")
        arrays = _norm_arrays("bfloat16", "bfloat16", False, True, False) + 2 * 0.5
        assert t.vecs_per_thread * t.vec * arrays <= value_budget(t.threads_per_row)
    t = norm_tiling(4096, "float32", "float32", backward=True)
    assert not norm_backward_prefetch(t, "float32", "float32")
    assert row_tiling(4096, t.vec, arrays=_norm_arrays("float32", "float32", False, True, False) + 2) != t



def test_dense_row_kernels_take_half_again_the_ctas_where_there_are_two():
    from cute_kernels.fused.tiling import dense_blocks_per_sm, min_blocks_per_sm

    assert [dense_blocks_per_sm(t) for t in (128, 256, 512, 1024)] == [6, 3, 1, 1]
    assert all(dense_blocks_per_sm(t) >= min_blocks_per_sm(t) for t in (32, 64, 128, 256, 512, 1024))
