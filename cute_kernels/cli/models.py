"""`cute-kernels bench models` and `cute-kernels precompile`: real models on cute_kernels.

    cute-kernels bench models                                   # the suite (~5 min on an H200)
    cute-kernels bench models --models llama_gqa,vit_b16 --modes train_eager,infer_eager
    cute-kernels bench models --out-dir docs/results            # JSON + plot, and docs/models.md
    cute-kernels bench models --models vit_b16 --out-dir docs/results --merge docs/results/OLDER.json
    cute-kernels bench models --list                            # models, modes, defaults
    cute-kernels precompile --model llama_gqa                   # fill the compile cache ahead of time
    cute-kernels precompile --config path/to/config.json --batch 4 --seq 2048

`bench models` is routed here by the CLI (its options are its own). Exit status 0; 1 when a
record of ours failed its correctness check.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    from cute_kernels.bench.models import MODES

    p = sub.add_parser("bench-models", help="real models: stock against cute_kernels (also: `bench models`)",
                       description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help="comma list of models (default: all; see --list)")
    p.add_argument("--modes", default=None, help=f"comma list of modes from {', '.join(MODES)} "
                                                 "(default: each model's own selection, see --list)")
    p.add_argument("--list", action="store_true", help="list the models and their default modes, and exit")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    p.add_argument("--iters", type=int, default=5, help="calls per timing round (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per side before timing (default 2)")
    p.add_argument("--prompts", type=int, default=8, help="generate: prompts (default 8)")
    p.add_argument("--prompt-len", type=int, default=512, help="generate: prompt tokens (default 512)")
    p.add_argument("--new-tokens", type=int, default=64, help="generate: new tokens (default 64)")
    p.add_argument("--device", default="cuda", help="cuda[:N]; 'cpu' with --size tiny exercises the harness")
    p.add_argument("--size", choices=("bench", "small", "tiny"), default="bench",
                   help="model size (small: the GPU tests' models, tiny: the CPU tests')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fuse-mlps", action="store_true",
                   help="also put every SwiGLU MLP on the gated GEMM (cute_kernels.nn.fuse_gated_mlps)")
    p.add_argument("--json", metavar="FILE", help="write the result JSON here")
    p.add_argument("--out-dir", metavar="DIR", help="write DIR/YYYY-MM-DD-models-<device>.json and .png, and the "
                                                    "page (--doc)")
    p.add_argument("--doc", default="docs/models.md", help="the page written with --out-dir (default docs/models.md)")
    p.add_argument("--merge", metavar="OLDER.json", help="keep the cases of this earlier models run that this run "
                                                         "does not re-run (each row then says when it was measured)")
    p.set_defaults(func=run_bench)

    q = sub.add_parser("precompile", help="fill the compile cache for a model's kernels ahead of time",
                       description="Run a short trace (a training step and a short generate) of a model patched "
                                   "by cute_kernels.nn.patch, so its kernels are in $CUTE_KERNELS_CACHE_DIR "
                                   "before the first real step. Needs the GPU the model will run on.")
    which = q.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a model of the models suite (cute-kernels bench models --list)")
    which.add_argument("--config", help="a transformers config.json (or a directory holding one), read locally")
    q.add_argument("--batch", type=int, default=None, help="with --config: batch size (default 1)")
    q.add_argument("--seq", type=int, default=None, help="with --config: sequence length (default 512)")
    q.add_argument("--size", choices=("bench", "small", "tiny"), default="bench")
    q.add_argument("--device", default="cuda")
    q.add_argument("--no-generate", action="store_true", help="trace the training step only")
    q.set_defaults(func=run_precompile)


def _names(text: str | None, known, what: str):
    if text is None:
        return None
    names = tuple(w.strip() for w in text.split(",") if w.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"cute-kernels bench models: unknown {what} {unknown or text!r}; known: {', '.join(known)}")
    return names


def run_bench(args) -> int:
    from cute_kernels.bench import model_specs
    from cute_kernels.bench.models import DEFAULT_MODES, MODES, ModelsSettings, run_models
    from cute_kernels.bench.records import merge_results, plot_path

    if args.list:
        for name, spec in model_specs.SPECS.items():
            print(f"{name:18s} {spec.description}; default modes: {', '.join(DEFAULT_MODES.get(name, ()))}")
        return 0
    models = _names(args.models, model_specs.SPECS, "model") or tuple(model_specs.SPECS)
    settings = ModelsSettings(models=models, modes=_names(args.modes, MODES, "mode"), rounds=args.rounds,
                              iters=args.iters, warmup=args.warmup, prompts=args.prompts,
                              prompt_len=args.prompt_len, new_tokens=args.new_tokens, seed=args.seed,
                              device=args.device, size=args.size,
                              fallback="torch" if args.device == "cpu" else "none", fuse_mlps=args.fuse_mlps)
    try:
        settings.validate()
    except ValueError as err:
        raise SystemExit(f"cute-kernels bench models: {err}") from None
    json_path = _json_path(args)
    older = _older(args.merge)
    result = run_models(settings, progress=(lambda r: r.write(json_path(r))) if json_path else None)
    from cute_kernels.bench.models_report import models_page, plot_models
    from cute_kernels.bench.table import format_table

    print(format_table(result.records))
    failed = [r for r in result.records if r.kind == "ours" and not r.ok]  # this run's, not the merged
    if older is not None:
        try:
            result = merge_results(result, older)
        except ValueError as err:  # another device: this run's records are written alone
            print(f"cute-kernels bench models: --merge skipped: {err}", file=sys.stderr)
    if json_path:
        from pathlib import Path

        path = Path(result.write(json_path(result)))
        print(f"wrote {path}")
        if args.out_dir:
            import os

            try:
                png = plot_models(result, plot_path(path))
                print(f"wrote {png}")
                plot = os.path.relpath(png, Path(args.doc).parent)
            except ImportError as err:
                print(f"plot skipped ({err}); draw it later with python -m cute_kernels.bench.models_report {path}")
                plot = None
            Path(args.doc).write_text(models_page(result, os.path.relpath(path, Path(args.doc).parent), plot))
            print(f"wrote {args.doc}")
    if failed:
        print(f"\n{len(failed)} record(s) of ours FAILED: " + ", ".join(r.case for r in failed), file=sys.stderr)
        return 1
    return 0


def _older(path):
    """The earlier run `--merge` names, read before the suite runs (a bad file fails at once)."""
    if path is None:
        return None
    from cute_kernels.bench.records import load_result

    try:
        older = load_result(path)
    except (OSError, ValueError) as err:
        raise SystemExit(f"cute-kernels bench models: --merge: {err}") from None
    if older.suite != "models":
        raise SystemExit(f"cute-kernels bench models: --merge: {path} is a {older.suite!r} result, not 'models'")
    return older


def _json_path(args):
    from cute_kernels.bench.records import result_path

    if args.json:
        return lambda result: args.json
    if args.out_dir:
        return lambda result: str(result_path(args.out_dir, result))
    return None


def run_precompile(args) -> int:
    from cute_kernels.bench.models import precompile

    if args.config is None and (args.batch or args.seq):
        raise SystemExit("cute-kernels precompile: --batch/--seq go with --config (a suite model has its own shapes)")
    precompile(args.model, config=args.config, batch=args.batch, seq=args.seq, size=args.size, device=args.device,
               generate=not args.no_generate)
    return 0
