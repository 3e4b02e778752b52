"""Table and plot of result files already written, e.g. ones brought back from a GPU machine
that has no matplotlib:

    python -m cute_kernels.bench.report docs/results/2026-11-30-gemm-h200.json [...]
    python -m cute_kernels.bench.report new.json --compare old.json

For each file: validate it, print its table, and write the plot of the same stem beside it
(unless --no-plot). With --compare, also compare it against the earlier run of the same suite.
Exit status: 0, or 3 when --compare found a regression.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cute_kernels.bench.compare import compare_results
from cute_kernels.bench.records import load_result, plot_path
from cute_kernels.bench.table import format_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cute_kernels.bench.report", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="result JSON files")
    parser.add_argument("--no-plot", action="store_true", help="print tables only")
    parser.add_argument("--compare", action="append", default=[], metavar="OLD.json",
                        help="earlier run(s) to compare against, matched by suite")
    parser.add_argument("--compare-floor", type=float, default=0.0)
    args = parser.parse_args(argv)
    olds = [load_result(p) for p in args.compare]
    regressions = 0
    for name in args.files:
        result = load_result(name)
        print(f"\n## {result.suite} on {result.device} ({result.date})")
        print(format_table(result.records))
        if not args.no_plot:
            from cute_kernels.bench.plot import plot_result

            print(f"wrote {plot_result(result, plot_path(name))}")
        for old, path in zip(olds, args.compare):
            if old.suite == result.suite:
                comparison = compare_results(old, result, floor=args.compare_floor)
                print(f"\n## compare with {path}\n{comparison.report()}")
                regressions += len(comparison.regressions)
    return 3 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
