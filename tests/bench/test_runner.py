"""runner: correctness before timing, derived metrics, skips (CPU tensors, injected timer)."""

from __future__ import annotations


import pytest
import torch

from cute_kernels.bench.cases import CopyCase, GemmCase
from cute_kernels.bench.impls import Impl, Prepared, Unsupported, gemm_impls
from cute_kernels.bench.runner import RunSettings, fill_ratios, run_suite
from cute_kernels.bench.records import Record

CASE = GemmCase(64, 48, 32, "bf16")
TIMES = {"good_peer": [2.0, 2.2, 1.8], "fast_ours": [1.0, 1.1, 0.9], "slow_peer": [4.0, 4.0, 4.0]}


def _matmul_impl(name, kind, transform=lambda out: out, writes=True):
    def prepare(case, inputs):
        a, b = inputs["a"], inputs["b"]
        out = case.empty_out(inputs)

        def fn():
            value = transform(torch.matmul(a, b.T))
            if writes:
                out.copy_(value)

        return Prepared(fn, out=out)

    return Impl(name, kind, prepare)


class FakeTimer:
    """Returns the scripted time per round for each label, recording the calls."""

    def __init__(self, times):
        self.times = {k: list(v) for k, v in times.items()}
        self.calls = []
        self.backend = "fake"

    def __call__(self, fn, label):
        self.calls.append(label)
        fn()
        return self.times[label].pop(0)


def _run(impls, times=TIMES, ceilings=None, cases=(CASE,)):
    timer = FakeTimer(times)
    result = run_suite("gemm", cases, impls, timer=timer, settings=RunSettings(rounds=3, device="cpu"),
                       ceilings=ceilings, device_name="cpu", versions={"torch": torch.__version__}, log=lambda s: None)
    return result, timer


def test_timed_records_carry_median_spread_rates_and_ratios():
    impls = {"fast_ours": _matmul_impl("fast_ours", "ours"), "good_peer": _matmul_impl("good_peer", "peer"),
             "slow_peer": _matmul_impl("slow_peer", "peer")}
    result, timer = _run(impls, ceilings={"bf16": 1e-3, "hbm_gbps": 10.0})
    by = {r.impl: r for r in result.records}
    assert sorted(timer.calls) == sorted(["fast_ours", "good_peer", "slow_peer"] * 3)
    ours = by["fast_ours"]
    assert ours.ok and ours.kind == "ours" and ours.ms == 1.0 and ours.rounds == 3
    assert ours.tflops == pytest.approx(CASE.flops / 1.0 / 1e9)
    assert ours.gbps == pytest.approx(CASE.bytes / 1.0 / 1e6)
    assert ours.spread == pytest.approx((1.06 - 0.94) / 1.0)
    assert ours.ratio_to_best_peer == pytest.approx(2.0)  # best peer 2.0 ms
    assert by["good_peer"].ratio_to_best_peer == 1.0
    assert by["slow_peer"].ratio_to_best_peer == pytest.approx(0.5)
    # roofline: min(math 1e-3 TFLOP/s, intensity * 10 GB/s)
    roof = min(1e-3, CASE.flops / CASE.bytes * 10.0 / 1e3)
    assert ours.pct_ceiling == pytest.approx(100 * ours.tflops / roof)
    assert ours.rel_err < CASE.tolerance and result.suite == "gemm" and result.device == "cpu"
    assert result.settings["timer"] == "fake" and result.settings["rounds"] == 3


def test_wrong_results_are_flagged_and_not_timed():
    impls = {
        "fast_ours": _matmul_impl("fast_ours", "ours", transform=lambda o: o * 1.1),  # 10% off
        "good_peer": _matmul_impl("good_peer", "peer"),
        "lazy": _matmul_impl("lazy", "ours", writes=False),  # leaves the NaN poison in place
    }
    result, timer = _run(impls)
    by = {r.impl: r for r in result.records}
    assert not by["fast_ours"].ok and by["fast_ours"].ms is None and by["fast_ours"].tflops is None
    assert by["fast_ours"].rel_err == pytest.approx(0.1, rel=0.05)
    assert "tolerance" in by["fast_ours"].error
    assert not by["lazy"].ok and by["lazy"].rel_err is None and "NaN" in by["lazy"].error
    assert set(timer.calls) == {"good_peer"}
    assert result.to_dict()  # a result with failures still serializes


def test_unsupported_and_failing_impls():
    def unsupported(case, inputs):
        raise Unsupported("needs fp8")

    def peer_breaks(case, inputs):
        return Prepared(lambda: (_ for _ in ()).throw(RuntimeError("no kernel")))

    def ours_breaks(case, inputs):
        return Prepared(lambda: (_ for _ in ()).throw(RuntimeError("illegal")))

    def declines_on_call(case, inputs):
        return Prepared(lambda: (_ for _ in ()).throw(ValueError("src is on cpu")))

    impls = {"u": Impl("u", "ours", unsupported), "p": Impl("p", "peer", peer_breaks),
             "d": Impl("d", "ours", declines_on_call),
             "o": Impl("o", "ours", ours_breaks), "gone": Impl("gone", "peer", unsupported, lambda: "not importable"),
             "good_peer": _matmul_impl("good_peer", "peer")}
    result, timer = _run(impls)
    skipped = {(s["impl"], s["case"]): s["reason"] for s in result.skipped}
    assert skipped[("u", CASE.name)] == "needs fp8"
    assert "no kernel" in skipped[("p", CASE.name)]
    assert skipped[("d", CASE.name)] == "ValueError: src is on cpu"
    assert skipped[("gone", "*")] == "not importable"
    by = {r.impl: r for r in result.records}
    assert set(by) == {"o", "good_peer"}
    assert not by["o"].ok and "illegal" in by["o"].error and by["o"].ms is None


def test_copy_case_reports_bandwidth_percent():
    case = CopyCase(4096, "fp32")

    def prepare(case, inputs):
        out = case.empty_out(inputs)
        return Prepared(lambda: out.copy_(inputs["src"]), out=out)

    result, _ = _run({"torch_copy": Impl("torch_copy", "peer", prepare)}, times={"torch_copy": [0.01] * 3},
                     ceilings={"hbm_gbps": 4000.0}, cases=(case,))
    r = result.records[0]
    assert r.rel_err == 0.0 and r.tflops == 0.0
    assert r.gbps == pytest.approx(case.bytes / 0.01 / 1e6)
    assert r.pct_ceiling == pytest.approx(100 * r.gbps / 4000.0)


def test_fill_ratios_without_a_peer_leaves_none():
    recs = [Record("c", "x", "bf16", 1.0, 1.0, 0.0, kind="ours")]
    fill_ratios(recs)
    assert recs[0].ratio_to_best_peer is None


def test_cublas_peer_runs_on_cpu_tensors():
    # The real peer adapter (torch.matmul with out=) through the real runner.
    impls = {"cublas": gemm_impls()["cublas"]}
    result, _ = _run(impls, times={"cublas": [1.0] * 3}, cases=(GemmCase(32, 16, 8, "fp32"),))
    r = result.records[0]
    assert r.ok and r.rel_err < 1e-6 and r.ms == 1.0


def test_settings_validate():
    with pytest.raises(ValueError, match="rounds"):
        RunSettings(rounds=0).validate()
    with pytest.raises(ValueError, match="device"):
        RunSettings(device="tpu").validate()


def test_progress_sees_each_finished_case_and_the_final_result_is_complete():
    seen = []
    cases = (GemmCase(16, 16, 16, "bf16"), GemmCase(32, 16, 16, "bf16"))
    timer = FakeTimer({"good_peer": [1.0] * 4})
    result = run_suite("gemm", cases, {"good_peer": _matmul_impl("good_peer", "peer")}, timer=timer,
                       settings=RunSettings(rounds=2, device="cpu"), device_name="cpu", versions={},
                       log=lambda s: None, progress=lambda r: seen.append((r.complete, [x.case for x in r.records])))
    assert seen == [(False, ["16x16x16"]), (False, ["16x16x16", "32x16x16"])]
    assert result.complete and result.to_dict()["complete"] is True
