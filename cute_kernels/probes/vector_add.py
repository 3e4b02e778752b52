"""The first kernel: `c = a + b` on fp32 vectors, in two versions (course page 2).

- `VectorAdd(threads, vec=1)`: thread `t` of block `b` owns element `i = b * threads + t` and
  does nothing when `i >= n`: the grid is `ceil(n / threads)` blocks, the ragged end is a
  predicate. Each load and store is one 4-byte `LDG.E` / `STG.E`.
- `VectorAdd(threads, vec=4)`: each thread owns 4 consecutive elements, moved as one 16-byte
  vector (`LDG.E.128` / `STG.E.128`): a quarter of the instructions for the same bytes. The
  thread-value layout `tv_layout` says which elements thread t holds; `n` must be a multiple
  of 4 and the tensors 16-byte aligned (`vector_add` checks both).

The torch-facing `vector_add(a, b)` checks its arguments before any launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from cute_kernels.layouts import Layout
from cute_kernels.runtime import register_variant, to_cute

from ._launch import fake_1d, job, run

__all__ = ["AddConfig", "VectorAdd", "tv_layout", "build", "vector_add"]


@dataclass(frozen=True)
class AddConfig:
    """threads per block (a multiple of 32, at most 1024); vec: elements per thread (1 or 4)."""

    threads: int = 256
    vec: int = 1

    def validate(self) -> "AddConfig":
        if not (isinstance(self.threads, int) and 32 <= self.threads <= 1024 and self.threads % 32 == 0):
            raise ValueError(f"AddConfig.threads must be a multiple of 32 in [32, 1024], got {self.threads!r}")
        if self.vec not in (1, 4):
            raise ValueError(f"AddConfig.vec must be 1 or 4, got {self.vec!r}")
        return self


def tv_layout(config: AddConfig) -> Layout:
    """(thread, value) -> element of the block's tile: `t * vec + v`.

    Post-condition: a bijection onto [0, threads * vec); a thread's values are contiguous and
    consecutive threads are `vec` elements apart (a warp covers 32 * vec consecutive elements).
    """
    config.validate()
    return Layout((config.threads, config.vec), (config.vec, 1))


class VectorAdd:
    """`c[i] = a[i] + b[i]` for 1-D fp32 tensors of one length."""

    def __init__(self, config: AddConfig):
        self.config = config.validate()
        self.tv_layout = tv_layout(config)
        self.tile = config.threads * config.vec

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
        # Host side: cut the vectors into tiles of one block each, then launch one block per tile.
        tiles = [cute.zipped_divide(t, (self.tile,)) for t in (a, b, c)]  # ((tile), (num_tiles))
        self.kernel(*tiles, cute.size(a)).launch(
            grid=[cute.ceil_div(cute.size(a), self.tile), 1, 1],
            block=[self.config.threads, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, ta: cute.Tensor, tb: cute.Tensor, tc: cute.Tensor, n: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        tv = to_cute(self.tv_layout)
        # This thread's `vec` elements of this block's tile.
        a = cute.composition(ta[(None, bidx)], tv)[(tidx, None)]
        b = cute.composition(tb[(None, bidx)], tv)[(tidx, None)]
        c = cute.composition(tc[(None, bidx)], tv)[(tidx, None)]
        first = bidx * self.tile + tidx * self.config.vec
        if first < n:  # with vec=4, n is a multiple of 4: a vector is wholly in or out
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32,
                                       num_bits_per_copy=32 * self.config.vec)
            ra, rb = cute.make_fragment_like(a), cute.make_fragment_like(b)
            cute.copy(atom, a, ra)
            cute.copy(atom, b, rb)
            rc = cute.make_fragment_like(c)
            rc.store(ra.load() + rb.load())
            cute.copy(atom, rc, c)


def build(threads: int = 256, vec: int = 1):
    """The CompileJob of `VectorAdd(AddConfig(threads, vec))` (the one `vector_add` runs)."""
    align = 4 * vec
    return job(VectorAdd(AddConfig(threads, vec)), ("vector_add", threads, vec),
               fake_1d(cutlass.Float32, align), fake_1d(cutlass.Float32, align), fake_1d(cutlass.Float32, align))


def vector_add(a, b, out=None, *, vec: int = 1, threads: int = 256):
    """`a + b` for 1-D contiguous fp32 CUDA tensors of one length, by `VectorAdd`."""
    import torch

    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"vector_add: {name} must be a torch tensor, got {type(t).__name__}")
        if t.dtype != torch.float32 or t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"vector_add: {name} must be a contiguous 1-D float32 tensor, got "
                             f"{t.dtype} of shape {tuple(t.shape)}")
    if a.shape != b.shape:
        raise ValueError(f"vector_add: a has shape {tuple(a.shape)} but b has {tuple(b.shape)}")
    AddConfig(threads, vec).validate()
    if vec == 4 and (a.numel() % 4 or any(t.data_ptr() % 16 for t in (a, b))):
        raise ValueError("vector_add(vec=4): the length must be a multiple of 4 and both tensors 16-byte aligned")
    if not (a.is_cuda and b.is_cuda):
        raise ValueError(f"vector_add: needs CUDA tensors, got a on '{a.device}', b on '{b.device}'")
    out = torch.empty_like(a) if out is None else out
    if a.numel():
        run(build(threads, vec), a, b, out)
    return out


register_variant("probes.vector_add", build, configs={"scalar": {"vec": 1}, "vec4": {"vec": 4}},
                 requires={"LDG", "STG", "FADD"})
