"""The fused fuzz's harness on CPU: its problems, references and bars accept a correct
implementation (the `fallback="torch"` path, fp32 arithmetic with the kernels' rounding) on
every family, and reject wrong ones (one corrupted element, a slightly scaled gradient). The
kernels themselves are fuzzed on the GPU (tests/fused/test_fused_fuzz_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.bench import fused_fuzz  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_problems_are_deterministic_and_cover_every_family():
    a, b = fused_fuzz.problems(11, 120), fused_fuzz.problems(11, 120)
    assert a == b and a != fused_fuzz.problems(12, 120)
    assert {p.family for p in a} == set(fused_fuzz.FAMILIES)
    assert any(p.width == 1 for p in fused_fuzz.problems(11, 2000))  # edge widths are drawn


def test_a_correct_implementation_passes_every_family():
    report = fused_fuzz.run(5, 150, device="cpu", fallback="torch")
    assert report.cases == 150 and report.errors == 0
    assert report.wrong == 0, [(f["problem"], f["why"]) for f in report.failures]


@pytest.mark.parametrize("how", ["one_element", "scaled_gradient"])
def test_wrong_results_are_caught(monkeypatch, how):
    """A corrupted forward element or a gradient off by 2% makes every case of a family wrong."""
    from cute_kernels.ops import eager_fused

    # the functional forms call the ops through their eager entries (`ops.eager_fused`)
    if how == "one_element":
        real = eager_fused.softmax.op

        def corrupt(x, dim, fallback):
            y = real(x, dim, fallback).clone()
            y.view(-1)[y.numel() // 2] += 0.5
            return y

        monkeypatch.setattr(eager_fused.softmax, "op", corrupt)
        families = ("softmax",)
    else:
        real = eager_fused.swiglu.op

        class Scaled(torch.autograd.Function):
            @staticmethod
            def forward(ctx, y):
                return y.clone()

            @staticmethod
            def backward(ctx, g):
                return g * 1.02

        monkeypatch.setattr(eager_fused.swiglu, "op", lambda *a: Scaled.apply(real(*a)))
        families = ("swiglu",)
    report = fused_fuzz.run(3, 20, device="cpu", fallback="torch", families=families)
    assert report.cases == 20 and report.wrong == 20, [(f["problem"], f["why"]) for f in report.failures]


def test_the_record_lands_in_the_results_dir(monkeypatch, tmp_path):
    from cute_kernels.bench.fuzz_record import write_to_results_dir
    from cute_kernels.bench.records import load_result

    report = fused_fuzz.run(2, 6, device="cpu", fallback="torch")
    monkeypatch.delenv("CUTE_KERNELS_RESULTS_DIR", raising=False)
    assert write_to_results_dir(fused_fuzz.result(report, device="cpu")) is None
    monkeypatch.setenv("CUTE_KERNELS_RESULTS_DIR", str(tmp_path))
    path = write_to_results_dir(fused_fuzz.result(report, device="cpu"))
    back = load_result(path)
    assert back.suite == "fused_fuzz" and path.name.startswith(back.date)
    (rec,) = back.records
    assert rec.extra["cases"] == 6 and rec.extra["wrong"] == report.wrong and rec.ok == (report.wrong == 0)


def test_the_report_tallies_wrong_raised_and_worst_passing_cases():
    from cute_kernels.bench.fuzz_record import FuzzReport

    r = FuzzReport()
    r.tally(None, 0.25, lambda: pytest.fail("a passing case keeps no failure"), 1)
    r.tally("rel_err 0.9", 0.9, lambda: {"problem": "a"}, 1)  # wrong: its error is not the worst passing
    r.tally(r.raised(ValueError("bad " + "x" * 400)), 0.0, lambda: {"problem": "b"}, 1)  # beyond max_failures
    r.tally(None, 0.125, lambda: {}, 1)
    assert (r.wrong, r.errors, r.worst, r.failures) == (2, 1, 0.25, [{"problem": "a"}])
    assert r.raised(KeyError("k")) == "KeyError: 'k'" and len(r.raised(ValueError("x" * 400))) == 300


def test_the_report_says_itself_and_runs_draw_their_seed_and_count(monkeypatch):
    from cute_kernels.bench.fuzz_record import FuzzReport, seed_and_cases

    r = FuzzReport(cases=3, wrong=1, worst=0.5, seconds=2.0, failures=[{"problem": "p", "why": "rel_err 1"}])
    assert r.summary("x fuzz") == "x fuzz: 3 cases, 1 wrong (0 raised), worst passing rel_err 0.5, 2.0 s"
    r.measure = "error/bound"
    assert "worst passing 0.5 of its bar" in r.summary("x fuzz")
    assert r.failure_lines().splitlines()[1:] == ["p: rel_err 1"]
    monkeypatch.setenv("CUTE_KERNELS_FUZZ_SEED", "17")
    monkeypatch.delenv("SOME_FUZZ_CASES", raising=False)
    assert seed_and_cases("SOME_FUZZ_CASES", 40) == (17, 40)
    monkeypatch.setenv("SOME_FUZZ_CASES", "9")
    monkeypatch.delenv("CUTE_KERNELS_FUZZ_SEED")
    seed, n = seed_and_cases("SOME_FUZZ_CASES", 40)
    assert n == 9 and 0 <= seed < 1 << 30


def test_run_recorded_precompiles_runs_and_writes_the_record(monkeypatch):
    import types

    from cute_kernels.bench import fuzz_record
    from cute_kernels.runtime import precompile

    calls = []
    fuzz = types.ModuleType("a_fuzz")
    fuzz.run = lambda seed, n: calls.append(("run", seed, n)) or fuzz_record.FuzzReport(cases=n)
    fuzz.result = lambda report: ("record", report.cases)
    monkeypatch.setattr(precompile, "precompile", lambda target, seed, n: calls.append((target, seed, n)) or {})
    monkeypatch.setattr(fuzz_record, "write_to_results_dir", calls.append)
    monkeypatch.setenv("CUTE_KERNELS_FUZZ_SEED", "5")
    monkeypatch.setenv("A_FUZZ_CASES", "3")
    report, n = fuzz_record.run_recorded(fuzz, "A_FUZZ_CASES", 9, "a fuzz")
    assert (report.cases, n) == (3, 3)
    assert calls == [("a_fuzz:trace", 5, 3), ("run", 5, 3), ("record", 3)]
