"""The `fused` benchmark suite without a GPU: case names round-trip, the byte counts are the
compulsory traffic, and the harness runs the eager implementation of every op on tiny cases on
CPU (references, canonical forms and the record's extras are exercised; nothing is timed for real)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.bench.fused_cases import FUSED_OPS, FusedCase  # noqa: E402
from cute_kernels.bench.runner import RunSettings, run_suite  # noqa: E402
from cute_kernels.bench.suites import SUITES, select_impls  # noqa: E402
from cute_kernels.bench.timing import wall_clock_timer  # noqa: E402

TINY = [FusedCase(op, 16, 64) for op in FUSED_OPS if op not in ("rope", "linear_cross_entropy") and
        not op.startswith("linear_swiglu")]
TINY += [FusedCase.rope(2, 8, 4, 2, 16), FusedCase.linear_cross_entropy(32, 16, 100),
         FusedCase.linear_swiglu(16, 32, 24), FusedCase.linear_swiglu(16, 32, 24, backward=True)]


def test_names_round_trip_and_the_suite_has_the_issue_cases():
    for case in TINY + list(SUITES["fused"].cases):
        assert FusedCase.parse(case.name, case.dtype) == case
    names = {c.name for c in SUITES["fused"].cases}
    assert {"rmsnorm_fwd_16384x4096", "softmax_fwd_16384x4096", "cross_entropy_fwd_8192x128256",
            "linear_cross_entropy_8192x4096x128256"} <= names
    with pytest.raises(ValueError, match="fused case must look like"):
        FusedCase.parse("rmsnorm_16384x4096")


def test_bytes_are_the_compulsory_traffic():
    m, n = 16384, 4096
    assert FusedCase("rmsnorm_fwd", m, n).bytes == 2 * m * n * 2 + n * 2
    assert FusedCase("rmsnorm_residual_fwd", m, n).bytes == 4 * m * n * 2 + n * 2
    assert FusedCase("softmax_bwd", m, n).bytes == 3 * m * n * 2
    assert FusedCase("cross_entropy_fwd", 8192, 128256).bytes == 8192 * 128256 * 2 + 12 * 8192
    lce = FusedCase.linear_cross_entropy(8192, 4096, 128256)
    assert lce.flops == 6 * 8192 * 4096 * 128256 and lce.result_dtype == "fp32"
    mlp = FusedCase.linear_swiglu(8192, 4096, 14336)
    assert mlp.name == "linear_swiglu_fwd_8192x4096x14336" and mlp.flops == 2 * 8192 * 4096 * 2 * 14336
    assert mlp.bytes == 2 * (8192 * 4096 + 2 * 14336 * 4096 + 8192 * 14336)
    assert FusedCase.linear_swiglu(8192, 4096, 14336, backward=True).flops == 3 * mlp.flops


def test_eager_runs_every_op_on_cpu():
    impls = select_impls(SUITES["fused"].impls(), "eager", lambda i: True)
    result = run_suite("fused", TINY, impls, timer=wall_clock_timer(), settings=RunSettings(rounds=1, device="cpu"),
                       device_name="cpu", versions={}, log=lambda line: None)
    assert {r.case for r in result.records} == {c.name for c in TINY}
    bad = [(r.case, r.error) for r in result.records if not r.ok]
    assert not bad, bad


def test_the_fusion_page_holds_the_generated_bytes_table_and_its_session_runs():
    import doctest
    from pathlib import Path

    from cute_kernels.bench.docs_tables import newest_result
    from cute_kernels.bench.fusion_bytes import FUSIONS, fill_page

    root = Path(__file__).resolve().parents[2]
    page = root / "docs" / "fusion.md"
    results = newest_result(root / "docs" / "results", "fused")
    assert fill_page(page, results) == page.read_text(), "run: python -m cute_kernels.bench.fusion_bytes docs/fusion.md"
    for f in FUSIONS:
        assert f.unfused > f.ours > 0 and f.name in page.read_text()
    result = doctest.testfile(str(page), module_relative=False, verbose=False)
    assert result.attempted >= 4 and result.failed == 0


def test_plot_bars_are_bandwidth_even_with_one_gemm_case():
    """The suite's records have no FLOPs but the linear + cross-entropy's: the bars are still GB/s
    (not TFLOP/s, where every other case would be a zero bar) and the right pane GB/s against
    traffic."""
    from cute_kernels.bench.plot import _figure
    from cute_kernels.bench.records import BenchResult, Record

    recs = []
    for name, ms in (("softmax_fwd_16384x4096", 0.07), ("linear_cross_entropy_8192x4096x128256", 55.0)):
        c = FusedCase.parse(name)
        r = Record(case=c.name, impl="cute_kernels", dtype="bf16", tflops=c.flops / ms / 1e9, ms=ms, rel_err=1e-3,
                   ok=True, kind="ours", tolerance=c.tolerance, flops=c.flops, bytes=c.bytes)
        r.gbps = c.bytes / ms / 1e6
        recs.append(r)
    result = BenchResult(date="2026-12-04", timestamp="2026-12-04T00:00:00Z", device="cpu", versions={},
                         suite="fused", records=recs, ceilings={"hbm_gbps": 4000.0})
    bars, roof = _figure(result).axes
    assert bars.get_ylabel() == "GB/s"
    assert [p.get_height() for p in bars.patches] == [pytest.approx(r.gbps) for r in recs]
    assert roof.get_xlabel() == "compulsory traffic (MiB)" and roof.get_ylabel() == "GB/s"
