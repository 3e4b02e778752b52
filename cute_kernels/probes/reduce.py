"""Reduction probes (course pages 6 and 8): one fp32 sum, four ways to combine the partials.

Every thread first walks the input with a grid-stride loop (thread i of the grid takes
elements i, i + G, i + 2G, ... with G the grid's thread count). Then:

- `atomic_each`: no partial sums at all: every element is an atomic add to the one result.
- `atomic_thread`: each thread sums its elements, then one atomic add per thread.
- `smem_tree`: the block's partials go to shared memory and are halved in log2(threads)
  steps, a barrier after each; one atomic add per block.
- `shuffle`: each warp sums its 32 partials with butterfly shuffles (`SHFL.BFLY`, no shared
  memory, no barrier), warp sums meet in shared memory, warp 0 shuffles them; one atomic add
  per block.

`out` (one float) must be zero before the launch; `block_sum` does that on its stream. The
order of the additions differs between strategies and between runs (atomics), so results agree
to rounding, not bit for bit.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cute_kernels.runtime import register_variant

from ._launch import fake_1d, job

__all__ = ["BlockSum", "STRATEGIES", "build_sum"]

STRATEGIES = ("atomic_each", "atomic_thread", "smem_tree", "shuffle")


class BlockSum:
    """out[0] += sum(src) with `blocks` blocks of `threads` threads and one of STRATEGIES."""

    def __init__(self, strategy: str = "shuffle", threads: int = 256):
        if strategy not in STRATEGIES:
            raise ValueError(f"BlockSum.strategy must be one of {STRATEGIES}, got {strategy!r}")
        if threads not in (64, 128, 256, 512, 1024):
            raise ValueError(f"BlockSum.threads must be a power of two in [64, 1024], got {threads!r}")
        self.strategy, self.threads = strategy, threads

    @cute.jit
    def __call__(self, src: cute.Tensor, out: cute.Tensor, blocks: cutlass.Int32, stream):
        self.kernel(src, out, cute.size(src)).launch(grid=[blocks, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, src: cute.Tensor, out: cute.Tensor, n: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        first, step = bidx * self.threads + tidx, grid * self.threads
        if cutlass.const_expr(self.strategy == "atomic_each"):
            for i in cutlass.range(first, n, step, unroll=1):
                cute.arch.atomic_add(out.iterator, src[i])
        else:
            acc = cutlass.Float32(0.0)
            for i in cutlass.range(first, n, step, unroll=4):
                acc += src[i]
            if cutlass.const_expr(self.strategy == "atomic_thread"):
                cute.arch.atomic_add(out.iterator, acc)
            elif cutlass.const_expr(self.strategy == "smem_tree"):
                self.tree_sum(out, acc, tidx)
            else:
                self.shuffle_sum(out, acc, tidx)

    @cute.jit
    def tree_sum(self, out: cute.Tensor, acc: cutlass.Float32, tidx):
        s = cutlass.memory.SmemAllocator().allocate_tensor(cutlass.Float32, cute.make_layout(self.threads), 16)
        s[tidx] = acc
        cute.arch.sync_threads()
        half = self.threads // 2
        while cutlass.const_expr(half >= 1):  # unrolled at trace time: log2(threads) steps
            if tidx < half:
                s[tidx] = s[tidx] + s[tidx + half]
            cute.arch.sync_threads()
            half //= 2
        if tidx == 0:
            cute.arch.atomic_add(out.iterator, s[0])

    @cute.jit
    def shuffle_sum(self, out: cute.Tensor, acc: cutlass.Float32, tidx):
        warps = self.threads // 32
        s = cutlass.memory.SmemAllocator().allocate_tensor(cutlass.Float32, cute.make_layout(warps), 16)
        lane, warp = tidx % 32, tidx // 32
        acc = warp_sum(acc)
        if lane == 0:
            s[warp] = acc
        cute.arch.sync_threads()
        if warp == 0:
            part = cutlass.Float32(0.0)
            if lane < warps:
                part = s[lane]
            part = warp_sum(part)
            if lane == 0:
                cute.arch.atomic_add(out.iterator, part)


@cute.jit
def warp_sum(x: cutlass.Float32) -> cutlass.Float32:
    """The sum of x over the 32 lanes of the warp, in every lane: five butterfly exchanges."""
    for k in cutlass.range_constexpr(5):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=16 >> k)
    return x


def build_sum(strategy: str = "shuffle", threads: int = 256):
    return job(BlockSum(strategy, threads), ("sum", strategy, threads), fake_1d(cutlass.Float32, 4),
               fake_1d(cutlass.Float32, 4), cutlass.Int32(1))


register_variant("probes.sum", build_sum, configs={s: {"strategy": s} for s in STRATEGIES}, requires={"LDG"})
