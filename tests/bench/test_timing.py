"""timing: percentiles, the summary, and the interleaved round-robin (fake timers)."""

from __future__ import annotations

import pytest

from cute_kernels.bench.timing import interleaved, percentile, summarize, wall_clock_timer


def test_percentile_interpolates_linearly():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 5.0 and percentile(xs, 50) == 3.0
    assert percentile(xs, 20) == pytest.approx(1.8)
    assert percentile(xs, 80) == pytest.approx(4.2)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summarize_spread_is_p80_minus_p20_over_median():
    t = summarize([1.0, 1.1, 0.9, 1.0, 1.2])
    assert t.median == 1.0
    assert t.p20 == pytest.approx(0.98) and t.p80 == pytest.approx(1.12)
    assert t.spread == pytest.approx(0.14)
    with pytest.raises(ValueError, match="positive"):
        summarize([1.0, 0.0])


def test_interleaved_rotates_start_and_takes_median_per_impl():
    order = []
    values = {"a": iter([3.0, 1.0, 2.0]), "b": iter([10.0, 30.0, 20.0]), "c": iter([5.0, 5.0, 8.0])}

    def timer(fn, label):
        order.append(label)
        return next(values[label])

    fns = {name: (lambda: None) for name in "abc"}
    result = interleaved(fns, timer, rounds=3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert result["a"].median == 2.0 and result["b"].median == 20.0 and result["c"].median == 5.0
    assert result["b"].samples == (10.0, 30.0, 20.0)
    with pytest.raises(ValueError, match="rounds"):
        interleaved(fns, timer, rounds=0)


def test_wall_clock_timer_calls_the_function():
    calls = []
    timer = wall_clock_timer(repeats=2)
    ms = timer(lambda: calls.append(1), "x")
    assert ms > 0 and len(calls) == 3  # one warm-up, two timed


def test_gpu_timer_routes_slow_calls_to_cuda_events(monkeypatch):
    import sys
    import types

    from cute_kernels.bench import timing

    calls = []
    fake_testing = types.ModuleType("triton.testing")

    def do_bench(fn, warmup, rep, return_mode):
        calls.append(("do_bench", warmup, rep, return_mode))
        return 0.5

    fake_testing.do_bench = do_bench
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.testing", fake_testing)
    probe_ms = {}
    monkeypatch.setattr(timing, "_one_call_ms", lambda fn: probe_ms[fn])
    monkeypatch.setattr(timing, "cuda_event_bench", lambda fn, warmup_ms, rep_ms: calls.append(("events",)) or 900.0)

    def fast():
        pass

    def slow():
        pass

    probe_ms.update({fast: 0.2, slow: 800.0})
    timer = timing.make_gpu_timer(10.0, 50.0, slow_ms=50.0)
    assert timer(fast, "a") == 0.5 and timer(fast, "a") == 0.5
    assert timer(slow, "b") == 900.0
    assert calls == [("do_bench", 10.0, 50.0, "median"), ("do_bench", 10.0, 50.0, "median"), ("events",)]
    assert timer.slow == {("a", id(fast)): False, ("b", id(slow)): True}
    assert "do_bench" in timer.backend

    events_only = timing.make_gpu_timer(backend="events")
    assert events_only(fast, "a") == 900.0 and events_only.backend == "cuda events median"
    with pytest.raises(ValueError, match="backend"):
        timing.make_gpu_timer(backend="nvbench")
