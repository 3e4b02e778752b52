"""Time sm90_persistent over a set of configs on mid-size and model shapes, beside cuBLAS, in
one process (L2 flushed, medians), to ground `sm90_config.pick_config`'s tile choice.

    python3 scripts/gemm_config_sweep.py [--out FILE.json] [--shapes 12608x768x3072,...]

Prints, per shape, each config's time relative to cuBLAS (ratio = cuBLAS ms / ours ms) and the
one the heuristic picks; writes every time to the JSON file.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

SHAPES = [
    # ViT-B/16 and ViT-L/16 at B64 (M = 12608): qkv, proj, fc1, fc2
    (12608, 2304, 768), (12608, 768, 768), (12608, 3072, 768), (12608, 768, 3072),
    (12608, 3072, 1024), (12608, 1024, 1024), (12608, 4096, 1024), (12608, 1024, 4096),
    # Llama-3 1B at M = 8192: q/o, k/v, gate/up, down, lm_head
    (8192, 2048, 2048), (8192, 512, 2048), (8192, 8192, 2048), (8192, 2048, 8192), (8192, 128256, 2048),
    # Llama-3 8B / Mistral at M = 4096 and 16384
    (4096, 4096, 4096), (4096, 1024, 4096), (4096, 14336, 4096), (4096, 4096, 14336),
    (16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336),
    # Qwen2.5-7B
    (8192, 3584, 3584), (8192, 18944, 3584), (8192, 3584, 18944), (8192, 512, 3584),
    # the public suite's big ones
    (8192, 8192, 8192), (8192, 28672, 8192),
]


def configs():
    from cute_kernels.gemm.sm90_config import Sm90GemmConfig

    c = Sm90GemmConfig
    return {
        "128x256c2": c(tile_m=128, tile_n=256, cluster_m=2),
        "128x256c2s8": c(tile_m=128, tile_n=256, cluster_m=2, swizzle=8, raster="n"),
        "128x256c1x2": c(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2),
        "256x128c2": c(tile_m=256, tile_n=128, cluster_m=2),
        "128x192c2": c(tile_m=128, tile_n=192, cluster_m=2),
        "128x128c2": c(tile_m=128, tile_n=128, cluster_m=2),
        "128x128pp": c(tile_m=128, tile_n=128, cluster_m=1, schedule="pingpong"),
        "128x160c2": c(tile_m=128, tile_n=160, cluster_m=2),
        "128x224c2": c(tile_m=128, tile_n=224, cluster_m=2),
    }


def trace(shapes: list) -> None:
    """The launches `main` makes, for runtime.precompile's workers."""
    from cute_kernels.gemm.sm90_persistent import rung

    for m, n, k in shapes[:1]:
        a = torch.randn(1, m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(1, n, k, device="cuda").to(torch.bfloat16).transpose(1, 2)
        out = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
        for cfg in configs().values():
            try:
                rung(a, b, out, config=cfg)
            except Exception:  # noqa: BLE001
                pass


def main(argv=None) -> int:
    import triton.testing

    from cute_kernels.gemm.sm90_config import pick_config
    from cute_kernels.gemm.sm90_persistent import rung
    from cute_kernels.runtime.precompile import precompile

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--shapes", default=None)
    args = p.parse_args(argv)
    shapes = SHAPES if not args.shapes else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    print(precompile("scripts.gemm_config_sweep:trace", shapes), flush=True)
    results = []
    for m, n, k in shapes:
        a = torch.randn(1, m, k, device="cuda").to(torch.bfloat16)
        w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        b = w.t().unsqueeze(0)
        out = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
        ref = a[0].float() @ w.float().t()

        def bench(fn):  # do_bench clears the L2 before every timed call
            return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")

        t_cublas = bench(lambda: torch.matmul(a[0], w.t(), out=out[0]))
        row = {"shape": f"{m}x{n}x{k}", "cublas_ms": t_cublas, "configs": {}}
        picked = pick_config(m, n, k)
        for name, cfg in configs().items():
            try:
                out.fill_(float("nan"))
                rung(a, b, out, config=cfg)
                err = ((out[0].float() - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    row["configs"][name] = {"error": f"rel_err {err}"}
                    continue
                t = bench(lambda: rung(a, b, out, config=cfg))
                row["configs"][name] = {"ms": t, "ratio": t_cublas / t, "picked": cfg == picked}
            except Exception as e:  # noqa: BLE001
                row["configs"][name] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
        best = max((v["ratio"], k_) for k_, v in row["configs"].items() if "ratio" in v)
        pick = next((k_ for k_, v in row["configs"].items() if v.get("picked")), "?")
        line = " ".join(f"{k_}={v['ratio']:.3f}" if "ratio" in v else f"{k_}=ERR" for k_, v in row["configs"].items())
        print(f"{row['shape']:>18} cublas {t_cublas:.4f} best {best[1]} {best[0]:.3f} pick {pick} | {line}", flush=True)
        results.append(row)
        del a, w, b, out, ref
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
