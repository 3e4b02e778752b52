"""Memory-hierarchy probes (course page 3): latency by pointer chasing, bandwidth by reading.

- `PointerChase(space)`: one thread follows a chain `j = chain[j]` for `steps` hops and
  records the clock cycles they took (`clock64` before and after) and the last index (so the
  loads cannot be dropped). Each hop depends on the one before, so cycles / steps is the
  *latency* of one load. The host builds the chain over a working set of W bytes, one hop per
  128-byte line in a random cyclic order: W decides which level serves the loads (L1 up to
  ~200 KB, L2 up to ~50 MB, then HBM). With `space="shared"` the block first copies the first
  `smem_elems` entries of the chain into shared memory and the thread chases there.
- `ReadBandwidth`: every thread sums 16-byte vectors (`LDG.E.128`); block `b` reads, in pass
  `p`, the tile `(b + p) mod tiles` of the source. The source's size is the working set: the
  same kernel measures HBM (a large source, one pass per block), L2 (a few MB read by many
  blocks) and L1 (a few tiles every block of an SM reads again and again).
- `SmemBandwidth`: each block fills shared memory once, then every thread reads a 16-byte
  vector per pass for `passes` passes (`LDS.128`, conflict-free).

Every probe writes what it summed, so a test can check it against torch. `smem_pad` (bytes of
extra, unused shared memory per block) limits how many blocks share an SM: course page 5 uses
it to vary occupancy with nothing else changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from cute_kernels.layouts import Layout
from cute_kernels.runtime import register_variant, to_cute

from ._launch import fake_1d, job

__all__ = ["PointerChase", "ReadConfig", "ReadBandwidth", "SmemBandwidth", "read_tv_layout",
           "build_chase", "build_read", "build_smem_read"]

LINE_ELEMS = 32  # int32 entries per 128-byte line: the chase visits one entry per line


class PointerChase:
    """Latency probe: one thread, `steps` dependent loads, timed in SM clock cycles."""

    def __init__(self, space: str = "global", smem_elems: int = 8192, threads: int = 128):
        if space not in ("global", "shared"):
            raise ValueError(f"PointerChase.space must be 'global' or 'shared', got {space!r}")
        self.space, self.smem_elems, self.threads = space, smem_elems, threads

    @cute.jit
    def __call__(self, chain: cute.Tensor, out: cute.Tensor, steps: cutlass.Int32, stream):
        self.kernel(chain, out, steps).launch(grid=[1, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, chain: cute.Tensor, out: cute.Tensor, steps: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        src = chain
        if cutlass.const_expr(self.space == "shared"):
            s = cutlass.memory.SmemAllocator().allocate_tensor(cutlass.Int32, cute.make_layout(self.smem_elems), 16)
            for i in cutlass.range(tidx, self.smem_elems, self.threads):
                s[i] = chain[i]
            cute.arch.sync_threads()
            src = s
        if tidx == 0:
            j = cutlass.Int32(0)
            for _ in cutlass.range(steps, unroll=1):  # warm-up lap: the caches now hold what fits
                j = src[j]
            start = cute.arch.clock64()
            for _ in cutlass.range(steps, unroll=1):
                j = src[j]
            stop = cute.arch.clock64()
            out[0] = stop - start
            out[1] = j.to(cutlass.Int64)


@dataclass(frozen=True)
class ReadConfig:
    """threads per block; vectors: 16-byte vectors each thread reads per tile; smem_pad: bytes
    of unused shared memory per block (0: none), to cap the blocks per SM."""

    threads: int = 256
    vectors: int = 4
    smem_pad: int = 0

    def validate(self) -> "ReadConfig":
        if not (isinstance(self.threads, int) and 32 <= self.threads <= 1024 and self.threads % 32 == 0):
            raise ValueError(f"ReadConfig.threads must be a multiple of 32 in [32, 1024], got {self.threads!r}")
        if not (isinstance(self.vectors, int) and 1 <= self.vectors <= 16):
            raise ValueError(f"ReadConfig.vectors must be an int in [1, 16], got {self.vectors!r}")
        if not (isinstance(self.smem_pad, int) and 0 <= self.smem_pad <= 227 * 1024 and self.smem_pad % 16 == 0):
            raise ValueError(f"ReadConfig.smem_pad must be a multiple of 16 in [0, 227 KiB], got {self.smem_pad!r}")
        return self

    @property
    def tile(self) -> int:
        """fp32 elements of one tile (what one block reads per pass)."""
        return self.threads * 4 * self.vectors


def read_tv_layout(config: ReadConfig) -> Layout:
    """(thread, (v, r)) -> element of the tile: `4 t + v + 4 threads r` (one 16-byte vector per
    (t, r); for each r a warp reads 512 consecutive bytes)."""
    config.validate()
    return Layout((config.threads, (4, config.vectors)), (4, (1, 4 * config.threads)))


class ReadBandwidth:
    """`out[b * threads + t]` = the sum of thread t's vectors of tiles (b + p) mod tiles, p < passes."""

    def __init__(self, config: ReadConfig):
        self.config = config.validate()
        self.tv_layout = read_tv_layout(config)

    @cute.jit
    def __call__(self, src: cute.Tensor, out: cute.Tensor, blocks: cutlass.Int32, passes: cutlass.Int32, stream):
        tiles = cute.zipped_divide(src, (self.config.tile,))  # ((tile), (ceil(size / tile)))
        # whole tiles only: the divide counts a partial last tile, whose tail lies past the source
        whole = cute.size(src) // self.config.tile
        self.kernel(tiles, out, passes, whole).launch(grid=[blocks, 1, 1], block=[self.config.threads, 1, 1],
                                               smem=self.config.smem_pad, stream=stream)

    @cute.kernel
    def kernel(self, tiles: cute.Tensor, out: cute.Tensor, passes: cutlass.Int32, num_tiles: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        tv = to_cute(self.tv_layout)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128)
        regs = cute.make_fragment_like(cute.composition(tiles[(None, 0)], tv)[(tidx, None)])
        acc = cutlass.Float32(0.0)
        tile = bidx % num_tiles  # (b + p) mod tiles, kept incrementally: no division per pass
        for _ in cutlass.range(passes, unroll=1):
            mine = cute.composition(tiles[(None, tile)], tv)[(tidx, None)]
            cute.copy(atom, mine, regs)
            acc += regs.load().reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
            tile = tile + 1
            if tile == num_tiles:
                tile = 0
        out[bidx * self.config.threads + tidx] = acc


class SmemBandwidth:
    """Shared-memory read bandwidth: `out[b * threads + t]` = the sum over passes p of the
    16-byte vector `(t + p * threads) mod V` of shared memory, which holds `src[:4 V]`."""

    def __init__(self, threads: int = 256, vectors: int = 8):
        self.threads, self.vectors = threads, vectors
        self.nvec = threads * vectors

    @cute.jit
    def __call__(self, src: cute.Tensor, out: cute.Tensor, blocks: cutlass.Int32, passes: cutlass.Int32, stream):
        self.kernel(src, out, passes).launch(grid=[blocks, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, src: cute.Tensor, out: cute.Tensor, passes: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        s = cutlass.memory.SmemAllocator().allocate_tensor(
            cutlass.Float32, cute.make_layout((4, self.nvec), stride=(1, 4)), 16)
        g = cute.make_tensor(src.iterator, cute.make_layout((4, self.nvec), stride=(1, 4)))
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128)
        for r in cutlass.range_constexpr(self.vectors):
            cute.copy(atom, g[(None, tidx + r * self.threads)], s[(None, tidx + r * self.threads)])
        cute.arch.sync_threads()
        regs = cute.make_rmem_tensor(cute.make_layout(4), cutlass.Float32)
        acc = cutlass.Float32(0.0)
        for p in cutlass.range(passes, unroll=4):
            cute.copy(atom, s[(None, (tidx + p * self.threads) % self.nvec)], regs)
            acc += regs.load().reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
        out[bidx * self.threads + tidx] = acc


def build_chase(space: str = "global"):
    return job(PointerChase(space), ("chase", space), fake_1d(cutlass.Int32, 4), fake_1d(cutlass.Int64, 8),
               cutlass.Int32(1))


def build_read(threads: int = 256, vectors: int = 4, smem_pad: int = 0):
    cfg = ReadConfig(threads, vectors, smem_pad)
    return job(ReadBandwidth(cfg), ("read", cfg), fake_1d(cutlass.Float32, 16), fake_1d(cutlass.Float32, 4),
               cutlass.Int32(1), cutlass.Int32(1))


def build_smem_read(threads: int = 256, vectors: int = 8):
    return job(SmemBandwidth(threads, vectors), ("smem_read", threads, vectors), fake_1d(cutlass.Float32, 16),
               fake_1d(cutlass.Float32, 4), cutlass.Int32(1), cutlass.Int32(1))


register_variant("probes.chase", build_chase, configs={"global": {"space": "global"}, "shared": {"space": "shared"}},
                 requires={"CS2R", "LDG"})
register_variant("probes.read", build_read, configs={"default": {}},
                 requires={"LDG.E.128", "FADD"})
register_variant("probes.smem_read", build_smem_read, configs={"default": {}}, requires={"LDS.128", "STS.128"})
