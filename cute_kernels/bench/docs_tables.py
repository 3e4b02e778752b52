"""Fill the measured tables in the docs from the committed benchmark results.

A page marks a place for a suite's results with

    <!-- BEGIN GENERATED: results SUITE [impl,impl,...] -->
    ...anything (replaced)...
    <!-- END GENERATED -->

and `python -m cute_kernels.bench.docs_tables docs/*.md` replaces what lies between with the
newest `docs/results/YYYY-MM-DD-SUITE-<device>.json`: where it came from (date, device,
versions), its table (only the listed implementations, if any) and its plot. A `summary` block
(`<!-- BEGIN GENERATED: summary SUITE -->`) stands for the same run in a few lines instead of
the table (what the results index shows for suites whose table is on a topic page). The figures
in the docs are therefore always a run's own output, never typed in.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from cute_kernels.bench.records import BenchResult, load_result, plot_path
from cute_kernels.bench.table import format_table, is_fuzz

_BLOCK = re.compile(
    r"(?P<begin><!-- BEGIN GENERATED: (?P<kind>results|summary|classes) (?P<suite>[\w-]+)(?: (?P<impls>[\w,]+))? -->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- END GENERATED -->)",
    re.DOTALL,
)
_RESULT_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-(?P<suite>[\w]+)-(?P<device>[\w-]+)\.json(\.gz)?$")


def newest_result(results_dir: Path, suite: str) -> Path | None:
    """The newest results file of `suite` (by the date in its name, then its name)."""
    found = [p for p in results_dir.glob(f"*-{suite}-*.json*")
             if (m := _RESULT_NAME.match(p.name)) and m["suite"] == suite]
    return max(found, key=lambda p: p.name) if found else None


def render_block(result: BenchResult, json_path: Path, page: Path, impls: list[str] | None) -> str:
    """The Markdown that stands for `result` on `page` (links relative to the page)."""
    records = [r for r in result.records if impls is None or r.impl in impls]
    versions = ", ".join(f"{k} {v}" for k, v in sorted(result.versions.items()) if v)
    rel = Path(_relpath(json_path, page.parent))
    fuzz = is_fuzz(records)
    by = _made_by(result, fuzz)
    what = ("each problem against a float64 reference, outputs poisoned first; `wrong` counts those "
            "outside the bar, `errors` those that raised" if fuzz
            else "the ratio is to the fastest peer in the same run")
    lines = [
        f"Measured by {by} on {result.device}, {result.date} "
        f"([{rel.name}]({rel.as_posix()})); {versions}. `*` marks ours; {what}.",
        "",
        format_table(records),
    ]
    png = plot_path(json_path)
    if png.exists():
        lines += ["", f"![{result.suite} on {result.device}]({Path(_relpath(png, page.parent)).as_posix()})"]
    return "\n".join(lines) + "\n"


def _made_by(result: BenchResult, fuzz: bool) -> str:
    command = result.settings.get("command")
    return f"`{command}`" if command else ("the GPU tests" if fuzz else f"`cute-kernels bench {result.suite}`")


def render_summary(result: BenchResult, json_path: Path, page: Path) -> str:
    """A few lines standing for `result` on `page`: where it came from, how many cases, and per
    implementation of ours its ratio to the fastest peer (geomean, worst case), then the plot."""
    rel = Path(_relpath(json_path, page.parent))
    cases = {r.case for r in result.records}
    failed = [r for r in result.records if not r.ok]
    lines = [f"{_made_by(result, is_fuzz(result.records))} on {result.device}, {result.date} "
             f"([{rel.name}]({rel.as_posix()})): {len(cases)} case{'s' if len(cases) != 1 else ''}, "
             f"{len(result.records)} records"
             + (f", {len(failed)} failing" if failed else "") + "."]
    for impl in dict.fromkeys(r.impl for r in result.records if r.kind == "ours"):
        ratios = [(r.ratio_to_best_peer, r.case) for r in result.records
                  if r.impl == impl and r.ok and r.ratio_to_best_peer]
        if ratios:
            geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
            worst = min(ratios)
            lines.append(f"- `{impl}`: {geo:.2f}x the fastest peer (geomean of {len(ratios)}), "
                         f"worst {worst[0]:.2f}x ({worst[1]}), best {max(ratios)[0]:.2f}x")
    png = plot_path(json_path)
    if png.exists():
        lines += ["", f"![{result.suite} on {result.device}]({Path(_relpath(png, page.parent)).as_posix()})"]
    return "\n".join(lines) + "\n"


def render_classes(result: BenchResult, json_path: Path, page: Path) -> str:
    """A `gemm_shapes` result by shape class (`model_shapes.shape_class`): per class and
    implementation of ours, the cases, the geomean and worst ratio to the fastest peer, and how
    many cases fall below 0.95x and 1.0x."""
    from cute_kernels.bench.model_shapes import shape_class

    groups: dict = {}
    for r in result.records:
        if r.kind == "ours" and r.ok and r.ratio_to_best_peer:
            groups.setdefault((shape_class(r.case), r.impl), []).append((r.ratio_to_best_peer, r.case))
    rows = []
    for (cls, impl), ratios in sorted(groups.items(), key=lambda kv: min(kv[1])):
        geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
        worst = min(ratios)
        rows.append(f"| {cls} | `{impl}` | {len(ratios)} | {geo:.2f}x | {worst[0]:.2f}x ({worst[1]}) | "
                    f"{sum(x < 0.95 for x, _ in ratios)} | {sum(x < 1.0 for x, _ in ratios)} |")
    rel = Path(_relpath(json_path, page.parent))
    return "\n".join([f"By shape class, from [{rel.name}]({rel.as_posix()}) ({result.device}, {result.date}); "
                      "ratios to the fastest peer, worst class first.", "",
                      "| class | impl | cases | geomean | worst | below 0.95x | below 1.0x |",
                      "| --- | --- | ---: | ---: | --- | ---: | ---: |", *rows]) + "\n"


def _relpath(target: Path, start: Path) -> str:
    import os

    return os.path.relpath(target.resolve(), start.resolve())


def fill_page(page: Path, results_dir: Path) -> tuple[str, list[str]]:
    """The page's text with every generated block filled, and the suites it had no results for."""
    text = page.read_text()
    missing: list[str] = []

    def replace(m: re.Match) -> str:
        path = newest_result(results_dir, m["suite"])
        if path is None:
            missing.append(m["suite"])
            return m.group(0)
        impls = m["impls"].split(",") if m["impls"] else None
        result = load_result(path)
        render = {"summary": render_summary, "classes": render_classes}.get(m["kind"])
        body = render(result, path, page) if render else render_block(result, path, page, impls)
        return m["begin"] + "\n" + body + "\n" + m["end"]

    return _BLOCK.sub(replace, text), missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cute_kernels.bench.docs_tables", description=__doc__.split("\n")[0])
    parser.add_argument("pages", nargs="+", type=Path, help="Markdown pages to fill in place")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), help="the results folder")
    args = parser.parse_args(argv)
    for page in args.pages:
        text, missing = fill_page(page, args.results)
        if text != page.read_text():
            page.write_text(text)
            print(f"filled {page}")
        for suite in missing:
            print(f"{page}: no results for suite {suite!r} in {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
