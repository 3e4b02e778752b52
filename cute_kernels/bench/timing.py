"""Timing: GPU timers and the interleaved round-robin over implementations.

A *timer* is any callable `timer(fn, label) -> float` that returns the time of one call of
`fn` in milliseconds (label names the implementation; real timers ignore it, fake timers in
tests use it). The GPU timer is `triton.testing.do_bench`'s median with its L2 flush and
warm-up, or, when triton is absent, the same method with CUDA events (`cuda_event_bench`);
calls slower than 50 ms use `cuda_event_bench` in any case, which estimates from one call
instead of five.

`interleaved` times several implementations in rounds: each round calls the timer once per
implementation, rotating the starting implementation each round, so slow drifts of clock and
temperature fall on all implementations alike. The summary per implementation is the median
over rounds, with p20 and p80 and the spread (p80 - p20) / median.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Timer = Callable[[Callable[[], object], str], float]

# Bytes written between timed calls to evict the 50-60 MB L2 of an H100/H200 (triton's
# do_bench uses the same size).
L2_FLUSH_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Timing:
    """Summary of one implementation's per-round times (ms)."""

    median: float
    p20: float
    p80: float
    samples: tuple[float, ...]

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative run-to-run noise."""
        return (self.p80 - self.p20) / self.median if self.median > 0 else float("inf")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> Timing:
    """Median, p20, p80 of positive finite samples; raises ValueError on any other sample."""
    bad = [s for s in samples if not (s > 0 and s != float("inf"))]
    if not samples or bad:
        raise ValueError(f"timings must be positive finite milliseconds, got {list(samples)}")
    return Timing(statistics.median(samples), percentile(samples, 20), percentile(samples, 80), tuple(samples))


def interleaved(fns: Mapping[str, Callable[[], object]], timer: Timer, rounds: int) -> dict[str, Timing]:
    """Time every fn `rounds` times, round-robin with a rotating start; summary per name."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            samples[name].append(float(timer(fns[name], name)))
    return {n: summarize(samples[n]) for n in names}


def make_gpu_timer(warmup_ms: float = 25.0, rep_ms: float = 100.0, *, backend: str = "auto",
                   slow_ms: float = 50.0) -> Timer:
    """A timer for CUDA work: triton's do_bench median (backend 'triton'), CUDA events
    ('events'), or triton when importable else events ('auto').

    A call slower than `slow_ms` (a naive rung at 8192³ takes about a second) is timed by
    `cuda_event_bench` with its single-call estimate instead of do_bench's five-call one, so a
    round costs about `rep_ms` or one call, not seven calls. The first timer call for each label
    spends one extra call to find out which kind it is.
    """
    if backend not in ("auto", "triton", "events"):
        raise ValueError(f"timer backend must be 'auto', 'triton' or 'events', got {backend!r}")
    do_bench = None
    if backend in ("auto", "triton"):
        try:
            from triton.testing import do_bench
        except ImportError:
            if backend == "triton":
                raise
    slow: dict[tuple[str, int], bool] = {}

    def timer(fn: Callable[[], object], label: str = "") -> float:
        key = (label, id(fn))  # per prepared call: one impl is fast at 4096³ and slow at 8192³
        if key not in slow:
            slow[key] = _one_call_ms(fn) > slow_ms
        if do_bench is None or slow[key]:
            return cuda_event_bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)
        try:
            return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
        except TypeError:  # older triton: no return_mode
            return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5]))

    timer.backend = (f"triton.testing.do_bench median (cuda events for calls over {slow_ms:g} ms)"  # type: ignore[attr-defined]
                     if do_bench is not None else "cuda events median")
    timer.slow = slow  # type: ignore[attr-defined]
    return timer


def _one_call_ms(fn: Callable[[], object]) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


_flush_buffer = None


def cuda_event_bench(fn: Callable[[], object], *, warmup_ms: float = 25.0, rep_ms: float = 100.0) -> float:
    """Median ms per call of `fn` on torch's current stream, with the L2 flushed before each call.

    Method (do_bench's): estimate the time of one call, run warm-up calls for about
    `warmup_ms`, then time about `rep_ms` worth of calls (at least one), each bracketed by its
    own pair of CUDA events after writing `L2_FLUSH_BYTES` so that no operand stays in L2.
    The estimate is one call when that call alone exceeds `rep_ms / 5` (then no warm-up calls
    beyond it), else the mean of 5 calls.
    """
    import torch

    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    estimate = start.elapsed_time(end)
    n_warmup = 0
    if estimate <= rep_ms / 5:
        start.record()
        for _ in range(5):
            _flush_buffer.zero_()
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(end) / 5, 1e-3)
        n_warmup = max(1, int(warmup_ms / estimate))
    n_repeat = max(1, int(rep_ms / estimate))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for _ in range(n_warmup):
        fn()
    for s, e in zip(starts, ends):
        _flush_buffer.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def wall_clock_timer(repeats: int = 3) -> Timer:
    """A CPU timer (for runs without a GPU, e.g. `--device cpu`): median wall time of `repeats`
    calls after one warm-up call. Meaningless as a GPU measurement; it exists so the harness
    runs end to end anywhere."""
    import time

    def timer(fn: Callable[[], object], label: str = "") -> float:
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return max(statistics.median(times), 1e-6)

    timer.backend = "wall_clock"  # type: ignore[attr-defined]
    return timer
