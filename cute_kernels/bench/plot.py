"""Plots of a result: a grouped bar chart and a roofline, side by side in one small PNG.

- left: per case, one bar per implementation (TFLOP/s; GB/s for a suite without FLOPs, e.g.
  `copy`, or a memory-bound one in `BANDWIDTH_SUITES`, e.g. `decode`), the dashed line at the
  measured ceiling when it is known; above `MANY_CASES` cases, our ratio to the fastest peer
  per case, sorted, instead;
- right: the roofline, log-log: arithmetic intensity (FLOP/byte of compulsory traffic) against
  TFLOP/s, one marker per timed record, with the measured math ceiling(s) and the HBM slope.
  For a suite without FLOPs: GB/s against transfer size, with the bandwidth ceiling.

Rendered with matplotlib's Agg backend, then quantized to a `PALETTE_COLORS` palette and written as
an optimized PNG, so a plot stays under `MAX_PNG_BYTES` (the DPI is lowered until it does).
"""

from __future__ import annotations

import io
from pathlib import Path

from cute_kernels.bench.ceilings import HBM_KEY
from cute_kernels.bench.records import BenchResult

MAX_PNG_BYTES = 200_000
# A plot's few colours and their anti-aliased edges fit a small palette: 64 entries made the
# results' plots 18% smaller than 256, and 32 (with 84 dpi, from 90) another 20% (the tracked
# tree has a size cap; 2026-12-05).
PALETTE_COLORS = 32
# Suites with FLOPs whose bars are GB/s against the HBM ceiling: memory-bound by design. The
# fused suite's records have no FLOPs but one (the linear + cross-entropy), so it is listed too,
# and its right pane is GB/s against traffic, as a suite without FLOPs draws it.
BANDWIDTH_SUITES = frozenset({"decode", "fused"})
# Above this many cases the left pane draws ratios to the fastest peer, sorted, instead of bars.
MANY_CASES = 40


def _figure(result: BenchResult):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    timed = [r for r in result.records if r.timed]
    cases = list(dict.fromkeys(f"{r.case}\n{r.dtype}" for r in result.records))
    impls = list(dict.fromkeys(r.impl for r in result.records))
    without_flops = [(r.flops or 0) <= 0 for r in result.records]
    gbps_bars = (all(without_flops) and bool(without_flops)) or result.suite in BANDWIDTH_SUITES
    memory_suite = gbps_bars and any(without_flops)  # the right pane: GB/s against traffic, not a roofline
    ceil = result.ceilings
    colors = plt.get_cmap("tab10")

    if result.suite == "overhead":
        return _host_figure(result, plt)
    fig, (bars, roof) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    if len(cases) > MANY_CASES:
        _ratio_pane(bars, result, colors)
    else:
        _bar_pane(bars, result, cases, impls, timed, gbps_bars, colors)

    if memory_suite:
        copy = result.suite == "copy"
        size = (lambda r: r.bytes / 2 / 2**20) if copy else (lambda r: r.bytes / 2**20)  # a copy moves its size twice
        sizes = sorted({size(r) for r in timed})
        for j, impl in enumerate(impls):
            pts = sorted((size(r), r.gbps) for r in timed if r.impl == impl)
            if pts:
                # a copy's sizes are one curve; other suites' records are different ops: points only
                roof.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if copy else "o", color=colors(j % 10),
                          label=impl)
        if isinstance(ceil.get(HBM_KEY), (int, float)):
            roof.axhline(ceil[HBM_KEY], ls="--", color="gray", lw=1, label="HBM ceiling")
        roof.set_xscale("log")
        if copy and sizes:  # a few sizes: each one its tick
            roof.minorticks_off()
            roof.set_xticks(sizes)
            roof.set_xticklabels([f"{x:g}" for x in sizes])
        else:
            roof.tick_params(axis="x", which="minor", labelbottom=False)
        roof.set_xlabel("copy size (MiB)" if copy else "compulsory traffic (MiB)")
        roof.set_ylabel("GB/s")
        roof.set_title("bandwidth", fontsize=10)
    else:
        intensities = [r.flops / r.bytes for r in timed if r.bytes]
        lo = min(intensities + [1.0]) / 2
        hi = max(intensities + [1e1 if gbps_bars else 1e3]) * 2
        bw = ceil.get(HBM_KEY)
        for key in sorted({r.dtype for r in result.records}):
            math_rate = ceil.get(key)
            if isinstance(math_rate, (int, float)):
                xs = [lo, hi]
                if isinstance(bw, (int, float)):
                    knee = math_rate * 1e3 / bw
                    xs = sorted({lo, min(max(knee, lo), hi), hi})
                    ys = [min(math_rate, x * bw / 1e3) for x in xs]
                else:
                    ys = [math_rate, math_rate]
                roof.plot(xs, ys, "--", lw=1, color="gray")
                roof.text(hi, math_rate, f"{key} {math_rate:.0f}", fontsize=7, ha="right", va="bottom", color="gray")
        if isinstance(bw, (int, float)) and not any(isinstance(ceil.get(r.dtype), (int, float))
                                                    for r in result.records):
            # only the bandwidth was measured (a memory-bound suite): draw the HBM slope alone
            roof.plot([lo, hi], [lo * bw / 1e3, hi * bw / 1e3], "--", lw=1, color="gray", label="HBM ceiling")
        for j, impl in enumerate(impls):
            pts = [(r.flops / r.bytes, r.tflops) for r in timed if r.impl == impl and r.bytes]
            if pts:
                roof.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, color=colors(j % 10), label=impl)
        roof.set_xscale("log")
        roof.set_yscale("log")
        roof.set_xlabel("arithmetic intensity (FLOP/byte)")
        roof.set_ylabel("TFLOP/s")
        roof.set_title("roofline (measured ceilings)", fontsize=10)
    roof.grid(alpha=0.3, which="both")
    if roof.get_legend_handles_labels()[0]:
        roof.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _bar_pane(bars, result: BenchResult, cases: list, impls: list, timed: list, gbps_bars: bool, colors) -> None:
    """Per case, one bar per implementation, the measured ceiling dashed."""
    ceil = result.ceilings
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        xs, ys = [], []
        for r in timed:
            if r.impl == impl:
                xs.append(cases.index(f"{r.case}\n{r.dtype}") - 0.4 + width * (j + 0.5))
                ys.append(r.gbps if gbps_bars else r.tflops)
        if xs:
            bars.bar(xs, ys, width=width, label=impl, color=colors(j % 10))
    for r in result.records:
        if not r.ok:
            x = cases.index(f"{r.case}\n{r.dtype}") - 0.4 + width * (impls.index(r.impl) + 0.5)
            bars.text(x, 0, "✗", ha="center", va="bottom", color="red", fontsize=9)
    ref_key = HBM_KEY if gbps_bars else (result.records[0].dtype if result.records else None)
    if ref_key and isinstance(ceil.get(ref_key), (int, float)):
        bars.axhline(ceil[ref_key], ls="--", color="gray", lw=1)
        bars.text(len(cases) - 0.5, ceil[ref_key], f" ceiling {ceil[ref_key]:.0f}", va="bottom", ha="right",
                  fontsize=7, color="gray")
    bars.set_xlim(-0.5, len(cases) - 0.5)
    bars.set_xticks(range(len(cases)))
    bars.set_xticklabels(cases, fontsize=7, rotation=30, ha="right")
    bars.set_ylabel("GB/s" if gbps_bars else "TFLOP/s")
    bars.set_title(f"{result.suite} on {result.device} ({result.date})", fontsize=10)
    bars.legend(fontsize=7, ncol=2)
    bars.grid(axis="y", alpha=0.3)


def _ratio_pane(ax, result: BenchResult, colors) -> None:
    """Too many cases for bars: each of our implementations' ratio to the fastest peer, one
    point per case, sorted, so the share of cases below 1.0x (and 0.95x) reads off the curve."""
    ours = list(dict.fromkeys(r.impl for r in result.records if r.kind == "ours"))
    for j, impl in enumerate(ours):
        ratios = sorted(r.ratio_to_best_peer for r in result.records
                        if r.impl == impl and r.timed and r.ratio_to_best_peer is not None)
        if ratios:
            ax.plot(range(len(ratios)), ratios, ".", ms=3, color=colors(j % 10), label=f"{impl} ({len(ratios)} cases)")
    for y, style in ((1.0, "-"), (0.95, ":")):
        ax.axhline(y, ls=style, color="gray", lw=1)
    ax.set_xlabel("cases, sorted by ratio")
    ax.set_ylabel("ours / fastest peer (speed)")
    ax.set_title(f"{result.suite} on {result.device} ({result.date})", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _host_figure(result: BenchResult, plt):
    """The overhead suite: host microseconds per call, one bar per (case, impl)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    timed = [r for r in result.records if r.timed]
    labels = [f"{r.case}\n{r.impl}" for r in timed]
    colors = ["tab:orange" if r.kind == "ours" else "tab:blue" for r in timed]
    ax.bar(range(len(timed)), [r.ms * 1e3 for r in timed], color=colors)
    ax.set_xticks(range(len(timed)))
    ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("host µs per call (lower is better)")
    ax.set_title(f"host overhead on {result.device} ({result.date}); orange: ours", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_result(result: BenchResult, path: str | Path, *, max_bytes: int = MAX_PNG_BYTES) -> Path:
    """Draw `result` (see the module docstring) to a PNG at `path`; returns the path.

    Post-condition: the file is a PNG no larger than `max_bytes`; raises RuntimeError if even
    the lowest resolution tried is larger."""
    return save_png(_figure(result), path, max_bytes=max_bytes, what=f"plot of {result.suite}")


def save_png(fig, path: str | Path, *, max_bytes: int = MAX_PNG_BYTES, what: str = "figure",
             dpis: tuple[int, ...] = (84, 72, 56)) -> Path:
    """Write matplotlib figure `fig` as a `PALETTE_COLORS`-colour palette PNG of at most
    `max_bytes` (the first of `dpis` that fits), close it, and return the path; RuntimeError if
    none fits."""
    import matplotlib.pyplot as plt

    try:
        from PIL import Image
    except ImportError:  # matplotlib writes PNGs itself; only the palette compression is lost
        Image = None

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        for dpi in dpis:
            raw = io.BytesIO()
            fig.savefig(raw, format="png", dpi=dpi, metadata={"Software": None})
            packed = raw
            if Image is not None:
                raw.seek(0)
                image = Image.open(raw).convert("RGB").quantize(colors=PALETTE_COLORS,
                                                                   method=Image.Quantize.MEDIANCUT)
                packed = io.BytesIO()
                image.save(packed, format="PNG", optimize=True)
            if packed.tell() <= max_bytes:
                path.write_bytes(packed.getvalue())
                return path
    finally:
        plt.close(fig)
    raise RuntimeError(f"{what} stays above {max_bytes} bytes even at {dpi} dpi")
