"""The `cute-kernels` console script.

Each subcommand lives in its own module with an `add_parser(subparsers)` function that
registers it and sets `func` to the handler; the modules are imported lazily so that
`cute-kernels layout` never pays for torch or the DSL.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module under cute_kernels.cli that registers it
COMMANDS = {
    "layout": "workbench",
    "atom": "workbench",
    "conflicts": "workbench",
    "sass": "sass",
    "bench": "bench",
    "demo": "demo",
    "bench-models": "models", "precompile": "models",  # `bench models` is routed to bench-models
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cute-kernels",
        description="Explore CuTe layouts, inspect kernels' SASS and benchmark them against the peers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = sorted(set(COMMANDS.values())) if only is None else [COMMANDS[only]]
    for name in modules:
        try:
            module = importlib.import_module(f"cute_kernels.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"cute_kernels.cli.{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "models"]:  # the models suite has options of its own (cli/models.py)
        argv = ["bench-models", *argv[2:]]
    # Import only the module behind the chosen command: `layout` must not pull in torch.
    only = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if not argv else 2
    from cute_kernels.cli.errors import run_guarded  # one-line errors for every subcommand

    return run_guarded(args.command, args.func, args)


if __name__ == "__main__":
    sys.exit(main())
