"""`gemm.gemv` on the GPU against float64: fresh N(0,1) operands, NaN-poisoned outputs.

Decode shapes (M <= 16 against nn.Linear weights), K and N of 1, primes and odd lengths, padded
leading dimensions and misaligned bases (every vector width), both majors of both operands and
of the output, both roles (N <= 16 swaps them), batches with a broadcast operand, every input and
output dtype, the fused epilogue, each config knob (warps, cluster split, chunks, prefetch, cache
hints), NaN/Inf propagation and the warm path.
"""

from __future__ import annotations

import pytest
import torch

from tests.gemm._gemv_cases import ACTS, check, matrix, operands, poisoned_out, reference, rung, run

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("n, k", [(4096, 4096), (1024, 4096), (3072, 768)])
def test_decode_shapes(m, n, k):
    run(1, m, n, k)


@pytest.mark.parametrize("warps", [None, 1])
@pytest.mark.parametrize("m, n, k", [(1, 128256, 2048), (8, 152064, 520), (16, 40000, 4096)])
def test_many_rows_with_four_warps_and_one(warps, m, n, k):
    """LM-head rows (row blocks enough to fill the GPU with one warp each): the heuristic's K
    split over four warps a CTA (None) and the one-warp CTAs it replaced."""
    config = None
    if warps is not None:
        a, b = operands(1, m, n, k)
        config = rung().config_for(a, b, poisoned_out(1, m, n, torch.bfloat16)).with_(warps=warps)
    run(1, m, n, k, config=config)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (3, 7, 1), (16, 1, 4097), (5, 13, 31), (16, 129, 4100),
                                     (9, 4099, 257), (1, 5000, 4093), (2, 33, 8), (7, 8, 33), (11, 65, 96)])
@pytest.mark.parametrize("b_unit", ["rows", "cols"])
def test_odd_and_prime_shapes(m, n, k, b_unit):
    run(1, m, n, k, b_unit=b_unit)


@pytest.mark.parametrize("pad_a, off_a, pad_b, off_b", [(3, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 3),
                                                        (2, 2, 4, 4), (0, 0, 2, 0)])
@pytest.mark.parametrize("b_unit", ["rows", "cols"])
def test_padded_leading_dims_and_misaligned_bases(pad_a, off_a, pad_b, off_b, b_unit):
    # 2-byte steps of the pads and offsets pick 8-, 4- and 2-byte vectors (and element loads)
    run(1, 8, 520, 264, pad_a=pad_a, off_a=off_a, pad_b=pad_b, off_b=off_b, b_unit=b_unit)


@pytest.mark.parametrize("a_unit", ["cols", "rows"])
@pytest.mark.parametrize("b_unit", ["rows", "cols"])
@pytest.mark.parametrize("out_unit", ["cols", "rows"])
@pytest.mark.parametrize("m, n", [(6, 1000), (1000, 6), (16, 16)])
def test_every_major_and_both_roles(a_unit, b_unit, out_unit, m, n):
    run(1, m, n, 328, a_unit=a_unit, b_unit=b_unit, out_unit=out_unit)


@pytest.mark.parametrize("bcast", ["a", "b", None])
@pytest.mark.parametrize("m, n", [(4, 700), (700, 4)])
def test_batched_with_broadcast(bcast, m, n):
    run(3, m, n, 136, bcast_a=bcast == "a", bcast_b=bcast == "b")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dtypes(dtype, out_dtype):
    run(1, 12, 777, 1000, dtype=dtype, out_dtype=out_dtype)


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("m, n, bias_dim, beta, out_dtype", [
    (8, 900, "n", 0.5, torch.bfloat16),  # nn.Linear's bias, beta * C
    (16, 300, "m", 0.0, torch.float32),  # a bias per row
    (500, 10, "n", -1.0, torch.float32),  # swapped roles: the bias runs along the small side
    (500, 10, "m", 0.0, torch.bfloat16),
])
def test_fused_epilogue(activation, m, n, bias_dim, beta, out_dtype):
    run(1, m, n, 200, out_dtype=out_dtype, alpha=0.75, beta=beta, bias_dim=bias_dim, activation=activation,
        c_unit="rows" if m > n else "cols")


def test_bias_dtypes_and_c_broadcast_major():
    run(2, 5, 333, 96, alpha=-1.5, beta=2.0, bias_dim="n", bias_dtype=torch.bfloat16, c_unit="rows")


KNOBS = [dict(warps=1), dict(warps=2), dict(warps=8), dict(cluster_k=2), dict(cluster_k=8, warps=2),
         dict(chunks=2, tiles=4), dict(chunks=4, tiles=2), dict(prefetch=True), dict(prefetch=True, cluster_k=4),
         dict(stream_b=False), dict(l2_prefetch=256), dict(tiles=16), dict(tiles=1, warps=4)]


@pytest.mark.parametrize("m, n, k, fields", [(16, 520, 4100, f) for f in KNOBS] + [
    (3, 1000, 999, f) for f in (dict(warps=1), dict(cluster_k=8, warps=2), dict(prefetch=True), dict(chunks=2))])
def test_config_knobs(m, n, k, fields):
    r = rung()
    a, b = operands(1, m, n, k)
    out = poisoned_out(1, m, n, torch.bfloat16)
    config = r.config_for(a, b, out).with_(**fields)
    run(1, m, n, k, config=config)


@pytest.mark.parametrize("b_unit", ["rows", "cols"])
def test_nan_and_inf_propagate(b_unit):
    r = rung()
    a, b = operands(1, 12, 300, 257, b_unit=b_unit)
    a[0, 3, 100] = float("nan")
    b[0, 200, 17] = float("inf")
    out = poisoned_out(1, 12, 300, torch.float32)
    r(a, b, out)
    torch.cuda.synchronize()
    assert torch.isnan(out[0, 3]).all()
    assert not torch.isfinite(out[0, :, 17]).any()
    rest = out[0].clone()
    rest[3] = 0
    rest[:, 17] = 0
    assert torch.isfinite(rest).all()


def test_warm_path_replays_with_fresh_tensors():
    r = rung()
    first = None
    for _ in range(3):  # a new call of the same signature: the stored plan, fresh data
        a, b = operands(1, 4, 4096, 1024)
        out = poisoned_out(1, 4, 4096, torch.bfloat16)
        r(a, b, out, alpha=2.0)
        torch.cuda.synchronize()
        check(out, reference(a, b, alpha=2.0), "warm path")
        first = first or len(r._plans)
    assert len(r._plans) == first  # one plan for the signature, reused


def test_nn_linear_semantics():
    """x @ w.t() + bias for an nn.Linear weight, against torch in fp32."""
    r = rung()
    lin = torch.nn.Linear(2048, 1536, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 3, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.full((1, 3, 1536), float("nan"), device="cuda", dtype=torch.bfloat16)
    r(x, lin.weight.t().unsqueeze(0), out, bias=lin.bias)
    ref = torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())
    check(out, ref, "nn.Linear")


def test_zero_k_and_empty_problems():
    r = rung()
    a, b = operands(1, 4, 64, 1)
    a, b = a[:, :, :0], b[:, :0, :]
    out = poisoned_out(1, 4, 64, torch.float32)
    c = matrix(1, 4, 64, torch.float32)
    r(a, b, out, beta=0.5, c=c)
    torch.testing.assert_close(out, 0.5 * c)
