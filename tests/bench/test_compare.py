"""compare: regressions beyond the measured spread, on synthetic records."""

from __future__ import annotations

import pytest

from cute_kernels.bench.compare import compare_records, compare_results
from cute_kernels.bench.records import BenchResult, Record


def rec(case, impl, ms, spread=0.02, ok=True):
    return Record(case, impl, "bf16", tflops=None if ms is None else 1.0 / ms, ms=ms, rel_err=1e-3,
                  ok=ok, spread=spread)


def test_slowdown_beyond_spread_is_flagged_within_is_not():
    old = [rec("a", "x", 1.00, 0.02), rec("b", "x", 1.00, 0.02), rec("c", "x", 1.00, 0.01), rec("d", "x", 1.0)]
    new = [rec("a", "x", 1.05, 0.01), rec("b", "x", 1.015, 0.01), rec("c", "x", 0.80, 0.01), rec("e", "x", 1.0)]
    cmp = compare_records(old, new)
    by = {c.case: c for c in cmp.changes}
    assert by["a"].regression and by["a"].slowdown == pytest.approx(0.05) and by["a"].threshold == 0.02
    assert not by["b"].regression  # 1.5% < 2% spread of the old run
    assert not by["c"].regression and by["c"].slowdown == pytest.approx(-0.2)
    assert [c.case for c in cmp.regressions] == ["a"]
    assert cmp.only_old == (("d", "x", "bf16"),) and cmp.only_new == (("e", "x", "bf16"),)
    report = cmp.report()
    flagged = [line for line in report.splitlines() if line.startswith("REGRESSION")]
    assert len(flagged) == 1 and " a x bf16: 1.0000 -> 1.0500 ms (+5.0%, threshold 2.0%)" in flagged[0]
    assert "1 regression(s) in 3 matched" in report


def test_threshold_is_the_larger_spread_and_the_floor():
    old, new = [rec("a", "x", 1.0, 0.01)], [rec("a", "x", 1.04, 0.05)]
    assert not compare_records(old, new).regressions  # new run's own spread is 5%
    old, new = [rec("a", "x", 1.0, 0.0)], [rec("a", "x", 1.02, 0.0)]
    assert compare_records(old, new).regressions
    assert not compare_records(old, new, floor=0.03).regressions
    with pytest.raises(ValueError):
        compare_records(old, new, floor=-1)


def test_newly_failing_correctness_is_a_regression():
    old = [rec("a", "x", 1.0)]
    new = [rec("a", "x", None, ok=False)]
    (change,) = compare_records(old, new).changes
    assert change.regression and "correctness" in change.reason


def test_untimed_on_either_side_is_not_flagged():
    old = [rec("a", "x", None, ok=False)]
    new = [rec("a", "x", 5.0)]
    (change,) = compare_records(old, new).changes
    assert not change.regression and change.slowdown is None


def test_compare_results_refuses_different_suites():
    a = BenchResult("2026-11-30", "NVIDIA H200", {}, "gemm", [])
    b = BenchResult("2026-11-30", "NVIDIA H200", {}, "attention", [])
    with pytest.raises(ValueError, match="suite"):
        compare_results(a, b)
