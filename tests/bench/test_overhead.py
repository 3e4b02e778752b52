"""overhead: the host timer's arithmetic (fake clock) and the run on CPU with fake impls."""

from __future__ import annotations

import pytest

from cute_kernels.bench.cases import GemmCase
from cute_kernels.bench.impls import Impl, Prepared
from cute_kernels.bench.overhead import ATTENTION_CASE, GEMM_CASE, make_host_timer, overhead_impls, run_overhead


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_host_timer_divides_wall_time_by_calls_and_counts_drained_rounds():
    clock = FakeClock()
    calls = []

    def fn():
        calls.append(1)
        clock.now += 25e-6  # 25 us per call

    idle = iter([False, True])
    timer = make_host_timer(calls=40, warmup=3, clock=clock, busy=lambda: (lambda: next(idle)))
    assert timer(fn, "x") == pytest.approx(0.025)
    assert len(calls) == 43 and timer.drained == {}
    timer(fn, "x")
    assert timer.drained == {"x": 1}
    with pytest.raises(ValueError):
        make_host_timer(calls=0)


def test_run_overhead_records_host_ms_and_ratios():
    clock = FakeClock()
    case = GemmCase(32, 16, 8, "fp32")

    def impl(cost_s, kind, name):
        def prepare(c, inputs):
            def fn():
                clock.now += cost_s
                return inputs["a"] @ inputs["b"].T
            return Prepared(fn)
        return Impl(name, kind, prepare)

    impls = {case: {"ours": impl(30e-6, "ours", "ours"), "peer": impl(20e-6, "peer", "peer")}}
    timer = make_host_timer(calls=10, warmup=1, clock=clock)
    records, skipped = run_overhead(impls, timer=timer, rounds=3, device="cpu", log=lambda s: None)
    by = {r.impl: r for r in records}
    assert by["ours"].ms == pytest.approx(0.030) and by["ours"].extra["us_per_call"] == pytest.approx(30.0)
    assert by["ours"].ratio_to_best_peer == pytest.approx(20 / 30)
    assert by["peer"].tflops == 0.0 and by["peer"].ok and not skipped


def test_overhead_cases_are_tiny():
    assert GEMM_CASE.name == "256x256x256"
    assert ATTENTION_CASE.name == "B1_H8_S256_D64"
    impls = overhead_impls()
    assert set(impls[GEMM_CASE]) == {"cute_kernels", "cublas", "quack"}
    assert set(impls[ATTENTION_CASE]) == {"cute_kernels", "sdpa", "fa4"}


def test_layer_cases_check_stock_against_their_references_and_use_their_call_counts():
    """The layer cases (small instances, fp32 on CPU): torch's own layers pass the references
    (forward output, dx, dq; dq also where q, k, v are views of one projection, as in a ViT),
    and each case's timer runs its own number of calls."""
    from cute_kernels.bench.overhead_layers import LinearCase, NormCase, SdpaCase, layer_impls

    by_family = {c.family: i["stock"] for c, i in layer_impls().items()}
    cases = [LinearCase("t", (2, 5), 8, 6, True, "fwd", "fp32"), LinearCase("t", (7,), 8, 6, False, "fwd_bwd", "fp32"),
             SdpaCase(1, 2, 9, 8, "fwd", "fp32"), SdpaCase(1, 2, 9, 8, "fwd_bwd", "fp32"),
             NormCase("layer", "t", (3, 5), 24, "fwd", "fp32"), NormCase("rms", "t", (7,), 40, "fwd_bwd", "fp32"),
             SdpaCase(2, 3, 9, 8, "fwd", "fp32", layout="vit"), SdpaCase(2, 3, 9, 8, "fwd_bwd", "fp32", layout="vit")]
    impls = {case: {"stock": by_family[case.family]} for case in cases}
    asked = []

    def timer(fn, label="", calls=None):
        asked.append(calls)
        fn()
        return 0.01

    records, skipped = run_overhead(impls, timer=timer, rounds=1, device="cpu", log=lambda s: None)
    assert not skipped and len(records) == 8 and all(r.ok and r.rel_err < 1e-5 for r in records), records
    assert asked == [200, 50] * 4  # fwd cases 200 calls a round, fwd_bwd 50


@pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")
def test_compile_checks_find_one_graph_for_the_patched_block():
    from cute_kernels.bench.overhead_layers import compile_checks

    records = compile_checks("cpu", dtype="fp32", fallback="torch", seqlens=(8, 12))
    assert [r.impl for r in records] == ["stock", "cute_kernels"]
    assert all(r.ok and r.extra["frames"] == 1 for r in records), [(r.impl, r.error) for r in records]
