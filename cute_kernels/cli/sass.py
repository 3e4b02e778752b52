"""`cute-kernels sass`: what a registered kernel variant compiles to on Hopper.

    cute-kernels sass --list
    cute-kernels sass NAME [--config CONFIG] [--set key=value ...] [--arch sm_90a] [--show-sass] [--json]

Prints registers per thread, shared memory, local memory and spills, the occupancy these
allow on an H100/H200 (blocks and warps per SM, and the limiting resource), and the SASS
instruction histogram. Works without a GPU: the variant compiles for sm_90a.
"""

from __future__ import annotations

import ast
import json
import os
import sys


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "sass",
        help="registers, shared memory, spills, occupancy and SASS histogram of a kernel variant",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("name", nargs="?", help="registered variant name (see --list)")
    parser.add_argument("--list", action="store_true", help="list registered variants and their configs")
    parser.add_argument("--config", default=None, help="named config of the variant (default: 'default')")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one build argument (VALUE is a Python literal, else a string); repeatable",
    )
    parser.add_argument("--arch", default=None, help="target arch (default: the GPU's, else CUTE_DSL_ARCH, else sm_90a)")
    parser.add_argument("--show-sass", action="store_true", help="also print the full SASS")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def parse_override(text: str) -> tuple[str, object]:
    """"key=value" -> (key, value), value parsed as a Python literal when it is one."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise ValueError(f"--set expects KEY=VALUE with KEY an identifier, got {text!r}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key, value


def report_dict(report) -> dict:
    """The JSON form of a SassReport."""
    occ = report.occupancy
    return {
        "variant": report.variant,
        "config": {k: repr(v) if not isinstance(v, (int, float, str, bool, type(None))) else v
                   for k, v in report.config.items()},
        "arch": report.arch,
        "kernel": report.primary.name,
        "registers": report.registers,
        "static_smem": report.static_smem,
        "dynamic_smem": report.dynamic_smem,
        "local_memory": report.local_memory,
        "spill_store_bytes": report.spill_store_bytes,
        "spill_load_bytes": report.spill_load_bytes,
        "threads_per_block": report.threads_per_block,
        "occupancy": None if occ is None else {
            "blocks_per_sm": occ.blocks_per_sm,
            "warps_per_sm": occ.warps_per_sm,
            "limiter": occ.limiter,
            "limits_by": occ.limits_by,
        },
        "histogram": dict(sorted(report.histogram.items())),
    }


def run(args) -> int:
    if not os.environ.get("CUTE_DSL_ARCH"):
        from cute_kernels.runtime import has_cuda

        if not has_cuda():
            os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    from cute_kernels.runtime import check_variant, compile_variant, get_variant, list_variants

    if args.list:
        variants = list_variants()
        if not variants:
            print("no kernel variants are registered")
            return 0
        for v in variants:
            requires = ",".join(sorted(v.requires)) or "-"
            forbids = ",".join(sorted(v.forbids)) or "-"
            print(f"{v.name}: configs {', '.join(v.configs)}; requires {requires}; forbids {forbids}")
        return 0
    if not args.name:
        print("cute-kernels sass: give a variant NAME or --list", file=sys.stderr)
        return 2
    try:
        variant = get_variant(args.name)
        overrides = dict(parse_override(text) for text in args.overrides)
        report = compile_variant(args.name, args.config, arch=args.arch, **overrides)
    except (KeyError, ValueError) as err:
        print(f"cute-kernels sass: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2
    problems = check_variant(report, variant)
    if args.json:
        data = report_dict(report)
        data["problems"] = problems
        print(json.dumps(data, indent=2))
    else:
        print(report.summary())
        for problem in problems:
            print(f"CHECK FAILED: {problem}")
        if args.show_sass:
            print()
            print(report.sass)
    return 0
