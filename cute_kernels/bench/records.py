"""Benchmark records and the result file: one JSON object per run of one suite.

A result is `{"date", "device", "versions", "suite", "records", ...}` where `records` holds one
`Record` per (case, implementation). The required record keys are `case`, `impl`, `dtype`,
`tflops`, `ms`, `rel_err`; the rest (`ok`, `kind`, `gbps`, `spread`, `pct_ceiling`,
`ratio_to_best_peer`, ...) are extras that the table, the plot and `--compare` use.

Files are written as strict JSON (no NaN): a value that is not a finite number is written as
`null`. A record whose implementation failed its correctness check has `ok: false`, its
`rel_err` (or `null` when the output was not finite or the call raised, with `error` saying
which), and `ms`/`tflops` null: it was not timed.

This module imports neither torch nor the DSL, so results can be read, validated and compared
on any machine.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
REQUIRED_RESULT_KEYS = ("date", "device", "versions", "suite", "records")
REQUIRED_RECORD_KEYS = ("case", "impl", "dtype", "tflops", "ms", "rel_err")
KINDS = ("ours", "peer")


@dataclass
class Record:
    """One (case, implementation) measurement.

    `ms` is the median over interleaved rounds of each round's median time per call; `spread`
    is (p80 - p20) / median over those rounds, the run-to-run noise `--compare` uses as its
    threshold. `ok` is False when the output missed the case's tolerance against the float32
    reference (then `ms`, `tflops` are None: the case was not timed).
    """

    case: str
    impl: str
    dtype: str
    tflops: float | None
    ms: float | None
    rel_err: float | None
    ok: bool = True
    kind: str = "peer"
    tolerance: float | None = None
    flops: float | None = None
    bytes: float | None = None
    gbps: float | None = None
    spread: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    rounds: int | None = None
    pct_ceiling: float | None = None
    ratio_to_best_peer: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        """(case, impl, dtype): what identifies a record across runs."""
        return (self.case, self.impl, self.dtype)

    @property
    def timed(self) -> bool:
        return self.ok and self.ms is not None

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        d.update(self.extra)
        return {k: _finite_or_none(v) for k, v in d.items() if v is not None or k in REQUIRED_RECORD_KEYS}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**known, extra=extra)


@dataclass
class BenchResult:
    """A whole run of one suite: what `--json` writes and `--compare` reads."""

    date: str
    device: str
    versions: dict[str, Any]
    suite: str
    records: list[Record]
    device_slug: str = ""
    timestamp: str = ""
    ceilings: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    complete: bool = True  # False in the files written after each case while a run is going on

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "date": self.date,
            "timestamp": self.timestamp,
            "device": self.device,
            "device_slug": self.device_slug or device_slug(self.device),
            "versions": self.versions,
            "suite": self.suite,
            "ceilings": {k: _finite_or_none(v) for k, v in self.ceilings.items()},
            "settings": self.settings,
            "records": [r.to_dict() for r in self.records],
            "skipped": self.skipped,
            "complete": self.complete,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchResult:
        validate_result(d)
        return cls(
            date=d["date"],
            device=d["device"],
            versions=dict(d["versions"]),
            suite=d["suite"],
            records=[Record.from_dict(r) for r in d["records"]],
            device_slug=d.get("device_slug", ""),
            timestamp=d.get("timestamp", ""),
            ceilings=dict(d.get("ceilings") or {}),
            settings=dict(d.get("settings") or {}),
            skipped=list(d.get("skipped") or []),
            complete=bool(d.get("complete", True)),
        )

    def write(self, path: str | Path) -> Path:
        """Write strict JSON (validated first), gzip-compressed when `path` ends in .gz;
        returns the path. The file replaces its other form (X.json for X.json.gz and the other
        way round): a run that writes as it goes (`result_path` picks the form by size) leaves
        one file."""
        path = Path(path)
        data = self.to_dict()
        validate_result(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = dumps_result(data)
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(text.encode(), mtime=0))  # mtime 0: same result, same bytes
            other = path.with_suffix("")
        else:
            path.write_text(text)
            other = path.with_name(path.name + ".gz")
        if other.name.endswith(RESULT_SUFFIXES) and other.is_file():
            other.unlink()
        return path


# A result whose JSON is larger than this is stored compressed under docs/results/ (the tracked
# tree has a size cap; records compress about threefold to fivefold).
GZIP_ABOVE = 2_000
RESULT_SUFFIXES = (".json", ".json.gz")


def result_path(out_dir: str | Path, result: BenchResult) -> Path:
    """Where `result` goes in a results directory: <date>-<suite>-<device>.json, or .json.gz
    when its JSON is larger than `GZIP_ABOVE` bytes."""
    big = len(dumps_result(result.to_dict())) > GZIP_ABOVE
    return Path(out_dir) / (result_stem(result.date, result.suite, result.device) + RESULT_SUFFIXES[big])


def plot_path(json_path: str | Path) -> Path:
    """The plot beside a result file: the same stem (without .json or .json.gz), .png."""
    path = Path(json_path)
    name = path.name
    for suffix in sorted(RESULT_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return path.with_name(name[: -len(suffix)] + ".png")
    return path.with_suffix(".png")


def _rounded(value):
    """Measured floats to 5 significant digits, inside dicts and lists too: a measurement's
    spread is ~1%, and the 17 digits of a double are two fifths of a result file (compressed).
    Whole numbers (counted FLOPs and bytes) stay exact."""
    if isinstance(value, float):
        return value if value.is_integer() else float(f"{value:.5g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def dumps_result(data: dict) -> str:
    """Strict JSON of a result: the header indented, one record a line (a diff shows which
    records changed; about 16% smaller than indenting every field); record floats rounded
    (`_rounded`)."""
    head = json.dumps({k: v for k, v in data.items() if k != "records"}, indent=1, allow_nan=False)
    records = ",\n".join("  " + json.dumps(_rounded(r), allow_nan=False, separators=(",", ":"))
                          for r in data["records"])
    return f'{head[:-2]},\n "records": [\n{records}\n ]\n}}\n'  # head ends with "\n}"


def load_result(path: str | Path) -> BenchResult:
    """Read and validate a result file; raises ValueError naming the file and the problem."""
    path = Path(path)
    try:
        data = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    try:
        return BenchResult.from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


def merge_results(newer: BenchResult, older: BenchResult) -> BenchResult:
    """`newer` with the cases it did not run taken from `older`, a run of the same suite on
    the same kind of device: what a partial re-run (a few models, a subset of shapes) leaves
    when the rest of the suite still stands. A case is taken whole (every implementation's
    record) from one run, so each ratio stays a same-process comparison. A record brought over
    carries `measured` (its run's timestamp, else its date) unless it has one already;
    `settings["merged"]` lists each run merged in (date, timestamp, versions, cases). Raises
    ValueError for another suite or device."""
    if newer.suite != older.suite:
        raise ValueError(f"cannot merge a {older.suite!r} result into a {newer.suite!r} one")
    new_slug, old_slug = newer.device_slug or device_slug(newer.device), older.device_slug or device_slug(older.device)
    if new_slug != old_slug:
        raise ValueError(f"cannot merge a result from {older.device!r} into one from {newer.device!r}")
    ran = {r.case for r in newer.records} | {s.get("case") for s in newer.skipped}
    when = older.timestamp or older.date
    kept = [dataclasses.replace(r, extra={"measured": when, **r.extra}) for r in older.records
            if r.case not in ran]
    cases = list(dict.fromkeys(r.case for r in kept))
    settings = dict(newer.settings)
    if cases:
        settings["merged"] = [*settings.get("merged", []), *older.settings.get("merged", []),
                              {"date": older.date, "timestamp": older.timestamp, "versions": older.versions,
                               "cases": len(cases)}]
    skipped = newer.skipped + [s for s in older.skipped if s.get("case") not in ran and s.get("case") not in cases]
    return dataclasses.replace(newer, records=newer.records + kept, settings=settings, skipped=skipped)


def validate_result(d: Any) -> None:
    """Raise ValueError naming the first problem if `d` is not a valid result object.

    Post-condition when it returns: every required key is present with the right type; every
    record has the required keys; timed records (ok true, ms not null) have positive finite
    `ms` and a finite non-negative `tflops`; (case, impl, dtype) is unique.
    """
    if not isinstance(d, dict):
        raise ValueError(f"result must be a JSON object, got {type(d).__name__}")
    missing = [k for k in REQUIRED_RESULT_KEYS if k not in d]
    if missing:
        raise ValueError(f"result lacks keys {missing}")
    for key in ("date", "device", "suite"):
        if not isinstance(d[key], str) or not d[key]:
            raise ValueError(f"result key {key!r} must be a non-empty string, got {d[key]!r}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", d["date"]):
        raise ValueError(f"result date must be YYYY-MM-DD, got {d['date']!r}")
    if not isinstance(d["versions"], dict):
        raise ValueError("result key 'versions' must be an object")
    if not isinstance(d["records"], list):
        raise ValueError("result key 'records' must be a list")
    seen: set[tuple] = set()
    for i, r in enumerate(d["records"]):
        where = f"record {i}"
        if not isinstance(r, dict):
            raise ValueError(f"{where} must be an object")
        missing = [k for k in REQUIRED_RECORD_KEYS if k not in r]
        if missing:
            raise ValueError(f"{where} ({r.get('case')}, {r.get('impl')}) lacks keys {missing}")
        for key in ("case", "impl", "dtype"):
            if not isinstance(r[key], str) or not r[key]:
                raise ValueError(f"{where}: {key!r} must be a non-empty string, got {r[key]!r}")
        for key in ("tflops", "ms", "rel_err"):
            v = r[key]
            if v is not None and (not _is_number(v) or not math.isfinite(v)):
                raise ValueError(f"{where} ({r['case']}, {r['impl']}): {key!r} must be a finite number or null, got {v!r}")
        ok = r.get("ok", True)
        if not isinstance(ok, bool):
            raise ValueError(f"{where}: 'ok' must be a boolean, got {ok!r}")
        if ok and r["ms"] is not None:
            if r["ms"] <= 0:
                raise ValueError(f"{where} ({r['case']}, {r['impl']}): 'ms' must be positive, got {r['ms']}")
            if r["tflops"] is None or r["tflops"] < 0:
                raise ValueError(f"{where} ({r['case']}, {r['impl']}): a timed record needs tflops >= 0, got {r['tflops']}")
        if r.get("kind", "peer") not in KINDS:
            raise ValueError(f"{where}: 'kind' must be one of {KINDS}, got {r.get('kind')!r}")
        key = (r["case"], r["impl"], r["dtype"])
        if key in seen:
            raise ValueError(f"{where}: duplicate record for {key}")
        seen.add(key)


def device_slug(device_name: str) -> str:
    """A short file-name slug for a device name: 'NVIDIA H200' -> 'h200', 'cpu' -> 'cpu'.

    The first token that contains a digit after dropping the vendor words, lowercased and
    reduced to [a-z0-9-]; the whole name slugified when no token has a digit.
    """
    words = [w for w in re.split(r"[\s_]+", device_name.strip()) if w]
    words = [w for w in words if w.lower() not in ("nvidia", "geforce", "tesla")]
    pick = next((w for w in words if re.search(r"\d", w)), "-".join(words) or "unknown")
    slug = re.sub(r"[^a-z0-9]+", "-", pick.lower()).strip("-")
    return slug or "unknown"


def result_stem(date: str, suite: str, device: str) -> str:
    """`YYYY-MM-DD-<suite>-<device slug>`: the file name stem under docs/results/."""
    return f"{date}-{suite}-{device_slug(device)}"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
