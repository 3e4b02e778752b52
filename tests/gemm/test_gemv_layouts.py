"""The skinny GEMM's mapping, checked on CPU: the layouts of `gemm.gemv_config` are bijections, and
a lane-by-lane simulation of the kernel's dataflow (the same layouts, indices and clamps as
`gemm.gemv.GemvKernel`, the MMA evaluated through the atom's own TV layouts) reproduces
A . B^T exactly on integer data for every read plan: K-major and R-major B, K-major and strided
A, every vector width, tails in R, S and K, warps, chunks and cluster splits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cute_kernels.gemm.gemv_config import (
    CHUNK_K,
    SLOTS,
    GemvConfig,
    a_fragment_slots,
    a_staging_layout,
    b_row_layout,
    b_staging_layout,
    k_slot_layout,
    output_coord,
    partial_smem_layout,
)
from cute_kernels.layouts import bank_conflicts
from cute_kernels.layouts.atoms import atom

ATOM = atom("SM80_16x8x16_F32BF16BF16F32_TN")


# ---- layouts ------------------------------------------------------------------------------------

@pytest.mark.parametrize("k_run", [1, 2, 4, 8])
def test_k_slot_layout_is_a_bijection_of_runs(k_run):
    lay = k_slot_layout(k_run)
    ks = [lay((q, w)) for q in range(4) for w in range(SLOTS)]
    assert sorted(ks) == list(range(CHUNK_K))
    for q in range(4):  # each run of k_run slots is k_run contiguous k (one vector)
        for i in range(SLOTS // k_run):
            run = [lay((q, (e, i))) for e in range(k_run)]
            assert run == list(range(run[0], run[0] + k_run)) and run[0] % k_run == 0


@pytest.mark.parametrize("tiles, r_vec", [(1, 1), (8, 1), (16, 1), (2, 2), (4, 4), (8, 4), (8, 8), (16, 8)])
def test_b_row_layout_is_a_bijection_with_contiguous_runs(tiles, r_vec):
    lay = b_row_layout(tiles, r_vec)
    rows = [lay((n, t)) for n in range(8) for t in range(tiles)]
    assert sorted(rows) == list(range(8 * tiles))
    for n in range(8):
        for run in range(tiles // r_vec):
            got = [lay((n, run * r_vec + e)) for e in range(r_vec)]
            assert got == list(range(got[0], got[0] + r_vec)) and got[0] % r_vec == 0


def test_a_fragment_slots_cover_two_rows_of_four_slots():
    lay = a_fragment_slots()
    assert sorted(lay(v) for v in range(8)) == [0, 1, 2, 3, 8, 9, 10, 11]


@pytest.mark.parametrize("rows", [8, 16, 32, 64, 128])
def test_partial_writes_are_conflict_free(rows):
    from cute_kernels.layouts import Layout

    lay = partial_smem_layout(rows, 16, 4)
    one_warp = Layout((rows, 16), (1, lay.stride[1]))
    # one 64-bit store of a warp's accumulator pair: lane (g, q) writes rows 2q, 2q + 1 at s = g
    pairs = Layout(((4, 8), 2), ((2, rows), 1))
    assert bank_conflicts(one_warp, pairs, "f32").conflict_free
    if rows >= 32:  # (8 or 16 rows: tiny-R blocks, where the read-back is 2-way)
        # the epilogue's read-back: consecutive threads on consecutive rows
        assert bank_conflicts(one_warp, "scalar", "f32").conflict_free
        # without the pad, a power-of-two stride would conflict
        assert not bank_conflicts(Layout((rows, 16), (1, rows)), pairs, "f32").conflict_free


def test_config_validation_messages():
    with pytest.raises(ValueError, match="tiles must be one of"):
        GemvConfig(tiles=3).validate()
    with pytest.raises(ValueError, match="r_vec 4 needs big_major 'r'"):
        GemvConfig(r_vec=4).validate()
    with pytest.raises(ValueError, match="multiple of r_vec"):
        GemvConfig(big_major="r", r_vec=8, tiles=4).validate()
    with pytest.raises(ValueError, match="warps must be one of"):
        GemvConfig(warps=32).validate()
    with pytest.raises(ValueError, match="s16 must be a bool"):
        GemvConfig(s16=1).validate()


# ---- the dataflow, lane by lane ------------------------------------------------------------------

def _atom_index(layout, lane, v, mn):
    idx = layout((lane, v))
    return idx % mn, idx // mn


def simulate(cfg: GemvConfig, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """C (S, R) as the kernel computes it for A (S, K), B (R, K) (one batch), every index from
    the config's layouts; asserts every unpredicated load is inside the operand, every partial
    and output element written exactly once."""
    S, K = A.shape
    R = B.shape[0]
    p, v_r, nt = cfg.k_run, cfg.r_vec, cfg.tiles
    kslot = k_slot_layout(p)
    brow = b_row_layout(nt, v_r)
    bst = b_staging_layout(nt, cfg.chunks, cfg.big_major, p, v_r)
    ast = a_staging_layout(cfg.chunks, p)
    afr = a_fragment_slots()
    psl = partial_smem_layout(cfg.rows, cfg.s_rows, cfg.warps)
    hs = (0, 1) if cfg.s16 else (0,)
    out = np.full((S, R), np.nan)
    n_out = cfg.rows * cfg.s_rows
    for blk in range(-(-R // cfg.rows)):
        r0 = blk * cfg.rows
        cta_sums = []
        for rank in range(cfg.cluster_k):
            n_st = -(-K // cfg.stage_k)
            first, end = rank * n_st // cfg.cluster_k, (rank + 1) * n_st // cfg.cluster_k
            full_end = min(end, K // cfg.stage_k)
            sP = np.full(psl.cosize(), np.nan)
            written = np.zeros(psl.cosize(), int)
            for w in range(cfg.warps):
                acc = np.zeros((32, 4, nt))
                stages = []
                mine = first + w
                if mine < full_end:
                    stages += [(mine + i * cfg.warps, False) for i in range((full_end - mine + cfg.warps - 1) // cfg.warps)]
                if full_end < end and w == (full_end - first) % cfg.warps:
                    stages.append((full_end, True))
                for st, pred in stages:
                    k0 = st * cfg.stage_k
                    vals_b = np.full((32, bst.cosize()), np.nan)
                    vals_a = np.full((32, ast.cosize()), np.nan)
                    for lane in range(32):
                        g, q = lane // 4, lane % 4
                        for u in range(cfg.chunks):
                            kc = k0 + CHUNK_K * u
                            if cfg.big_major == "k":
                                for i in range(SLOTS // p):
                                    kv = (kc + kslot((q, (0, i)))) // p
                                    inside = kv * p < K
                                    assert inside or pred, "an unpredicated load past K"
                                    for t in range(nt):
                                        r = min(r0 + brow((g, t)), R - 1)
                                        for e in range(p):
                                            vals_b[lane, bst(((e, i), t, u))] = B[r, kv * p + e] if inside else 0
                            else:
                                for ws in range(SLOTS):
                                    k = kc + kslot((q, ws))
                                    assert k < K or pred, "an unpredicated load past K"
                                    kk = min(k, K - 1)
                                    for run in range(nt // v_r):
                                        rv = min((r0 + brow((g, run * v_r))) // v_r, R // v_r - 1)
                                        for e in range(v_r):
                                            vals_b[lane, bst((ws, (e, run), u))] = B[rv * v_r + e, kk] if k < K else 0
                            for h in hs:
                                s = min(g + 8 * h, S - 1)
                                if cfg.small_major == "k":
                                    for i in range(SLOTS // p):
                                        kv = (kc + kslot((q, (0, i)))) // p
                                        for e in range(p):
                                            vals_a[lane, ast(((e, i), h, u))] = A[s, kv * p + e] if kv * p < K else 0
                                else:
                                    for ws in range(SLOTS):
                                        k = kc + kslot((q, ws))
                                        vals_a[lane, ast((ws, h, u))] = A[s, k] if k < K else 0
                    for u, j in itertools.product(range(cfg.chunks), range(2)):
                        amat = np.full((16, 16), np.nan)
                        for lane, v in itertools.product(range(32), range(8)):
                            ws, h = 4 * j + afr(v) % 8, afr(v) // 8
                            m, kk = _atom_index(ATOM.a_layout, lane, v, 16)
                            assert np.isnan(amat[m, kk])
                            amat[m, kk] = vals_a[lane, ast((ws, h, u))] if (h == 0 or cfg.s16) else 0
                        for t in range(nt):
                            bmat = np.full((8, 16), np.nan)
                            for lane, v in itertools.product(range(32), range(4)):
                                n, kk = _atom_index(ATOM.b_layout, lane, v, 8)
                                assert np.isnan(bmat[n, kk])
                                bmat[n, kk] = vals_b[lane, bst((4 * j + v, t, u))]
                            d = amat @ bmat.T
                            for lane, v in itertools.product(range(32), range(4)):
                                m, n = _atom_index(ATOM.c_layout, lane, v, 16)
                                acc[lane, v, t] += d[m, n]
                for lane in range(32):
                    g, q = lane // 4, lane % 4
                    for t, h, e in itertools.product(range(nt), hs, range(2)):
                        off = psl((brow((2 * q + e, t)), g + 8 * h, w))
                        sP[off] = acc[lane, e + 2 * h, t]
                        written[off] += 1
            for w in range(cfg.warps):  # each warp wrote each of its partials exactly once
                offs = [psl((r, s, w)) for r in range(cfg.rows) for s in range(cfg.s_rows)]
                assert all(written[o] == 1 for o in offs)
            cta = np.full((cfg.rows, cfg.s_rows), np.nan)
            for idx in range(n_out):
                r, s = output_coord(idx, cfg.rows, cfg.s_rows, cfg.out_major)
                cta[r, s] = sum(sP[psl((r, s, w))] for w in range(cfg.warps))
            cta_sums.append(cta)
        share = n_out // cfg.cluster_k
        seen = set()
        for rank in range(cfg.cluster_k):
            for jdx in range(share):
                r, s = output_coord(rank * share + jdx, cfg.rows, cfg.s_rows, cfg.out_major)
                assert (r, s) not in seen
                seen.add((r, s))
                x = sum(cta_sums[c][r, s] for c in range(cfg.cluster_k))
                if s < S and r0 + r < R:
                    assert np.isnan(out[s, r0 + r])
                    out[s, r0 + r] = x
        assert len(seen) == n_out
    return out


CASES = [
    # (S, R, K, config fields)
    (16, 64, 64, {}),
    (1, 70, 96, dict(s16=False, tiles=4)),
    (5, 9, 37, dict(s16=False, k_run=1, tiles=2)),
    (13, 40, 100, dict(k_run=4, warps=2, out_major="s")),
    (16, 33, 70, dict(k_run=2, chunks=2, warps=2, cluster_k=2)),
    (9, 24, 8, dict(k_run=8, cluster_k=4, warps=1, tiles=1)),
    (7, 64, 80, dict(big_major="r", r_vec=8, tiles=8, s16=False, warps=2)),
    (16, 36, 45, dict(big_major="r", r_vec=4, tiles=4, k_run=1, small_major="s", cluster_k=2)),
    (12, 18, 33, dict(big_major="r", r_vec=2, tiles=2, chunks=2, small_major="s", out_major="s")),
    (3, 11, 5, dict(big_major="r", r_vec=1, tiles=2, small_major="s", s16=False)),
    (16, 17, 1, dict(k_run=1, warps=2)),
]


@pytest.mark.parametrize("S, R, K, fields", CASES)
def test_simulated_kernel_matches_matmul(S, R, K, fields):
    cfg = GemvConfig(**fields).validate()
    rng = np.random.default_rng(S * 1000 + R * 10 + K)
    A = rng.integers(-4, 5, size=(S, K)).astype(float)
    B = rng.integers(-4, 5, size=(R, K)).astype(float)
    got = simulate(cfg, A, B)
    assert np.array_equal(got, A @ B.T)
