"""Where a GPU step idles: its kernel timeline read from a torch.profiler trace.

    gaps = gpu_gaps(trace)           # trace: the dict of prof.export_chrome_trace's JSON
    print(format_gaps(gaps))

A step whose kernels sum to less than its wall time spends the difference with the GPU idle,
waiting on the host (a launch path slower than the kernels it launches) or on a
synchronization (a device-to-host copy, an event wait). `gpu_gaps` finds each idle interval
between kernels (the union over streams, so overlapping streams count once) and charges it to
the launch that ended it: the kernel that ran next, the CPU op and the Python function that
enclosed its launch call on the host (innermost of each, when the trace recorded them:
`with_stack=True` gives the Python frames). A gap whose next kernel was launched after the
previous kernel finished is host-bound (`late`): the GPU had nothing queued. Host calls that
waited on the device (`*Synchronize`, blocking copies) are listed with their duration.

Pure Python over the trace's events: no torch import, testable on any machine.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

__all__ = ["Gap", "GapReport", "gpu_gaps", "format_gaps"]

_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
_SYNC_NAMES = ("Synchronize", "cudaMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD")


@dataclass(frozen=True)
class Gap:
    """One idle interval (µs) before `kernel`, whose launch ran in `op` / `py` on the host."""

    start_us: float
    us: float
    kernel: str
    op: str
    py: str
    late: bool  # the launch came after the GPU went idle: the host was behind


@dataclass
class GapReport:
    busy_us: float  # union of GPU activity
    span_us: float  # first kernel start to last kernel end
    gaps: list[Gap] = field(default_factory=list)
    syncs: list[tuple[str, float, str]] = field(default_factory=list)  # (call, µs, enclosing op)

    @property
    def idle_us(self) -> float:
        return sum(g.us for g in self.gaps)

    def by_launcher(self, top: int = 12) -> list[tuple[str, float, int]]:
        """[(op | py, idle µs, gaps)] summed over gaps, largest first."""
        acc: dict[str, list] = defaultdict(lambda: [0.0, 0])
        for g in self.gaps:
            a = acc[f"{g.op} | {g.py}"]
            a[0] += g.us
            a[1] += 1
        return sorted(((k, v[0], v[1]) for k, v in acc.items()), key=lambda t: -t[1])[:top]


def gpu_gaps(trace: dict, min_gap_us: float = 2.0) -> GapReport:
    """The idle intervals of at least `min_gap_us` between the GPU activities of `trace` (a
    chrome trace as torch.profiler exports it), each charged to the launch that ended it."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    gpu = sorted((e for e in events if e.get("cat") in _GPU_CATS), key=lambda e: float(e["ts"]))
    if not gpu:
        return GapReport(busy_us=0.0, span_us=0.0)
    launches = {}
    for e in events:
        if e.get("cat") in _LAUNCH_CATS:
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                launches[c] = e
    hosts = defaultdict(list)  # (tid, cat) -> host events sorted by start (cpu ops, Python frames)
    for e in events:
        if e.get("cat") in ("cpu_op", "python_function", "user_annotation"):
            hosts[e.get("tid"), e.get("cat")].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e))
    for v in hosts.values():
        v.sort(key=lambda x: x[0])
    starts = {k: [x[0] for x in v] for k, v in hosts.items()}

    def enclosing(launch, cat: str) -> str:
        """The innermost `cat` event around the launch: host events nest, so of those holding
        its time the latest to start."""
        key, t = (launch.get("tid"), cat), float(launch["ts"])
        row = hosts.get(key, ())
        for i in range(bisect.bisect_right(starts.get(key, ()), t) - 1, -1, -1):
            if row[i][1] >= t:
                return str(row[i][2].get("name", "?"))[:80]
        return "-"

    report = GapReport(busy_us=0.0, span_us=0.0)
    first = float(gpu[0]["ts"])
    busy_until = first
    for e in gpu:
        ts, dur = float(e["ts"]), float(e.get("dur", 0))
        if ts - busy_until >= min_gap_us:
            launch = launches.get((e.get("args") or {}).get("correlation"))
            op = py = "-"
            late = False
            if launch is not None:
                op, py = enclosing(launch, "cpu_op"), enclosing(launch, "python_function")
                late = float(launch["ts"]) >= busy_until
            report.gaps.append(Gap(busy_until, ts - busy_until, str(e.get("name", "?"))[:80], op, py, late))
        if ts + dur > busy_until:
            report.busy_us += ts + dur - max(ts, busy_until)
            busy_until = ts + dur
    report.span_us = busy_until - first
    for e in events:
        if e.get("cat") in _LAUNCH_CATS and any(s in str(e.get("name", "")) for s in _SYNC_NAMES):
            report.syncs.append((str(e["name"]), float(e.get("dur", 0)), enclosing(e, "cpu_op")))
    report.syncs.sort(key=lambda s: -s[1])
    return report


def format_gaps(report: GapReport, top: int = 12) -> str:
    """A few lines: busy against span, idle time by launcher, the longest gaps, the syncs."""
    late = sum(g.us for g in report.gaps if g.late)
    lines = [f"GPU busy {report.busy_us / 1e3:.3f} ms of a {report.span_us / 1e3:.3f} ms span; idle "
             f"{report.idle_us / 1e3:.3f} ms in {len(report.gaps)} gaps ({late / 1e3:.3f} ms host-bound: "
             f"launched after the GPU went idle)"]
    for who, us, n in report.by_launcher(top):
        lines.append(f"    idle {us / 1e3:8.3f} ms {n:5d} gaps before launches from {who}")
    for g in sorted(report.gaps, key=lambda g: -g.us)[:top // 2]:
        lines.append(f"    gap {g.us:8.1f} us{' (late)' if g.late else ''} before {g.kernel} | {g.op} | {g.py}")
    for name, us, op in report.syncs[:top // 2]:
        lines.append(f"    sync {name} {us:.1f} us in {op}")
    return "\n".join(lines)
