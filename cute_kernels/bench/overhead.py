"""Host overhead per call: time from the Python call until its launch is enqueued.

Method: the GPU is first given a long sleep kernel (`torch.cuda._sleep`), so everything after
it only queues; then `calls` back-to-back calls of the public entry point are timed with the
host's wall clock (`time.perf_counter`), and the time per call is the elapsed time over
`calls`. Because the GPU is still busy when the clock stops, the time is host work alone
(argument checks, dispatch, cache lookups, allocation, the launch itself); a hidden device
synchronization would show up as the remaining sleep. Each round re-arms the sleep; the rounds
are interleaved over implementations like the GPU timings, and a round whose sleep had finished
before the clock stopped is counted in `drained_rounds` (its figure may then include waiting).

Cases: a tiny GEMM (256³ bf16, C = A·Bᵀ) and a tiny attention (B1_H8_S256_D64 bf16). Ours go
through the public APIs with `kernel="auto"` (`cute_kernels.gemm.matmul`,
`cute_kernels.attention.scaled_dot_product_attention`); the peers are `cublas`
(torch.matmul), `quack`, `sdpa` (F.scaled_dot_product_attention, default dispatch) and `fa4`.
Beside them, the layers a model calls (`overhead_layers`): cute_kernels.nn.Linear against
torch.nn.Linear and our functional SDPA against torch's (`stock`), forward and forward +
backward, at model shapes; a case may set its own number of `calls` per round. Then
`overhead_layers.compile_checks` (run by the CLI on CUDA) records whether a patched block
compiles as one graph without recompiling.
Records: `ms` is host milliseconds per call (`us_per_call` too), `tflops` is 0 (not a rate).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from cute_kernels.bench.cases import AttentionCase, GemmCase, torch_dtype
from cute_kernels.bench.impls import Impl, Prepared, Unsupported, _needs_module, our_attention_kernels, our_gemm_rungs
from cute_kernels.bench.records import Record
from cute_kernels.bench.runner import check_correctness, fill_ratios
from cute_kernels.bench.timing import Timer, interleaved

GEMM_CASE = GemmCase(256, 256, 256, "bf16")
ATTENTION_CASE = AttentionCase(1, 8, 256, 64, False, "bf16")
SLEEP_CYCLES = 200_000_000  # ~0.1 s at H200 clocks: longer than `calls` enqueues of any peer


def _ours_gemm_available() -> str | None:
    names, why = our_gemm_rungs()
    return None if names else (why or "cute_kernels.gemm.KERNELS is empty")


def _ours_attention_available() -> str | None:
    names, why = our_attention_kernels()
    return None if names else (why or "cute_kernels.attention.KERNELS is empty")


def _gemm_ours(case, inputs) -> Prepared:
    from cute_kernels.gemm import matmul

    a, bt = inputs["a"], inputs["b"].T
    return Prepared(lambda: matmul(a, bt))


def _gemm_cublas(case, inputs) -> Prepared:
    import torch

    a, bt = inputs["a"], inputs["b"].T
    return Prepared(lambda: torch.matmul(a, bt))


def _gemm_quack(case, inputs) -> Prepared:
    from quack.gemm_interface import gemm

    a, b_kn = inputs["a"], inputs["b"].mT
    return Prepared(lambda: gemm(a, b_kn, tuned=False))


def _attention_ours(case, inputs) -> Prepared:
    from cute_kernels.attention import scaled_dot_product_attention

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    return Prepared(lambda: scaled_dot_product_attention(q, k, v, is_causal=case.causal))


def _attention_sdpa(case, inputs) -> Prepared:
    import torch.nn.functional as F

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    return Prepared(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal))


def _attention_fa4(case, inputs) -> Prepared:
    from flash_attn.cute import flash_attn_func

    q, k, v = (inputs[n].transpose(1, 2) for n in ("q", "k", "v"))

    def fn():
        r = flash_attn_func(q, k, v, causal=case.causal)
        return r[0] if isinstance(r, tuple) else r

    return Prepared(fn, canonical=lambda o: o.transpose(1, 2))


def overhead_impls() -> dict[Any, dict[str, Impl]]:
    """case -> {impl name: Impl} for the overhead benchmark."""
    from cute_kernels.bench.overhead_layers import layer_impls

    return {**_api_impls(), **layer_impls()}


def _api_impls() -> dict[Any, dict[str, Impl]]:
    return {
        GEMM_CASE: {
            "cute_kernels": Impl("cute_kernels", "ours", _gemm_ours, _ours_gemm_available),
            "cublas": Impl("cublas", "peer", _gemm_cublas),
            "quack": Impl("quack", "peer", _gemm_quack, _needs_module("quack")),
        },
        ATTENTION_CASE: {
            "cute_kernels": Impl("cute_kernels", "ours", _attention_ours, _ours_attention_available),
            "sdpa": Impl("sdpa", "peer", _attention_sdpa),
            "fa4": Impl("fa4", "peer", _attention_fa4, _needs_module("flash_attn.cute")),
        },
    }


def make_host_timer(*, calls: int = 200, warmup: int = 20, clock: Callable[[], float] = time.perf_counter,
                    busy: Callable[[], Callable[[], bool]] | None = None,
                    sync: Callable[[], None] | None = None) -> Timer:
    """A timer returning host ms per call (see the module docstring).

    `busy()` keeps the device busy and returns a probe that is True once the device went idle;
    `sync()` waits for the device. Both default to no-ops, which is what a CPU test injects
    (with a fake `clock`)."""
    if calls < 1 or warmup < 0:
        raise ValueError(f"calls must be >= 1 and warmup >= 0, got calls={calls}, warmup={warmup}")
    busy = busy or (lambda: (lambda: False))
    sync = sync or (lambda: None)

    default_calls = calls

    def timer(fn: Callable[[], object], label: str = "", calls: int | None = None) -> float:
        calls = calls or default_calls
        for _ in range(warmup):
            fn()
        sync()
        drained = busy()
        t0 = clock()
        for _ in range(calls):
            fn()
        t1 = clock()
        if drained():
            timer.drained[label] = timer.drained.get(label, 0) + 1
        sync()
        return (t1 - t0) * 1e3 / calls

    timer.drained = {}  # type: ignore[attr-defined]
    timer.backend = f"host wall clock over {calls} enqueues, GPU kept busy"  # type: ignore[attr-defined]
    return timer


def cuda_busy_probe() -> Callable[[], Callable[[], bool]]:
    """`busy` for make_host_timer on CUDA: enqueue a sleep kernel, return its 'done yet' probe."""
    import torch

    def busy() -> Callable[[], bool]:
        torch.cuda._sleep(SLEEP_CYCLES)
        done = torch.cuda.Event()
        done.record()
        return done.query

    return busy


def run_overhead(impls_by_case: Mapping[Any, Mapping[str, Impl]], *, timer: Timer, rounds: int = 5,
                 device: str = "cuda", seed: int = 0,
                 log: Callable[[str], None] | None = None) -> tuple[list[Record], list[dict[str, str]]]:
    """Check each impl on each tiny case, then time host overhead interleaved; records and skips."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    records: list[Record] = []
    skipped: list[dict[str, str]] = []
    for case, impls in impls_by_case.items():
        inputs = case.make_inputs(device, seed)
        reference = case.reference(inputs)
        ready = {}
        for name, impl in impls.items():
            reason = impl.available()
            if reason:
                skipped.append({"case": case.name, "impl": name, "reason": reason})
                continue
            try:
                prepared = impl.prepare(case, inputs)
            except Exception as exc:
                skipped.append({"case": case.name, "impl": name, "reason": f"{type(exc).__name__}: {exc}"})
                continue
            try:
                err, ok, error = check_correctness(prepared, reference, case.tolerance, device,
                                                   torch_dtype(case.result_dtype))
            except Unsupported as exc:
                skipped.append({"case": case.name, "impl": name, "reason": str(exc)})
                continue
            rec = Record(case=case.name, impl=name, dtype=case.dtype, tflops=None, ms=None,
                         rel_err=err if math.isfinite(err) else None, ok=ok, kind=impl.kind,
                         tolerance=case.tolerance, error=error)
            records.append(rec)
            if ok:
                ready[name] = prepared.fn
            else:
                log(f"  {case.name} {name}: FAILED correctness: {error}")
        if ready:
            drained = getattr(timer, "drained", {})
            drained.clear()  # counted per case: the cases share impl names
            calls = getattr(case, "calls", None)
            case_timer = timer if calls is None else (lambda fn, label, _c=calls: timer(fn, label, calls=_c))
            timings = interleaved(ready, case_timer, rounds)
            for rec in records:
                if rec.case == case.name and rec.impl in timings:
                    t = timings[rec.impl]
                    rec.ms, rec.p20_ms, rec.p80_ms, rec.spread, rec.rounds = t.median, t.p20, t.p80, t.spread, len(t.samples)
                    rec.tflops = 0.0
                    rec.extra = {"us_per_call": t.median * 1e3, "drained_rounds": drained.get(rec.impl, 0)}
                    log(f"  {case.name} {rec.impl}: {t.median * 1e3:.1f} us per call (host)")
    fill_ratios(records)
    return records, skipped
