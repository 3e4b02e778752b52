"""Warp probes (course pages 5 and 7): divergence, and independent FMA chains (ILP).

- `Divergence(group)`: every thread runs one of two different loops of `iters` steps, chosen
  by `(t // group) % 2`. With `group = 32` each warp takes one side (no divergence: the two
  halves of a block are different warps); with `group < 32` every warp holds threads of both
  sides, so it runs both loops one after the other with half its lanes masked off each time.
- `FmaChains(chains)`: every thread keeps `chains` independent accumulators and updates each
  with one FMA per step. One chain waits the FMA latency between steps; `chains` of them give
  the scheduler independent instructions to issue meanwhile (instruction-level parallelism),
  at a cost of registers. `min_blocks` (the launch bound `min_blocks_per_mp`) caps the
  registers ptxas may use, which with many chains makes it spill to local memory (`STL`/`LDL`).

The loops are contractions (each step maps x to a*x + b with |a| < 1, or to x*x/2 + 1/10), so the
values stay finite and a test can replay them in torch.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cute_kernels.runtime import register_variant

from ._launch import fake_1d, job

__all__ = ["Divergence", "FmaChains", "FMA_A", "FMA_B", "build_divergence", "build_fma"]

FMA_A, FMA_B = 0.999, 0.5  # x <- FMA_A * x + FMA_B (side 0 of Divergence, every FmaChains chain)


class Divergence:
    """out[b * threads + t] = the sum of `chains` values, chain c starting at (t + c) / 1024 and
    stepped `iters` times by side (t // group) % 2's rule.

    Each side keeps `chains` independent chains and unrolls its loop, so a warp issues an
    instruction every cycle it can: the kernel is bound by instruction issue, and a warp whose
    lanes take both sides issues both loops. (With one dependent chain per lane the kernel is
    bound by the chain's latency instead, and the two paths of a diverged warp fill each other's
    idle issue slots: no measurable cost, which the first measurement showed.)"""

    def __init__(self, group: int = 32, threads: int = 256, chains: int = 8):
        if group not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"Divergence.group must be a power of two up to 32, got {group!r}")
        if not (isinstance(chains, int) and 1 <= chains <= 32):
            raise ValueError(f"Divergence.chains must be an int in [1, 32], got {chains!r}")
        self.group, self.threads, self.chains = group, threads, chains

    @cute.jit
    def __call__(self, out: cute.Tensor, blocks: cutlass.Int32, iters: cutlass.Int32, stream):
        self.kernel(out, iters).launch(grid=[blocks, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, out: cute.Tensor, iters: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        x = cute.make_rmem_tensor(cute.make_layout(self.chains), cutlass.Float32)
        for c in cutlass.range_constexpr(self.chains):
            x[c] = (tidx + c).to(cutlass.Float32) * cutlass.Float32(1.0 / 1024)
        if (tidx // self.group) % 2 == 0:
            for _ in cutlass.range(iters, unroll=4):
                for c in cutlass.range_constexpr(self.chains):
                    x[c] = x[c] * cutlass.Float32(FMA_A) + cutlass.Float32(FMA_B)
        else:
            for _ in cutlass.range(iters, unroll=4):
                for c in cutlass.range_constexpr(self.chains):
                    x[c] = x[c] * x[c] * cutlass.Float32(0.5) + cutlass.Float32(0.1)
        out[bidx * self.threads + tidx] = x.load().reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)


class FmaChains:
    """out[b * threads + t] = the sum of `chains` accumulators, chain c starting at (t + c) / 1024
    and stepped `iters` times by x <- FMA_A * x + FMA_B."""

    def __init__(self, chains: int = 1, threads: int = 256, min_blocks: int | None = None):
        if not (isinstance(chains, int) and 1 <= chains <= 128):
            raise ValueError(f"FmaChains.chains must be an int in [1, 128], got {chains!r}")
        self.chains, self.threads, self.min_blocks = chains, threads, min_blocks

    @cute.jit
    def __call__(self, out: cute.Tensor, blocks: cutlass.Int32, iters: cutlass.Int32, stream):
        # A launch bound needs an explicit carveout, else the DSL asks a (maybe absent) device.
        launch = {} if self.min_blocks is None else {"min_blocks_per_mp": self.min_blocks,
                                                     "preferred_smem_carveout": 0}
        self.kernel(out, iters).launch(grid=[blocks, 1, 1], block=[self.threads, 1, 1], stream=stream, **launch)

    @cute.kernel
    def kernel(self, out: cute.Tensor, iters: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        x = cute.make_rmem_tensor(cute.make_layout(self.chains), cutlass.Float32)
        for c in cutlass.range_constexpr(self.chains):
            x[c] = (tidx + c).to(cutlass.Float32) * cutlass.Float32(1.0 / 1024)
        for _ in cutlass.range(iters, unroll=4):
            for c in cutlass.range_constexpr(self.chains):  # `chains` independent FMAs per step
                x[c] = x[c] * cutlass.Float32(FMA_A) + cutlass.Float32(FMA_B)
        out[bidx * self.threads + tidx] = x.load().reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)


def _args():
    return fake_1d(cutlass.Float32, 4), cutlass.Int32(1), cutlass.Int32(1)


def build_divergence(group: int = 32, chains: int = 8):
    return job(Divergence(group, chains=chains), ("divergence", group, chains), *_args())


def build_fma(chains: int = 1, min_blocks: int | None = None):
    return job(FmaChains(chains, min_blocks=min_blocks), ("fma", chains, min_blocks), *_args())


register_variant("probes.divergence", build_divergence, configs={f"group{g}": {"group": g} for g in (1, 32)},
                 requires={"FFMA", "FMUL", "BRA"})
register_variant("probes.fma", build_fma, configs={f"chains{c}": {"chains": c} for c in (1, 8)},
                 requires={"FFMA"})
# The same kernel squeezed by its launch bound: 64 chains in at most 32 registers must spill.
register_variant("probes.fma_spill", build_fma, configs={"chains64_min8": {"chains": 64, "min_blocks": 8}},
                 requires={"FFMA", "STL", "LDL"}, forbids=frozenset())
