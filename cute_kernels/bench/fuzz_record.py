"""What every fuzz shares: its report, the allocator poisoning before each case, and its
benchmark record (one `Record` with `cases` and `wrong`, ok when none is), written where the GPU
check collects results (`CUTE_KERNELS_RESULTS_DIR`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FuzzReport", "seed_and_cases", "run_recorded", "poison", "fuzz_result", "write_to_results_dir"]


@dataclass
class FuzzReport:
    cases: int = 0
    wrong: int = 0
    errors: int = 0  # calls that raised (counted in `wrong`)
    worst: float = 0.0  # the worst passing case, in `measure`
    # "rel_err": relative error against float64; "error/bound": each case's error over its own
    # bound (a fuzz whose bar scales with the problem's conditioning; 1 is the bar)
    measure: str = "rel_err"
    seconds: float = 0.0
    seed: int = 0
    failures: list[dict] = field(default_factory=list)  # the first few wrong cases

    def raised(self, exc: BaseException) -> str:
        """Count a case whose call raised (it is wrong too); returns its `why`."""
        self.errors += 1
        return f"{type(exc).__name__}: {exc}"[:300]

    def summary(self, name: str) -> str:
        """One line: cases, wrong (raised), the worst passing case and the time."""
        worst = f"worst passing {self.worst:.3g} of its bar" if self.measure == "error/bound" else \
            f"worst passing rel_err {self.worst:.3g}"
        return f"{name}: {self.cases} cases, {self.wrong} wrong ({self.errors} raised), {worst}, {self.seconds} s"

    def failure_lines(self) -> str:
        """The first few wrong cases, a line each (what a failing test shows)."""
        return "wrong cases (first few):\n" + "\n".join(f"{f['problem']}: {f['why']}" for f in self.failures)

    def tally(self, why: str | None, worst: float, failure, max_failures: int) -> None:
        """Count one checked case's verdict: wrong when `why` says why (`failure()`, the
        description kept, among the first `max_failures`), else passing, its `worst` joining
        the worst passing case."""
        if why is None:
            self.worst = max(self.worst, worst)
            return
        self.wrong += 1
        if len(self.failures) < max_failures:
            self.failures.append(failure())


def seed_and_cases(cases_variable: str, default: int) -> tuple[int, int]:
    """(seed, cases) of a fuzz run: CUTE_KERNELS_FUZZ_SEED, else a fresh seed (print it: it is
    kept in the record too), and the count `cases_variable` sets, else `default`."""
    import random

    cases = int(os.environ.get(cases_variable, str(default)))
    seed = int(os.environ.get("CUTE_KERNELS_FUZZ_SEED", random.SystemRandom().randrange(1 << 30)))
    return seed, cases


def run_recorded(module, cases_variable: str, default: int, label: str) -> tuple[FuzzReport, int]:
    """A GPU fuzz test's run of fuzz module `module` (its `trace`, `run` and `result`): the seed
    and count (`seed_and_cases`), the kernels compiled first in parallel processes
    (`runtime.precompile` of `module:trace`), the run, its record written
    (`write_to_results_dir`), each step printed; returns (report, cases asked)."""
    from cute_kernels.runtime.precompile import precompile

    seed, n = seed_and_cases(cases_variable, default)
    print(f"{label}: seed {seed}, {n} cases")
    print(f"precompiled: {precompile(f'{module.__name__}:trace', seed, n)}")
    report = module.run(seed, n)
    print(report.summary(label))
    write_to_results_dir(module.result(report))
    return report, n


def poison(device, numel: int) -> None:
    """Fill free memory of the caching allocator with NaN, so a result it hands out next
    starts as NaN."""
    import torch

    torch.empty(max(numel, 1 << 20), dtype=torch.float32, device=device).fill_(math.nan)


def fuzz_result(report: FuzzReport, suite: str, impl: str, settings: dict, device: str = "cuda", *,
                command: str, classes: dict[str, tuple[str, FuzzReport]] | None = None):
    """The `suite` BenchResult of `report`, made by `command`: one record of ours with cases,
    wrong, errors, seed, seconds and the first failures; or, with `classes` (case name ->
    (dtype, that class's report)), one such record per class of problems."""
    import datetime

    from .environment import device_name, versions
    from .records import BenchResult, Record

    def record(case: str, dtype: str, r: FuzzReport) -> Record:
        by_ratio = r.measure == "error/bound"
        extra = dict(cases=r.cases, wrong=r.wrong, errors=r.errors, seed=r.seed, seconds=r.seconds,
                     failures=r.failures)
        if by_ratio:
            extra["worst_error_to_bound"] = r.worst
        return Record(case=case, impl=impl, dtype=dtype, tflops=None, ms=None,
                      rel_err=None if by_ratio else r.worst, ok=r.wrong == 0, kind="ours", extra=extra)

    rows = classes if classes is not None else {f"random_{report.cases}": ("mixed", report)}
    now = datetime.datetime.now(datetime.timezone.utc)
    return BenchResult(date=now.strftime("%Y-%m-%d"), timestamp=now.isoformat(timespec="seconds"),
                       device=device_name(device), versions=versions(device), suite=suite,
                       records=[record(case, dtype, r) for case, (dtype, r) in rows.items()],
                       settings={"command": command, "cases": report.cases, "wrong": report.wrong,
                                 "seed": report.seed, **settings})


def write_to_results_dir(result) -> Path | None:
    """Write `result` as <date>-<suite>-<device>.json into $CUTE_KERNELS_RESULTS_DIR (what the GPU
    check brings back into docs/results/); None when the variable is unset."""
    from .records import result_path

    out_dir = os.environ.get("CUTE_KERNELS_RESULTS_DIR")
    if not out_dir:
        return None
    return result.write(result_path(out_dir, result))
