"""What every fuzz shares: its report, the allocator poisoning before each case, and its
benchmark record (one `Record` with `cases` and `wrong`, ok when none is), written where the GPU
check collects results (`CUTE_KERNELS_RESULTS_DIR`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FuzzReport", "poison", "fuzz_result", "write_to_results_dir"]


@dataclass
class FuzzReport:
    cases: int = 0
    wrong: int = 0
    errors: int = 0  # calls that raised (counted in `wrong`)
    worst: float = 0.0
    seconds: float = 0.0
    seed: int = 0
    failures: list[dict] = field(default_factory=list)  # the first few wrong cases


def poison(device, numel: int) -> None:
    """Fill free memory of the caching allocator with NaN, so a result it hands out next
    starts as NaN."""
    import torch

    torch.empty(max(numel, 1 << 20), dtype=torch.float32, device=device).fill_(math.nan)


def fuzz_result(report: FuzzReport, suite: str, impl: str, settings: dict, device: str = "cuda"):
    """The `suite` BenchResult of `report`: one record of ours with cases, wrong, errors, seed,
    seconds and the first failures."""
    import datetime

    from .environment import device_name, versions
    from .records import BenchResult, Record

    rec = Record(case=f"random_{report.cases}", impl=impl, dtype="mixed", tflops=None, ms=None,
                 rel_err=report.worst, ok=report.wrong == 0, kind="ours",
                 extra=dict(cases=report.cases, wrong=report.wrong, errors=report.errors, seed=report.seed,
                            seconds=report.seconds, failures=report.failures))
    now = datetime.datetime.now(datetime.timezone.utc)
    return BenchResult(date=now.strftime("%Y-%m-%d"), timestamp=now.isoformat(timespec="seconds"),
                       device=device_name(device), versions=versions(device), suite=suite, records=[rec],
                       settings=settings)


def write_to_results_dir(result) -> Path | None:
    """Write `result` as <date>-<suite>-<device>.json into $CUTE_KERNELS_RESULTS_DIR (what the GPU
    check brings back into docs/results/); None when the variable is unset."""
    from .records import result_stem

    out_dir = os.environ.get("CUTE_KERNELS_RESULTS_DIR")
    if not out_dir:
        return None
    path = Path(out_dir) / (result_stem(result.date, result.suite, result.device) + ".json")
    result.write(path)
    return path
