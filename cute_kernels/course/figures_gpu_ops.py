"""The course's `gpu` figures made with the library's own ops (pages 8-23): attention's dQ
atomics, streams, timing methods, pipeline depth, memory-bound PyTorch ops, autotuning, CUDA
graphs. As in `figures_gpu`: `measure()` on the GPU, `make(ctx)` from the stored numbers.
"""

from __future__ import annotations

import math
import time

from .core import figure, md_table
from .draw import MB, fmt as _fmt
from .measure import check_close, check_equal, gbps, randn, time_ms


def _measure_dq_atomics():
    import torch

    from cute_kernels.attention import attention_backward, attention_forward

    b, h, s, dim = 2, 16, 2048, 128
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v, do = (torch.randn(b, h, s, dim, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    out, lse = attention_forward(q, k, v, causal="top_left")
    rows = {}
    grads = {}
    for det in (False, True):
        grads[det] = attention_backward(do, q, k, v, out, lse, causal="top_left", deterministic=det)
        rows["deterministic" if det else "fp32 atomics"] = time_ms(
            lambda det=det: attention_backward(do, q, k, v, out, lse, causal="top_left", deterministic=det))
    for a, r, what in zip(grads[False], grads[True], ("dq", "dk", "dv")):
        check_close(a.float(), r.float(), f"attention backward {what}: atomics vs deterministic", rtol=2e-2, atol=2e-2)
    again = attention_backward(do, q, k, v, out, lse, causal="top_left", deterministic=False)[0]
    return {"shape": [b, h, s, dim], "ms": rows,
            "dq_bitwise_repeatable": bool(torch.equal(again, grads[False][0]))}


@figure("dq_atomics", "08-atomics.md", "gpu", measure=_measure_dq_atomics)
def dq_atomics(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = [[k, _fmt(ms, ".3f")] for k, ms in d["ms"].items()]
    b, h, s, dim = d["shape"]
    return (f"{ctx.gpu_source()} `attention_backward` for (B, H, S, D) = ({b}, {h}, {s}, {dim}), bf16, causal; "
            f"two fp32-atomic runs gave bitwise-equal dQ: {'yes' if d['dq_bitwise_repeatable'] else 'no'}.\n\n"
            + md_table(["dQ accumulated by", "ms"], rows))


# ---- page 9: streams -------------------------------------------------------------------------

def _measure_streams():
    import torch

    from cute_kernels.gemm import matmul

    gen = torch.Generator(device="cuda").manual_seed(12)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=gen)
    host = torch.randn(64 * MB, dtype=torch.float32).pin_memory()  # 256 MiB
    dev = torch.empty_like(host, device="cuda")
    side = torch.cuda.Stream()
    c = matmul(a, b)  # checked on a corner, against float32
    check_close(c[:256, :256].float(), a[:256].float() @ b[:, :256].float(), "matmul", rtol=2e-2, atol=1.0)

    def wall(fn, reps=5):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]

    def gemm():
        matmul(a, b)

    def copy():
        dev.copy_(host, non_blocking=True)

    def serial():
        gemm()
        copy()

    def overlapped():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            copy()
        gemm()
        torch.cuda.current_stream().wait_stream(side)

    res = {"gemm": wall(gemm), "h2d_copy": wall(copy), "serial": wall(serial), "overlapped": wall(overlapped)}
    check_equal(dev.cpu(), host, "host-to-device copy")
    return res


@figure("stream_overlap", "09-streams-async-copies.md", "gpu", measure=_measure_streams)
def stream_overlap(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    names = {"gemm": "8192³ bf16 GEMM alone", "h2d_copy": "256 MiB pinned host-to-device copy alone",
             "serial": "both on one stream", "overlapped": "copy on a second stream"}
    rows = [[names[k], _fmt(d[k], ".2f")] for k in ("gemm", "h2d_copy", "serial", "overlapped")]
    return (f"{ctx.gpu_source()} Wall-clock milliseconds (median of 5, synchronized).\n\n"
            + md_table(["what", "ms"], rows))


# ---- page 10: timing ---------------------------------------------------------------------

def _measure_timing():
    import statistics

    import torch

    from cute_kernels.bench.timing import cuda_event_bench
    from cute_kernels.elementwise import copy

    src = randn(16 * MB, seed=13)  # 64 MiB
    dst = torch.empty_like(src)
    small = randn(2 * MB, seed=14)  # 8 MiB: fits the L2
    small_dst = torch.empty_like(small)
    copy(src, dst)
    check_equal(dst, src, "copy")
    torch.cuda.synchronize()
    res = {}
    t0 = time.perf_counter()
    copy(src, dst)
    res["wall clock, no synchronize"] = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    copy(src, dst)
    torch.cuda.synchronize()
    res["wall clock, synchronized"] = (time.perf_counter() - t0) * 1e3
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    copy(src, dst)
    e1.record()
    torch.cuda.synchronize()
    res["one pair of CUDA events"] = e0.elapsed_time(e1)
    samples = []
    for _ in range(50):  # a synchronize after each call: the next one starts on an idle GPU
        e0.record()
        copy(src, dst)
        e1.record()
        torch.cuda.synchronize()
        samples.append(e0.elapsed_time(e1))
    res["CUDA events, median of 50, synchronized each"] = statistics.median(samples)
    res["CUDA events, median of 50 back to back"] = statistics.median(_back_to_back(lambda: copy(src, dst)))
    res["do_bench median, L2 flushed"] = time_ms(lambda: copy(src, dst))
    res["8 MiB copy, L2 warm (back to back)"] = statistics.median(_back_to_back(lambda: copy(small, small_dst)))
    res["8 MiB copy, L2 flushed"] = cuda_event_bench(lambda: copy(small, small_dst), warmup_ms=10, rep_ms=40)
    return {"method": TIMING_METHOD, "ms": res, "ncu": _ncu_summary()}


# The method of the warm rows (3: the GPU is held busy while the calls are enqueued, so no
# launch gap enters an event pair. Method 1 synchronized after each call; method 2 enqueued them
# back to back, but a copy's host path outlasts an 8 MiB copy, so the GPU still waited for the
# host inside each pair, and both showed the warm copy slower than the flushed one). Data of
# another version is not drawn.
TIMING_METHOD = 3


def _back_to_back(fn, calls: int = 50) -> list:
    """ms of each of `calls` calls of `fn`, each in its own event pair, all enqueued behind a
    spin kernel that keeps the GPU busy until they are (the GPU never waits for the host, and
    what a call leaves in the L2 stays)."""
    import torch

    fn()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    torch.cuda._sleep(50_000_000)  # ~25 ms of spinning: longer than enqueueing `calls` calls
    for e0, e1 in pairs:
        e0.record()
        fn()
        e1.record()
    torch.cuda.synchronize()
    return [e0.elapsed_time(e1) for e0, e1 in pairs]


def _ncu_summary():
    """Nsight Compute's summary of one vector copy, if `ncu` is on this machine and may profile."""
    import os
    import shutil
    import subprocess
    import sys

    ncu = shutil.which("ncu")
    if ncu is None:
        return {"available": False, "reason": "ncu is not on PATH on the GPU machine"}
    code = ("import torch; from cute_kernels.elementwise import copy; "
            "x = torch.randn(1 << 24, device='cuda'); y = torch.empty_like(x); copy(x, y); torch.cuda.synchronize()")
    metrics = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active"]
    cmd = [ncu, "--csv", "--kernel-name", "regex:VectorCopy", "--metrics", ",".join(metrics), sys.executable, "-c", code]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return {"available": False, "reason": "ncu did not finish in 120 s"}
    rows = []
    import csv
    import io

    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        if "Metric Name" in rec:
            rows.append([rec["Metric Name"], rec.get("Metric Unit", ""), rec.get("Metric Value", "")])
    if not rows:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"available": False, "reason": "ncu gave no metrics: " + " / ".join(tail)[:300]}
    return {"available": True, "rows": rows}


@figure("timing_methods", "10-timing-profiling.md", "gpu", measure=_measure_timing)
def timing_methods(ctx):
    d = ctx.measured(method=TIMING_METHOD)
    if d is None:
        return ctx.placeholder()
    rows = [[k, _fmt(v, ".4f")] for k, v in d["ms"].items()]
    text = (f"{ctx.gpu_source()} One 64 MiB `cute_kernels.elementwise.copy` (128 MiB of traffic) unless the row "
            "says otherwise.\n\n" + md_table(["how it was timed", "ms"], rows))
    ncu = d["ncu"]
    if ncu.get("available"):
        text += "\n\nNsight Compute on one 64 MiB copy:\n\n" + md_table(["metric", "unit", "value"], ncu["rows"])
    else:
        text += f"\n\nNsight Compute: not run ({ncu.get('reason')})."
    return text


# ---- page 14: pipelining ----------------------------------------------------------------------

def _measure_stages():
    import torch

    from cute_kernels.gemm import KERNELS
    from cute_kernels.gemm.sm90_config import pick_config, with_overrides

    m = n = k = 8192
    gen = torch.Generator(device="cuda").manual_seed(15)
    a = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    bt = torch.randn(1, n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = bt.transpose(1, 2)  # (1, K, N), K-major
    ref = (a[0, :256].float() @ b[0, :, :256].float())
    rung = KERNELS["sm90_persistent"]
    base = pick_config(m, n, k)
    rows = []
    out = torch.empty((1, m, n), device="cuda", dtype=torch.bfloat16)
    for stages in (1, 2, 3, 4):
        cfg = with_overrides(base, stages=stages)
        try:
            resolved = cfg.validate().resolved_stages(2, 16)
        except ValueError as err:  # the config refuses it: nothing is compiled
            rows.append({"stages": stages, "error": str(err).split("): ")[-1][:120]})
            continue
        out.fill_(float("nan"))
        rung(a, b, out, config=cfg)
        check_close(out[0, :256, :256].float(), ref, f"sm90_persistent stages={stages}", rtol=2e-2, atol=1.0)
        ms = time_ms(lambda cfg=cfg: rung(a, b, out, config=cfg))
        rows.append({"stages": stages, "resolved": resolved, "tflops": 2 * m * n * k / ms / 1e9})
    return {"shape": [m, n, k], "tile": [base.tile_m, base.tile_n, base.tile_k], "rows": rows}


@figure("pipeline_stages", "14-pipelining.md", "gpu", measure=_measure_stages)
def pipeline_stages(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = []
    for r in d["rows"]:
        label = str(r["stages"])
        if "error" in r:
            rows.append([label, "-", f"rejected: {r['error']}"])
        else:
            rows.append([label, r["resolved"], _fmt(r["tflops"], ".0f")])
    m, n, k = d["shape"]
    return (f"{ctx.gpu_source()} `sm90_persistent` at {m}x{n}x{k} bf16, tile {d['tile'][0]}x{d['tile'][1]}x"
            f"{d['tile'][2]}, only the pipeline depth changed.\n\n" + md_table(["stages asked", "stages", "TFLOP/s"], rows))


# ---- page 20: memory-bound ops ------------------------------------------------------------------

def _measure_memory_bound():
    import torch
    import torch.nn.functional as F

    from cute_kernels.elementwise import copy

    rows, cols = 16384, 4096
    x = randn(rows * cols, dtype=torch.bfloat16, seed=16).view(rows, cols)
    w = randn(cols, dtype=torch.bfloat16, seed=17)
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * 2

    def rms_eager():
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    ref = rms_eager()
    check_close(F.rms_norm(x, (cols,), w, 1e-6).float(), ref.float(), "F.rms_norm", rtol=2e-2, atol=2e-2)
    res = {
        "copy (cute_kernels.elementwise.copy)": time_ms(lambda: copy(x, y)),
        "RMSNorm, eager PyTorch ops": time_ms(rms_eager),
        "RMSNorm, F.rms_norm": time_ms(lambda: F.rms_norm(x, (cols,), w, 1e-6)),
        "softmax, torch.softmax": time_ms(lambda: torch.softmax(x, dim=-1)),
    }
    return {"shape": [rows, cols], "bytes": nbytes, "ms": res}


@figure("memory_bound_ops", "20-norms-softmax-fusion.md", "gpu", measure=_measure_memory_bound)
def memory_bound_ops(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = [[k, _fmt(ms, ".3f"), _fmt(gbps(d["bytes"], ms), ",.0f")] for k, ms in d["ms"].items()]
    return (f"{ctx.gpu_source()} A {d['shape'][0]} x {d['shape'][1]} bf16 tensor; GB/s counts the compulsory "
            "traffic (read x once, write y once).\n\n" + md_table(["op", "ms", "GB/s"], rows))


# ---- page 22: autotuning ---------------------------------------------------------------------

def _measure_autotune():
    import torch

    from cute_kernels.gemm.autotune import autotune, search_space

    gen = torch.Generator(device="cuda").manual_seed(18)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=gen)
    t0 = time.perf_counter()
    res = autotune(a, b, budget_s=30.0, save=False)
    seconds = time.perf_counter() - t0
    ran = [t for t in res.trials if t.ms is not None]
    return {"shape": [4096, 4096, 4096], "candidates": len(search_space()[0]), "trials": len(res.trials),
            "timed": len(ran), "seconds": seconds, "heuristic_ms": res.heuristic_ms, "winner_ms": res.winner_ms,
            "dropped": sorted({t.dropped for t in res.trials if t.dropped})[:5]}


@figure("autotune_cost", "22-autotuning.md", "gpu", measure=_measure_autotune)
def autotune_cost(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    m, n, k = d["shape"]
    why = ", ".join(d["dropped"]) or "-"
    rows = [["candidates in the search space", d["candidates"]], ["timed (correct) within the 30 s budget", d["timed"]],
            [f"not timed ({why})", d["trials"] - d["timed"]], ["wall time of the search (s)", _fmt(d["seconds"], ".1f")],
            ["heuristic config (ms)", _fmt(d["heuristic_ms"], ".4f")], ["winner (ms)", _fmt(d["winner_ms"], ".4f")],
            ["speed-up over the heuristic", f"{d['heuristic_ms'] / d['winner_ms']:.3f}x"]]
    return (f"{ctx.gpu_source()} `autotune(a, b, budget_s=30, save=False)` at {m}x{n}x{k} bf16.\n\n"
            + md_table(["", "value"], rows, align="lr"))


# ---- page 23: CUDA graphs ---------------------------------------------------------------------

def _measure_graphs():
    import torch

    from cute_kernels.gemm import matmul

    rows = []
    calls = 100
    for size in (256, 2048):
        gen = torch.Generator(device="cuda").manual_seed(size)
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=gen)
        check_close(matmul(a, b).float(), a.float() @ b.float(), f"matmul {size}", rtol=2e-2, atol=0.5)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                matmul(a, b)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                static = matmul(a, b)
        graph.replay()
        torch.cuda.synchronize()
        check_close(static.float(), a.float() @ b.float(), f"graph replay {size}", rtol=2e-2, atol=0.5)

        def eager():
            for _ in range(calls):
                matmul(a, b)

        def wall(fn):
            fn()
            torch.cuda.synchronize()
            best = math.inf
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
            return best / calls * 1e6

        rows.append({"size": size, "eager_us": wall(eager), "graph_us": wall(graph.replay)})
    return {"calls": calls, "rows": rows}


@figure("graph_replay", "23-cuda-graphs.md", "gpu", measure=_measure_graphs)
def graph_replay(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = [[f"{r['size']}³", _fmt(r["eager_us"], ".1f"), _fmt(r["graph_us"], ".1f"),
             f"{r['eager_us'] / r['graph_us']:.2f}x"] for r in d["rows"]]
    return (f"{ctx.gpu_source()} {d['calls']} back-to-back `cute_kernels.gemm.matmul` calls (bf16), wall clock "
            "per call, best of 5, synchronized at the end.\n\n"
            + md_table(["GEMM", "eager µs / call", "graph replay µs / call", "saved"], rows))
