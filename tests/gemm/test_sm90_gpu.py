"""sm90 rungs against torch (float64 reference) on the GPU: aligned, odd (padded), batched,
transposed operands, alpha/beta, fp32 output; outputs NaN-poisoned first."""

import pytest
import torch

pytestmark = pytest.mark.gpu

CASES = [  # L, M, N, K, in, out, a M-major, b N-major, alpha, beta
    (1, 256, 256, 256, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),
    (1, 333, 517, 129, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),
    (3, 512, 384, 320, torch.float16, torch.float16, False, False, 0.5, 0.0),
    (1, 768, 640, 448, torch.bfloat16, torch.float32, False, False, 1.0, 0.0),
    (1, 640, 768, 384, torch.bfloat16, torch.bfloat16, True, True, 1.0, 0.0),
    (1, 512, 512, 512, torch.bfloat16, torch.bfloat16, False, False, 2.0, 0.5),
    (1, 100, 3000, 4096, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),  # split-K
    (1, 96, 1024, 4096, torch.float16, torch.float16, True, False, 0.5, 1.0),  # split-K, beta
]


def _rung(name):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    import importlib

    return importlib.import_module(f"cute_kernels.gemm.{name}").rung


@pytest.mark.parametrize("name", ["sm90_persistent", "sm90_warp_specialized", "sm90_tma_wgmma"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"L{c[0]}-{c[1]}x{c[2]}x{c[3]}-{str(c[4])[6:]}-{str(c[5])[6:]}")
def test_matches_torch(name, case):
    rung = _rung(name)
    L, M, N, K, dt, odt, a_mm, b_nm, alpha, beta = case
    a = torch.randn(L, K, M, device="cuda", dtype=dt).transpose(1, 2) if a_mm else torch.randn(L, M, K, device="cuda", dtype=dt)
    b = torch.randn(L, K, N, device="cuda", dtype=dt) if b_nm else torch.randn(L, N, K, device="cuda", dtype=dt).transpose(1, 2)
    c = torch.randn(L, M, N, device="cuda", dtype=odt) if beta else None
    out = torch.full((L, M, N), float("nan"), device="cuda", dtype=odt)
    assert rung.supports(a, b, out) is None
    rung(a, b, out, alpha=alpha, beta=beta, c=c)
    ref = alpha * (a.double() @ b.double()) + (beta * c.double() if beta else 0)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < (1e-2 if odt == torch.float32 else 2e-2), err


@pytest.mark.parametrize("name", ["sm90_persistent", "sm90_warp_specialized", "sm90_tma_wgmma"])
def test_nan_propagates(name):
    rung = _rung(name)
    a = torch.randn(1, 256, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, 256, 256, device="cuda", dtype=torch.bfloat16)
    a[0, 7, 3] = float("nan")
    out = torch.zeros(1, 256, 256, device="cuda", dtype=torch.bfloat16)
    rung(a, b, out, alpha=1.0, beta=0.0, c=None)
    assert out[0, 7].isnan().all() and not out[0, 8].isnan().any()


# One problem per class of `pick_config` (its cluster follows the tile counts), with partial
# tiles on both sides, batched or M-major where it matters: (L, M, N, K, A M-major, the class).
HEURISTIC_CASES = [
    (1, 4000, 1000, 1100, False, ((128, 256), (1, 2), "cooperative")),   # 4 N tiles, last partial
    (2, 2049, 2400, 1040, True, ((128, 192), (1, 1), "cooperative")),    # 17 x 13 tiles of 192: both odd
    (1, 12607, 2304, 768, False, ((128, 128), (1, 2), "pingpong")),     # short K, 18 N tiles of 128
    (2, 2049, 2400, 520, True, ((128, 128), (1, 1), "pingpong")),       # short K, 19 N tiles of 128
    (1, 12607, 768, 3000, True, ((128, 192), (1, 2), "cooperative")),   # 99 x 4 tiles of 192 = 3.0 waves
    (1, 4096, 3584, 3584, False, ((128, 192), (2, 1), "cooperative")),  # 32 x 19 tiles of 192
    (1, 2304, 1344, 4096, False, ((128, 192), (1, 1), "cooperative")),  # 18 x 7 tiles: under a wave
    (1, 2048, 8200, 1536, False, ((128, 256), (2, 1), "cooperative")),  # 16 x 33 tiles
    (1, 1000, 1000, 4096, False, ((128, 128), (2, 1), "cooperative")),  # under 0.9 of a wave
]


@pytest.mark.parametrize("case", HEURISTIC_CASES, ids=lambda c: f"L{c[0]}-{c[1]}x{c[2]}x{c[3]}-{c[5][2]}")
def test_every_heuristic_class_matches_float64(case):
    """The default configs themselves: each class `pick_config` hands out, on shapes it picks it
    for, against a float64 reference (the class is asserted, so a new heuristic moves the case)."""
    from cute_kernels.gemm.sm90_config import pick_config

    rung = _rung("sm90_persistent")
    L, M, N, K, a_mm, want = case
    c = pick_config(M, N, K)
    assert ((c.tile_m, c.tile_n), (c.cluster_m, c.cluster_n), c.schedule) == want
    a = torch.randn(L, K, M, device="cuda", dtype=torch.bfloat16).transpose(1, 2) if a_mm else \
        torch.randn(L, M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(L, N, K, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    out = torch.full((L, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    rung(a, b, out)
    ref = a.double() @ b.double()
    assert not out.isnan().any()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
