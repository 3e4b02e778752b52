"""Time the skinny GEMM (`cute_kernels.gemm.gemv`) against torch.matmul (cuBLAS) on decode shapes,
in one process, the L2 flushed before every timed call (`cute_kernels.bench.timing`).

    python3 scripts/gemv_bench.py                    # target shapes, M in {1, 2, 4, 8, 16}
    python3 scripts/gemv_bench.py --sweep            # M in {1, 16}: a grid of configs per shape
    python3 scripts/gemv_bench.py --shapes 1x4096x4096,16x14336x4096 --major n --json out.json

A shape is MxNxK of out (M, N) = x (M, K) @ w; --major k (default) takes w as nn.Linear's
(N, K) weight (x @ w.t()), --major n as a row-major (K, N) matrix. M or N must be at most 16
(N <= 16 runs with the roles swapped). Columns: the config (GemvConfig.tag), our time and
torch's (median us), GB/s over the bytes read and written once, that as a share of the copy
bandwidth measured first in the same process, and torch time / ours (> 1: we are faster).
Every timed config is first checked against torch in float64 (rel. error < 1e-2), so a
wrong kernel is reported, never timed as fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

# run from a checkout: its cute_kernels, not another installed copy
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DECODE = [(n, k) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096), (1024, 4096),
                              (2048, 2048), (8192, 2048), (2048, 8192), (768, 768), (3072, 768), (768, 3072),
                              (8192, 8192), (32768, 1024), (1024, 32768))]
# N <= 16 over many rows (the roles swap): an MoE router, a classifier head
SWAPPED = [(8192, 8, 4096), (32768, 16, 2048), (16384, 2, 768)]
TARGETS = [(m, n, k) for m in (1, 2, 4, 8, 16) for n, k in DECODE] + SWAPPED


def parse_shapes(text: str):
    out = []
    for item in text.split(","):
        m, n, k = (int(x) for x in item.lower().split("x"))
        out.append((m, n, k))
    return out


def copy_bandwidth(timer) -> float:
    """GB/s of a 1 GiB device-to-device copy (bytes read + written)."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), "copy")
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e9


def sweep_configs(base):
    """The heuristic's config and a grid around it (tiles x chunks, warps, cluster split, prefetch),
    keeping its read plan: one grid for every shape, so the builds are shared."""
    out = [base]
    shapes = ((8, 1), (16, 1)) if base.r_vec == 8 else ((8, 1), (4, 2))
    for t, chunks in shapes:
        for warps in (4, 8):
            for cluster in (1, 2, 4):
                for prefetch in (False, True):
                    try:
                        c = base.with_(tiles=t, chunks=chunks, warps=warps, cluster_k=cluster,
                                       prefetch=prefetch).validate()
                    except ValueError:
                        continue
                    if c not in out:
                        out.append(c)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=parse_shapes, default=TARGETS, help="comma-separated MxNxK")
    ap.add_argument("--major", choices=("k", "n"), default="k", help="w as (N, K) (k) or (K, N) (n)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--sweep", action="store_true", help="time a few configs per shape")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--rep-ms", type=float, default=50.0, help="timed milliseconds per measurement")
    args = ap.parse_args(argv)
    if args.sweep and args.shapes is TARGETS:
        args.shapes = [(m, n, k) for m in (1, 16) for n, k in DECODE] + SWAPPED

    from cute_kernels.bench.timing import interleaved, make_gpu_timer
    from cute_kernels.gemm.gemv import RUNG

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    timer = make_gpu_timer(warmup_ms=min(10.0, args.rep_ms / 4), rep_ms=args.rep_ms)
    copy_gbs = copy_bandwidth(timer)
    print(f"device {torch.cuda.get_device_name()}  copy bandwidth {copy_gbs:.0f} GB/s  timer {timer.backend}")
    print(f"{'shape':>20} {'config':<34} {'ours us':>8} {'torch us':>8} {'GB/s':>6} {'%copy':>6} {'torch/ours':>10}")
    records = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in args.shapes:
        x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        w = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
        if args.major == "n":
            w = w.t().contiguous()  # (K, N) row-major
            b3 = w.unsqueeze(0)

            def ref_fn():
                return x @ w
        else:
            b3 = w.t().unsqueeze(0)

            def ref_fn():
                return x @ w.t()
        a3 = x.unsqueeze(0)
        out3 = torch.empty(1, m, n, dtype=dtype, device="cuda")
        why = RUNG.supports(a3, b3, out3)
        if why is not None:
            print(f"{m}x{n}x{k:>6}: gemv declines: {why}")
            continue
        base = RUNG.config_for(a3, b3, out3)
        configs = sweep_configs(base) if args.sweep else [base]
        ref = x.double() @ (w.double() if args.major == "n" else w.double().t())
        nbytes = (m * k + n * k + m * n) * x.element_size()
        fns = {"torch": ref_fn}
        for cfg in configs:
            RUNG(a3, b3, out3, config=cfg)
            err = ((out3[0].double() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                print(f"{m}x{n}x{k}: config {cfg.tag} is WRONG (relative error {err:.3g}); not timed")
                records.append(dict(case=f"{m}x{n}x{k}", config=cfg.tag, wrong=True, rel_err=err))
                continue
            fns[cfg.tag] = (lambda cfg=cfg: RUNG(a3, b3, out3, config=cfg))
        times = {name: t.median for name, t in interleaved(fns, timer, args.rounds).items()}
        t_ref = times.pop("torch")
        best = min(times, key=times.get) if times else None
        for tag, ms in times.items():
            gbs = nbytes / (ms * 1e-3) / 1e9
            mark = "*" if (tag == best and len(times) > 1) else " "
            shape = f"{m}x{n}x{k}"
            print(f"{shape:>20} {tag:<33}{mark} {ms * 1e3:8.1f} {t_ref * 1e3:8.1f} {gbs:6.0f} {100 * gbs / copy_gbs:5.1f}% "
                  f"{t_ref / ms:9.2f}x")
            records.append(dict(case=shape, major=args.major, dtype=args.dtype, config=tag, heuristic=tag == base.tag,
                                ms=ms, torch_ms=t_ref, gbs=gbs, copy_gbs=copy_gbs, ratio=t_ref / ms))
        if len(times) > 1:
            print(f"{'':>20} heuristic {base.tag}: {t_ref / times.get(base.tag, float('nan')):.2f}x, best {best}: "
                  f"{t_ref / times[best]:.2f}x")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
