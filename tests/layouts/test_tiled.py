"""Tiled MMA and tiled copy TV layouts: ownership is a bijection, queries invert each other,
and atoms land where the atom layout and permutation put them."""

from __future__ import annotations

import pytest

from cute_kernels.layouts.atoms import atom
from cute_kernels.layouts.errors import LayoutError
from cute_kernels.layouts.layout import Layout
from cute_kernels.layouts.tiled import make_tiled_copy, make_tiled_mma


def assert_bijection(tv: Layout, rows: int, cols: int):
    nt, nv = tv[0].size(), tv[1].size()
    seen = sorted(tv(t, v) for t in range(nt) for v in range(nv))
    assert seen == list(range(rows * cols))


@pytest.mark.parametrize("name,layout", [
    ("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1)),
    ("SM80_16x8x16_F32BF16BF16F32_TN", (4, 1, 1)),
    ("SM80_16x8x8_F16F16F16F16_TN", (1, 2, 1)),
    ("SM70_8x8x4_F32F16F16F32_NT", (2, 2, 1)),
    ("SM70_8x8x4_F16F16F16F16_TN", (4, 1, 1)),
    ("SM90_64x64x16_F32BF16BF16_RS", (2, 1, 1)),
])
def test_register_operands_are_bijections(name, layout):
    t = make_tiled_mma(name, layout)
    m, n, k = t.tile_mnk
    assert t.num_threads == atom(name).num_threads * layout[0] * layout[1] * layout[2]
    assert_bijection(t.tv_layout_c, m, n)
    if atom(name).a_source == "rmem":
        # A is replicated across the N atoms (same values in each), so count per-N-slice
        tv = t.tv_layout_a
        owners = {}
        for th in range(tv[0].size()):
            for v in range(tv[1].size()):
                owners.setdefault(tv(th, v), set()).add((th, v))
        assert sorted(owners) == list(range(m * k))
        assert all(len(o) == layout[1] for o in owners.values())


def test_owner_and_elements_are_inverse():
    t = make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1))
    for thread in (0, 5, 37, 127):
        for v, (r, c) in enumerate(t.elements(thread, "C")):
            assert t.owner("C", r, c) == [(thread, v)]


def test_atom_placement_follows_atom_layout():
    # (2,2,1): warp 1 takes the second M atom (rows 16..31), warp 2 the second N atom
    t = make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1))
    assert t.tile_mnk == (32, 16, 16)
    assert t.elements(32, "C")[0] == (16, 0)
    assert t.elements(64, "C")[0] == (0, 8)
    # a PTX check through the tiling: lane 5 of warp 3 holds c0 at (16 + 5//4, 8 + 2*(5%4))
    assert t.elements(3 * 32 + 5, "C")[0] == (17, 10)


def test_value_repeats_and_permutation():
    # 32x32 tile: each warp's atom repeats twice along N
    plain = make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1), (32, 32, 16))
    assert plain.tile_mnk == (32, 32, 16) and plain.tv_layout_c[1].size() == 8
    assert [c for _, c in plain.elements(0, "C")] == [0, 1, 0, 1, 16, 17, 16, 17]
    # CuTe's N permutation (8,2,2):(1,16,8) makes a thread's N values 0,1,8,9 (ldmatrix-friendly)
    perm = make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1), (32, Layout((8, 2, 2), (1, 16, 8)), 16))
    assert [c for _, c in perm.elements(0, "C")] == [0, 1, 0, 1, 8, 9, 8, 9]
    assert_bijection(perm.tv_layout_c, 32, 32)


def test_sm70_physical_lanes():
    t = make_tiled_mma("SM70_8x8x4_F32F16F16F32_NT", (2, 2, 1))
    # quad pair 0 = lanes 0-3 and 16-19; lane 16 holds rows 4/6 of the first atom (PTX: X + 4)
    assert {r for r, _ in t.elements(16, "C")} == {4, 6}
    assert t.owner("C", 0, 0) == [(0, 0)]
    with pytest.raises(LayoutError, match="not contiguous"):
        make_tiled_mma("SM70_8x8x4_F32F16F16F32_NT", (1, 1, 1))


def test_bad_inputs():
    with pytest.raises(LayoutError, match="multiple"):
        make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1), (24, None, None))
    with pytest.raises(LayoutError, match="at most 3"):
        make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN", (1, 1, 1, 1))
    t = make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN")
    with pytest.raises(LayoutError, match="outside"):
        t.owner("C", 16, 0)
    with pytest.raises(LayoutError, match="operand"):
        t.elements(0, "D")


def test_tiled_copy():
    c = make_tiled_copy("SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>", Layout((32, 4), (4, 1)), Layout((1, 8)))
    assert c.tile_shape == (32, 32) and c.num_threads == 128
    assert_bijection(c.tv_layout, 32, 32)
    # row-major threads: thread 1 copies row 0, columns 8..15; thread 4 row 1
    assert c.elements(1) == [(0, j) for j in range(8, 16)]
    assert c.elements(4)[0] == (1, 0)
    assert c.owner(1, 3) == [(4, 3)]
    with pytest.raises(LayoutError, match="bijection"):
        make_tiled_copy("SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>", Layout((32, 4), (1, 16)), Layout((1, 8)))
