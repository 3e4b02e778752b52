"""The course's `cpu` figures: made from the layout algebra, the analyses, the configs and the
committed benchmark results (docs/results/), with no DSL and no GPU."""

from __future__ import annotations

import math

from .core import figure, md_table
from .draw import plot

# ---- helpers over committed results -------------------------------------------------------


def _measured_by(ctx, suite: str) -> str:
    r = ctx.results(suite)
    return f"From {ctx.result_link(suite)} (`cute-kernels bench {suite}` on {r.device}, {r.date})."


def _results_rows(result, *, impls=None, dtypes=None, rate: str = "tflops"):
    rows = []
    for rec in result.records:
        if (impls and rec.impl not in impls) or (dtypes and rec.dtype not in dtypes) or not rec.timed:
            continue
        value = rec.tflops if rate == "tflops" else rec.gbps
        ratio = f"{rec.ratio_to_best_peer:.2f}x" if rec.kind == "ours" and rec.ratio_to_best_peer else "-"
        rows.append([rec.case, rec.dtype, rec.impl + ("*" if rec.kind == "ours" else ""),
                     f"{rec.ms:.3f}", f"{value:.1f}" if value else "-", ratio])
    return rows


def _results_table(ctx, suite: str, *, impls=None, dtypes=None, rate: str = "tflops") -> str:
    result = ctx.results(suite)
    if result is None:
        return f"No `{suite}` result is committed in docs/results/ yet."
    head = ["case", "dtype", "impl", "ms", "TFLOP/s" if rate == "tflops" else "GB/s", "vs best peer"]
    return (_measured_by(ctx, suite) + " `*` marks ours.\n\n"
            + md_table(head, _results_rows(result, impls=impls, dtypes=dtypes, rate=rate), align="lllrrr"))


def _plot(ctx, name, draw, size=(6.4, 3.2)):
    return plot(ctx, name, draw, size=size)


# ---- page 1: GPUs for AI ------------------------------------------------------------------

def _ceilings(ctx) -> dict:
    """The measured ceilings per key over the committed results of one device (the first
    suite's: a ridge point divides one machine's rates), and that device as "device"."""
    best: dict = {}
    for suite in ("ladder", "gemm", "fp8", "copy"):
        r = ctx.results(suite)
        if r is None or best.setdefault("device", r.device) != r.device:
            continue
        for k, v in (r.ceilings or {}).items():
            if isinstance(v, (int, float)):
                best.setdefault(k, (v, suite))
    return best


@figure("ceilings", "01-gpus.md")
def ceilings(ctx):
    c = _ceilings(ctx)
    hbm = c["hbm_gbps"][0]
    rows = []
    names = {"bf16": "bf16 tensor cores (cuBLAS 8192³)", "fp8_e4m3": "fp8 e4m3 tensor cores (torch._scaled_mm 8192³)",
             "fp32": "fp32 without TF32 (cuBLAS SGEMM 8192³)"}
    for key in ("fp8_e4m3", "bf16", "fp32"):
        if key in c:
            v, suite = c[key]
            rows.append([names[key], f"{v:,.0f} TFLOP/s", f"{v * 1e12 / (hbm * 1e9):,.0f}", suite])
    rows.append(["HBM3e (1 GiB device-to-device copy)", f"{hbm:,.0f} GB/s", "-", c["hbm_gbps"][1]])
    return (f"Measured ceilings of the {c['device']} in the committed benchmark runs (each run measures them again); "
            "the ridge point is the arithmetic intensity where the two roofs meet.\n\n"
            + md_table(["ceiling", "measured", "ridge point (FLOP/byte)", "result"], rows, align="lrrl"))


@figure("roofline", "01-gpus.md", what="plot")
def roofline(ctx):
    c = _ceilings(ctx)
    hbm = c["hbm_gbps"][0]
    points = []
    for suite, impls, label in (("gemm", {"sm90_persistent"}, "GEMM bf16 (sm90_persistent)"),
                                ("fp8", {"sm90_persistent"}, "GEMM fp8"),
                                ("attention", {"sm90_flash"}, "attention fwd (sm90_flash)"),
                                ("decode", {"decode"}, "paged decode"),
                                ("skinny", {"sm90_persistent"}, "skinny GEMM (M ≤ 128)")):
        r = ctx.results(suite)
        for rec in (r.records if r and r.device == c["device"] else []):  # points under their own roofs
            if rec.impl in impls and rec.timed and rec.flops and rec.bytes:
                points.append((label, rec.flops / rec.bytes, rec.tflops))

    def draw(fig):
        ax = fig.add_subplot(111)
        xs = [2 ** e for e in range(-2, 15)]
        for key, style in (("fp8_e4m3", "-"), ("bf16", "-"), ("fp32", "--")):
            if key in c:
                peak = c[key][0]
                ax.loglog(xs, [min(peak, x * hbm / 1e3) for x in xs], style, lw=1, label=f"{key} roof")
        for label in dict.fromkeys(p[0] for p in points):
            pts = [p for p in points if p[0] == label]
            ax.loglog([p[1] for p in pts], [p[2] for p in pts], "o", ms=4, label=label)
        ax.set_xlabel("arithmetic intensity (FLOP / byte of compulsory traffic)")
        ax.set_ylabel("TFLOP/s")
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=6, loc="lower right")

    return ("The roofline of the H200 as measured, with every timed record of our kernels from the committed "
            "results placed at its arithmetic intensity.\n\n" + _plot(ctx, "roofline", draw, size=(6.4, 3.8)))


# ---- pages 3 and 5: the SM's resources -----------------------------------------------------

@figure("sm_limits", "01-gpus.md")
def sm_limits(ctx):
    from cute_kernels.runtime.occupancy import SM90

    rows = [["registers per SM (32-bit)", f"{SM90.registers_per_sm:,}", f"{SM90.registers_per_sm * 4 // 1024} KiB"],
            ["registers per thread, at most", SM90.max_registers_per_thread, ""],
            ["shared memory per SM", f"{SM90.smem_per_sm // 1024} KiB", "shared with the L1 cache"],
            ["shared memory per block, at most", f"{SM90.max_smem_per_block // 1024} KiB",
             f"+{SM90.smem_reserved_per_block} B reserved per block"],
            ["warps per SM, at most", SM90.max_warps_per_sm, f"{SM90.max_threads_per_sm} threads"],
            ["blocks per SM, at most", SM90.max_blocks_per_sm, ""],
            ["threads per block, at most", SM90.max_threads_per_block, ""]]
    return (f"The per-SM limits of {SM90.name} that `cute_kernels.runtime.occupancy` computes with.\n\n"
            + md_table(["resource", "limit", "note"], rows, align="lrl"))


# ---- page 4: bank conflicts drawn -----------------------------------------------------------

@figure("bank_maps", "04-access-patterns.md", what="picture")
def bank_maps(ctx):
    from cute_kernels.layouts import bank_conflicts
    from cute_kernels.layouts.analysis import element_offset_fn
    from cute_kernels.probes.smem_layouts import SMEM_LAYOUTS, TILE, column_read

    def draw(fig):
        import matplotlib.pyplot as plt

        for i, (name, layout) in enumerate(SMEM_LAYOUTS.items()):
            off = element_offset_fn(layout, 32, "elements")
            banks = [[off(r + TILE * c) % 32 for c in range(TILE)] for r in range(TILE)]
            ax = fig.add_subplot(1, 3, i + 1)
            ax.imshow(banks, cmap=plt.get_cmap("hsv", 32), interpolation="nearest")
            ax.add_patch(plt.Rectangle((-0.5, -0.5), 1, TILE, fill=False, lw=1.5, ec="black"))
            rep = bank_conflicts(layout, column_read(), "f32", swizzle_unit="elements")
            ax.set_title(f"{name}: column read {rep.wavefronts} wavefront(s)", fontsize=7)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_xlabel("column c", fontsize=7)
            ax.set_ylabel("row r", fontsize=7)

    return ("Bank of every element (r, c) of the 32 x 32 fp32 tile under the three shared-memory layouts of "
            "the transpose probe (colour = bank 0-31); the black box is what one warp reads in the write-out "
            "phase. Drawn from `cute_kernels.probes.smem_layouts`, the objects the kernel converts.\n\n"
            + _plot(ctx, "bank_maps", draw, size=(7.2, 2.7)))


@figure("transpose_analysis", "04-access-patterns.md")
def transpose_analysis(ctx):
    from cute_kernels.layouts import bank_conflicts, cosize
    from cute_kernels.probes.smem_layouts import SMEM_LAYOUTS, column_read, row_write

    rows = []
    for name, layout in SMEM_LAYOUTS.items():
        w = bank_conflicts(layout, row_write(), "f32", swizzle_unit="elements")
        r = bank_conflicts(layout, column_read(), "f32", swizzle_unit="elements")
        rows.append([f"`{name}`", f"`{layout}`", cosize(layout) * 4, w.wavefronts, r.wavefronts])
    return md_table(["layout", "(r, c) -> offset", "bytes", "wavefronts: row write", "wavefronts: column read"],
                    rows, align="llrrr")


# ---- page 11: the SIMT rungs ------------------------------------------------------------------

@figure("ladder_simt", "11-gemm-simt.md")
def ladder_simt(ctx):
    return _results_table(ctx, "ladder", dtypes={"fp32"})


# ---- page 12: tensor cores ------------------------------------------------------------------

@figure("mma_atoms", "12-gemm-tensor-cores.md")
def mma_atoms(ctx):
    from cute_kernels.layouts import size
    from cute_kernels.layouts.atoms import atom

    rows = []
    for name in ("SM70_8x8x4_F32F16F16F32_TN", "SM80_16x8x8_F32BF16BF16F32_TN", "SM80_16x8x16_F32BF16BF16F32_TN",
                 "SM90_64x128x16_F32BF16BF16_SS", "SM90_64x256x16_F32BF16BF16_RS"):
        a = atom(name)
        m, n, k = a.shape_mnk
        threads = size(a.thr_id)
        per = lambda lay: size(lay) // threads if lay.stride[0] != 0 else 0  # noqa: E731
        rows.append([f"`{name}`", f"{m}x{n}x{k}", threads, per(a.a_layout) or "smem", per(a.b_layout) or "smem",
                     per(a.c_layout), f"{2 * m * n * k:,}"])
    return ("From `cute_kernels.layouts.atoms`: how much of each operand one thread holds in registers "
            "(values per thread), and the work of one instruction.\n\n"
            + md_table(["atom", "M x N x K", "threads", "A values", "B values", "C values", "FLOPs"], rows,
                       align="lrrrrrr"))


@figure("ladder_tensor_cores", "12-gemm-tensor-cores.md")
def ladder_tensor_cores(ctx):
    return _results_table(ctx, "ladder", impls={"sm70_mma", "sm80_mma", "triton_ampere", "cublas"},
                          dtypes={"fp16", "bf16"})


# ---- page 13: layouts for tensor cores --------------------------------------------------------

@figure("smem_atom_conflicts", "13-layouts-for-tensor-cores.md")
def smem_atom_conflicts(ctx):
    from cute_kernels.layouts import bank_conflicts
    from cute_kernels.layouts.smem_atoms import gmma_smem_atom

    rows = []
    for kind in ("K_INTER", "K_SW32", "K_SW64", "K_SW128"):
        atom = gmma_smem_atom(kind, "bf16")
        cells = [f"`{atom.layout}`"]
        for access in ("ldmatrix_x4", "vec128"):
            rep = bank_conflicts(atom.layout, access, "bf16")
            cells.append(f"{rep.wavefronts} / {rep.ideal_wavefronts}")
        rows.append([kind] + cells)
    return ("Wavefronts (worst instruction / ideal) when a warp reads each GMMA shared-memory atom for bf16, "
            "by `bank_conflicts()`.\n\n" + md_table(["atom", "layout", "ldmatrix.x4", "16-byte loads"], rows,
                                                    align="llrr"))


# ---- page 14: pipelining ------------------------------------------------------------------------

@figure("stage_budget", "14-pipelining.md")
def stage_budget(ctx):
    from cute_kernels.gemm.sm90_config import Sm90GemmConfig

    rows = []
    for tm, tn, tk in ((128, 256, 64), (128, 128, 64), (256, 128, 64), (128, 64, 64), (64, 128, 64)):
        cfg = Sm90GemmConfig(tile_m=tm, tile_n=tn, tile_k=tk)
        stage = (tm + tn) * tk * 2
        rows.append([f"{tm}x{tn}x{tk}", f"{stage // 1024} KiB", cfg.resolved_stages(2, 16),
                     f"{2 * tm * tn * tk / stage:.0f}"])
    return ("bf16 operands, bf16 output: what one pipeline stage holds in shared memory, and how many stages "
            "`Sm90GemmConfig.resolved_stages` fits beside the epilogue's buffers in 227 KiB.\n\n"
            + md_table(["tile M x N x K", "bytes per stage", "stages that fit", "FLOP per byte staged"], rows))


# ---- page 16: warp specialization -----------------------------------------------------------------

@figure("warp_roles", "16-warp-specialization.md")
def warp_roles(ctx):
    from cute_kernels.hopper.warp_roles import WarpRoles

    rows = []
    for wgs in (1, 2):
        r = WarpRoles(wgs)
        r.validate()
        total = 128 * (r.producer_regs + wgs * r.consumer_regs)
        rows.append([wgs, r.threads, r.producer_regs, r.consumer_regs, f"{total:,} of 65,536"])
    return ("`cute_kernels.hopper.warp_roles.WarpRoles`: warpgroup 0 produces (TMA), the others consume "
            "(wgmma); `setmaxnreg` moves registers from the first to the others.\n\n"
            + md_table(["consumer warpgroups", "threads", "producer regs/thread", "consumer regs/thread",
                        "registers in use per block"], rows))


# ---- page 17: SoL GEMM ------------------------------------------------------------------------------

@figure("sol_gemm", "17-sol-gemm.md", what="table and plot")
def sol_gemm(ctx):
    result = ctx.results("gemm")
    ladder = ["sm80_mma", "sm90_tma_wgmma", "sm90_warp_specialized", "sm90_persistent"]
    ratios = {}
    for rec in result.records:
        if rec.impl in ladder and rec.timed:
            peer = next((p for p in result.records if p.case == rec.case and p.impl == "cublas" and p.timed), None)
            if peer:
                ratios.setdefault(rec.impl, []).append(peer.ms / rec.ms)
    geo = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in ratios.items()}

    def draw(fig):
        ax = fig.add_subplot(111)
        names = [k for k in ladder if k in geo]
        ax.bar(range(len(names)), [geo[k] for k in names], color="tab:blue")
        ax.axhline(1.0, color="black", ls="--", lw=1)
        ax.set_xticks(range(len(names)), names, fontsize=7)
        ax.set_ylabel("geomean speed vs cuBLAS")
        for i, k in enumerate(names):
            ax.text(i, geo[k] + 0.01, f"{geo[k]:.2f}", ha="center", fontsize=7)

    rows = [[k, len(ratios[k]), f"{geo[k]:.3f}x", f"{min(ratios[k]):.2f}x", f"{max(ratios[k]):.2f}x"]
            for k in ladder if k in geo]
    return (_measured_by(ctx, "gemm") + " Each rung's speed relative to cuBLAS on the same case, over the "
            "suite's bf16 shapes.\n\n" + md_table(["rung", "cases", "geomean", "worst", "best"], rows) + "\n\n"
            + _plot(ctx, "sol_gemm", draw, size=(5.6, 2.8)))


@figure("gemm_results", "17-sol-gemm.md")
def gemm_results(ctx):
    return _results_table(ctx, "gemm", impls={"sm90_persistent", "cublas", "quack"})


@figure("gate_pairs", "17-sol-gemm.md")
def gate_pairs(ctx):
    from cute_kernels.layouts.atoms_sm90 import c_layout, gate_layouts

    gate, up_offset = gate_layouts(64)
    out = c_layout(32)
    rows = []
    for t in range(2):
        for v in range(8):
            g, o = gate(t, v), out(t, v)
            rows.append([t, v, g % 64, g // 64, (g + up_offset) // 64, o // 64])
    return ("From `layouts.atoms_sm90.gate_layouts(64)` and `c_layout(32)`: for two threads, the product elements "
            "each value of a 64x64 gate-up tile's output gates (row, gate column, up column), and where that "
            "value lands in the 64x32 output.\n\n"
            + md_table(["thread", "value", "row", "gate column", "up column", "output column"], rows,
                       align="rrrrrr"))


# ---- page 18: attention I ---------------------------------------------------------------------

@figure("masks", "18-attention-algorithm.md", what="picture")
def masks(ctx):
    from cute_kernels.attention.mask_rule import dense_mask

    cases = [("causal, 16 x 16", dict(seqlen_q=16, seqlen_k=16, causal=True)),
             ("causal bottom-right, 8 x 16", dict(seqlen_q=8, seqlen_k=16, causal=True, align="bottom_right")),
             ("causal window, left 4, 16 x 16", dict(seqlen_q=16, seqlen_k=16, causal=True, window_left=4))]

    def draw(fig):
        for i, (title, kw) in enumerate(cases):
            m = dense_mask(**kw)
            ax = fig.add_subplot(1, 3, i + 1)
            ax.imshow(m.int().tolist(), cmap="Blues", vmin=0, vmax=1.3)
            ax.set_title(title, fontsize=7)
            ax.set_xlabel("key j", fontsize=7)
            ax.set_ylabel("query i", fontsize=7)
            ax.tick_params(labelsize=5)

    return ("Which (query, key) pairs each mask keeps (blue), from `cute_kernels.attention.mask_rule.dense_mask`, "
            "the rule every attention kernel of the project follows.\n\n" + _plot(ctx, "masks", draw, size=(7.2, 2.6)))


# ---- page 19: attention II -------------------------------------------------------------------

@figure("attention_results", "19-attention-hopper.md")
def attention_results(ctx):
    parts = []
    for suite in ("attention", "attention_bwd"):
        parts.append(f"**{suite}**: " + _results_table(ctx, suite, impls={"sm90_flash", "fa4", "sdpa_cudnn"}))
    parts.append("**decode**: " + _results_table(ctx, "decode", rate="gbps"))
    return "\n\n".join(parts)


# ---- page 20: the bandwidth limit -----------------------------------------------------------

@figure("bandwidth_limit", "20-norms-softmax-fusion.md")
def bandwidth_limit(ctx):
    hbm = _ceilings(ctx)["hbm_gbps"][0]
    ops = [("RMSNorm forward, 16384 x 4096 bf16", 16384 * 4096 * 2 * 2 + 4096 * 2),
           ("softmax forward, 16384 x 4096 bf16", 16384 * 4096 * 2 * 2),
           ("cross-entropy forward, 8192 x 128256 bf16 logits", 8192 * 128256 * 2 + 8192 * 8),
           ("RMSNorm + residual add (fused), 16384 x 4096 bf16", 16384 * 4096 * 2 * 4),
           ("RMSNorm then residual add (two kernels)", 16384 * 4096 * 2 * 2 + 16384 * 4096 * 2 * 3)]
    rows = [[name, f"{b / 2**20:,.0f} MiB", f"{b / (hbm * 1e9) * 1e3:.3f}"] for name, b in ops]
    return (f"The least time each op can take on this GPU: its compulsory bytes over the measured copy bandwidth "
            f"({hbm:,.0f} GB/s, {ctx.result_link('copy')}).\n\n"
            + md_table(["op", "compulsory traffic", "ms at the bandwidth limit"], rows, align="lrr"))


@figure("fused_results", "20-norms-softmax-fusion.md")
def fused_results(ctx):
    result = ctx.results("fused")
    if result is None:
        return "No `fused` result is committed in docs/results/ yet."
    cases: dict = {}
    for rec in result.records:
        if rec.timed:
            cases.setdefault(rec.case, []).append(rec)
    rows = []
    for case, recs in cases.items():
        ours = [r for r in recs if r.impl == "cute_kernels"]
        peers = [r for r in recs if r.kind == "peer"]
        if not ours or not peers:
            continue
        o, best = ours[0], min(peers, key=lambda r: r.ms)
        pct = f"{o.pct_ceiling:.0f}%" if o.pct_ceiling else "-"
        rows.append([case, f"{o.ms:.3f}", pct, best.impl, f"{best.ms:.3f}", f"{best.ms / o.ms:.2f}x"])
    return (_measured_by(ctx, "fused") + " Ours (`cute_kernels.nn.fused_functional`, through autograd for the "
            "backwards) against the fastest of eager PyTorch, torch.compile, quack and Liger on the same tensors; "
            "`% ceil` is of the measured copy bandwidth (of the GEMMs' peak for the linear + cross-entropy).\n\n"
            + md_table(["case", "ours ms", "% ceil", "fastest peer", "peer ms", "peer / ours"], rows, align="lrrlrr"))


# ---- page 21: mixed precision -------------------------------------------------------------------

@figure("formats", "21-mixed-precision.md")
def formats(ctx):
    import torch

    rows = []
    for name, dt, bits in (("fp32", torch.float32, (8, 23)), ("bf16", torch.bfloat16, (8, 7)),
                           ("fp16", torch.float16, (5, 10)), ("fp8 e4m3", torch.float8_e4m3fn, (4, 3)),
                           ("fp8 e5m2", torch.float8_e5m2, (5, 2))):
        fi = torch.finfo(dt)
        rows.append([name, 1 + sum(bits), bits[0], bits[1], f"{fi.max:.4g}", f"{fi.tiny:.3g}", f"{fi.eps:.3g}"])
    return ("From `torch.finfo`: sign + exponent + mantissa bits, the largest finite value, the smallest normal "
            "one and the spacing just above 1 (eps).\n\n"
            + md_table(["format", "bits", "exponent", "mantissa", "max", "smallest normal", "eps"], rows,
                       align="lrrrrrr"))


@figure("fp8_results", "21-mixed-precision.md")
def fp8_results(ctx):
    return _results_table(ctx, "fp8")


# ---- page 22: autotuning --------------------------------------------------------------------

@figure("search_space", "22-autotuning.md")
def search_space_table(ctx):
    from collections import Counter

    from cute_kernels.gemm.autotune import search_space

    rows = []
    for label, kw in (("bf16 in, bf16 out", dict(in_bytes=2, out_bits=16)),
                      ("fp8 in, bf16 out", dict(in_bytes=1, out_bits=16)),
                      ("fp8, fast accumulation", dict(in_bytes=1, out_bits=16, fp8_fast_accum=True))):
        cands, rejected = search_space(**kw)
        why = Counter(r.split(":")[0].split(" (")[0][:60] for _, r in rejected).most_common(1)
        rows.append([label, len(cands), len(rejected), why[0][0] if why else "-"])
    return ("`cute_kernels.gemm.autotune.search_space`: the candidate configs, and the combinations excluded "
            "before anything is compiled.\n\n" + md_table(["problem", "candidates", "rejected", "commonest reason"],
                                                         rows, align="lrrl"))


# ---- page 24: custom ops ----------------------------------------------------------------------

@figure("custom_ops", "24-pytorch-custom-ops.md")
def custom_ops(ctx):
    import torch

    import cute_kernels.ops as ops

    rows = []
    for name in ops.OPS:
        op = getattr(torch.ops.cute_kernels, name).default
        schema = str(op._schema).split("(", 1)[1]
        rows.append([f"`cute_kernels::{name}`", f"`({schema}`"])
    return ("Every operator `import cute_kernels.ops` registers, with the schema torch keeps for it.\n\n"
            + md_table(["op", "schema"], rows, align="ll"))


# ---- page 10: timing ------------------------------------------------------------------------------

@figure("run_spread", "10-timing-profiling.md")
def run_spread(ctx):
    rows = []
    for r in ctx.all_results():
        spreads = sorted(x.spread for x in r.records if x.timed and x.spread is not None)
        if not spreads:
            continue
        rows.append([r.suite, r.date, len(spreads), r.records[0].rounds or "-",
                     f"{100 * spreads[len(spreads) // 2]:.1f}%", f"{100 * spreads[-1]:.1f}%",
                     sum(s > 0.05 for s in spreads)])
    return ("How noisy the committed runs were: per suite, the spread (p80 - p20) / median of each "
            "timed record's interleaved rounds, the figure `cute-kernels bench --compare` holds a "
            "difference against before calling it a change.\n\n"
            + md_table(["suite", "date", "timed records", "rounds", "median spread", "largest spread",
                        "records over 5%"], rows, align="llrrrrr"))


# ---- page 25: benchmarking ----------------------------------------------------------------------

@figure("suite_summary", "25-benchmarking.md")
def suite_summary(ctx):
    rows = []
    for r in ctx.all_results():
        ours = [x.ratio_to_best_peer for x in r.records if x.kind == "ours" and x.timed and x.ratio_to_best_peer]
        best = {}
        for x in r.records:
            if x.kind == "ours" and x.timed and x.ratio_to_best_peer:
                best[x.case] = max(best.get(x.case, 0), x.ratio_to_best_peer)
        geo = math.exp(sum(map(math.log, best.values())) / len(best)) if best else None
        rows.append([r.suite, r.date, len({x.case for x in r.records}), len(r.records),
                     f"{geo:.3f}x" if geo else "-", f"{min(ours):.2f}x" if ours else "-"])
    return ("Every committed result: per suite, the geomean over cases of our best implementation's speed "
            "relative to the fastest peer in the same run, and our worst record.\n\n"
            + md_table(["suite", "date", "cases", "records", "ours vs best peer (geomean)", "worst record"], rows,
                       align="llrrrr"))


# ---- page 26: end to end --------------------------------------------------------------------------

@figure("transformer_result", "26-end-to-end.md")
def transformer_result(ctx):
    result = ctx.results("transformer")
    if result is None:
        return "No `transformer` result is committed yet."
    rows = [[x.impl + ("*" if x.kind == "ours" else ""), f"{x.ms:.1f}", f"{x.tflops:.0f}", f"{x.rel_err:.1e}"]
            for x in result.records if x.timed]
    cfg = result.settings.get("config", {})
    return (f"From {ctx.result_link('transformer')} (`{result.settings.get('command')}` on {result.device}, "
            f"{result.date}): one forward and backward of a Llama-style block, batch {cfg.get('batch')}, "
            f"sequence {cfg.get('seq')}, hidden {cfg.get('hidden')}.\n\n"
            + md_table(["version", "ms", "TFLOP/s", "worst rel_err"], rows))


# ---- page 23: host overhead ------------------------------------------------------------------------

@figure("overhead_result", "23-cuda-graphs.md")
def overhead_result(ctx):
    result = ctx.results("overhead")
    if result is None:
        return "No `overhead` result is committed yet."
    rows = [[x.case, x.impl + ("*" if x.kind == "ours" else ""), f"{x.ms * 1e3:.1f}"] for x in result.records
            if x.timed]
    return (_measured_by(ctx, "overhead") + " Host microseconds per warm call, `*` ours.\n\n"
            + md_table(["case", "impl", "µs per call"], rows, align="llr"))
