"""The course's `gpu` figures: each `measure()` runs on a Hopper GPU and returns plain numbers;
each `make(ctx)` draws them from the stored data file (or says they are not measured yet).

Sizes are chosen so that the whole set runs in a few minutes on one H200, compiles included.
"""

from __future__ import annotations

import math
import time

from .core import figure, md_table
from .measure import check_close, check_equal, gbps, randn, run_probe, sm_count, time_ms

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30


def _fmt(v, spec=".1f") -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", GB), ("MiB", MB), ("KiB", KB)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _plot(ctx, name: str, draw, *, size=(6.4, 3.2)):
    """Draw with `draw(ax)` (or `draw(fig)` for several axes) into docs/course/img/NAME.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cute_kernels.bench.plot import save_png

    fig = plt.figure(figsize=size)
    draw(fig)
    fig.tight_layout()
    save_png(fig, ctx.image(name), max_bytes=60_000, dpis=(80, 64, 50))
    return ctx.img_link(name, name.replace("_", " "))


# ---- page 2: the first kernel -------------------------------------------------------------

def _measure_vector_add():
    import torch

    from cute_kernels.probes.vector_add import vector_add

    n = 1 << 26
    a, b = randn(n, seed=1), randn(n, seed=2)
    ref = a + b
    rows = {}
    for vec in (1, 4):
        out = torch.full_like(a, float("nan"))
        vector_add(a, b, out, vec=vec)
        check_equal(out, ref, f"vector_add(vec={vec})")
        rows[f"VectorAdd vec={vec}"] = time_ms(lambda out=out, vec=vec: vector_add(a, b, out, vec=vec))
    out = torch.empty_like(a)
    rows["torch.add"] = time_ms(lambda: torch.add(a, b, out=out))
    return {"n": n, "bytes": 3 * 4 * n, "ms": rows}


@figure("vector_add_speed", "02-programming-model.md", "gpu", measure=_measure_vector_add)
def vector_add_speed(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = [[k, _fmt(ms, ".3f"), _fmt(gbps(d["bytes"], ms), ".0f")] for k, ms in d["ms"].items()]
    return (f"{ctx.gpu_source()} c = a + b on {d['n']:,} fp32 elements ({_size(d['bytes'])} moved), "
            "the output checked equal to torch's first.\n\n" + md_table(["kernel", "ms", "GB/s"], rows))


# ---- page 3: the memory hierarchy ---------------------------------------------------------

CHASE_SETS = [16 * KB, 32 * KB, 64 * KB, 128 * KB, 192 * KB, 256 * KB, 512 * KB, 1 * MB, 4 * MB, 16 * MB,
              32 * MB, 48 * MB, 64 * MB, 128 * MB, 512 * MB]
CHASE_STEPS = 4096


def _chase(space: str, working_set: int, steps: int = CHASE_STEPS):
    import torch

    from cute_kernels.probes.memory import build_chase
    from cute_kernels.probes.reference import chase_chain, chase_end

    chain = chase_chain(working_set, device="cuda")
    out = torch.full((2,), -1, dtype=torch.int64, device="cuda")
    run_probe(build_chase(space), chain, out, steps, align=4)
    torch.cuda.synchronize()
    expect = chase_end(chain, 2 * steps)
    if int(out[1]) != expect:
        raise AssertionError(f"chase({space}, {working_set}): ended at {int(out[1])}, expected {expect}")
    return int(out[0]) / steps, chain, out


def _clock_mhz() -> float:
    """The SM clock during a long chase: its clock64 cycles over its CUDA-event time (the kernel
    chases twice `steps` hops, the warm-up lap and the timed one, at the same pace)."""
    import torch

    from cute_kernels.probes.memory import build_chase

    _, chain, out = _chase("global", 16 * KB)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run_probe(build_chase("global"), chain, out, 200_000, align=4)
    stop.record()
    torch.cuda.synchronize()
    return 2 * float(out[0]) / (start.elapsed_time(stop) * 1e3)


def _measure_latency():
    rows = [{"bytes": ws, "cycles": _chase("global", ws)[0]} for ws in CHASE_SETS]
    shared = _chase("shared", 32 * KB)[0]
    return {"global": rows, "shared_cycles": shared, "clock_mhz": _clock_mhz(), "steps": CHASE_STEPS}


@figure("latency_levels", "03-memory-hierarchy.md", "gpu", measure=_measure_latency, what="plot and table")
def latency_levels(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    mhz = d["clock_mhz"]

    def draw(fig):
        ax = fig.add_subplot(111)
        xs = [r["bytes"] for r in d["global"]]
        ax.semilogx(xs, [r["cycles"] for r in d["global"]], "o-", label="global load (LDG)")
        ax.axhline(d["shared_cycles"], color="tab:green", ls="--", label="shared load (LDS)")
        ax.set_xlabel("working set (bytes)")
        ax.set_ylabel("cycles per dependent load")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()

    rows = [[_size(r["bytes"]), _fmt(r["cycles"], ".0f"), _fmt(r["cycles"] / mhz * 1e3, ".0f")] for r in d["global"]]
    rows.append(["shared memory, 32 KiB", _fmt(d["shared_cycles"], ".0f"), _fmt(d["shared_cycles"] / mhz * 1e3, ".0f")])
    return (f"{ctx.gpu_source()} One thread, {d['steps']} dependent loads after a warm-up lap; SM clock "
            f"{mhz:.0f} MHz during the chase.\n\n" + _plot(ctx, "latency_levels", draw) + "\n\n"
            + md_table(["working set", "cycles / load", "ns / load"], rows))


def _read_case(src, blocks: int, passes: int, vectors: int = 4, smem_pad: int = 0):
    import torch

    from cute_kernels.probes.memory import build_read
    from cute_kernels.probes.reference import read_sums

    threads = 256
    out = torch.full((blocks * threads,), float("nan"), device="cuda")
    job = build_read(threads, vectors, smem_pad)
    run_probe(job, src, out, blocks, passes)
    check_close(out, read_sums(src, threads=threads, vectors=vectors, blocks=blocks, passes=passes),
                f"read(blocks={blocks}, passes={passes})", rtol=1e-4, atol=1e-3 * math.sqrt(passes))
    ms = time_ms(lambda: run_probe(job, src, out, blocks, passes))
    return ms, blocks * passes * threads * 4 * vectors * 4


def _measure_bandwidth():
    import torch

    from cute_kernels.probes.memory import build_smem_read
    from cute_kernels.probes.reference import smem_read_sums

    sms = sm_count()
    tile_bytes = 256 * 16 * 4
    levels = []
    hbm = randn(GB // 4, seed=3)
    ms, nbytes = _read_case(hbm, hbm.numel() * 4 // tile_bytes, 1)
    levels.append(("HBM", GB, ms, nbytes))
    del hbm
    l2 = randn(8 * MB // 4, seed=4)
    ms, nbytes = _read_case(l2, sms * 8, 64)
    levels.append(("L2", 8 * MB, ms, nbytes))
    l1 = randn(4 * tile_bytes // 4, seed=5)
    ms, nbytes = _read_case(l1, sms * 8, 512)
    levels.append(("L1", 4 * tile_bytes, ms, nbytes))
    src = randn(8192 * 4, seed=6)
    blocks, passes = sms * 8, 4096
    out = torch.full((blocks * 256,), float("nan"), device="cuda")
    job = build_smem_read(256, 8)
    run_probe(job, src, out, blocks, passes)
    check_close(out, smem_read_sums(src, threads=256, vectors=8, blocks=blocks, passes=passes), "smem_read",
                rtol=1e-4, atol=0.1)
    ms = time_ms(lambda: run_probe(job, src, out, blocks, passes))
    levels.append(("shared memory", 32 * KB, ms, blocks * passes * 256 * 16))
    return {"sms": sms, "levels": [{"level": l, "working_set": ws, "ms": m, "bytes": b} for l, ws, m, b in levels]}


@figure("bandwidth_levels", "03-memory-hierarchy.md", "gpu", measure=_measure_bandwidth)
def bandwidth_levels(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = [[r["level"], _size(r["working_set"]), _fmt(gbps(r["bytes"], r["ms"]), ",.0f"),
             _fmt(gbps(r["bytes"], r["ms"]) / d["sms"], ".0f")] for r in d["levels"]]
    return (f"{ctx.gpu_source()} Every figure is bytes read over the kernel's time; the summed values "
            "were checked against torch first.\n\n" + md_table(["level", "working set", "GB/s", "GB/s per SM"], rows))


# ---- page 4: access patterns ---------------------------------------------------------------

STRIDES = (1, 2, 4, 8, 16, 32)


def _measure_strided():
    import torch

    from cute_kernels.probes.access import build_strided

    m = 1 << 22
    job = build_strided()
    rows = []
    for s in STRIDES:
        src = randn(m * s, seed=s)
        out = torch.full((m,), float("nan"), device="cuda")
        run_probe(job, src, out, s, align=4)
        check_equal(out, src[::s], f"strided read, stride {s}")
        rows.append({"stride": s, "ms": time_ms(lambda src=src, out=out, s=s: run_probe(job, src, out, s, align=4))})
        del src
    return {"elements": m, "rows": rows}


@figure("strided_reads", "04-access-patterns.md", "gpu", measure=_measure_strided, what="table")
def strided_reads(ctx):
    from cute_kernels.layouts import Layout, coalescing

    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = []
    for r in d["rows"]:
        rep = coalescing(Layout((32, r["stride"]), (r["stride"], 1)), "f32", Layout((32, 1), (1, 0)))
        rows.append([r["stride"], rep.sectors, f"{100 * rep.efficiency:.1f}%", _fmt(r["ms"], ".4f"),
                     _fmt(gbps(8 * d["elements"], r["ms"]), ",.0f")])
    return (f"{ctx.gpu_source()} out[i] = src[i * stride] for {d['elements']:,} fp32 outputs; "
            "'sectors' and 'efficiency' are `coalescing()`'s prediction for one warp's load, "
            "GB/s counts the useful bytes only (4 read + 4 written per element).\n\n"
            + md_table(["stride", "sectors / warp load", "predicted efficiency", "ms", "useful GB/s"], rows))


def _measure_vector_widths():
    import torch

    from cute_kernels.elementwise import copy
    from cute_kernels.elementwise.vector_copy import CopyConfig

    src = randn(64 * MB, dtype=torch.float32, seed=7)  # 256 MiB
    dst = torch.empty_like(src)
    rows = []
    for vb in (4, 8, 16):
        cfg = CopyConfig(vector_bytes=vb)
        dst.fill_(float("nan"))
        copy(src, dst, config=cfg)
        check_equal(dst, src, f"copy, {vb}-byte vectors")
        rows.append({"vector_bytes": vb, "ms": time_ms(lambda cfg=cfg: copy(src, dst, config=cfg))})
    return {"bytes": 2 * src.numel() * 4, "rows": rows}


@figure("vector_widths", "04-access-patterns.md", "gpu", measure=_measure_vector_widths)
def vector_widths(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = [[r["vector_bytes"], _fmt(r["ms"], ".3f"), _fmt(gbps(d["bytes"], r["ms"]), ",.0f")] for r in d["rows"]]
    return (f"{ctx.gpu_source()} `cute_kernels.elementwise.copy` of 256 MiB with `CopyConfig(vector_bytes=...)`; "
            "every other setting the default.\n\n" + md_table(["bytes per access", "ms", "GB/s"], rows))


def _measure_transpose():
    import torch

    from cute_kernels.probes.access import SMEM_LAYOUTS, build_transpose

    n = 8192
    inp = randn(n * n, seed=8).view(n, n)
    ref = inp.t().contiguous()
    out = torch.empty_like(inp)
    rows = {}
    for name in SMEM_LAYOUTS:
        job = build_transpose(name)
        out.fill_(float("nan"))
        run_probe(job, inp, out)
        check_equal(out, ref, f"transpose through {name} shared memory")
        rows[name] = time_ms(lambda job=job: run_probe(job, inp, out))
    rows["torch (x.t().contiguous())"] = time_ms(lambda: out.copy_(inp.t()))
    return {"n": n, "ms": rows}


@figure("transpose_layouts", "04-access-patterns.md", "gpu", measure=_measure_transpose)
def transpose_layouts(ctx):
    from cute_kernels.layouts import bank_conflicts
    from cute_kernels.probes.smem_layouts import SMEM_LAYOUTS, column_read

    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = []
    for name, ms in d["ms"].items():
        pred = "-"
        if name in SMEM_LAYOUTS:
            rep = bank_conflicts(SMEM_LAYOUTS[name], column_read(), "f32", swizzle_unit="elements")
            pred = f"{rep.wavefronts} ({rep.way}-way)" if not rep.conflict_free else "1 (conflict-free)"
        rows.append([name, pred, _fmt(ms, ".3f"), _fmt(gbps(8 * d["n"] ** 2, ms), ",.0f")])
    return (f"{ctx.gpu_source()} A {d['n']} x {d['n']} fp32 transpose, output checked equal to torch's; "
            "wavefronts: `bank_conflicts()`'s prediction for the column read of shared memory.\n\n"
            + md_table(["shared-memory layout", "wavefronts per column read", "ms", "GB/s"], rows))


# ---- page 5: warps ---------------------------------------------------------------------------

def _measure_divergence():
    import torch

    from cute_kernels.probes.reference import divergence_values
    from cute_kernels.probes.warps import build_divergence

    blocks, iters = sm_count() * 8, 4096
    out = torch.empty(blocks * 256, device="cuda")
    rows = []
    for g in (1, 2, 4, 8, 16, 32):
        job = build_divergence(g)
        out.fill_(float("nan"))
        run_probe(job, out, blocks, iters, align=4)
        check_close(out, divergence_values(g, threads=256, blocks=blocks, iters=iters, device="cuda"),
                    f"divergence group {g}", rtol=1e-4, atol=1e-4)
        rows.append({"group": g, "ms": time_ms(lambda job=job: run_probe(job, out, blocks, iters, align=4))})
    return {"blocks": blocks, "iters": iters, "rows": rows}


@figure("divergence", "05-warps-occupancy.md", "gpu", measure=_measure_divergence)
def divergence(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    base = next(r["ms"] for r in d["rows"] if r["group"] == 32)
    rows = [[r["group"], "no" if r["group"] == 32 else "yes", _fmt(r["ms"], ".3f"), f"{r['ms'] / base:.2f}x"]
            for r in d["rows"]]
    return (f"{ctx.gpu_source()} {d['blocks']} blocks of 256 threads, {d['iters']} steps per thread; a thread "
            "takes side (t // group) % 2.\n\n" + md_table(["group (lanes per side)", "warps diverge", "ms",
                                                           "time vs no divergence"], rows))


def _measure_occupancy():
    import torch

    from cute_kernels.probes.reference import fma_values
    from cute_kernels.probes.warps import build_fma

    sms = sm_count()
    src = randn(GB // 4, seed=9)
    tile_bytes = 256 * 16 * 4
    blocks = src.numel() * 4 // tile_bytes
    mem = []
    for per_sm in (1, 2, 4, 8):
        pad = (227 * KB // per_sm) // 1024 * 1024 - 1024 if per_sm < 8 else 0
        ms, nbytes = _read_case(src, blocks, 1, smem_pad=max(pad, 0))
        mem.append({"blocks_per_sm": per_sm, "gbps": gbps(nbytes, ms)})
    del src
    fma, iters = [], 4096
    for chains in (1, 8):
        job = build_fma(chains)
        for per_sm in (1, 2, 4, 8):
            nblk = sms * per_sm
            out = torch.full((nblk * 256,), float("nan"), device="cuda")
            run_probe(job, out, nblk, iters, align=4)
            check_close(out, fma_values(chains, threads=256, blocks=nblk, iters=iters, device="cuda"),
                        f"fma chains={chains}", rtol=1e-4, atol=1e-3)
            ms = time_ms(lambda job=job, out=out, nblk=nblk: run_probe(job, out, nblk, iters, align=4))
            fma.append({"chains": chains, "blocks_per_sm": per_sm, "tflops": 2 * chains * iters * nblk * 256 / ms / 1e9})
    return {"memory": mem, "fma": fma}


@figure("occupancy_sweep", "05-warps-occupancy.md", "gpu", measure=_measure_occupancy, what="plot")
def occupancy_sweep(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()

    def draw(fig):
        ax1, ax2 = fig.add_subplot(121), fig.add_subplot(122)
        ax1.plot([8 * r["blocks_per_sm"] for r in d["memory"]], [r["gbps"] for r in d["memory"]], "o-")
        ax1.set_title("1 GiB read (16-byte loads)")
        ax1.set_xlabel("warps per SM")
        ax1.set_ylabel("GB/s")
        for chains in sorted({r["chains"] for r in d["fma"]}):
            pts = [r for r in d["fma"] if r["chains"] == chains]
            ax2.plot([8 * r["blocks_per_sm"] for r in pts], [r["tflops"] for r in pts], "o-", label=f"{chains} chain(s)")
        ax2.set_title("FP32 FMA chains")
        ax2.set_xlabel("warps per SM")
        ax2.set_ylabel("TFLOP/s")
        ax2.legend()
        for ax in (ax1, ax2):
            ax.grid(True, alpha=0.3)

    rows = [[8 * r["blocks_per_sm"], _fmt(r["gbps"], ",.0f")] for r in d["memory"]]
    frows = [[r["chains"], 8 * r["blocks_per_sm"], _fmt(r["tflops"], ".1f")] for r in d["fma"]]
    return (f"{ctx.gpu_source()} Left: `ReadBandwidth` over 1 GiB with unused shared memory (`smem_pad`) "
            "capping the blocks per SM. Right: `FmaChains` with 1 and 8 independent chains, one wave of "
            "blocks.\n\n" + _plot(ctx, "occupancy_sweep", draw, size=(7.2, 3.0)) + "\n\n"
            + md_table(["warps per SM", "read GB/s"], rows) + "\n\n"
            + md_table(["chains", "warps per SM", "TFLOP/s"], frows))


# ---- pages 6 and 8: reductions and atomics --------------------------------------------------

def _measure_reductions():
    import torch

    from cute_kernels.probes.reduce import STRATEGIES, build_sum

    n = 1 << 25
    src = randn(n, seed=10)
    ref = src.double().sum()
    scale = float(src.double().abs().sum())
    out = torch.zeros(1, device="cuda")
    blocks = sm_count() * 8
    rows = {}
    for s in STRATEGIES:
        job = build_sum(s)

        def call(job=job):
            out.zero_()
            run_probe(job, src, out, blocks, align=4)

        call()
        torch.cuda.synchronize()
        if abs(float(out[0]) - float(ref)) > 1e-5 * scale:
            raise AssertionError(f"sum ({s}): {float(out[0])}, reference {float(ref)}")
        rows[s] = time_ms(call)
    rows["torch.sum"] = time_ms(lambda: torch.sum(src, out=out[0]))
    return {"n": n, "blocks": blocks, "ms": rows}


@figure("reductions", "06-shared-memory-sync.md", "gpu", measure=_measure_reductions)
def reductions(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()
    rows = [[k, _fmt(ms, ".3f"), _fmt(gbps(4 * d["n"], ms), ",.0f")] for k, ms in d["ms"].items()]
    return (f"{ctx.gpu_source()} The sum of {d['n']:,} fp32 values with {d['blocks']} blocks of 256 threads; "
            "each result checked against a float64 sum first (the time includes zeroing the result).\n\n"
            + md_table(["strategy", "ms", "GB/s"], rows))


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


# ---- page 7: registers and ILP ------------------------------------------------------------

def _measure_ilp():
    import torch

    from cute_kernels.probes.reference import fma_values
    from cute_kernels.probes.warps import build_fma

    sms, iters = sm_count(), 4096
    rows = []
    for chains in (1, 2, 4, 8, 16):
        job = build_fma(chains)
        for per_sm in (2, 8):
            nblk = sms * per_sm
            out = torch.full((nblk * 256,), float("nan"), device="cuda")
            run_probe(job, out, nblk, iters, align=4)
            check_close(out, fma_values(chains, threads=256, blocks=nblk, iters=iters, device="cuda"),
                        f"fma chains={chains}", rtol=1e-4, atol=1e-3)
            ms = time_ms(lambda job=job, out=out, nblk=nblk: run_probe(job, out, nblk, iters, align=4))
            rows.append({"chains": chains, "warps_per_sm": 8 * per_sm, "tflops": 2 * chains * iters * nblk * 256 / ms / 1e9})
    spill = build_fma(64, 8)
    nblk = sms * 8
    out = torch.full((nblk * 256,), float("nan"), device="cuda")
    run_probe(spill, out, nblk, iters, align=4)
    check_close(out, fma_values(64, threads=256, blocks=nblk, iters=iters, device="cuda"), "fma 64 chains, spilled",
                rtol=1e-4, atol=1e-2)
    ms = time_ms(lambda: run_probe(spill, out, nblk, iters, align=4))
    return {"rows": rows, "spilled_64": 2 * 64 * iters * nblk * 256 / ms / 1e9}


@figure("ilp_throughput", "07-registers-ilp.md", "gpu", measure=_measure_ilp, what="plot and table")
def ilp_throughput(ctx):
    d = ctx.measured()
    if d is None:
        return ctx.placeholder()

    def draw(fig):
        ax = fig.add_subplot(111)
        for w in sorted({r["warps_per_sm"] for r in d["rows"]}):
            pts = [r for r in d["rows"] if r["warps_per_sm"] == w]
            ax.plot([r["chains"] for r in pts], [r["tflops"] for r in pts], "o-", label=f"{w} warps/SM")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("independent FMA chains per thread")
        ax.set_ylabel("FP32 TFLOP/s")
        ax.grid(True, alpha=0.3)
        ax.legend()

    rows = [[r["chains"], r["warps_per_sm"], _fmt(r["tflops"], ".1f")] for r in d["rows"]]
    rows.append(["64 (spilled: launch bound 8 blocks/SM)", 64, _fmt(d["spilled_64"], ".1f")])
    return (f"{ctx.gpu_source()}\n\n" + _plot(ctx, "ilp_throughput", draw) + "\n\n"
            + md_table(["chains", "warps per SM", "TFLOP/s"], rows))


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
    check_close(matmul(a[:256], b[:, :256].contiguous()).float(), a[:256].float() @ b[:, :256].float(), "matmul",
                rtol=2e-2, atol=0.5)

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
    for _ in range(50):
        e0.record()
        copy(src, dst)
        e1.record()
        torch.cuda.synchronize()
        samples.append(e0.elapsed_time(e1))
    res["CUDA events, median of 50 (L2 warm)"] = statistics.median(samples)
    res["do_bench median, L2 flushed"] = time_ms(lambda: copy(src, dst))
    hot = []
    for _ in range(50):
        e0.record()
        copy(small, small_dst)
        e1.record()
        torch.cuda.synchronize()
        hot.append(e0.elapsed_time(e1))
    res["8 MiB copy, L2 warm"] = statistics.median(hot)
    res["8 MiB copy, L2 flushed"] = cuda_event_bench(lambda: copy(small, small_dst), warmup_ms=10, rep_ms=40)
    return {"ms": res, "ncu": _ncu_summary()}


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
    d = ctx.measured()
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
    res = autotune(a, b, budget_s=45.0, save=False)
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
    rows = [["candidates in the search space", d["candidates"]], ["tried within the 45 s budget", d["trials"]],
            ["of them timed (correct)", d["timed"]], ["wall time of the search (s)", _fmt(d["seconds"], ".1f")],
            ["heuristic config (ms)", _fmt(d["heuristic_ms"], ".4f")], ["winner (ms)", _fmt(d["winner_ms"], ".4f")],
            ["speed-up over the heuristic", f"{d['heuristic_ms'] / d['winner_ms']:.3f}x"]]
    return (f"{ctx.gpu_source()} `autotune(a, b, budget_s=45, save=False)` at {m}x{n}x{k} bf16.\n\n"
            + md_table(["", "value"], rows, align="lr"))


# ---- page 23: CUDA graphs ---------------------------------------------------------------------

def _measure_graphs():
    import torch

    from cute_kernels.gemm import matmul

    rows = []
    calls = 100
    for size in (256, 1024, 4096):
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
