"""The swizzle search: its F2 prediction agrees with the enumerating bank-conflict analysis, and
what it returns is conflict-free, vectorized and the best of its family."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cute_kernels.layouts import ComposedLayout, Layout, LayoutError, Swizzle, bank_conflicts, make_tiled_mma
from cute_kernels.layouts.swizzle_search import (
    _access_map, _base, _swizzle_candidates, find_swizzle, fragment_access, predicted_conflict_degree,
)

ACCESSES = ["ldmatrix_x1", "ldmatrix_x2", "ldmatrix_x4", "ldmatrix_x4_trans", "stmatrix_x4", "vec32", "vec64",
            "vec128", "scalar"]


def _brute(layout, access, dtype):
    try:
        return bank_conflicts(layout, access, dtype).conflict_degree
    except LayoutError:
        return float("inf")


@given(
    st.sampled_from([(8, 64), (16, 32), (32, 32), (64, 16), (16, 128)]),
    st.sampled_from(["K", "MN"]),
    st.sampled_from(["bf16", "f32", "e4m3"]),
    st.sampled_from(ACCESSES),
    st.integers(0, 10_000),
)
def test_f2_prediction_matches_enumeration(tile, major, dtype, access, pick):
    base = _base(tile, major)
    try:
        amap = _access_map(access, base, dtype)
    except LayoutError:
        return  # the access does not fit this tile (e.g. a vector wider than the contiguous mode)
    candidates = _swizzle_candidates(tile, major, dtype, 0)
    _, layout = candidates[pick % len(candidates)]
    predicted = predicted_conflict_degree(layout, amap, dtype)
    assert predicted is not None
    assert predicted == _brute(layout, access, dtype), (layout, access, dtype)


def test_ldmatrix_read_of_a_k_major_tile_finds_the_128_byte_swizzle():
    r = find_swizzle((64, 64), "bf16", ["ldmatrix_x4"])
    assert r.swizzle == Swizzle(3, 4, 3) and r.layout == ComposedLayout(Swizzle(3, 4, 3), 0, Layout((64, 64), (64, 1)))
    assert r.conflict_free and r.vector.bits == 128
    assert r.reports[0] == bank_conflicts(r.layout, "ldmatrix_x4", "bf16")
    assert bank_conflicts(Layout((64, 64), (64, 1)), "ldmatrix_x4", "bf16").conflict_degree == 8  # what it fixed
    assert "found Sw<3,4,3> o 0 o (64,64):(64,1)" in str(r) and "<table>" in r._repr_html_()


def test_tma_write_and_ldmatrix_read_pick_the_widest_gmma_atom():
    r = find_swizzle((64, 64), "bf16", ["tma", "ldmatrix_x4"])
    assert r.tma and r.swizzle == Swizzle(3, 4, 3) and r.conflict_free
    assert str(r.layout) == "Sw<3,4,3> o 0 o ((8,8),(64,1)):((64,512),(1,0))"
    assert r.candidates == 4
    mn = find_swizzle((64, 64), "bf16", ["tma", "ldmatrix_x4_trans"], major="MN")
    assert mn.conflict_free and mn.swizzle == Swizzle(3, 4, 3)


def test_register_fragment_store_and_ldmatrix_read():
    tiled = make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1), (32, 32, 16))
    store = fragment_access(tiled.tv_layout_c, 2)  # two adjacent bf16 accumulators: one 32-bit store
    assert str(store) == "((4,8,2,2),2):((64,1,16,256),32)"
    r = find_swizzle((32, 32), "bf16", [store, "ldmatrix_x4"])
    assert r.conflict_free and all(rep.conflict_free for rep in r.reports)
    assert bank_conflicts(Layout((32, 32), (32, 1)), store, "bf16").conflict_degree > 1  # unswizzled conflicts


@pytest.mark.parametrize("tile, dtype, accesses", [
    ((16, 64), "bf16", ["ldmatrix_x4", "stmatrix_x4"]),
    ((16, 32), "f32", ["vec128", "vec64"]),
])
def test_the_winner_is_the_best_of_its_family_by_enumeration(tile, dtype, accesses):
    r = find_swizzle(tile, dtype, accesses)
    worst = [max(_brute(layout, a, dtype) for a in accesses) for _, layout in _swizzle_candidates(tile, "K", dtype, 4)]
    assert max(rep.conflict_degree for rep in r.reports) == min(worst)


def test_search_errors():
    with pytest.raises(LayoutError, match="power-of-two"):
        find_swizzle((48, 64), "bf16", ["ldmatrix_x4"])
    with pytest.raises(LayoutError, match="at least one access"):
        find_swizzle((64, 64), "bf16", [])
    with pytest.raises(LayoutError, match="major"):
        find_swizzle((64, 64), "bf16", ["vec128"], major="row")


def test_f2_prediction_matches_enumeration_for_a_fragment_store():
    tiled = make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1), (32, 32, 16))
    store = fragment_access(tiled.tv_layout_c, 2)
    amap = _access_map(store, _base((32, 32), "K"), "bf16")
    assert amap.columns is not None and amap.mode is None
    for _, layout in _swizzle_candidates((32, 32), "K", "bf16", 0)[::3]:
        assert predicted_conflict_degree(layout, amap, "bf16") == _brute(layout, store, "bf16"), layout
