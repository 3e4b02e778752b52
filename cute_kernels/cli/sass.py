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

from .errors import CliError


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


def _check_overrides(variant, overrides: dict) -> None:
    """Every --set key must be a build argument of the variant."""
    import inspect

    params = inspect.signature(variant.build).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(overrides) - set(params))
    if unknown:
        raise CliError(f"unknown --set key(s) {', '.join(unknown)} for {variant.name}; its build arguments: "
                       f"{', '.join(params) or '(none)'}")


def _check_arch(arch: str | None) -> str | None:
    """A well-formed arch the CuTe DSL compiles for, or a one-line error listing those."""
    if arch is None:
        return None
    from cute_kernels.runtime.arch import normalize_arch

    try:
        arch = normalize_arch(arch)
    except ValueError as err:
        raise CliError(str(err)) from None
    from cutlass.base_dsl.enums import Arch

    known = [a.name for a in Arch]
    if arch not in known:
        raise CliError(f"unsupported --arch {arch}; the CuTe DSL compiles for {', '.join(known)}")
    return arch


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
        raise CliError("give a variant NAME or --list")
    try:
        variant = get_variant(args.name)
        overrides = dict(parse_override(text) for text in args.overrides)
        variant.config(args.config)  # an unknown config name fails here, before any build
    except (KeyError, ValueError) as err:
        raise CliError(str(err.args[0] if err.args else err)) from None
    _check_overrides(variant, overrides)
    arch = _check_arch(args.arch)
    try:
        report = compile_variant(args.name, args.config, arch=arch, **overrides)
    except Exception as err:  # noqa: BLE001 - with an explicit --arch, a refusal is the user's choice
        if arch is None:
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CliError(f"{args.name} does not compile for {arch}: {first}") from err
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
