"""`sm70_mma`: config validation, the quad-pair fragment arithmetic against the SM70 atom's
layouts, supports() reasons (CPU); SASS (compile); values against float64 torch (gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cute_kernels.gemm.sm70_mma import Sm70MmaConfig, mma_atom_name, quad_pair_layout
from cute_kernels.layouts.atoms import atom


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tile_m": 0}, "tile_m must be a positive int"),
        ({"tile_m": 48}, "multiple of 16 x 16"),
        ({"tile_k": 6}, "tile_k must be a multiple of 4"),
        ({"warps_m": 8, "warps_n": 8, "tile_m": 128, "tile_n": 128}, "exceed 1024"),
        ({"a_major": "n"}, "a_major must be"),
        ({"b_major": "m"}, "b_major must be"),
        ({"out_dtype": "bfloat16"}, "out_dtype must be"),
        ({"has_c": "yes"}, "has_c must be a bool"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        Sm70MmaConfig(**overrides).validate()


def _lane_roles(lane):
    """The kernel's formulas: quad pair, logical atom thread."""
    return (lane % 16) // 4, lane % 4 + 4 * (lane // 16)


def test_lane_formula_matches_atom_thr_id():
    at = atom(mma_atom_name())
    for lane in range(32):
        qp, t = _lane_roles(lane)
        assert at.thr_id(t) + 4 * qp == lane


def test_quad_pair_fragments_compute_a_16x16x4_product():
    """Emulate one k4 step of a warp with the atom's A/B/C layouts and the kernel's index
    formulas: every output of the 16x16 step must equal the true dot product."""
    at = atom(mma_atom_name())
    rng = np.random.default_rng(0)
    A = rng.standard_normal((16, 4))
    B = rng.standard_normal((16, 4))  # (N, K), K-major as in shared memory
    qpl = quad_pair_layout()
    out = np.full((16, 16), np.nan)
    for qp in range(4):
        qm, qn = qp % 2, qp // 2  # the kernel's placement
        assert qpl(qm, qn) == qp
        # what the hardware computes for this quad pair: rows/cols as the atom's A/B layouts say
        a_blk = np.zeros((8, 4))
        b_blk = np.zeros((8, 4))
        for lane in range(32):
            q, t = _lane_roles(lane)
            if q != qp:
                continue
            for v in range(4):
                # kernel loads A[row_a = qm*8 + t, v] into value v; the atom says value v of
                # thread t is element idx = m + 8 k of the 8x4 A tile
                idx = at.a_layout(t, v)
                a_blk[idx % 8, idx // 8] = A[qm * 8 + t, v]
                idx = at.b_layout(t, v)
                b_blk[idx % 8, idx // 8] = B[qn * 8 + t, v]
        d = a_blk @ b_blk.T
        for lane in range(32):
            q, t = _lane_roles(lane)
            if q != qp:
                continue
            t0, t1, t2 = t % 2, (t // 2) % 2, t // 4
            for v in range(8):
                idx = at.c_layout(t, v)
                m_atom, n_atom = idx % 8, idx // 8
                # the kernel's epilogue formula
                m = t0 + 4 * t2 + 2 * ((v // 2) % 2)
                n = 2 * t1 + (v % 2) + 4 * (v // 4)
                assert (m, n) == (m_atom, n_atom), (t, v)
                out[qm * 8 + m, qn * 8 + n] = d[m_atom, n_atom]
    np.testing.assert_allclose(out, A @ B.T, rtol=1e-12, atol=1e-12)


def _views(m, n, k, dtype=torch.float16, out_dtype=None):
    return (torch.empty(1, m, k, dtype=dtype), torch.empty(1, k, n, dtype=dtype),
            torch.empty(1, m, n, dtype=out_dtype or dtype))


def test_supports_reasons():
    from cute_kernels.gemm.sm70_mma import RUNG

    assert RUNG.supports(*_views(17, 13, 7)) is None  # any shape, any alignment
    assert RUNG.supports(*_views(16, 16, 16, out_dtype=torch.float32)) is None
    assert "float16 only" in RUNG.supports(*_views(16, 16, 16, dtype=torch.bfloat16))
    assert "output dtype" in RUNG.supports(*_views(16, 16, 16, out_dtype=torch.bfloat16))
    a, b, out = _views(16, 16, 16)
    strided = torch.empty(1, 32, 32, dtype=torch.float16)[:, ::2, ::2]
    assert "neither of its last two modes" in RUNG.supports(strided, b, out)
    assert "batch" in RUNG.supports(a.expand(70000, 16, 16), b.expand(70000, 16, 16), out.expand(70000, 16, 16))


@pytest.mark.compile
@pytest.mark.parametrize("config", ["default", "nt_c"])
def test_sass(config):
    from cute_kernels.runtime import compile_variant

    report = compile_variant("gemm.sm70_mma", config, arch="sm_90a")
    # m8n8k4 is emulated on sm_90a: a call to ptxas's internal routine, shuffles and FFMAs.
    assert report.has("CALL") and report.has("SHFL") and report.has("FFMA")
    assert "__cuda_sm_8x_mma_row_col_f32_f16_f16_f32" in report.sass
    assert not report.has("HMMA")
    assert not report.has("LDL") and not report.has("STL")


# ---- GPU ------------------------------------------------------------------------------------------

gpu = pytest.mark.gpu
_TOL = {torch.float32: 1e-4, torch.float16: 2e-3}


def _run(m, n, k, *, out_dtype=torch.float16, a_major="k", b_major="n", batch=1, alpha=1.0, beta=0.0):
    from cute_kernels.gemm.sm70_mma import RUNG

    a = (torch.randn(batch, m, k, device="cuda") if a_major == "k"
         else torch.randn(batch, k, m, device="cuda").transpose(1, 2)).half()
    b = (torch.randn(batch, k, n, device="cuda") if b_major == "n"
         else torch.randn(batch, n, k, device="cuda").transpose(1, 2)).half()
    c = torch.randn(batch, m, n, device="cuda").to(out_dtype) if beta else None
    out = torch.full((batch, m, n), float("nan"), device="cuda", dtype=out_dtype)
    assert RUNG.supports(a, b, out) is None
    RUNG(a, b, out, alpha=alpha, beta=beta, c=c)
    torch.cuda.synchronize()
    ref = alpha * torch.matmul(a.double(), b.double())
    if beta:
        ref = ref + beta * c.double()
    return out, ref


def _assert_close(out, ref):
    assert torch.isfinite(out).all(), "poisoned (NaN) outputs left unwritten or non-finite results"
    err = (out.double() - ref).norm() / ref.norm().clamp_min(1e-30)
    assert err < _TOL[out.dtype], f"relative error {err:.3g}"


@gpu
@pytest.mark.parametrize("a_major", ["k", "m"])
@pytest.mark.parametrize("b_major", ["n", "k"])
def test_transposes(a_major, b_major):
    _assert_close(*_run(72, 136, 40, a_major=a_major, b_major=b_major))


@gpu
@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (7, 100, 33), (131, 5, 67), (1, 1, 1), (97, 89, 257)])
def test_shapes(m, n, k):
    _assert_close(*_run(m, n, k))


@gpu
def test_fp32_out_batched_alpha_beta():
    _assert_close(*_run(80, 48, 24, out_dtype=torch.float32, batch=3, alpha=-0.75, beta=2.0))
    _assert_close(*_run(33, 65, 17, batch=2, alpha=1.5, beta=0.5))


@gpu
def test_column_major_output():
    from cute_kernels.gemm.sm70_mma import RUNG

    a = torch.randn(1, 40, 24, device="cuda").half()
    b = torch.randn(1, 24, 56, device="cuda").half()
    out = torch.full((1, 56, 40), float("nan"), device="cuda", dtype=torch.float32).transpose(1, 2)
    RUNG(a, b, out)
    torch.cuda.synchronize()
    _assert_close(out, torch.matmul(a.double(), b.double()))


@gpu
def test_nan_inf_propagate():
    from cute_kernels.gemm.sm70_mma import RUNG

    a = torch.randn(1, 40, 24, device="cuda").half()
    b = torch.randn(1, 24, 36, device="cuda").half()
    a[0, 3, 5] = float("nan")
    b[0, 7, 9] = float("inf")
    out = torch.full((1, 40, 36), float("nan"), device="cuda", dtype=torch.float16)
    RUNG(a, b, out)
    torch.cuda.synchronize()
    assert torch.isnan(out[0, 3]).all()
    assert not torch.isfinite(torch.cat([out[0, :3, 9], out[0, 4:, 9]])).any()
    rest = out[0].clone()
    rest[3] = 0
    rest[:, 9] = 0
    assert torch.isfinite(rest).all()
