"""The results table: one row per record, as an aligned Markdown table.

Columns: case, dtype, impl, ms, TFLOP/s, GB/s, % of ceiling, ratio to the best peer (× > 1 is
faster), rel_err, spread, and a status (`ok`, or `FAIL` with the error). Records keep their
run order (case by case, ours before peers); a failed record shows `-` for the times.
"""

from __future__ import annotations

from collections.abc import Iterable

from cute_kernels.bench.records import Record

STATUS_WIDTH = 72  # the full error stays in the JSON
HEADERS = ("case", "dtype", "impl", "ms", "TFLOP/s", "GB/s", "% ceil", "vs best peer", "rel_err", "spread", "status")


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def row(r: Record) -> tuple[str, ...]:
    """The cells of one record (see the module docstring for the columns)."""
    impl = r.impl + ("*" if r.kind == "ours" else "")
    tflops = _num(r.tflops, ".1f") if (r.flops or 0) > 0 else "-"
    error = r.error or "wrong result"
    status = "ok" if r.ok else "FAIL: " + (error if len(error) <= STATUS_WIDTH else error[: STATUS_WIDTH - 3] + "...")
    ratio = "-" if r.ratio_to_best_peer is None else f"{r.ratio_to_best_peer:.2f}x"
    spread = "-" if r.spread is None else f"{100 * r.spread:.1f}%"
    return (r.case, r.dtype, impl, _num(r.ms, ".4f"), tflops, _num(r.gbps, ".0f"),
            _num(r.pct_ceiling, ".1f"), ratio, _num(r.rel_err, ".1e"), spread, status)


FUZZ_HEADERS = ("case", "dtype", "impl", "cases", "wrong", "errors", "worst rel_err", "worst error/bound", "seed")


def is_fuzz(records: Iterable[Record]) -> bool:
    """A fuzz run's records count problems (`cases`, `wrong`) instead of timing one."""
    records = list(records)
    return bool(records) and all("wrong" in r.extra and r.ms is None for r in records)


def fuzz_row(r: Record) -> tuple[str, ...]:
    """The cells of one fuzz record: how many problems ran, how many were wrong or raised, and
    the worst passing one (as a relative error, or as its error over its own bound)."""
    impl = r.impl + ("*" if r.kind == "ours" else "")
    seed = r.extra.get("seed")
    return (r.case, r.dtype, impl, str(r.extra.get("cases", "-")), str(r.extra["wrong"]),
            str(r.extra.get("errors", 0)), _num(r.rel_err, ".1e"), _num(r.extra.get("worst_error_to_bound"), ".2f"),
            "-" if seed is None else str(seed))


def format_table(records: Iterable[Record]) -> str:
    """A Markdown table with aligned columns; `*` marks our implementations. Fuzz records get
    their own columns (`FUZZ_HEADERS`)."""
    records = list(records)
    if is_fuzz(records):
        headers, rows, numeric = FUZZ_HEADERS, [fuzz_row(r) for r in records], {3, 4, 5, 6, 7, 8}
    else:
        headers, rows, numeric = HEADERS, [row(r) for r in records], {3, 4, 5, 6, 7, 8, 9}
    rows = [headers] + rows
    widths = [max(len(rw[i]) for rw in rows) for i in range(len(headers))]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in numeric else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if i in numeric else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(rows[0]), sep] + [line(rw) for rw in rows[1:]])
