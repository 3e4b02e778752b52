"""probes.reference: what each probe must compute, checked against plain Python loops."""

from __future__ import annotations

import pytest
import torch

from cute_kernels.probes.reference import (LINE_ELEMS, chase_chain, chase_end, divergence_values, fma_values,
                                           read_sums, smem_read_sums)


@pytest.mark.parametrize("working_set", [256, 4096, 1 << 16])
def test_the_chain_visits_every_line_once_per_lap(working_set):
    chain = chase_chain(working_set, seed=3)
    lines = working_set // (4 * LINE_ELEMS)
    seen, j = [], 0
    for _ in range(lines):
        j = int(chain[j])
        seen.append(j)
    assert sorted(seen) == [i * LINE_ELEMS for i in range(lines)] and j == 0
    assert chase_end(chain, 5) == seen[4 % lines] and chase_end(chain, lines + 5) == seen[4 % lines]


def test_a_working_set_that_is_not_whole_lines_is_refused():
    with pytest.raises(ValueError, match="multiple of 128 bytes"):
        chase_chain(1000)


@pytest.mark.parametrize("blocks, passes", [(3, 1), (5, 7), (2, 12)])
def test_read_sums_match_a_loop_over_blocks_and_passes(blocks, passes):
    threads, vectors = 32, 2
    tile = threads * 4 * vectors
    src = torch.randn(tile * 3 + 5)  # a partial tile at the end is never read
    got = read_sums(src, threads=threads, vectors=vectors, blocks=blocks, passes=passes)
    want = torch.zeros(blocks * threads, dtype=torch.float64)
    for b in range(blocks):
        for p in range(passes):
            t0 = ((b + p) % 3) * tile
            for t in range(threads):
                for r in range(vectors):
                    for v in range(4):
                        want[b * threads + t] += float(src[t0 + 4 * t + v + 4 * threads * r])
    torch.testing.assert_close(got, want)


def test_smem_read_sums_match_a_loop():
    threads, vectors, blocks, passes = 32, 4, 2, 11
    src = torch.randn(4 * threads * vectors + 7)
    got = smem_read_sums(src, threads=threads, vectors=vectors, blocks=blocks, passes=passes)
    want = torch.zeros(threads, dtype=torch.float64)
    for t in range(threads):
        for p in range(passes):
            i = (t + p * threads) % (threads * vectors)
            want[t] += src[4 * i:4 * i + 4].double().sum()
    torch.testing.assert_close(got, want.repeat(blocks))


def test_fma_values_closed_form_matches_stepping():
    got = fma_values(3, threads=8, blocks=2, iters=50)
    t = torch.arange(8, dtype=torch.float64)
    want = 0
    for c in range(3):
        x = (t + c) / 1024
        for _ in range(50):
            x = 0.999 * x + 0.5
        want = want + x
    torch.testing.assert_close(got, want.repeat(2))


def test_divergence_values_pick_the_side_by_group():
    x = divergence_values(4, threads=16, blocks=1, iters=3, chains=2)

    def side(start, rule):
        for _ in range(3):
            start = rule(start)
        return start

    def lane(t, rule):  # chains c = 0, 1 start at (t + c) / 1024
        return side(t / 1024, rule) + side((t + 1) / 1024, rule)

    zero, one = (lambda v: v * 0.999 + 0.5), (lambda v: v * v * 0.5 + 0.1)
    assert x[0].item() == pytest.approx(lane(0, zero), rel=1e-6)
    assert x[4].item() == pytest.approx(lane(4, one), rel=1e-6)
    assert x[8].item() == pytest.approx(lane(8, zero), rel=1e-6)
