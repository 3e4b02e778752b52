"""Where the fused suite's time goes, and which row tiling each kernel runs best with.

    python3 scripts/fused_sweep.py [--profile CASES] [--impls cute_kernels,quack,...]
                                   [--sweep softmax_fwd,softmax_bwd,softmax_wide,swiglu_fwd,rms_fwd,ce_fused]
                                   [--out FILE.json]

--profile: for each `fused` suite case (names as `cute-kernels bench fused --cases` takes them) and
each implementation, prepared as the suite prepares it: the suite's time per call (do_bench
median, L2 flushed), the host time per call (calls queued back to back, the GPU kept busy), and
the GPU kernel time per call from the profiler, with its kernels. A suite time near the host time
and above the kernel time is a host-bound call.

--sweep: the kernels alone (the compiled TVM-FFI function called on torch tensors, L2 flushed),
at the suite's shapes, for every candidate tiling of the family, compiled first in parallel.
Prints GB/s and % of the copy bandwidth each; writes everything as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cute_kernels.fused.dispatch import stash_chunks_for  # noqa: E402

COPY_GBPS = 4181.0  # the H200's measured copy bandwidth (bench copy suite), for the % column

# ---- sweep candidates: (label, config) per family --------------------------------------------------


def _softmax_configs(width: int, backward: bool):
    from cute_kernels.fused.dispatch import softmax_tiling
    from cute_kernels.fused.softmax import SoftmaxConfig
    from cute_kernels.fused.tiling import RowTiling

    t0, s0 = softmax_tiling(width, "bfloat16", backward=backward)
    cands = [("dispatch", (t0, s0))]
    if width <= 16384:
        nvec = width // 8
        for tpr in (64, 128, 256, 512):
            vpt = nvec // tpr
            if 1 <= vpt <= 16:
                for rows in (1, 2) if tpr <= 128 else (1,):
                    cands.append((f"resident tpr{tpr} rows{rows} vpt{vpt}", (RowTiling(8, tpr, rows, vpt), False)))
    stashes = {}
    for threads in (256, 512, 1024):
        for values in (16, 32, 64):
            if threads * values >= 2 * width and width <= 16384:
                continue
            t = RowTiling(8, threads, 1, values // 8)
            cands.append((f"streaming t{threads} v{values}", (t, True)))
            if not backward and width > 16384:  # the forward's shared-memory stash: all it holds, and half
                most = stash_chunks_for(width, t, "bfloat16")
                for k in sorted({most, most // 2} - {0}):
                    stashes[f"streaming t{threads} v{values} stash{k}"] = (t, k)
    dispatch_stash = stash_chunks_for(width, t0, "bfloat16") if s0 and not backward else 0
    out = [(label, SoftmaxConfig(t, "bfloat16", streaming=s, stash_chunks=dispatch_stash if label == "dispatch" else 0))
           for label, (t, s) in cands]
    return out + [(label, SoftmaxConfig(t, "bfloat16", streaming=True, stash_chunks=k))
                  for label, (t, k) in stashes.items()]


def _ce_configs(width: int):
    from cute_kernels.fused.cross_entropy import CrossEntropyConfig
    from cute_kernels.fused.tiling import RowTiling

    out = []
    for threads in (256, 512, 1024):
        for values in (16, 32, 64):
            t = RowTiling(8, threads, 1, values // 8)
            most = stash_chunks_for(width, t, "bfloat16")
            for k in sorted({0, most, most // 2}):
                out.append((f"t{threads} v{values} stash{k}",
                            CrossEntropyConfig(t, "bfloat16", forward=True, grad=True, stash_chunks=k)))
    return out


def _swiglu_configs(width: int):
    from cute_kernels.fused.dispatch import swiglu_tiling
    from cute_kernels.fused.swiglu import SwigluConfig
    from cute_kernels.fused.tiling import RowTiling

    cands = [("dispatch", swiglu_tiling(width, "bfloat16"))]
    for tpr, rows, vpt in ((128, 2, 2), (128, 1, 4), (256, 1, 2), (64, 4, 4), (32, 8, 4), (128, 4, 1), (256, 1, 4),
                           (512, 1, 2), (128, 2, 1)):
        cands.append((f"tpr{tpr} rows{rows} vpt{vpt}", RowTiling(8, tpr, rows, vpt)))
    return [(label, SwigluConfig(t, "bfloat16")) for label, t in cands]


def _norm_configs(width: int, residual: bool):
    from cute_kernels.fused.dispatch import norm_tiling
    from cute_kernels.fused.norms import NormConfig
    from cute_kernels.fused.tiling import RowTiling

    cands = [("dispatch", norm_tiling(width, "bfloat16", "bfloat16", residual=residual))]
    nvec = width // 8
    for tpr in (64, 128, 256, 512):
        vpt = nvec // tpr
        if 1 <= vpt <= 8:
            for rows in (1, 2) if tpr <= 128 else (1,):
                cands.append((f"tpr{tpr} rows{rows} vpt{vpt}", RowTiling(8, tpr, rows, vpt)))
    res = "bfloat16" if residual else None
    return [(label, NormConfig("rms", t, "bfloat16", weight_dtype="bfloat16", residual_dtype=res, save_stats=True))
            for label, t in cands]


SWEEPS = {  # name: (rows, width, configs, kernel kind)
    "softmax_fwd": (16384, 4096, lambda: _softmax_configs(4096, False), "softmax_fwd"),
    "softmax_bwd": (16384, 4096, lambda: _softmax_configs(4096, True), "softmax_bwd"),
    "softmax_wide": (2048, 128256, lambda: _softmax_configs(128256, False), "softmax_fwd"),
    "swiglu_fwd": (16384, 14336, lambda: _swiglu_configs(14336), "swiglu_fwd"),
    "rms_fwd": (16384, 4096, lambda: _norm_configs(4096, False), "norm_fwd"),
    "rms_residual_fwd": (16384, 4096, lambda: _norm_configs(4096, True), "norm_fwd"),
    "ce_fused": (8192, 128256, lambda: _ce_configs(128256), "ce_fused"),
}


def _compiled(kind: str, config):
    from cute_kernels.fused.host import compile_tvm_ffi

    if kind == "softmax_fwd":
        from cute_kernels.fused.softmax import SoftmaxForward, forward_args
        return compile_tvm_ffi(SoftmaxForward(config), forward_args(config), ("fused.softmax_fwd", config))
    if kind == "softmax_bwd":
        from cute_kernels.fused.softmax import SoftmaxBackward, backward_args
        return compile_tvm_ffi(SoftmaxBackward(config), backward_args(config), ("fused.softmax_bwd", config))
    if kind == "swiglu_fwd":
        from cute_kernels.fused.swiglu import SwigluForward, forward_args
        return compile_tvm_ffi(SwigluForward(config), forward_args(config), ("fused.swiglu_fwd", config))
    if kind == "ce_fused":
        from cute_kernels.fused.cross_entropy import CrossEntropy, kernel_args
        return compile_tvm_ffi(CrossEntropy(config), kernel_args(config), ("fused.cross_entropy", config))
    from cute_kernels.fused.norms import NormForward, forward_args
    return compile_tvm_ffi(NormForward(config), forward_args(config), ("fused.norm_fwd", config))


def compile_all(names: str) -> None:
    """The precompile trace: every sweep candidate's compile (no launch)."""
    for name in names.split(","):
        kind = SWEEPS[name][3]
        for _, config in SWEEPS[name][2]():
            try:
                _compiled(kind, config)
            except Exception:  # an invalid candidate is reported by the timed run
                pass


def _sweep(name: str) -> list[dict]:
    from cute_kernels.bench.timing import cuda_event_bench

    rows, width, configs, kind = SWEEPS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, width, device="cuda", generator=g).to(torch.bfloat16)
    out = []
    for label, config in configs():
        try:
            fn = _compiled(kind, config)
        except Exception as exc:
            print(f"  {name} {label}: compile failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if kind == "softmax_fwd":
            y = torch.empty_like(x)
            call, nbytes = (lambda: fn(x, y)), 2 * x.nbytes
            ref = torch.softmax(x.float(), -1)
            check = lambda: (y.float() - ref).abs().max().item()  # noqa: E731
        elif kind == "softmax_bwd":
            yv = torch.softmax(x.float(), -1).to(torch.bfloat16)
            dy = torch.randn_like(x)
            dx = torch.empty_like(x)
            call, nbytes = (lambda: fn(yv, dy, dx)), 3 * x.nbytes
            yf = yv.float()
            ref = yf * (dy.float() - (dy.float() * yf).sum(-1, keepdim=True))
            check = lambda: ((dx.float() - ref).norm() / ref.norm()).item()  # noqa: E731
        elif kind == "ce_fused":
            labels = torch.randint(0, width, (rows,), device="cuda", generator=g)
            loss = torch.empty(rows, device="cuda")
            lse = torch.empty(rows, device="cuda")
            one = torch.ones(1, device="cuda")
            grad = torch.empty_like(x)
            call, nbytes = (lambda: fn(x, labels, loss, lse, one, grad, -100, 0.0, 0.0)), 2 * x.nbytes
            ref_loss = torch.nn.functional.cross_entropy(x[:512].float(), labels[:512], reduction="none")
            ref_grad = torch.softmax(x[:512].float(), -1)
            ref_grad[torch.arange(512, device="cuda"), labels[:512]] -= 1
            check = lambda: max(((loss[:512] - ref_loss).norm() / ref_loss.norm()).item(),  # noqa: E731
                                ((grad[:512].float() - ref_grad).norm() / ref_grad.norm()).item())
        elif kind == "swiglu_fwd":
            u = torch.randn_like(x)
            o = torch.empty_like(x)
            call, nbytes = (lambda: fn(x, u, o)), 3 * x.nbytes
            ref = torch.nn.functional.silu(x.float()) * u.float()
            check = lambda: ((o.float() - ref).norm() / ref.norm()).item()  # noqa: E731
        else:
            w = torch.randn(width, device="cuda", dtype=torch.bfloat16)
            r = torch.randn_like(x) if config.residual_dtype else None
            y = torch.empty_like(x)
            s = torch.empty_like(x) if r is not None else None
            rstd = torch.empty(rows, device="cuda", dtype=torch.float32)
            call = lambda: fn(x, r, w, None, y, s, rstd, None, 1e-6)  # noqa: E731
            nbytes = (4 if r is not None else 2) * x.nbytes
            xs = x.float() + (r.float() if r is not None else 0)
            ref = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
            check = lambda: ((y.float() - ref).norm() / ref.norm()).item()  # noqa: E731
        try:
            call()
            torch.cuda.synchronize()
            err = check()
            ms = cuda_event_bench(call, warmup_ms=10, rep_ms=60)
        except Exception as exc:
            print(f"  {name} {label}: run failed: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        gbps = nbytes / ms / 1e6
        t = config.tiling
        rec = dict(sweep=name, label=label, tiling=[t.vec, t.threads_per_row, t.rows_per_cta, t.vecs_per_thread],
                   streaming=getattr(config, "streaming", False), ms=ms, gbps=gbps, pct=100 * gbps / COPY_GBPS,
                   err=err)
        print(f"  {name:16s} {label:32s} {ms * 1e3:8.1f} us {gbps:7.0f} GB/s {rec['pct']:5.1f}%  err {err:.1e}")
        out.append(rec)
    return out


def _profile(case_names: str, impl_names: str) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from cute_kernels.bench.fused_cases import FusedCase
    from cute_kernels.bench.fused_impls import fused_impls
    from cute_kernels.bench.timing import make_gpu_timer

    timer = make_gpu_timer(10, 60)
    impls = fused_impls()
    out = []
    for name in case_names.split(","):
        case = FusedCase.parse(name)
        inputs = case.make_inputs("cuda", 0)
        for impl in impl_names.split(","):
            try:
                fn = impls[impl].prepare(case, inputs).fn
                fn()
                torch.cuda.synchronize()
            except Exception as exc:
                print(f"  {name} {impl}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            ms = timer(fn, f"{name}/{impl}")
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            n = 50
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            host_us = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            kernels: dict[str, list] = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    k = kernels.setdefault(e.name[:70], [0.0, 0])
                    k[0] += e.device_time_total / 10
                    k[1] += 1
            gpu_us = sum(v[0] for v in kernels.values())
            top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:4]
            print(f"  {name:36s} {impl:14s} suite {ms * 1e3:8.1f} us  host {host_us:7.1f} us  gpu {gpu_us:7.1f} us  "
                  + "; ".join(f"{k} {v[0]:.1f}us x{v[1] // 10}" for k, v in top))
            out.append(dict(case=name, impl=impl, suite_us=ms * 1e3, host_us=host_us, gpu_us=gpu_us,
                            kernels={k: v[0] for k, v in top}))
        del inputs
        torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="")
    p.add_argument("--impls", default="cute_kernels,eager,torch_compile,quack,liger")
    p.add_argument("--sweep", default="")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    result = {"device": torch.cuda.get_device_name(), "profile": [], "sweep": []}
    if a.sweep:
        from cute_kernels.runtime.precompile import precompile

        t0 = time.time()
        counts = precompile("scripts.fused_sweep:compile_all", a.sweep)
        print(f"precompiled in {time.time() - t0:.0f} s: {counts}")
        for name in a.sweep.split(","):
            result["sweep"] += _sweep(name)
    if a.profile:
        result["profile"] = _profile(a.profile, a.impls)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
