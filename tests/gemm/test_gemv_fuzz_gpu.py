"""`gemm.gemv` on random problems against float64: the small side 1-16 on either role, the big side
and K from 1 to ~5000 with primes and odd lengths, random majors, padded leading dimensions,
misaligned bases, batches with broadcasts, dtypes and (for a quarter of the problems) the fused
epilogue. Outputs are NaN-poisoned; each problem is checked by relative error."""

from __future__ import annotations

import random

import pytest
import torch

from tests.gemm._gemv_cases import ACTS, run

pytestmark = pytest.mark.gpu

SMALL = (1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16)
BIG = (1, 2, 7, 31, 64, 127, 300, 1024, 1031, 2048, 4099, 5000)
KS = (1, 2, 3, 8, 15, 16, 31, 33, 64, 100, 127, 256, 1000, 1024, 2047, 4096, 4100)


def problem(seed: int) -> dict:
    g = random.Random(seed)
    small, big, k = g.choice(SMALL), g.choice(BIG), g.choice(KS)
    m, n = (small, big) if g.random() < 0.6 else (big, small)
    layout = dict(a_unit=g.choice(("cols", "cols", "rows")), b_unit=g.choice(("rows", "rows", "cols")),
                  pad_a=g.choice((0, 0, 1, 3, 8)), pad_b=g.choice((0, 0, 1, 2, 8)), off_a=g.choice((0, 0, 1, 4)),
                  off_b=g.choice((0, 0, 2, 3)))
    l = g.choice((1, 1, 1, 2, 3))
    if l > 1:
        layout["bcast_a" if g.random() < 0.5 else "bcast_b"] = g.random() < 0.5
    dtype = g.choice((torch.bfloat16, torch.bfloat16, torch.float16))
    out_dtype = g.choice((dtype, dtype, torch.float32))
    epi = {}
    if g.random() < 0.25:
        epi = dict(alpha=g.choice((0.5, -2.0)), beta=g.choice((0.0, 1.0)), bias_dim=g.choice((None, "n", "m")),
                   activation=g.choice(ACTS))
    return dict(l=l, m=m, n=n, k=k, dtype=dtype, out_dtype=out_dtype, out_unit=g.choice(("cols", "cols", "rows")),
                **layout, **epi)


@pytest.mark.parametrize("seed", range(40))
def test_random_problem(seed):
    p = problem(seed)
    run(p.pop("l"), p.pop("m"), p.pop("n"), p.pop("k"), **p)
