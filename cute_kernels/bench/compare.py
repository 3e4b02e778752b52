"""Compare a run against a committed earlier one: which cases got slower beyond the noise.

A record pair is matched on (case, impl, dtype). With slowdown = new.ms / old.ms - 1, a
*regression* is a slowdown above the threshold max(old.spread, new.spread, floor): the
run-to-run spread each run measured for itself (p80 - p20 over the median of its rounds),
never less than `floor`. A pair whose new record failed correctness while the old one passed is
a regression whatever the times. Records present on one side only are listed, not flagged.
"""

from __future__ import annotations

from dataclasses import dataclass

from cute_kernels.bench.records import BenchResult, Record


@dataclass(frozen=True)
class Change:
    case: str
    impl: str
    dtype: str
    old_ms: float | None
    new_ms: float | None
    slowdown: float | None  # new/old - 1; positive is slower
    threshold: float | None
    regression: bool
    reason: str

    def line(self) -> str:
        mark = "REGRESSION" if self.regression else "ok"
        if self.slowdown is None:
            return f"{mark:10s} {self.case} {self.impl} {self.dtype}: {self.reason}"
        return (f"{mark:10s} {self.case} {self.impl} {self.dtype}: {self.old_ms:.4f} -> {self.new_ms:.4f} ms "
                f"({self.slowdown:+.1%}, threshold {self.threshold:.1%})")


@dataclass(frozen=True)
class Comparison:
    changes: tuple[Change, ...]
    only_old: tuple[tuple[str, str, str], ...]
    only_new: tuple[tuple[str, str, str], ...]

    @property
    def regressions(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.regression)

    def report(self) -> str:
        lines = [c.line() for c in self.changes]
        lines += [f"{'gone':10s} {' '.join(k)}: in the old run only" for k in self.only_old]
        lines += [f"{'new':10s} {' '.join(k)}: in the new run only" for k in self.only_new]
        lines.append(f"{len(self.regressions)} regression(s) in {len(self.changes)} matched record(s)")
        return "\n".join(lines)


def _spread(r: Record) -> float:
    return r.spread if r.spread is not None and r.spread >= 0 else 0.0


def compare_records(old: list[Record], new: list[Record], *, floor: float = 0.0) -> Comparison:
    """Match records on (case, impl, dtype) and flag regressions (see the module docstring)."""
    if floor < 0:
        raise ValueError(f"compare floor must be >= 0, got {floor}")
    old_by = {r.key: r for r in old}
    new_by = {r.key: r for r in new}
    changes = []
    for key, n in new_by.items():
        o = old_by.get(key)
        if o is None:
            continue
        if o.ok and not n.ok:
            changes.append(Change(*key, o.ms, None, None, None, True,
                                  f"now fails correctness (rel_err {n.rel_err}, {n.error})"))
            continue
        if not (o.timed and n.timed):
            changes.append(Change(*key, o.ms, n.ms, None, None, False, "not timed in both runs"))
            continue
        slowdown = n.ms / o.ms - 1.0
        threshold = max(_spread(o), _spread(n), floor)
        changes.append(Change(*key, o.ms, n.ms, slowdown, threshold, slowdown > threshold, ""))
    only_old = tuple(k for k in old_by if k not in new_by)
    only_new = tuple(k for k in new_by if k not in old_by)
    return Comparison(tuple(changes), only_old, only_new)


def compare_results(old: BenchResult, new: BenchResult, *, floor: float = 0.0) -> Comparison:
    """compare_records on two results; raises ValueError if they are different suites."""
    if old.suite != new.suite:
        raise ValueError(f"cannot compare suite {new.suite!r} against a run of suite {old.suite!r}")
    return compare_records(old.records, new.records, floor=floor)
