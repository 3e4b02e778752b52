"""`cute-kernels bench SUITE`: our kernels beside the peers, timed in one process.

    cute-kernels bench gemm                                    # default impls, 7 bf16 shapes
    cute-kernels bench gemm --impl naive,sm90_persistent,cublas --cases 4096x4096x4096
    cute-kernels bench ladder --cases 1024x1024x1024:fp32      # a case of another dtype
    cute-kernels bench attention --json att.json --plot att.png
    cute-kernels bench all --out-dir docs/results              # every suite: <date>-<suite>-<device>.{json,png}
    cute-kernels bench gemm --compare docs/results/2026-11-30-gemm-h200.json
    cute-kernels bench gemm --list                             # cases and implementations found here
    cute-kernels bench decode --out-dir docs/results           # paged decode: GB/s and % of HBM

Suites: gemm, attention, attention_bwd, copy, skinny, fp8, ladder, decode, fused (see cute_kernels.bench.suites) and overhead
(host time per call, see cute_kernels.bench.overhead); `all` runs each in turn.

Exit status: 0; 1 when one of our implementations failed its correctness check; 3 when
`--compare` found a regression (and nothing failed).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from .errors import CliError

SUITE_NAMES = ("gemm", "gemm_shapes", "attention", "attention_bwd", "attention_varlen", "attention_varlen_bwd", "copy", "skinny", "fp8", "ladder",
               "decode", "fused", "overhead")
# Ceilings each suite's percentages need (the HBM bandwidth is always measured).
SUITE_CEILING_DTYPES = {"gemm": {"bf16"}, "gemm_shapes": {"bf16"}, "attention": {"bf16"}, "attention_bwd": {"bf16"},
                        "attention_varlen": {"bf16"}, "attention_varlen_bwd": {"bf16"}, "copy": set(), "skinny": {"bf16"}, "fp8": {"fp8_e4m3"},
                        "ladder": {"fp32", "fp16", "bf16"}, "decode": set(), "fused": {"bf16"}, "overhead": set()}


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark our kernels beside cuBLAS, SDPA, quack and FlashAttention-4",
                       description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", choices=SUITE_NAMES + ("all",), help="the suite to run")
    p.add_argument("--impl", default=None,
                   help="comma list of implementations (rung names, peers: cublas, cublas_fp8, quack, triton_ampere, sdpa_flash, "
                        "sdpa_cudnn, fa4, torch_copy, cute_kernels, decode, fa4_paged, sdpa_gathered) and keywords default, all, ours, peers")
    p.add_argument("--cases", default=None, help="comma list of case names replacing the suite's, e.g. 4096x4096x4096, "
                                                 "B4_H32_S2048_D128_causal, 256MiB, B64_Hq32_Hkv8_D128_ctx8192_page16; suffix :DTYPE to change the dtype")
    p.add_argument("--list", action="store_true", help="list the suite's cases and the implementations found, and exit")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case (median over rounds; default 5)")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="warm-up per timer call (default 25 ms)")
    p.add_argument("--rep-ms", type=float, default=100.0, help="timed work per timer call (default 100 ms)")
    p.add_argument("--timer", choices=("auto", "triton", "events"), default="auto",
                   help="triton.testing.do_bench, CUDA events, or triton when importable (default)")
    p.add_argument("--device", default="cuda", help="cuda[:N]; 'cpu' only exercises the harness (wall clock)")
    p.add_argument("--seed", type=int, default=0, help="seed of the N(0,1) inputs")
    p.add_argument("--json", metavar="FILE", help="write the result JSON here")
    p.add_argument("--plot", metavar="FILE", help="write the bar chart and roofline PNG here")
    p.add_argument("--out-dir", metavar="DIR",
                   help="write DIR/YYYY-MM-DD-<suite>-<device>.json and .png (docs/results naming)")
    p.add_argument("--compare", metavar="OLD.json", action="append", default=[],
                   help="flag cases slower than this earlier run by more than the spread (repeatable: one per suite)")
    p.add_argument("--compare-floor", type=float, default=0.0,
                   help="smallest relative slowdown flagged, whatever the spread (default 0)")
    p.add_argument("--ceilings", metavar="FILE", help="take ceilings from this record instead of measuring them")
    p.add_argument("--no-ceilings", action="store_true", help="neither measure nor report ceilings")
    p.set_defaults(func=run)


def _validate(args) -> None:
    if args.rounds < 1:
        raise SystemExit("cute-kernels bench: --rounds must be >= 1")
    if args.warmup_ms < 0 or args.rep_ms <= 0:
        raise SystemExit("cute-kernels bench: --warmup-ms must be >= 0 and --rep-ms > 0")
    if args.suite == "all" and (args.json or args.plot or args.cases):
        raise SystemExit("cute-kernels bench all: use --out-dir (one file per suite), not --json/--plot/--cases")
    if args.ceilings and args.no_ceilings:
        raise SystemExit("cute-kernels bench: --ceilings and --no-ceilings contradict each other")


@contextlib.contextmanager
def _choice(what: str):
    """A ValueError from choosing impls or cases is the user's: one line, exit 2."""
    try:
        yield
    except ValueError as err:
        raise CliError(f"{what}: {err}") from None


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _timers(args):
    from cute_kernels.bench import timing

    if args.device == "cpu":
        return timing.wall_clock_timer()
    return timing.make_gpu_timer(args.warmup_ms, args.rep_ms, backend=args.timer)


def _ceilings(args, suites, timer) -> dict:
    from cute_kernels.bench import ceilings

    if args.no_ceilings:
        return {}
    if args.ceilings:
        return ceilings.load_ceilings(args.ceilings)
    if args.device == "cpu" or set(suites) == {"overhead"}:
        return {}
    dtypes = set().union(*(SUITE_CEILING_DTYPES[s] for s in suites))
    _log(f"measuring ceilings: {sorted(dtypes)} GEMM and HBM copy")
    found = ceilings.measure_ceilings(timer, dtypes, device=args.device)
    _log("  " + ", ".join(f"{k} {v:.0f}" for k, v in found.items() if isinstance(v, float)))
    return found


def _list(args) -> int:
    from cute_kernels.bench.overhead import overhead_impls
    from cute_kernels.bench.suites import SUITES

    names = SUITE_NAMES if args.suite == "all" else (args.suite,)
    for name in names:
        if name == "overhead":
            for case, impls in overhead_impls().items():
                print(f"overhead {case.name} {case.dtype}: " + ", ".join(
                    f"{n} ({i.kind}{'; ' + r if (r := i.available()) else ''})" for n, i in impls.items()))
            continue
        suite = SUITES[name]
        with _choice("--cases"):
            cases = suite.parse_cases(args.cases) if args.cases else suite.cases
        print(f"{name}: {suite.description}")
        print("  cases: " + ", ".join(f"{c.name}:{c.dtype}" for c in cases))
        for n, impl in suite.impls().items():
            why = impl.available()
            mark = "default" if suite.default(impl) else "opt-in"
            print(f"  {n:24s} {impl.kind:5s} {mark:8s} {'unavailable: ' + why if why else ''}")
    return 0


def _run_one(name: str, args, timer, ceilings: dict):
    from cute_kernels.bench import environment
    from cute_kernels.bench.overhead import cuda_busy_probe, make_host_timer, overhead_impls, run_overhead
    from cute_kernels.bench.records import BenchResult
    from cute_kernels.bench.runner import RunSettings, run_suite
    from cute_kernels.bench.suites import SUITES, select_impls

    settings = RunSettings(rounds=args.rounds, seed=args.seed, device=args.device)
    if name == "overhead":
        import datetime as dt

        import torch

        settings.validate()
        cpu = args.device == "cpu"
        host_timer = make_host_timer(busy=None if cpu else cuda_busy_probe(),
                                     sync=None if cpu else torch.cuda.synchronize)
        by_case = overhead_impls()
        if args.cases:  # overhead cases by name (`--list` shows them), e.g. linear_vit_12608x3072x768_bias/fwd
            wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
            by_case = {c: i for c, i in by_case.items() if c.name in wanted or f"{c.name}:{c.dtype}" in wanted}
        if args.impl:  # names apply to the case that has them (cublas: the GEMM, sdpa: attention)
            with _choice("--impl"):
                _check_names(args.impl, [i for impls in by_case.values() for i in impls], "overhead")
            by_case = {c: select_impls(impls, args.impl, lambda i: True, strict=False) for c, impls in by_case.items()}
        records, skipped = run_overhead(by_case, timer=host_timer, rounds=args.rounds, device=args.device,
                                        seed=args.seed, log=_log)
        if not cpu and (not args.cases or "compile/block" in args.cases):
            from cute_kernels.bench.overhead_layers import compile_checks

            checks = compile_checks(args.device)
            for rec in checks:
                verdict = "one graph, no recompile" if rec.ok else f"FAILED: {rec.error}"
                _log(f"  compile/block {rec.impl}: {verdict}")
            records += checks
        now = dt.datetime.now(dt.timezone.utc)
        return BenchResult(date=now.strftime("%Y-%m-%d"), timestamp=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                           device=environment.device_name(args.device), versions=environment.versions(args.device),
                           suite="overhead", records=records, skipped=skipped,
                           settings={"rounds": args.rounds, "timer": host_timer.backend, "device": args.device})
    suite = SUITES[name]
    with _choice("--cases"):
        cases = suite.parse_cases(args.cases) if args.cases else suite.cases
    with _choice("--impl"):
        impls = select_impls(suite.impls(), args.impl, suite.default, strict=args.suite != "all")
    partial = _json_path(args)

    def progress(so_far) -> None:  # keep finished cases on disk in case a later one hangs
        if partial:
            so_far.write(partial(so_far))

    result = run_suite(name, cases, impls, timer=timer, settings=settings, ceilings=ceilings, log=_log,
                       progress=progress)
    result.settings.update({"warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms})
    return result


def _json_path(args):
    """result -> the JSON path it goes to (None when neither --json nor --out-dir is given)."""
    from cute_kernels.bench.records import result_path

    if args.json:
        return lambda result: args.json
    if args.out_dir:
        return lambda result: str(result_path(args.out_dir, result))
    return None


def _check_names(spec: str, known: list[str], where: str) -> None:
    keywords = {"default", "all", "ours", "peers"}
    unknown = [w.strip() for w in spec.split(",") if w.strip() and w.strip() not in keywords and w.strip() not in known]
    if unknown:
        raise ValueError(f"unknown impl(s) {unknown} for {where}; known here: {', '.join(dict.fromkeys(known))}")


def _outputs(result, args) -> list[str]:
    from cute_kernels.bench.plot import plot_result
    from cute_kernels.bench.records import plot_path

    written = []
    json_of = _json_path(args)
    json_path = json_of(result) if json_of else None
    png = args.plot or (str(plot_path(json_path)) if args.out_dir and json_path else None)
    if json_path:
        written.append(str(result.write(json_path)))
    if png:
        try:
            written.append(str(plot_result(result, png)))
        except ImportError as err:  # a device without matplotlib: plot later from the JSON
            _log(f"plot skipped ({err}); draw it later with: python -m cute_kernels.bench.report {json_path or 'RESULT.json'}")
    return written


def _compare(result, paths: list[str], floor: float) -> int:
    from cute_kernels.bench.compare import compare_results
    from cute_kernels.bench.records import load_result

    regressions = 0
    for path in paths:
        old = load_result(path)
        if old.suite != result.suite:
            continue
        comparison = compare_results(old, result, floor=floor)
        print(f"\n## compare with {path} ({old.date}, {old.device})\n{comparison.report()}")
        regressions += len(comparison.regressions)
    return regressions


def run(args) -> int:
    _validate(args)
    if args.list:
        return _list(args)
    from cute_kernels.bench.table import format_table

    names = SUITE_NAMES if args.suite == "all" else (args.suite,)
    timer = _timers(args)
    ceilings = _ceilings(args, names, timer)
    failed = regressions = 0
    for name in names:
        result = _run_one(name, args, timer, ceilings)
        print(f"\n## {name} on {result.device} ({result.date}), timer: {result.settings.get('timer')}")
        print(format_table(result.records))
        if result.skipped:
            print("skipped: " + "; ".join(f"{s['impl']} @ {s['case']}: {s['reason']}" for s in result.skipped))
        for path in _outputs(result, args):
            print(f"wrote {path}")
        failed += sum(1 for r in result.records if r.kind == "ours" and not r.ok)
        regressions += _compare(result, args.compare, args.compare_floor)
    if failed:
        print(f"\n{failed} record(s) of ours FAILED correctness", file=sys.stderr)
        return 1
    return 3 if regressions else 0
