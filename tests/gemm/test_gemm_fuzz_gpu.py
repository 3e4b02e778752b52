"""The GEMM fuzz on the GPU: thousands of random problems through `matmul` and
`matmul_epilogue` against float64 (cute_kernels.bench.gemm_fuzz), zero wrong.

Each run draws a fresh seed (printed, and kept in the record) unless CUTE_KERNELS_FUZZ_SEED
sets one; CUTE_KERNELS_GEMM_FUZZ_CASES sets the count (default 2000). The kernels the problems
need are compiled first in parallel processes (`runtime.precompile`). With
CUTE_KERNELS_RESULTS_DIR set, the `gemm_fuzz` record (cases, wrong) is written there as
<date>-gemm_fuzz-<device>.json, as `scripts/gpu_check.sh` does for docs/results/.
"""

from __future__ import annotations

import pytest

from cute_kernels.bench import gemm_fuzz

pytestmark = pytest.mark.gpu


def test_random_gemm_problems_are_all_right():
    from cute_kernels.bench.fuzz_record import run_recorded

    report, n = run_recorded(gemm_fuzz, "CUTE_KERNELS_GEMM_FUZZ_CASES", 2000, "gemm fuzz")
    assert report.cases == n
    assert report.wrong == 0, report.failure_lines()


def test_small_n_and_small_m_regime_is_right_on_every_major():
    """Issue 13's sweep, whole: M x N over the small sizes (both orientations), both majors of
    A and B, at K = 1024, against float64; NaN-poisoned results."""
    import torch

    from cute_kernels.gemm import matmul

    sizes = (1, 2, 3, 4, 7, 8, 15, 16, 17)
    big = (1, 2, 64, 128, 129, 130, 256, 1000, 4096)
    wrong = []
    for small, large in [(s, l) for s in sizes for l in big]:
        for m, n in ((large, small), (small, large)):
            for a_major in ("row", "col"):
                for b_major in ("row", "col"):
                    p = gemm_fuzz.Problem(m=m, n=n, k=1024, dtype="bf16", out_dtype="bf16", a_major=a_major,
                                          b_major=b_major)
                    t = gemm_fuzz.inputs(p, torch.Generator(device="cuda").manual_seed(m * 7919 + n), "cuda")
                    gemm_fuzz._poison("cuda", 4 * m * n + 1024 * (m + n))
                    out = matmul(t["a"], t["b"])
                    ref = gemm_fuzz.reference(p, t)
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    if not err <= gemm_fuzz.tolerance(p):
                        wrong.append(f"M={m} N={n} a {a_major} b {b_major}: {err:.3g}")
    assert not wrong, f"{len(wrong)} wrong: {wrong[:10]}"


@pytest.mark.parametrize("scales", ["tensor", "rowwise", "a_rowwise"])
def test_fp8_scaled_mm_per_tensor_and_row_wise(scales):
    """fp8 e4m3 through `scaled_mm` on every route (swap-AB, split-K, the ordinary path, and
    copies of an N-major b) with per-tensor, row-wise or mixed scales, against float64."""
    import torch

    from cute_kernels.gemm.epilogue_api import scaled_mm

    fp8 = torch.float8_e4m3fn
    for m, n, k, b_nmajor in [(16, 4096, 1024, False), (16, 1024, 8192, False), (1000, 1536, 2048, False),
                              (4096, 4096, 4096, False), (300, 256, 512, True), (129, 8, 1024, False)]:
        a = torch.randn(m, k, device="cuda").to(fp8)
        b = torch.randn(k, n, device="cuda").to(fp8) if b_nmajor else torch.randn(n, k, device="cuda").to(fp8).t()
        one = ((), ())
        rows = {"tensor": one, "rowwise": ((m, 1), (1, n)), "a_rowwise": ((m, 1), ())}[scales]
        sa = torch.rand(rows[0], device="cuda") + 0.5
        sb = torch.rand(rows[1], device="cuda") + 0.5
        for _ in range(2):  # cold, then the warm plan
            gemm_fuzz._poison("cuda", 4 * m * n)
            out = scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
            ref = (a.double() * sa.double()) @ (b.double() * sb.double())
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 5e-3, (m, n, k, b_nmajor, scales, err)
