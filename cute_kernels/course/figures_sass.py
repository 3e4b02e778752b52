"""The course's `compile` figures: what the project's kernels compile to for sm_90a, read from
their SASS and cubins (`cute_kernels.runtime.compile_variant`), on a machine without a GPU."""

from __future__ import annotations

import re

from .core import figure, md_table


def _report(name: str, config=None, **overrides):
    from cute_kernels.runtime import compile_variant

    return compile_variant(name, config, arch="sm_90a", **overrides)


def _count(report, mnemonic: str) -> int:
    return report.histogram.get(mnemonic, 0)


def _ops(report, prefix: str) -> str:
    """The distinct full opcodes starting with `prefix`, e.g. the HGMMA shapes."""
    found = sorted({op for op in report.opcodes if op.split(".", 1)[0] == prefix})
    return ", ".join(f"`{op}`" for op in found) or "-"


def _resources(rows_of):
    head = ["kernel", "registers", "smem / block", "spill bytes (st/ld)", "threads", "blocks / SM", "limited by"]
    rows = []
    for label, r in rows_of:
        occ = r.occupancy
        smem = r.static_smem + (r.dynamic_smem or 0)
        rows.append([label, r.registers, f"{smem:,} B", f"{r.spill_store_bytes}/{r.spill_load_bytes}",
                     r.threads_per_block or "-", occ.blocks_per_sm if occ else "-", occ.limiter if occ else "-"])
    return md_table(head, rows, align="lrrrrrl")


def _listing(report, max_lines: int = 40) -> str:
    lines = []
    for line in report.sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", line)
        if m and not m.group(2).startswith("NOP"):
            lines.append(f"/*{m.group(1)}*/  {m.group(2)}")
    body = "\n".join(lines[:max_lines]) + ("\n..." if len(lines) > max_lines else "")
    return f"```text\n{body}\n```"


# ---- page 2 ---------------------------------------------------------------------------------

@figure("vector_add_sass", "02-programming-model.md", "compile", what="SASS listing")
def vector_add_sass(ctx):
    scalar, vec = _report("probes.vector_add", "scalar"), _report("probes.vector_add", "vec4")
    return ("`cute-kernels sass probes.vector_add vec4`, i.e. "
            "`compile_variant(\"probes.vector_add\", \"vec4\", arch=\"sm_90a\")`: the whole kernel, NOPs left out.\n\n"
            + _listing(vec) + "\n\n"
            + _resources([("`VectorAdd` vec=1", scalar), ("`VectorAdd` vec=4", vec)]) + "\n\n"
            + md_table(["kernel", "global loads", "global stores", "FADD"],
                       [["vec=1", _ops(scalar, "LDG"), _ops(scalar, "STG"), _count(scalar, "FADD")],
                        ["vec=4", _ops(vec, "LDG"), _ops(vec, "STG"), _count(vec, "FADD")]], align="lllr"))


# ---- page 5: occupancy from SASS ----------------------------------------------------------------

@figure("occupancy_table", "05-warps-occupancy.md", "compile")
def occupancy_table(ctx):
    cases = [("`probes.vector_add` vec4", "probes.vector_add", "vec4"),
             ("`probes.fma` 8 chains", "probes.fma", "chains8"),
             ("`gemm.simt_smem`", "gemm.simt_smem", "nt"),
             ("`gemm.sm80_mma`", "gemm.sm80_mma", "default"),
             ("`gemm.sm90_persistent`", "gemm.sm90_persistent", "default"),
             ("`attention.sm90_flash` d128", "attention.sm90_flash", "d128_bfloat16")]
    return ("Registers and shared memory read from each cubin, and the occupancy "
            "`cute_kernels.runtime.occupancy` derives from them for an H100/H200 SM.\n\n"
            + _resources([(label, _report(n, c)) for label, n, c in cases]))


# ---- page 6 ------------------------------------------------------------------------------------

@figure("reduction_sass", "06-shared-memory-sync.md", "compile")
def reduction_sass(ctx):
    from cute_kernels.probes.reduce import STRATEGIES

    rows = []
    for s in STRATEGIES:
        r = _report("probes.sum", s)
        rows.append([f"`{s}`", _count(r, "BAR"), _count(r, "LDS"), _count(r, "STS"), _count(r, "SHFL"),
                     _ops(r, "REDG") if _count(r, "REDG") else _ops(r, "RED")])
    return ("Static instruction counts in each strategy's SASS (`cute-kernels sass probes.sum STRATEGY`).\n\n"
            + md_table(["strategy", "BAR", "LDS", "STS", "SHFL", "atomic"], rows, align="lrrrrl"))


# ---- page 7 -----------------------------------------------------------------------------------

@figure("ilp_sass", "07-registers-ilp.md", "compile")
def ilp_sass(ctx):
    rows = []
    for chains in (1, 2, 4, 8, 16, 32):
        r = _report("probes.fma", None, chains=chains)
        rows.append([chains, "-", r.registers, _count(r, "FFMA"), r.local_memory, r.spill_store_bytes,
                     r.spill_load_bytes])
    r = _report("probes.fma_spill", "chains64_min8")
    rows.append([64, "8 blocks/SM", r.registers, _count(r, "FFMA"), r.local_memory, r.spill_store_bytes,
                 r.spill_load_bytes])
    return ("`FmaChains` compiled for sm_90a with more and more independent chains; the last row asks for 8 "
            "resident blocks of 256 threads (`min_blocks_per_mp=8`), which caps ptxas at 32 registers.\n\n"
            + md_table(["chains", "launch bound", "registers", "FFMA (static)", "local memory B/thread",
                        "spill stores B", "spill loads B"], rows, align="rlrrrrr"))


# ---- page 8 -----------------------------------------------------------------------------------

@figure("atomics_sass", "08-atomics.md", "compile")
def atomics_sass(ctx):
    cases = [("`attention.sm90_flash_bwd` d128 causal (fp32 dQ atomics)", "attention.sm90_flash_bwd", "d128_bfloat16_causal"),
             ("`attention.sm90_flash_bwd` d128, TMA reduce-add", "attention.sm90_flash_bwd", "d128_bfloat16_tma"),
             ("`attention.sm80_flash_bwd_dq` d128 causal (own dQ pass)", "attention.sm80_flash_bwd_dq", "d128_bfloat16_causal")]
    rows = []
    for label, n, c in cases:
        r = _report(n, c)
        reds = sorted(op for op in r.opcodes if op.startswith(("RED", "ATOM", "UTMAREDG")))
        rows.append([label, ", ".join(f"`{op}` x{r.opcodes[op]}" for op in reds) or "none"])
    return "Atomic and reduction instructions in the attention backward kernels' SASS.\n\n" + md_table(
        ["kernel", "atomic / reduce instructions (static count)"], rows, align="ll")


# ---- page 9 -----------------------------------------------------------------------------------

_COPY_OPS = ("LDG", "STS", "LDGSTS", "LDGDEPBAR", "DEPBAR", "UTMALDG", "SYNCS", "LDS", "LDSM")


@figure("async_copy_sass", "09-streams-async-copies.md", "compile")
def async_copy_sass(ctx):
    cases = [("`gemm.simt_smem`: LDG, then STS", "gemm.simt_smem", "nt"),
             ("`gemm.sm80_mma`: cp.async", "gemm.sm80_mma", "default"),
             ("`gemm.sm90_tma_wgmma`: TMA", "gemm.sm90_tma_wgmma", "default")]
    rows = []
    for label, n, c in cases:
        r = _report(n, c)
        rows.append([label] + [_count(r, op) for op in _COPY_OPS])
    return ("How global memory reaches shared memory in three GEMM rungs: static counts of the copy and "
            "synchronization instructions in their SASS.\n\n" + md_table(["kernel", *_COPY_OPS], rows))


# ---- page 11 ---------------------------------------------------------------------------------

@figure("gemm_simt_sass", "11-gemm-simt.md", "compile")
def gemm_simt_sass(ctx):
    naive, smem = _report("gemm.naive", "fp32_nn"), _report("gemm.simt_smem", "nt")
    rows = []
    for label, r in (("`naive`", naive), ("`simt_smem`", smem)):
        rows.append([label, r.registers, _ops(r, "LDG"), _ops(r, "LDS"), _count(r, "FFMA"), _count(r, "BAR")])
    return ("The two SIMT rungs' SASS: where the operands come from and how many FMAs the main loop "
            "holds.\n\n" + md_table(["rung", "registers", "global loads", "shared loads", "FFMA", "BAR"], rows,
                                    align="lrllrr"))


# ---- page 12 ---------------------------------------------------------------------------------

@figure("mma_sass", "12-gemm-tensor-cores.md", "compile")
def mma_sass(ctx):
    rows = []
    for label, n, c in (("`sm70_mma`", "gemm.sm70_mma", "default"), ("`sm80_mma`", "gemm.sm80_mma", "default"),
                        ("`sm90_tma_wgmma`", "gemm.sm90_tma_wgmma", "default")):
        r = _report(n, c)
        mma = _ops(r, "HMMA") if _count(r, "HMMA") else _ops(r, "HGMMA")
        rows.append([label, mma, _count(r, "HMMA") + _count(r, "HGMMA"), _count(r, "LDSM"), _count(r, "FFMA")])
    return ("The tensor-core instructions each rung compiled to. `sm70_mma` targets Volta's `mma.sync.m8n8k4`, "
            "which sm_90 no longer has as one instruction: ptxas emulates it (no HMMA appears).\n\n"
            + md_table(["rung", "MMA instructions", "count", "LDSM", "FFMA"], rows, align="llrrr"))


# ---- page 14 ---------------------------------------------------------------------------------

@figure("mbarrier_sass", "14-pipelining.md", "compile")
def mbarrier_sass(ctx):
    rows = []
    for label, n, c in (("`sm80_mma` (cp.async groups)", "gemm.sm80_mma", "default"),
                        ("`sm90_tma_wgmma` (mbarriers)", "gemm.sm90_tma_wgmma", "default"),
                        ("`sm90_persistent`", "gemm.sm90_persistent", "default")):
        r = _report(n, c)
        syncs = sorted(op for op in r.opcodes if op.startswith(("SYNCS", "DEPBAR", "LDGDEPBAR", "BAR")))
        rows.append([label, ", ".join(f"`{op}` x{r.opcodes[op]}" for op in syncs)])
    return ("The synchronization instructions of three pipelined GEMMs: `cp.async` groups wait with "
            "`LDGDEPBAR`/`DEPBAR`, TMA pipelines with mbarrier operations (`SYNCS.*`).\n\n"
            + md_table(["kernel", "instructions (static count)"], rows, align="ll"))


# ---- page 15 ---------------------------------------------------------------------------------

@figure("tma_sass", "15-tma.md", "compile")
def tma_sass(ctx):
    rows = []
    for label, n, c in (("`sm90_tma_wgmma`", "gemm.sm90_tma_wgmma", "default"),
                        ("`sm90_warp_specialized`, cluster 1x2", "gemm.sm90_warp_specialized", "cluster_1x2"),
                        ("`sm90_persistent`", "gemm.sm90_persistent", "default")):
        r = _report(n, c)
        tma = sorted(op for op in r.opcodes if op.startswith(("UTMALDG", "UTMASTG", "UBLKCP", "UTMAPF")))
        rows.append([label, ", ".join(f"`{op}` x{r.opcodes[op]}" for op in tma), _count(r, "LDG")])
    return ("The TMA instructions in the Hopper rungs' SASS (one thread issues each; `.MULTICAST` where a "
            "cluster shares a tile), and what is left of per-thread global loads.\n\n"
            + md_table(["kernel", "TMA instructions (static count)", "LDG"], rows, align="llr"))


# ---- page 16 ---------------------------------------------------------------------------------

@figure("warp_spec_sass", "16-warp-specialization.md", "compile")
def warp_spec_sass(ctx):
    rows = []
    for label, n, c in (("`sm90_tma_wgmma`", "gemm.sm90_tma_wgmma", "default"),
                        ("`sm90_warp_specialized`", "gemm.sm90_warp_specialized", "default"),
                        ("`sm90_persistent` cooperative", "gemm.sm90_persistent", "default"),
                        ("`sm90_persistent` ping-pong", "gemm.sm90_persistent", "pingpong_128x128")):
        r = _report(n, c)
        regs = sorted(op for op in r.opcodes if op.startswith("USETMAXREG"))
        rows.append([label, r.threads_per_block or "-", r.registers, ", ".join(f"`{op}`" for op in regs) or "-",
                     _ops(r, "HGMMA")])
    return ("Threads, the register count ptxas allocated at launch, and the `setmaxnreg` instructions that "
            "re-divide registers between the roles.\n\n"
            + md_table(["kernel", "threads", "registers at launch", "setmaxnreg", "wgmma"], rows, align="lrrll"))


# ---- page 17 ---------------------------------------------------------------------------------

@figure("epilogue_loads", "17-sol-gemm.md", "compile")
def epilogue_loads(ctx):
    rows = []
    bf16, fp8 = "gemm.sm90_persistent", "gemm.sm90_persistent_fp8"
    for label, variant, c in (("no epilogue terms", bf16, "pingpong_128x128_1x2"),
                              ("+ bias (staged per tile)", bf16, "pingpong_128x128_1x2_bias"),
                              ("+ beta * C, bias, GELU (C per element)", bf16, "epi_c_bias_n_gelu"),
                              ("fp8, row-wise scales (both staged per tile)", fp8, "e4m3_rowwise"),
                              ("SwiGLU gated, product stored too (reads nothing)", bf16, "swiglu_preact")):
        r = _report(variant, c)
        rows.append([label, f"`{c}`", _count(r, "LDG"), _count(r, "LDS"), _count(r, "STS"), r.registers])
    return ("What the fused epilogue reads, in `sm90_persistent` builds (static instruction counts): the "
            "bias and fp8's row-wise scales come from global memory once per tile (`LDG`), through shared "
            "memory (`STS`, then `LDS` per accumulator pair); C is read per element, so its build's `LDG` "
            "count grows with the tile.\n\n"
            + md_table(["epilogue", "build", "LDG", "LDS", "STS", "registers"], rows, align="llrrrr"))


# ---- page 21 ---------------------------------------------------------------------------------

@figure("fp8_sass", "21-mixed-precision.md", "compile")
def fp8_sass(ctx):
    rows = []
    for label, n, c in (("bf16", "gemm.sm90_persistent", "default"), ("fp8 e4m3", "gemm.sm90_persistent_fp8", "e4m3"),
                        ("fp8 e4m3, fast accumulation", "gemm.sm90_persistent_fp8", "e4m3_fast_accum_128x256")):
        r = _report(n, c)
        mma = _ops(r, "QGMMA") if _count(r, "QGMMA") else _ops(r, "HGMMA")
        rows.append([label, mma, r.registers, _count(r, "FADD")])
    return ("The warpgroup MMA each precision compiles to (`HGMMA` for 16-bit inputs, `QGMMA` for 8-bit), and "
            "the FADDs that fp8's promotion to a full fp32 accumulator adds.\n\n"
            + md_table(["GEMM", "wgmma", "registers", "FADD"], rows, align="llrr"))
