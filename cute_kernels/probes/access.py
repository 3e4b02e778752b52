"""Access-pattern probes (course page 4): strided global reads, and a shared-memory transpose
whose shared-memory layout is a `cute_kernels.layouts` object.

- `StridedRead`: `out[i] = src[i * stride]` for i < len(out), one fp32 per thread. With stride
  1 a warp's 32 loads fall in four 32-byte sectors; from stride 8 on, every load is a sector of
  its own, so 7/8 of the bytes the memory system moves are wasted.
- `SmemTranspose(smem_layout)`: out = inᵀ for square fp32 matrices (N a multiple of 32), one
  32 x 32 tile per block of 32 x 8 threads. A block reads its tile row by row (coalesced) into
  shared memory at `smem_layout(r, c)`, then writes the transposed tile row by row, reading
  shared memory down a column: lane `l` reads `smem_layout(l, r)`. What that column read costs
  is decided by the layout alone: `ROW_MAJOR` puts the whole column in one bank (32-way
  conflict), `PADDED` (row pitch 33) and `SWIZZLED` (`Sw<5,0,5>`: column XOR row, no extra
  bytes) spread it over all 32. `cute_kernels.layouts.bank_conflicts` predicts each, and the
  course times them.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cute_kernels.runtime import fake_tensor, register_variant, to_cute

from ._launch import fake_1d, job
from .smem_layouts import ROWS_PER_PASS, SMEM_LAYOUTS, TILE, column_read, row_write

__all__ = ["StridedRead", "SmemTranspose", "TILE", "SMEM_LAYOUTS", "column_read", "row_write",
           "build_strided", "build_transpose"]


class StridedRead:
    """`out[i] = src[i * stride]`, one element per thread, blocks of `threads`."""

    def __init__(self, threads: int = 256):
        self.threads = threads

    @cute.jit
    def __call__(self, src: cute.Tensor, out: cute.Tensor, stride: cutlass.Int32, stream):
        n = cute.size(out)
        self.kernel(src, out, stride, n).launch(grid=[cute.ceil_div(n, self.threads), 1, 1],
                                                block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, src: cute.Tensor, out: cute.Tensor, stride: cutlass.Int32, n: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * self.threads + tidx
        if i < n:
            out[i] = src[i * stride]


class SmemTranspose:
    """`out = inp.T` for (N, N) row-major fp32, N a multiple of 32, through shared memory laid
    out by `smem_layout` (a (32, 32) Layout or ComposedLayout of `cute_kernels.layouts`)."""

    def __init__(self, smem_layout):
        self.smem_layout = smem_layout

    @cute.jit
    def __call__(self, inp: cute.Tensor, out: cute.Tensor, stream):
        tiles = inp.shape[0] // TILE
        self.kernel(inp, out).launch(grid=[tiles, tiles, 1], block=[TILE * ROWS_PER_PASS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, inp: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        lane, row = tidx % TILE, tidx // TILE
        cosize = cute.cosize(to_cute(self.smem_layout))
        buf = cutlass.memory.SmemAllocator().allocate_tensor(cutlass.Float32, cute.make_layout(cosize), 16)
        tile = cute.make_tensor(buf.iterator, to_cute(self.smem_layout))  # (r, c) -> shared memory
        # Load: tile (by, bx) of inp, rows row, row + 8, ...: a warp reads 128 contiguous bytes.
        for k in cutlass.range_constexpr(TILE // ROWS_PER_PASS):
            r = row + k * ROWS_PER_PASS
            tile[(r, lane)] = inp[(by * TILE + r, bx * TILE + lane)]
        cute.arch.sync_threads()
        # Store: tile (bx, by) of out is the transpose; lane l reads tile (l, r): a column.
        for k in cutlass.range_constexpr(TILE // ROWS_PER_PASS):
            r = row + k * ROWS_PER_PASS
            out[(bx * TILE + r, by * TILE + lane)] = tile[(lane, r)]


def build_strided(threads: int = 256):
    return job(StridedRead(threads), ("strided", threads), fake_1d(cutlass.Float32, 4), fake_1d(cutlass.Float32, 4),
               cutlass.Int32(1))


def build_transpose(layout: str = "row_major"):
    if layout not in SMEM_LAYOUTS:
        raise ValueError(f"SmemTranspose layout must be one of {sorted(SMEM_LAYOUTS)}, got {layout!r}")
    mat = [fake_tensor(cutlass.Float32, 2, leading_dim=1, assumed_align=16, stride_divisibility=TILE)
           for _ in range(2)]
    return job(SmemTranspose(SMEM_LAYOUTS[layout]), ("transpose", layout), *mat)


register_variant("probes.strided", build_strided, configs={"default": {}}, requires={"LDG", "STG"})
register_variant("probes.transpose", build_transpose, configs={name: {"layout": name} for name in SMEM_LAYOUTS},
                 requires={"LDS", "STS", "BAR"})
