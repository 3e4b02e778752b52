"""Time sm90_persistent over a set of configs (and split-K factors) on model shapes, beside
cuBLAS, in one process (L2 flushed, medians), to ground `sm90_config.pick_config`'s choices.

    python3 scripts/gemm_config_sweep.py [--out FILE.json] [--shapes 12608x768x3072,768x3072x12608_am_bn,...]
                                         [--configs 128x256c2,128x192c1x2,...] [--splits 1,2,4] [--hot]
                                         [--reduce torch|kernel|both]

Shapes are `bench.cases.GemmCase` names (layout suffix _bn: B read N-major, the input gradient;
_am_bn: A M-major too, the weight gradient). Prints, per shape, each (config, split) time
relative to cuBLAS (ratio = cuBLAS ms / ours ms) and the one the heuristic picks; writes every
time to the JSON file. A split other than 1 forces `pick_split_k`'s answer for that run; `--reduce`
says how its chunks are summed: by torch afterwards, in the kernel (`sm90_skinny.REDUCE_IN_KERNEL`,
the default; keys `.../s4k`), or both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

VIT = [  # ViT-B/16 at B64 (M = 12608): forward, input gradient, weight gradient of qkv, proj, fc1, fc2
    f"{m}x{n}x{k}{sfx}" for n, k in ((2304, 768), (768, 768), (3072, 768), (768, 3072))
    for m, n, k, sfx in ((12608, n, k, ""), (12608, k, n, "_bn"), (n, k, 12608, "_am_bn"))
]


def _cfgs():
    from cute_kernels.gemm.sm90_config import Sm90GemmConfig as c

    return {
        "128x256c2": c(tile_m=128, tile_n=256, cluster_m=2),
        "128x256c1x2": c(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2),
        "128x256c1": c(tile_m=128, tile_n=256, cluster_m=1),
        "256x128c1x2": c(tile_m=256, tile_n=128, cluster_m=1, cluster_n=2),
        "256x128c1": c(tile_m=256, tile_n=128, cluster_m=1),
        "128x192c1": c(tile_m=128, tile_n=192, cluster_m=1),
        "128x192c1x2": c(tile_m=128, tile_n=192, cluster_m=1, cluster_n=2),
        "128x192c2": c(tile_m=128, tile_n=192, cluster_m=2),
        "128x128c2": c(tile_m=128, tile_n=128, cluster_m=2),
        "128x128c1x2": c(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2),
        "128x128pp": c(tile_m=128, tile_n=128, cluster_m=1, schedule="pingpong"),
        "128x128pp1x2": c(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, schedule="pingpong"),
        "128x128pp2": c(tile_m=128, tile_n=128, cluster_m=2, schedule="pingpong"),
        "256x128c2": c(tile_m=256, tile_n=128, cluster_m=2),
        "128x160c1": c(tile_m=128, tile_n=160, cluster_m=1),
        "128x224c1": c(tile_m=128, tile_n=224, cluster_m=1),
    }


@contextlib.contextmanager
def _forced_split(split: int | None, in_kernel: bool = False):
    from cute_kernels.gemm import sm90_skinny

    saved, saved_reduce = sm90_skinny.pick_split_k, sm90_skinny.REDUCE_IN_KERNEL
    if split is not None:
        sm90_skinny.pick_split_k = lambda *a, **k: split
    sm90_skinny.REDUCE_IN_KERNEL = in_kernel
    try:
        yield
    finally:
        sm90_skinny.pick_split_k, sm90_skinny.REDUCE_IN_KERNEL = saved, saved_reduce


def _problem(name: str):
    from cute_kernels.bench.cases import GemmCase

    case = GemmCase.parse(name, "bf16")
    t = case.make_inputs("cuda", seed=0)
    a, bt = t["a"], t["b"]  # (M, K), (N, K) views with the layout's strides
    return case, a.unsqueeze(0), bt.t().unsqueeze(0)


def _modes(reduce: str, split: int) -> tuple:
    """The reductions (in_kernel flags) to time a split with: one for an unsplit run."""
    if split == 1 or reduce == "torch":
        return (False,)
    return (True,) if reduce == "kernel" else (False, True)


def _runs(names, cfg_names, splits, reduce="torch"):
    for name in names:
        for cfg in cfg_names:
            for s in splits:
                for in_kernel in _modes(reduce, s):
                    yield name, cfg, s, in_kernel


def trace(names, cfg_names, splits, reduce="torch") -> None:
    """The launches `main` makes, for runtime.precompile's workers."""
    from cute_kernels.gemm.sm90_persistent import rung
    from cute_kernels.runtime import plan_cache

    cfgs = _cfgs()
    for name, cfg, s, in_kernel in _runs(names, cfg_names, splits, reduce):
        _, a, b = _problem(name)
        out = torch.empty(1, a.shape[1], b.shape[2], device="cuda", dtype=torch.bfloat16)
        plan_cache.invalidate()
        with contextlib.suppress(Exception), _forced_split(s, in_kernel):
            rung(a, b, out, config=cfgs[cfg])


def _hot_ms(fn, calls: int = 20, reps: int = 7) -> float:
    """Median ms per call of `calls` back-to-back calls (CUDA events), L2 not flushed. A sleep
    kernel queued first keeps the GPU busy while the host enqueues, so host time never shows."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(20_000_000)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[reps // 2]


def main(argv=None) -> int:
    import triton.testing

    from cute_kernels.gemm.sm90_config import pick_config, pick_split_k
    from cute_kernels.gemm.sm90_persistent import rung
    from cute_kernels.runtime import plan_cache
    from cute_kernels.runtime.precompile import precompile

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--shapes", default=",".join(VIT))
    p.add_argument("--configs", default=",".join(_cfgs()))
    p.add_argument("--splits", default="1")
    p.add_argument("--reduce", choices=("torch", "kernel", "both"), default="torch",
                   help="how a split's chunks are summed: by torch afterwards, in the kernel, or both")
    p.add_argument("--no-precompile", action="store_true")
    p.add_argument("--hot", action="store_true",
                   help="time back-to-back calls without flushing the L2 (inputs left there, as in a model "
                        "where the previous layer just wrote them)")
    args = p.parse_args(argv)
    names, cfg_names = args.shapes.split(","), args.configs.split(",")
    splits = [int(s) for s in args.splits.split(",")]
    cfgs = _cfgs()
    if not args.no_precompile:
        print(precompile("scripts.gemm_config_sweep:trace", names, cfg_names, splits, args.reduce), flush=True)
    results = []
    for name in names:
        case, a, b = _problem(name)
        M, K, N = a.shape[1], a.shape[2], b.shape[2]
        out = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
        ref = a[0].double() @ b[0].double()

        def bench(fn):  # do_bench clears the L2 before every timed call
            if args.hot:
                return _hot_ms(fn)
            return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")

        t_cublas = bench(lambda: torch.matmul(a[0], b[0], out=out[0]))
        picked = pick_config(M, N, K)
        row = {"shape": name, "cublas_ms": t_cublas, "picked": str(picked),
               "picked_split": pick_split_k(M, N, K, 1, picked), "configs": {}}
        for _, cfg, s, in_kernel in _runs([name], cfg_names, splits, args.reduce):
            key = cfg if s == 1 else f"{cfg}/s{s}" + ("k" if in_kernel else "")
            try:
                plan_cache.invalidate()  # a stored plan would replay another variant's launch
                with _forced_split(s, in_kernel):
                    out.fill_(float("nan"))
                    rung(a, b, out, config=cfgs[cfg])
                    err = ((out[0].double() - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        row["configs"][key] = {"error": f"rel_err {err}"}
                        continue
                    t = bench(lambda: rung(a, b, out, config=cfgs[cfg]))
                row["configs"][key] = {"ms": t, "ratio": t_cublas / t,
                                       "picked": cfgs[cfg] == picked and s == row["picked_split"]
                                       and not in_kernel}
            except Exception as e:  # noqa: BLE001 - the row says why
                row["configs"][key] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
        ok = [(v["ratio"], k_) for k_, v in row["configs"].items() if "ratio" in v]
        best = max(ok) if ok else (0.0, "-")
        pick = next((k_ for k_, v in row["configs"].items() if v.get("picked")), "?")
        line = " ".join(f"{k_}={v['ratio']:.3f}" if "ratio" in v else f"{k_}=ERR" for k_, v in row["configs"].items())
        print(f"{name:>20} cublas {t_cublas:.4f} best {best[1]} {best[0]:.3f} pick {pick} | {line}", flush=True)
        results.append(row)
        del a, b, out, ref
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
