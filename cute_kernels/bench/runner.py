"""Run a suite: for each case, check every implementation's correctness, then time them all
interleaved on the same tensors, and derive TFLOP/s, GB/s, percent of ceiling and the ratio to
the best peer.

Per case (post-conditions of `run_suite`):
1. fresh N(0, 1) inputs (seeded) and the float32 reference are built once and shared by all
   implementations;
2. each implementation is prepared; one that does not take the case (`Unsupported`, a
   ValueError/NotImplementedError from its input checks when prepared or first called, or any
   failure of a peer) is listed in `skipped` with the reason and produces no record;
3. its output buffer is filled with NaN, it runs once, and rel_err against the reference is
   computed; if rel_err is above the case's tolerance (or not finite, or the call raised) a
   record with `ok: false`, its rel_err and the error is kept and it is *not* timed;
4. the correct ones are timed together by `timing.interleaved` (round-robin, `rounds` rounds):
   `ms` is the median over rounds, `spread` = (p80 - p20) / median.
"""

from __future__ import annotations

import datetime as _dt
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cute_kernels.bench.cases import Case, rel_err, torch_dtype
from cute_kernels.bench.ceilings import pct_ceiling
from cute_kernels.bench.impls import Impl, Prepared, Unsupported
from cute_kernels.bench.records import BenchResult, Record
from cute_kernels.bench.timing import Timer, interleaved


@dataclass(frozen=True)
class RunSettings:
    """How a suite is run. `device` is 'cuda' (or 'cuda:N') for measurements, 'cpu' only to
    exercise the harness."""

    rounds: int = 5
    seed: int = 0
    device: str = "cuda"

    def validate(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")


def _sync(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def _poison_allocator(reference, out_dtype) -> None:
    """Best effort for implementations that allocate their own output: fill a block of the
    output's size with NaN and free it, so torch's caching allocator is likely to hand that
    block to the output (elements the implementation forgets to write then read NaN)."""
    import torch

    if reference.device.type == "cuda":
        # discarded at once: the NaN-filled block goes back to the allocator's cache
        torch.full(reference.shape, float("nan"), dtype=out_dtype or reference.dtype, device=reference.device)


def check_correctness(prepared: Prepared, reference, tolerance: float, device: str,
                      out_dtype=None) -> tuple[float, bool, str | None]:
    """Poison the output with NaN, run once, compare: (rel_err, ok, error message or None).

    With a preallocated `prepared.out`, that buffer is filled with NaN; otherwise a freed
    NaN-filled block of the output's size (`out_dtype`) is left for the allocator to reuse.

    A ValueError or NotImplementedError from the call is the implementation's input check
    declining the case (our kernels validate before launching): it is re-raised as
    `Unsupported`. Any other exception is a failure, returned as the error message."""
    if prepared.out is not None:
        prepared.out.fill_(float("nan"))
    else:
        _poison_allocator(reference, out_dtype)
    try:
        returned = prepared.fn()
        _sync(device)
        err = rel_err(prepared.result(returned), reference)
    except (Unsupported, ValueError, NotImplementedError) as exc:
        raise Unsupported(f"{type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        return float("nan"), False, f"{type(exc).__name__}: {exc}"
    if not math.isfinite(err):
        return err, False, "output holds NaN or Inf (elements left unwritten, or overflow)"
    if err > tolerance:
        return err, False, f"rel_err {err:.3g} above tolerance {tolerance:.3g}"
    return err, True, None


def _base_record(case: Case, impl: Impl, err: float, ok: bool, error: str | None) -> Record:
    return Record(case=case.name, impl=impl.name, dtype=case.dtype, tflops=None, ms=None,
                  rel_err=err if math.isfinite(err) else None, ok=ok, kind=impl.kind,
                  tolerance=case.tolerance, flops=case.flops, bytes=case.bytes, error=error)


def fill_ratios(records: list[Record]) -> None:
    """Set ratio_to_best_peer = best peer ms / ms for every timed record, per (case, dtype).

    Post-condition: > 1 means faster than the fastest correct peer; the best peer itself has
    1.0; no timed peer on a case leaves the ratio None."""
    best: dict[tuple[str, str], float] = {}
    for r in records:
        if r.timed and r.kind == "peer":
            k = (r.case, r.dtype)
            best[k] = min(best.get(k, math.inf), r.ms)
    for r in records:
        k = (r.case, r.dtype)
        r.ratio_to_best_peer = best[k] / r.ms if r.timed and k in best else None


def run_case(case: Case, impls: Mapping[str, Impl], *, timer: Timer, settings: RunSettings,
             ceilings: Mapping[str, Any], log: Callable[[str], None]) -> tuple[list[Record], list[dict[str, str]]]:
    """Records and skips for one case (see the module docstring for the steps)."""
    inputs = case.make_inputs(settings.device, settings.seed)
    reference = case.reference(inputs)
    records: list[Record] = []
    skipped: list[dict[str, str]] = []
    ready: dict[str, Callable[[], object]] = {}
    for name, impl in impls.items():
        try:
            prepared = impl.prepare(case, inputs)
        except (Unsupported, ValueError, NotImplementedError) as exc:
            skipped.append({"case": case.name, "impl": name, "reason": str(exc) or type(exc).__name__})
            continue
        except Exception as exc:
            if impl.kind == "peer":
                skipped.append({"case": case.name, "impl": name, "reason": f"{type(exc).__name__}: {exc}"})
            else:
                records.append(_base_record(case, impl, math.nan, False, f"prepare failed: {type(exc).__name__}: {exc}"))
            continue
        try:
            err, ok, error = check_correctness(prepared, reference, case.tolerance, settings.device,
                                               torch_dtype(case.result_dtype))
        except Unsupported as exc:
            skipped.append({"case": case.name, "impl": name, "reason": str(exc)})
            continue
        if not ok and impl.kind == "peer" and error and not error.startswith(("rel_err", "output")):
            skipped.append({"case": case.name, "impl": name, "reason": error})  # a peer that cannot run here
            continue
        log(f"  {case.name} {name}: rel_err {err:.2e} " + ("ok" if ok else f"FAILED correctness: {error}"))
        if not ok:
            records.append(_base_record(case, impl, err, False, error))
            continue
        ready[name] = prepared.fn
        records.append(_base_record(case, impl, err, True, None))
        records[-1].extra.update(prepared.extra or {})
    del reference
    if ready:
        timings = interleaved(ready, timer, settings.rounds)
        for r in records:
            t = timings.get(r.impl)
            if t is None or not r.ok:
                continue
            r.ms, r.p20_ms, r.p80_ms, r.spread, r.rounds = t.median, t.p20, t.p80, t.spread, len(t.samples)
            r.tflops = case.flops / t.median / 1e9
            r.gbps = case.bytes / t.median / 1e6
            r.pct_ceiling = pct_ceiling(dict(ceilings), case.dtype, case.flops, case.bytes, t.median)
    fill_ratios(records)
    for r in records:
        if r.timed:
            log(f"  {case.name} {r.dtype} {r.impl}: {r.ms:.4f} ms, {r.tflops:.1f} TFLOP/s, {r.gbps:.0f} GB/s, "
                f"rel_err {r.rel_err:.2e}, spread {r.spread:.1%}")
    del inputs
    if settings.device != "cpu":
        import torch

        torch.cuda.empty_cache()
    return records, skipped


def run_suite(suite: str, cases: Iterable[Case], impls: Mapping[str, Impl], *, timer: Timer,
              settings: RunSettings = RunSettings(), ceilings: Mapping[str, Any] | None = None,
              device_name: str | None = None, versions: dict[str, Any] | None = None,
              log: Callable[[str], None] | None = None,
              progress: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """Run `cases` × `impls` and return the result (see the module docstring).

    `progress`, when given, receives the result so far (`complete` False) after each case, so
    a caller can write it out: a run killed by a hung kernel keeps the cases it finished."""
    import torch

    from cute_kernels.bench import environment

    settings.validate()
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    ceilings = dict(ceilings or {})
    skipped: list[dict[str, str]] = []
    active: dict[str, Impl] = {}
    for name, impl in impls.items():
        reason = impl.available()
        if reason:
            skipped.append({"case": "*", "impl": name, "reason": reason})
            log(f"  skip {name}: {reason}")
        else:
            active[name] = impl
    now = _dt.datetime.now(_dt.timezone.utc)
    result = BenchResult(
        date=now.strftime("%Y-%m-%d"),
        timestamp=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        device=device_name or environment.device_name(settings.device),
        versions=versions if versions is not None else environment.versions(settings.device),
        suite=suite,
        records=[],
        ceilings=ceilings,
        settings={**asdict(settings), "timer": getattr(timer, "backend", type(timer).__name__),
                  "float32_matmul_precision": "highest"},
        skipped=skipped,
        complete=False,
    )
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # fp32 peers run without TF32
    try:
        for case in cases:
            case.validate()
            log(f"[{suite}] {case.name} {case.dtype}")
            recs, skips = run_case(case, active, timer=timer, settings=settings, ceilings=ceilings, log=log)
            result.records += recs
            result.skipped += skips
            if progress is not None:
                progress(result)
    finally:
        torch.set_float32_matmul_precision(saved)
    result.complete = True
    return result
