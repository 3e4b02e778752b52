"""The course's `gpu` figures made by the probe kernels (pages 2-7): each `measure()` runs on a
Hopper GPU and returns plain numbers; each `make(ctx)` draws them from the stored data file (or
says they are not measured yet). Sizes are chosen so that the whole set of gpu figures (these
and `figures_gpu_ops`) runs in a few minutes on one H200, compiles included.
"""

from __future__ import annotations

import math

from .core import figure, md_table
from .draw import GB, KB, MB, fmt as _fmt, plot as _plot, size as _size
from .measure import check_close, check_equal, gbps, randn, run_probe, sm_count, time_ms


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
    run_probe(build_chase(space), chain, out, steps)
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
    run_probe(build_chase("global"), chain, out, 200_000)
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
                f"read(blocks={blocks}, passes={passes})", rtol=1e-4, atol=1e-2 * math.sqrt(passes))
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
                rtol=1e-3, atol=0.1)
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
        run_probe(job, src, out, s)
        check_equal(out, src[::s], f"strided read, stride {s}")
        rows.append({"stride": s, "ms": time_ms(lambda src=src, out=out, s=s: run_probe(job, src, out, s))})
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
        job = build_divergence(g, DIVERGENCE_CHAINS)
        out.fill_(float("nan"))
        run_probe(job, out, blocks, iters)
        check_close(out, divergence_values(g, threads=256, blocks=blocks, iters=iters, chains=DIVERGENCE_CHAINS,
                                           device="cuda"), f"divergence group {g}", rtol=3e-4, atol=1e-3)
        rows.append({"group": g, "ms": time_ms(lambda job=job: run_probe(job, out, blocks, iters))})
    return {"method": DIVERGENCE_METHOD, "blocks": blocks, "iters": iters, "chains": DIVERGENCE_CHAINS,
            "rows": rows}


# Independent chains per lane in the divergence probe (issue-bound). Method 2: the first run
# (no method recorded) had one latency-bound chain; its numbers are not drawn.
DIVERGENCE_CHAINS, DIVERGENCE_METHOD = 8, 2


@figure("divergence", "05-warps-occupancy.md", "gpu", measure=_measure_divergence)
def divergence(ctx):
    d = ctx.measured(method=DIVERGENCE_METHOD)
    if d is None:
        return ctx.placeholder()
    base = next(r["ms"] for r in d["rows"] if r["group"] == 32)
    rows = [[r["group"], "no" if r["group"] == 32 else "yes", _fmt(r["ms"], ".3f"), f"{r['ms'] / base:.2f}x"]
            for r in d["rows"]]
    return (f"{ctx.gpu_source()} {d['blocks']} blocks of 256 threads, {d['iters']} steps of {d['chains']} "
            "independent chains per thread; a thread takes side (t // group) % 2.\n\n" + md_table(["group (lanes per side)", "warps diverge", "ms",
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
            run_probe(job, out, nblk, iters)
            check_close(out, fma_values(chains, threads=256, blocks=nblk, iters=iters, device="cuda"),
                        f"fma chains={chains}", rtol=3e-4, atol=1e-3)
            ms = time_ms(lambda job=job, out=out, nblk=nblk: run_probe(job, out, nblk, iters))
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
            run_probe(job, src, out, blocks)

        call()
        torch.cuda.synchronize()
        if abs(float(out[0]) - float(ref)) > 1e-5 * scale:
            raise AssertionError(f"sum ({s}): {float(out[0])}, reference {float(ref)}")
        rows[s] = time_ms(call)
    total = out[0]  # a 0-d view: torch.sum writes a full reduction there only with dim given
    rows["torch.sum"] = time_ms(lambda: torch.sum(src, dim=0, out=total))
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
            run_probe(job, out, nblk, iters)
            check_close(out, fma_values(chains, threads=256, blocks=nblk, iters=iters, device="cuda"),
                        f"fma chains={chains}", rtol=3e-4, atol=1e-3)
            ms = time_ms(lambda job=job, out=out, nblk=nblk: run_probe(job, out, nblk, iters))
            rows.append({"chains": chains, "warps_per_sm": 8 * per_sm, "tflops": 2 * chains * iters * nblk * 256 / ms / 1e9})
    spill = build_fma(64, 8)
    nblk = sms * 8
    out = torch.full((nblk * 256,), float("nan"), device="cuda")
    run_probe(spill, out, nblk, iters)
    check_close(out, fma_values(64, threads=256, blocks=nblk, iters=iters, device="cuda"), "fma 64 chains, spilled",
                rtol=3e-4, atol=1e-2)
    ms = time_ms(lambda: run_probe(spill, out, nblk, iters))
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
