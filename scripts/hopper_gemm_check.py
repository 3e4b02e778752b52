"""Correctness and speed of the sm_90a GEMM rungs on an H100/H200, in one batched run.

    python scripts/hopper_gemm_check.py correctness [--rungs sm90_persistent,...]
    python scripts/hopper_gemm_check.py bench [--shapes default|quick] [--configs name,...]
    python scripts/hopper_gemm_check.py batch [--groups a,b] [--jobs 8] [--deadline 150]
    python scripts/hopper_gemm_check.py host

host: host time vs GPU time per warm call (rung, kernel-only launcher, matmul_epilogue, cuBLAS;
256³, skinny M, linear+GELU), telling slow host code from a wait for the GPU or extra GPU work.

batch: one device session's checks: correctness groups (base rungs, ping-pong, fused
epilogue, fp8), each in its own process, in parallel (a faulting kernel poisons only its own
CUDA context; a hung one is killed at the deadline), then a timing table in one process (bf16
suite and skinny M vs cuBLAS, fp8 vs torch._scaled_mm, fused bias+GELU); results in
$OUT/hopper_batch.json, per-group logs in $OUT/hopper_batch_groups.log.

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
    "p64x128_1x1": dict(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong"),
    "p64x128_1x2": dict(tile_m=64, tile_n=128, cluster_m=1, cluster_n=2, schedule="pingpong"),
    "p128x128_1x2_sw8n": dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, schedule="pingpong", swizzle=8,
                              raster="n"),
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


def correctness(rungs, out_records, case_slice=slice(None), nan=True):
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
    cases = cases[case_slice]
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
    for name, rung in (rungs.items() if nan else ()):
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
                Ak, Bk, Ck = (R.tma_operand(t) for t in (a3.permute(1, 2, 0), b3.permute(2, 1, 0), out3.permute(1, 2, 0)))
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


# ---- batch: every check of one device session, correctness groups in parallel processes ----------

ACTS = (None, "relu", "gelu_tanh", "silu")


def _ref_act(x, act):
    if act == "relu":
        return torch.relu(x)
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if act == "silu":
        return torch.nn.functional.silu(x)
    return x


def _check(records, tag, impl, fn, ref_fn, tol):
    """Run fn() -> out, compare with ref_fn() (float64) by relative error; record PASS/FAIL/ERROR."""
    try:
        out = fn()
        torch.cuda.synchronize()
        ref = ref_fn()
        err = rel_err(out, ref)
        nan_ok = not bool(out.isnan().any()) if not bool(ref.isnan().any()) else True
        ok = math.isfinite(err) and err < tol and nan_ok
        print(f"{'PASS' if ok else 'FAIL'} {impl} {tag}: rel_err={err:.2e}", flush=True)
        records.append(dict(case=tag, impl=impl, rel_err=err, ok=ok))
    except Exception as e:
        print(f"ERROR {impl} {tag}: {type(e).__name__}: {str(e)[:400]}", flush=True)
        traceback.print_exc(limit=4)
        records.append(dict(case=tag, impl=impl, error=f"{type(e).__name__}: {str(e)[:400]}", ok=False))


def group_epilogue(records, kernels=("sm90_persistent",), shapes=None, config=None, impl_suffix=""):
    from cute_kernels.gemm.epilogue_api import matmul_epilogue

    shapes = shapes or [((1, 384, 640, 256), "n", 0.5, torch.bfloat16), ((2, 256, 512, 192), "m", 0.0, torch.float32),
                        ((1, 333, 517, 129), "n", 1.0, torch.bfloat16), ((1, 1024, 2048, 1024), "n", 0.0, torch.bfloat16)]
    for kernel in kernels:
        for (L, M, N, K), bias_dim, beta, odt in shapes:
            for act in ACTS:
                a = torch.randn(L, M, K, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(L, N, K, device="cuda", dtype=torch.bfloat16)
                bias = torch.randn(N if bias_dim == "n" else M, device="cuda", dtype=torch.bfloat16)
                c = torch.randn(L, M, N, device="cuda", dtype=odt) if beta else None

                def ref():
                    pre = 0.75 * (a.double() @ w.double().transpose(1, 2))
                    pre = pre + (bias.double().view(1, 1, -1) if bias_dim == "n" else bias.double().view(1, -1, 1))
                    return _ref_act(pre + (beta * c.double() if beta else 0), act)

                tag = f"epi L{L} {M}x{N}x{K} bias_{bias_dim} beta={beta} act={act} out={str(odt)[6:]}"
                _check(records, tag, kernel + impl_suffix,
                       lambda: matmul_epilogue(a, w.transpose(1, 2), bias=bias, bias_dim=bias_dim, activation=act,
                                               alpha=0.75, beta=beta, c=c, out_dtype=odt, kernel=kernel, config=config),
                       ref, 1e-2 if odt == torch.float32 else 2e-2)
    # NaN through each activation; beta = 0 must not read a NaN C
    for act in ACTS:
        a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
        a[7, 3] = float("nan")
        try:
            out = matmul_epilogue(a, b, bias=torch.randn(256, device="cuda"), activation=act, kernel=kernels[0],
                                  config=config)
            ok = bool(out[7].isnan().all()) and not bool(out[8].isnan().any())
        except Exception as e:
            ok, out = False, print(f"ERROR nan {act}: {e}")
        print(f"{'PASS' if ok else 'FAIL'} NaN through act={act}{impl_suffix}", flush=True)
        records.append(dict(case=f"nan act={act}", impl=kernels[0] + impl_suffix, ok=ok))


def group_fp8(records):
    from cute_kernels.gemm.epilogue_api import scaled_mm
    from cute_kernels.gemm.sm90_config import Sm90GemmConfig, pick_fp8_config

    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    fast = Sm90GemmConfig(tile_m=128, tile_n=256, tile_k=128, fp8_fast_accum=True)
    pp = Sm90GemmConfig(tile_m=128, tile_n=64, tile_k=128, cluster_m=2, schedule="pingpong")
    cases = [  # M, N, K, a dtype, b dtype, out dtype, config name, config, bias/act
        (512, 768, 1024, e4, e4, torch.bfloat16, "auto", None, False),
        (512, 768, 1024, e5, e4, torch.float32, "auto", None, False),
        (512, 768, 1024, e5, e5, torch.bfloat16, "auto", None, True),
        (1000, 1000, 1000, e4, e4, torch.bfloat16, "auto", None, True),  # padded path (K not 16-aligned)
        (4096, 4096, 4096, e4, e4, torch.bfloat16, "auto", None, True),
        (4096, 4096, 4096, e4, e4, torch.bfloat16, "fast128x256", fast, True),
        (64, 8192, 8192, e4, e4, torch.bfloat16, "auto", None, False),   # skinny: split-K
        (2048, 2048, 2048, e4, e4, torch.bfloat16, "pingpong128x64", pp, True),
    ]
    for M, N, K, da, db, odt, cname, cfg, epi in cases:
        a = torch.randn(M, K, device="cuda").to(da)
        w = torch.randn(N, K, device="cuda").to(db)
        sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([1.5], device="cuda")
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if epi else None
        act = "gelu_tanh" if epi else None

        def ref():
            pre = 0.75 * (a.double() @ w.double().t())
            return _ref_act(pre + (bias.double() if epi else 0), act)

        tag = f"fp8 {M}x{N}x{K} {str(da)[6:]}x{str(db)[6:]}->{str(odt)[6:]} [{cname}] epi={epi}"
        _check(records, tag, "sm90_persistent",
               lambda: scaled_mm(a, w.t(), sa, sb, bias=bias, activation=act, out_dtype=odt, config=cfg), ref,
               1e-2 if odt == torch.float32 else 2e-2)
    # promotion vs fast accumulation: fp32 output error on a long K
    a = torch.randn(256, 16384, device="cuda").to(e4)
    w = torch.randn(256, 16384, device="cuda").to(e4)
    one = torch.ones(1, device="cuda")
    ref = a.double() @ w.double().t()
    for cname, cfg in (("promoted", Sm90GemmConfig(tile_m=128, tile_n=128, tile_k=128, cluster_m=1)),
                       ("fast_accum", Sm90GemmConfig(tile_m=128, tile_n=128, tile_k=128, cluster_m=1,
                                                     fp8_fast_accum=True))):
        try:
            err = rel_err(scaled_mm(a, w.t(), one, one, out_dtype=torch.float32, config=cfg), ref)
            print(f"INFO fp8 K=16384 fp32-out rel_err {cname}: {err:.3e}", flush=True)
            records.append(dict(case=f"fp8 accumulation error K=16384 [{cname}]", impl="sm90_persistent", rel_err=err,
                                ok=err < 1e-2))
        except Exception as e:
            print(f"ERROR fp8 accumulation {cname}: {e}", flush=True)
            records.append(dict(case=f"fp8 accumulation error [{cname}]", impl="sm90_persistent", error=str(e), ok=False))


def group_pingpong(records, cfg_name):
    from cute_kernels.gemm.sm90_config import Sm90GemmConfig

    rungs = load_rungs([f"sm90_persistent[{cfg_name}]"])
    correctness(rungs, records, case_slice=slice(None))
    cfg = Sm90GemmConfig(**CONFIGS[cfg_name])
    group_epilogue(records, shapes=[((1, 4096, 4096, 1024), "n", 0.5, torch.bfloat16)], config=cfg,
                   impl_suffix=f"[{cfg_name}]")


def group_base(records, part):
    if part == 0:
        correctness(load_rungs(["sm90_persistent"]), records, case_slice=slice(0, 8), nan=True)
    elif part == 1:
        correctness(load_rungs(["sm90_persistent"]), records, case_slice=slice(8, None), nan=False)
    else:
        correctness(load_rungs(["sm90_warp_specialized", "sm90_tma_wgmma"]), records, case_slice=slice(2, 10))


def group_warm(records):
    """Compile (into the disk cache) and run once everything the timing phase launches."""
    bench_phase(records, warm_only=True)


GROUPS = {
    "base0": lambda r: group_base(r, 0),
    "base1": lambda r: group_base(r, 1),
    "ladder": lambda r: group_base(r, 2),
    "pp2x1": lambda r: group_pingpong(r, "p128x128_2x1"),
    "pp1x2": lambda r: group_pingpong(r, "p128x128_1x2_sw8n"),
    "pp64": lambda r: group_pingpong(r, "p64x128_1x1"),
    "epi_persistent": lambda r: group_epilogue(r),
    "epi_ws": lambda r: group_epilogue(r, kernels=("sm90_warp_specialized",)),
    "fp8": group_fp8,
    "warm": group_warm,
}


def _child(name, path):
    import io
    import contextlib

    records = []
    log = open(path + ".log", "w", buffering=1)
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            GROUPS[name](records)
        except Exception as e:
            traceback.print_exc()
            records.append(dict(case=f"group {name}", impl="-", error=str(e)[:500], ok=False))
    with open(path + ".json", "w") as f:
        json.dump(records, f)


def run_groups(names, deadline_s, jobs):
    """Each group in its own spawned process (a faulting kernel poisons only its CUDA context);
    at most `jobs` at a time; those still running at the deadline are killed and reported."""
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")
    t0 = time.time()
    pending, running, results, logs = list(names), {}, {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            n = pending.pop(0)
            path = f"/tmp/ck_group_{n}"
            p = ctx.Process(target=_child, args=(n, path))
            p.start()
            running[n] = (p, path, time.time())
        for n, (p, path, ts) in list(running.items()):
            if not p.is_alive():
                p.join()
                del running[n]
                try:
                    results[n] = json.load(open(path + ".json"))
                except Exception:
                    results[n] = [dict(case=f"group {n}", impl="-", error=f"exit code {p.exitcode}, no results", ok=False)]
                logs[n] = open(path + ".log").read() if os.path.exists(path + ".log") else ""
                print(f"[{time.time() - t0:5.0f}s] group {n} done: "
                      f"{sum(r.get('ok', False) for r in results[n])}/{len(results[n])} ok", flush=True)
            elif time.time() - t0 > deadline_s:
                p.kill()
                p.join()
                del running[n]
                logs[n] = open(path + ".log").read() if os.path.exists(path + ".log") else ""
                results[n] = [dict(case=f"group {n}", impl="-", error=f"killed at the {deadline_s}s deadline (hang?)",
                                   ok=False)]
                print(f"[{time.time() - t0:5.0f}s] group {n} KILLED at deadline", flush=True)
        time.sleep(0.5)
    return results, logs


def _time(fn, rep=40):
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=rep)


def bench_phase(records, warm_only=False, allow=("pingpong", "p64", "fp8")):
    """Timing table, same process: bf16 suite vs cuBLAS, ping-pong, fused epilogue, fp8 vs
    torch._scaled_mm, skinny M. With warm_only, run each launch once (compiles, disk cache).
    Entries that need a feature not in `allow` (its correctness group failed) are skipped, and
    those needing one run last, so a faulting kernel cannot poison the other timings."""
    import cute_kernels.gemm.sm90_rung as R
    from cute_kernels.gemm.epilogue_api import matmul_epilogue, scaled_mm
    from cute_kernels.gemm.sm90_config import Sm90GemmConfig, pick_config
    from cute_kernels.gemm.sm90_persistent import rung
    from cute_kernels.hopper.epilogue import EpilogueSpec

    later = []

    def record(case, impl, fn, flop, dtype="bf16", needs=None, now=False):
        if needs is not None and needs not in allow:
            return
        if needs is not None and not now:
            later.append((case, impl, fn, flop, dtype, needs))
            return
        try:
            if warm_only:
                fn()
                torch.cuda.synchronize()
                return
            ms = _time(fn)
            records.append(dict(case=case, impl=impl, dtype=dtype, ms=ms, tflops=flop / ms / 1e9))
            base = [r for r in records if r["case"] == case and r["impl"] in ("cublas", "cublas_fp8", "cublas_fp8_fast")]
            ratio = " ".join(f"{base_r['ms'] / ms:.3f}x {base_r['impl']}" for base_r in base if base_r["impl"] != impl)
            print(f"{case:>24} {impl:>28} {ms:8.3f} ms {flop / ms / 1e9:7.1f} TFLOP/s  {ratio}", flush=True)
        except Exception as e:
            print(f"{case:>24} {impl:>28} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
            records.append(dict(case=case, impl=impl, error=str(e)[:300]))

    def ours(cfg, a3, b3, out3, **kw):
        """Kernel-only timing: the launcher is built (compiled) on first call, arguments prebuilt."""
        Ak, Bk, Ck = (R.tma_operand(t) for t in (a3.permute(1, 2, 0), b3.permute(2, 1, 0), out3.permute(1, 2, 0)))
        held = {}

        def run():
            if "fn" not in held:
                held["fn"] = rung.launcher(cfg, Ak, Bk, Ck, **kw)
            held["fn"]()
        return run

    # bf16 suite (+ ping-pong on two shapes)
    for (M, N, K) in SUITE:
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        C0 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        case, flop = f"{M}x{N}x{K}", 2.0 * M * N * K
        a3, b3, out3 = A.unsqueeze(0), B.t().unsqueeze(0), C0.unsqueeze(0)
        record(case, "cublas", lambda: torch.matmul(A, B.t(), out=C0), flop)
        record(case, "sm90_persistent[auto]", ours(pick_config(M, N, K), a3, b3, out3), flop)
        if (M, N, K) in ((4096, 4096, 4096), (8192, 8192, 8192)):
            for cn in ("p128x128_2x1", "p128x128_2x1_sw8n"):
                record(case, f"sm90_persistent[{cn}]", ours(Sm90GemmConfig(**CONFIGS[cn]), a3, b3, out3), flop,
                       needs="pingpong")
    # fused epilogue: bias + GELU on an MLP up-projection
    M, N, K = 8192, 14336, 4096
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    case, flop = f"linear+gelu {M}x{N}x{K}", 2.0 * M * N * K
    record(case, "cublas", lambda: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias), approximate="tanh"), flop)
    record(case, "cublas_matmul_only", lambda: torch.nn.functional.linear(x, w), flop)
    y = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
    cfg = pick_config(M, N, K)
    record(case, "sm90_persistent[fused bias+gelu]",
           ours(cfg, x.unsqueeze(0), w.t().unsqueeze(0), y, epi=EpilogueSpec(bias="n", activation="gelu_tanh"),
                bias=bias), flop)
    record(case, "sm90_persistent[no epilogue]", ours(cfg, x.unsqueeze(0), w.t().unsqueeze(0), y), flop)
    record(case, "sm90_persistent[call fused]", lambda: matmul_epilogue(x, w.t(), bias=bias, activation="gelu_tanh"),
           flop)
    del x, w
    # fp8
    for (M, N, K) in ((4096, 4096, 4096), (8192, 8192, 8192)):
        a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
        sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([2.0], device="cuda")
        case, flop = f"fp8 {M}x{N}x{K}", 2.0 * M * N * K
        record(case, "cublas_fp8", lambda: torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16), flop, "e4m3",
               now=True)
        record(case, "cublas_fp8_fast", lambda: torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16,
                                                                 use_fast_accum=True), flop, "e4m3", now=True)
        y = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
        a3, b3 = a.unsqueeze(0), w.t().unsqueeze(0)
        scaled = dict(epi=EpilogueSpec(scale_ab=True), scales=(sa, sb))
        for cn, cfg in (("promoted,auto", pick_config(M, N, K, 1)),
                        ("promoted128x128_sw8n", Sm90GemmConfig(tile_m=128, tile_n=128, tile_k=128, swizzle=8, raster="n")),
                        ("fast128x256", Sm90GemmConfig(tile_m=128, tile_n=256, tile_k=128, fp8_fast_accum=True)),
                        ("fast128x256_sw8n", Sm90GemmConfig(tile_m=128, tile_n=256, tile_k=128, fp8_fast_accum=True,
                                                            swizzle=8, raster="n"))):
            record(case, f"sm90_persistent[{cn}]", ours(cfg, a3, b3, y, **scaled), flop, "e4m3", needs="fp8")
        record(case, "sm90_persistent[call]", lambda a=a, w=w, sa=sa, sb=sb: scaled_mm(a, w.t(), sa, sb), flop, "e4m3",
               needs="fp8")
    # skinny M
    for (M, N, K) in SKINNY:
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        C0 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        case, flop = f"{M}x{N}x{K}", 2.0 * M * N * K
        out3 = C0.unsqueeze(0)
        record(case, "cublas", lambda: torch.matmul(A, B.t(), out=C0), flop)
        record(case, "sm90_persistent[call,auto]", lambda: rung(A.unsqueeze(0), B.t().unsqueeze(0), out3), flop)
        for cn in ("c128x64_1x1", "p64x128_1x1", "p64x128_1x2"):
            cfg = Sm90GemmConfig(**CONFIGS[cn])
            record(case, f"sm90_persistent[call,{cn}]",
                   lambda cfg=cfg, A=A, B=B, out3=out3: rung(A.unsqueeze(0), B.t().unsqueeze(0), out3, config=cfg), flop,
                   needs="p64" if cn.startswith("p64") else None)
    # the entries that need a feature last, fp8 first (its group is the least likely to fault)
    for item in sorted(later, key=lambda it: it[5] != "fp8"):
        record(*item[:5], now=True)


def host_phase(records, calls=100, spin_cycles=400_000_000):
    """Host vs GPU cost of warm calls: `host_us` is the wall time per call of `calls` calls
    enqueued behind a GPU spin (GPU time cannot count; `waited` says whether the spin finished
    during them, i.e. something in the call waited for the GPU); `gpu_us` is the per-call GPU
    time of back-to-back calls between two events (no L2 flush). A call whose gpu_us exceeds
    the kernel's is paying for extra GPU work or idle gaps, not host code."""
    import time

    import cute_kernels.gemm.sm90_rung as R
    from cute_kernels.gemm.epilogue_api import matmul_epilogue
    from cute_kernels.gemm.sm90_config import pick_config
    from cute_kernels.gemm.sm90_persistent import rung
    from cute_kernels.hopper.epilogue import EpilogueSpec
    from cute_kernels.runtime import tvm_ffi_available

    def measure(case, impl, fn):
        fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(spin_cycles)
        spin = torch.cuda.Event()
        spin.record()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        host_us = (time.perf_counter() - t) / calls * 1e6
        waited = spin.query()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        gpu_us = start.elapsed_time(end) / calls * 1e3
        records.append(dict(case=case, impl=impl, host_us=host_us, gpu_us=gpu_us, waited=waited,
                            tvm_ffi=tvm_ffi_available()))
        print(f"{case:>24} {impl:>22} host {host_us:7.1f} us/call  gpu {gpu_us:8.1f} us/call"
              f"{'  WAITED FOR THE GPU' if waited else ''}", flush=True)

    def kernel_only(cfg, a3, b3, out3, **kw):
        Ak, Bk, Ck = (R.tma_operand(t) for t in (a3.permute(1, 2, 0), b3.permute(2, 1, 0), out3.permute(1, 2, 0)))
        return rung.launcher(cfg, Ak, Bk, Ck, **kw)

    print(f"TVM-FFI available: {tvm_ffi_available()}", flush=True)
    for (M, N, K) in [(256, 256, 256)] + SKINNY:
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        C0 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        a3, b3, out3 = A.unsqueeze(0), B.t().unsqueeze(0), C0.unsqueeze(0)
        case = f"{M}x{N}x{K}"
        measure(case, "cublas", lambda: torch.matmul(A, B.t(), out=C0))
        measure(case, "sm90_persistent[call]", lambda: rung(a3, b3, out3))
        measure(case, "sm90_persistent[kernel]", kernel_only(pick_config(M, N, K, swap_ab=False), a3, b3, out3))
    M, N, K = 8192, 14336, 4096
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
    case = f"linear+gelu {M}x{N}x{K}"
    measure(case, "matmul_epilogue", lambda: matmul_epilogue(x, w.t(), bias=bias, activation="gelu_tanh"))
    measure(case, "rung[call,fused]", lambda: rung(x.unsqueeze(0), w.t().unsqueeze(0), y, bias=bias,
                                                   activation="gelu_tanh"))
    measure(case, "kernel[fused]", kernel_only(pick_config(M, N, K, swap_ab=False), x.unsqueeze(0), w.t().unsqueeze(0), y,
                                               epi=EpilogueSpec(bias="n", activation="gelu_tanh"), bias=bias))


def batch(args):
    import time

    t0 = time.time()
    out_dir = os.environ.get("OUT", "/tmp")
    summary = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, groups={}, bench=[])

    def dump():
        with open(os.path.join(out_dir, "hopper_batch.json"), "w") as f:
            json.dump(summary, f, indent=1)

    names = [n for n in args.groups.split(",") if n]
    results, logs = run_groups(names, args.deadline, args.jobs)
    with open(os.path.join(out_dir, "hopper_batch_groups.log"), "w") as f:
        for n in names:
            recs = results.get(n, [])
            bad = [r for r in recs if not r.get("ok")]
            summary["groups"][n] = dict(ok=len(recs) - len(bad), total=len(recs), records=recs)
            f.write(f"===== {n}: {len(recs) - len(bad)}/{len(recs)} ok\n{logs.get(n, '')[-20000:]}\n")
            print(f"== {n}: {len(recs) - len(bad)}/{len(recs)} ok", flush=True)
            for r in bad[:12]:
                print(f"   BAD {r.get('impl')} {r.get('case')}: {r.get('error', r.get('rel_err'))}", flush=True)
    dump()
    print(f"[{time.time() - t0:5.0f}s] correctness done; timing", flush=True)
    if args.bench:
        ok = {n: g["total"] > 0 and g["ok"] == g["total"] for n, g in summary["groups"].items()}
        allow = [f for f, gs in (("pingpong", ("pp2x1", "pp1x2")), ("p64", ("pp64",)), ("fp8", ("fp8",)))
                 if all(ok.get(g, False) for g in gs)]
        print(f"timing with {allow}", flush=True)
        bench_phase(summary["bench"], allow=tuple(allow))
    dump()
    if args.host:
        summary["host"] = []
        host_phase(summary["host"])
        dump()
    print(f"[{time.time() - t0:5.0f}s] all done", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("phase", choices=["correctness", "bench", "batch", "host"])
    p.add_argument("--groups", default=",".join(GROUPS), help="batch: correctness groups to run")
    p.add_argument("--deadline", type=float, default=150.0, help="batch: seconds before stuck groups are killed")
    p.add_argument("--jobs", type=int, default=8, help="batch: groups run at once")
    p.add_argument("--bench", type=int, default=1, help="batch: run the timing table after the groups")
    p.add_argument("--host", type=int, default=1, help="batch: then time host vs GPU per warm call")
    p.add_argument("--rungs", default="sm90_persistent,sm90_warp_specialized,sm90_tma_wgmma")
    p.add_argument("--shapes", default="default")
    p.add_argument("--no-peers", action="store_true", help="skip the other rungs' timing lines")
    p.add_argument("--configs", default="c128x256_2x1,c128x256_1x2,c128x128_2x1")
    args = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    records = []
    if args.phase == "batch":
        return batch(args)
    if args.phase == "correctness":
        correctness(load_rungs(args.rungs.split(",")), records)
    elif args.phase == "host":
        host_phase(records)
    else:
        shapes = {"default": SUITE, "quick": SUITE[:2], "skinny": SKINNY, "all": SUITE + SKINNY}[args.shapes]
        bench(shapes, [c for c in args.configs.split(",") if c], records, others=not args.no_peers)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"hopper_gemm_{args.phase}.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), records=records), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
