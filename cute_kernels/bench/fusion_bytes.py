"""What each fusion saves in HBM traffic, computed from the op chains it replaces.

An unfused chain is the sequence of PyTorch ops a model runs without the fused kernel (the
eager code of Hugging Face's LlamaRMSNorm, of `F.cross_entropy(logits.float(), ...)` and its
backward, of `F.silu(gate) * up`, ...); each op reads its inputs and writes its output once, so
its traffic is counted per element of the op's (rows, width) tensor. The fused kernel moves the
compulsory bytes (`fused_cases.FusedCase.bytes`). `python -m cute_kernels.bench.fusion_bytes
docs/fusion.md` fills the page's block

    <!-- BEGIN GENERATED: fusion-bytes -->
    <!-- END GENERATED -->

with the table at the fused suite's shapes (and, given a results file, the time those bytes take
at its measured copy bandwidth: the floor each implementation is measured against).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Fusion", "FUSIONS", "table", "fill_page"]


@dataclass(frozen=True)
class Fusion:
    """A fusion: the case it is measured on, the unfused chain as (op, bytes read, bytes written)
    per element (bf16 in and out, fp32 intermediates as the eager code makes them), and the fused
    kernel's bytes per element as our kernel runs it (may exceed the compulsory count)."""

    name: str
    case: str
    chain: tuple[tuple[str, float, float], ...]
    ours: float
    note: str = ""

    @property
    def unfused(self) -> float:
        return sum(r + w for _, r, w in self.chain)


def _stashed(vocab: int) -> float:
    """The fraction of a bf16 row of `vocab` logits the fused cross-entropy keeps in shared memory
    between its two passes (read from global memory once; the rest twice)."""
    from cute_kernels.fused.dispatch import cross_entropy_tiling, stash_chunks_for

    t = cross_entropy_tiling(vocab, "bfloat16", fused=True)
    return min(1.0, stash_chunks_for(vocab, t, "bfloat16") * t.capacity / vocab)


FUSIONS = (
    Fusion("RMSNorm (Llama's eager code)", "rmsnorm_fwd_16384x4096",
           (("x.to(float32)", 2, 4), ("pow(2)", 4, 4), ("mean(-1)", 4, 0), ("x * rsqrt(var + eps)", 4, 4),
            ("to(bfloat16)", 4, 2), ("weight * x", 2, 2)), 4.0),
    Fusion("residual add + RMSNorm", "rmsnorm_residual_fwd_16384x4096",
           (("s = x + residual", 4, 2), ("RMSNorm(s) (one kernel)", 2, 2)), 8.0,
           "ours reads x and the residual once and writes y and s"),
    Fusion("SwiGLU, silu(gate) * up", "swiglu_fwd_16384x14336",
           (("silu(gate)", 2, 2), ("a * up", 4, 2)), 6.0),
    Fusion("cross-entropy forward + backward (F.cross_entropy(logits.float()))", "cross_entropy_fwd_bwd_8192x128256",
           (("logits.float()", 2, 4), ("log_softmax", 4, 4), ("nll_loss backward (zeros, scatter)", 0, 4),
            ("log_softmax backward", 8, 4), ("grad to(bfloat16)", 4, 2)), 2 * (2 - _stashed(128256)) + 2,
           f"ours reads the logits once where its shared-memory stash holds them ({_stashed(128256):.0%} of a row) "
           "and twice elsewhere, and writes dlogits"),
    Fusion("RoPE on q and k (Hugging Face's q * cos + rotate_half(q) * sin)", "rope_8x4096x32x8x128",
           (("q * cos", 2, 2), ("-x2 (half the elements)", 1, 1), ("cat: rotate_half", 2, 2), ("* sin", 2, 2),
            ("add", 4, 2)), 4.0, "ours rotates in place: q and k read and written once"),
)


def _case_elements(case_name: str) -> float:
    """Elements of the (rows, width) tensor the per-element counts refer to."""
    from cute_kernels.bench.fused_cases import FusedCase

    case = FusedCase.parse(case_name)
    if case.op == "rope":
        b, s, hq, hk, d = case.dims
        return float(b * s * (hq + hk) * d)
    return float(case.rows * case.width)


def table(copy_gbps: float | None = None) -> str:
    """The Markdown table of every fusion (module docstring)."""
    head = "| fusion | case | unfused chain | unfused bytes | ours | saved |"
    sep = "| --- | --- | --- | ---: | ---: | ---: |"
    if copy_gbps:
        head += f" floor at {copy_gbps:.0f} GB/s (unfused / ours) |"
        sep += " ---: |"
    rows = [head, sep]
    for f in FUSIONS:
        n = _case_elements(f.case)
        unfused, ours = f.unfused * n, f.ours * n
        chain = ", ".join(op for op, _, _ in f.chain)
        row = (f"| {f.name} | `{f.case}` | {chain} | {unfused / 2**20:,.0f} MiB | {ours / 2**20:,.0f} MiB | "
               f"{unfused / ours:.1f}x |")
        if copy_gbps:
            row += f" {unfused / copy_gbps / 1e6:.2f} / {ours / copy_gbps / 1e6:.2f} ms |"
        rows.append(row)
    notes = [f"- {f.name}: {f.note}." for f in FUSIONS if f.note]
    return "\n".join(rows) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


_BLOCK = re.compile(r"(<!-- BEGIN GENERATED: fusion-bytes -->\n)(.*?)(<!-- END GENERATED -->)", re.DOTALL)


def fill_page(page: Path, results: Path | None = None) -> str:
    """The page's text with its fusion-bytes block filled (the copy bandwidth from `results`)."""
    gbps = None
    if results is not None and results.exists():
        from cute_kernels.bench.records import load_result

        gbps = load_result(results).ceilings.get("hbm_gbps")
    text = page.read_text()
    return _BLOCK.sub(lambda m: m[1] + "\n" + table(gbps) + "\n" + m[3], text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cute_kernels.bench.fusion_bytes", description=__doc__.split("\n")[0])
    parser.add_argument("pages", nargs="+", type=Path)
    parser.add_argument("--results", type=Path, default=None,
                        help="a fused-suite result JSON (default: the newest under docs/results)")
    args = parser.parse_args(argv)
    results = args.results
    if results is None:
        from cute_kernels.bench.docs_tables import newest_result

        results = newest_result(Path("docs/results"), "fused")
    for page in args.pages:
        text = fill_page(page, results)
        if text != page.read_text():
            page.write_text(text)
            print(f"filled {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
