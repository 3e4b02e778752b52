"""Correctness and speed of the sm_90a GEMM rungs on an H100/H200, in one batched run.

    python scripts/hopper_gemm_check.py correctness [--rungs sm90_persistent,...]
    python scripts/hopper_gemm_check.py bench [--shapes default|quick] [--configs name,...]

correctness: fresh N(0,1) inputs, NaN-poisoned outputs, relative error (Frobenius) against a
float64 reference, over aligned, odd (padded path), batched, transposed-operand, alpha/beta
and fp32-output cases. bench: C = A . B^T (A MxK, B NxK, both K-major), median time with
triton.testing.do_bench (L2 flushed between calls), TFLOP/s and ratios to torch.matmul (cuBLAS)
and quack measured in the same run. Results go to $OUT/hopper_gemm_<phase>.json when OUT is set.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import traceback

import torch

SUITE = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 28672, 8192),
         (8192, 8192, 28672), (4096, 14336, 4096), (16384, 4096, 4096)]
SKINNY = [(16, 8192, 8192), (64, 8192, 8192), (128, 8192, 8192)]
RUNG_MODULES = {"sm90_tma_wgmma": "cute_kernels.gemm.sm90_tma_wgmma",
                "sm90_warp_specialized": "cute_kernels.gemm.sm90_warp_specialized",
                "sm90_persistent": "cute_kernels.gemm.sm90_persistent"}
CONFIGS = {
    "c128x256_2x1": dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1),
    "c128x256_1x2": dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2),
    "c128x256_1x1": dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1),
    "c128x128_2x1": dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1),
    "c128x256_2x1_sw4": dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, swizzle=4),
    "c128x256_2x1_sw8n": dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, swizzle=8, raster="n"),
    "c128x256_2x1_e2": dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, epi_stages=2),
    "c256x128_1x2": dict(tile_m=256, tile_n=128, cluster_m=1, cluster_n=2),
    "c128x128_1x1": dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1),
    "c128x64_1x1": dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=1),
    "p128x128_2x1": dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, schedule="pingpong"),
    "p128x128_1x2": dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, schedule="pingpong"),
    "p128x128_2x1_sw8n": dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, schedule="pingpong", swizzle=8,
                              raster="n"),
}


class WithConfig:
    """A rung pinned to one config (to check schedules the heuristic does not pick)."""

    def __init__(self, rung, config_name):
        from cute_kernels.gemm.sm90_config import Sm90GemmConfig

        self.rung, self.config = rung, Sm90GemmConfig(**CONFIGS[config_name])
        self.supports = rung.supports

    def __call__(self, a, b, out, **kw):
        return self.rung(a, b, out, config=self.config, **kw)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def load_rungs(names):
    rungs = {}
    for n in names:
        try:
            if "[" in n:  # e.g. sm90_persistent[p128x128_2x1]
                base, cfg = n.rstrip("]").split("[")
                rungs[n] = WithConfig(importlib.import_module(RUNG_MODULES[base]).rung, cfg)
                continue
            rungs[n] = importlib.import_module(RUNG_MODULES[n]).rung
        except Exception as e:  # a rung that does not import is reported, not fatal
            print(f"[{n}] import failed: {type(e).__name__}: {e}")
    return rungs


def correctness(rungs, out_records):
    dev = "cuda"
    cases = [  # (L, M, N, K, dtype, out_dtype, a_mmajor, b_nmajor, alpha, beta)
        (1, 256, 256, 256, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),
        (1, 1024, 2048, 512, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),
        (1, 1000, 1000, 1000, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),
        (1, 333, 517, 129, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),
        (3, 512, 384, 320, torch.float16, torch.float16, False, False, 0.5, 0.0),
        (1, 768, 640, 448, torch.bfloat16, torch.float32, False, False, 1.0, 0.0),
        (2, 512, 512, 256, torch.bfloat16, torch.bfloat16, True, False, 1.0, 0.0),
        (2, 512, 512, 256, torch.bfloat16, torch.bfloat16, False, True, 1.0, 0.0),
        (1, 640, 768, 384, torch.bfloat16, torch.bfloat16, True, True, 1.0, 0.0),
        (1, 512, 512, 512, torch.bfloat16, torch.bfloat16, False, False, 2.0, 0.5),
        (1, 64, 8192, 8192, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),
        (1, 100, 3000, 4096, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),
        (1, 96, 1024, 4096, torch.float16, torch.float16, True, False, 0.5, 1.0),
        (1, 16, 8192, 8192, torch.bfloat16, torch.float32, False, False, 1.0, 0.0),
        (1, 4096, 4096, 4096, torch.bfloat16, torch.bfloat16, False, False, 1.0, 0.0),
    ]
    for name, rung in rungs.items():
        for (L, M, N, K, dt, odt, a_mm, b_nm, alpha, beta) in cases:
            tag = f"{name} L{L} {M}x{N}x{K} {str(dt)[6:]}->{str(odt)[6:]} a{'M' if a_mm else 'K'} b{'N' if b_nm else 'K'} alpha={alpha} beta={beta}"
            try:
                a = torch.randn(L, K, M, device=dev, dtype=dt).transpose(1, 2) if a_mm else torch.randn(L, M, K, device=dev, dtype=dt)
                b = torch.randn(L, K, N, device=dev, dtype=dt) if b_nm else torch.randn(L, N, K, device=dev, dtype=dt).transpose(1, 2)
                c = torch.randn(L, M, N, device=dev, dtype=odt) if beta else None
                out = torch.full((L, M, N), float("nan"), device=dev, dtype=odt)
                why = rung.supports(a, b, out)
                if why:
                    print(f"SKIP {tag}: {why}")
                    continue
                rung(a, b, out, alpha=alpha, beta=beta, c=c)
                torch.cuda.synchronize()
                ref = alpha * torch.matmul(a.double(), b.double())
                if beta:
                    ref = ref + beta * c.double()
                err = rel_err(out, ref)
                tol = 2e-2 if odt != torch.float32 else 1e-2
                ok = math.isfinite(err) and err < tol
                print(f"{'PASS' if ok else 'FAIL'} {tag}: rel_err={err:.2e}")
                out_records.append(dict(case=tag, impl=name, rel_err=err, ok=ok))
            except Exception as e:
                print(f"ERROR {tag}: {type(e).__name__}: {e}")
                traceback.print_exc(limit=3)
                out_records.append(dict(case=tag, impl=name, error=str(e)[:500], ok=False))
    # NaN propagation: a NaN in A must reach the output row
    for name, rung in rungs.items():
        a = torch.randn(1, 256, 256, device=dev, dtype=torch.bfloat16)
        b = torch.randn(1, 256, 256, device=dev, dtype=torch.bfloat16)
        a[0, 7, 3] = float("nan")
        out = torch.zeros(1, 256, 256, device=dev, dtype=torch.bfloat16)
        try:
            rung(a, b, out, alpha=1.0, beta=0.0, c=None)
            ok = bool(out[0, 7].isnan().all()) and not bool(out[0, 8].isnan().any())
        except Exception as e:
            ok = False
            print(f"ERROR nan-propagation {name}: {e}")
        print(f"{'PASS' if ok else 'FAIL'} {name} NaN propagation")
        out_records.append(dict(case="nan_propagation", impl=name, ok=ok))


def bench(shapes, config_names, out_records, others=True):
    from triton.testing import do_bench

    from cute_kernels.gemm.sm90_config import Sm90GemmConfig, pick_config
    from cute_kernels.gemm.sm90_persistent import rung

    try:
        from quack.gemm_interface import gemm as quack_gemm
    except Exception as e:
        quack_gemm = None
        print("quack unavailable:", e)
    print(f"{'shape':>20} {'impl':>22} {'ms':>8} {'TFLOP/s':>8} {'/cuBLAS':>8} {'/quack':>7}")
    for (M, N, K) in shapes:
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        flop = 2.0 * M * N * K
        ref = torch.matmul(A.double() if M * N * K <= 2**31 else A.float(), (B.double() if M * N * K <= 2**31 else B.float()).t())
        res = {}

        def record(impl, fn, out=None):
            try:
                ms = do_bench(fn, warmup=10, rep=60)
                err = rel_err(out(), ref) if out else float("nan")
                res[impl] = ms
                cub, q = res.get("cublas"), res.get("quack")
                line = f"{str((M, N, K)):>20} {impl:>22} {ms:8.3f} {flop / ms / 1e9:8.1f} {cub / ms if cub else 0:8.3f} {q / ms if q else 0:7.3f}  err={err:.1e}"
                print(line)
                out_records.append(dict(case=f"{M}x{N}x{K}", impl=impl, dtype="bf16", ms=ms, tflops=flop / ms / 1e9, rel_err=err))
            except Exception as e:
                print(f"{str((M, N, K)):>20} {impl:>22} ERROR {type(e).__name__}: {str(e)[:300]}")

        C0 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        record("cublas", lambda: torch.matmul(A, B.t(), out=C0), lambda: C0)
        if quack_gemm is not None:
            Cq = {}
            def qrun():
                Cq["c"] = quack_gemm(A, B.t(), tuned=False)
            record("quack", qrun, lambda: Cq["c"])
        a3, b3 = A.unsqueeze(0), B.t().unsqueeze(0)
        out3 = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
        cfgs = {"auto": pick_config(M, N, K)} | {n: Sm90GemmConfig(**CONFIGS[n]) for n in config_names}
        for cname, cfg in cfgs.items():
            try:
                rung(a3, b3, out3, config=cfg)  # compile + warm
                # kernel-only timing: prebuilt DSL arguments, no per-call conversion
                import cute_kernels.gemm.sm90_rung as R
                Ak, Bk, Ck = (R._sane_batch_stride(t) for t in (a3.permute(1, 2, 0), b3.permute(2, 1, 0), out3.permute(1, 2, 0)))
                record(f"ours[{cname}]", rung.launcher(cfg, Ak, Bk, Ck), lambda: out3[0])
            except Exception as e:
                print(f"{str((M, N, K)):>20} ours[{cname}] ERROR {type(e).__name__}: {str(e)[:400]}")
                traceback.print_exc(limit=4)
        record("ours[call,auto]", lambda: rung(a3, b3, out3), lambda: out3[0])
        for other in ("sm90_tma_wgmma", "sm90_warp_specialized") if others else ():
            try:
                r = importlib.import_module(RUNG_MODULES[other]).rung
                record(f"{other}[call]", lambda: r(a3, b3, out3), lambda: out3[0])
            except Exception as e:
                print(f"{other} bench failed:", e)
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("phase", choices=["correctness", "bench"])
    p.add_argument("--rungs", default="sm90_persistent,sm90_warp_specialized,sm90_tma_wgmma")
    p.add_argument("--shapes", default="default")
    p.add_argument("--no-peers", action="store_true", help="skip the other rungs' timing lines")
    p.add_argument("--configs", default="c128x256_2x1,c128x256_1x2,c128x128_2x1")
    args = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    records = []
    if args.phase == "correctness":
        correctness(load_rungs(args.rungs.split(",")), records)
    else:
        shapes = {"default": SUITE, "quick": SUITE[:2], "skinny": SKINNY, "all": SUITE + SKINNY}[args.shapes]
        bench(shapes, [c for c in args.configs.split(",") if c], records, others=not args.no_peers)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"hopper_gemm_{args.phase}.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), records=records), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
