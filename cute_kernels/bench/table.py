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


def format_table(records: Iterable[Record]) -> str:
    """A Markdown table with aligned columns; `*` marks our implementations."""
    rows = [HEADERS] + [row(r) for r in records]
    widths = [max(len(rw[i]) for rw in rows) for i in range(len(HEADERS))]
    numeric = {3, 4, 5, 6, 7, 8, 9}

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in numeric else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if i in numeric else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(rows[0]), sep] + [line(rw) for rw in rows[1:]])
