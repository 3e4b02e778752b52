"""Small kernels with known resource usage, for the runtime's inspection tests.

- `SmemKernel`: stages a block of `threads` floats through shared memory, launched with an
  explicit dynamic shared-memory size `smem_bytes`.
- `LocalArrayKernel`: keeps more values live than its launch bounds leave registers for, so
  ptxas spills and its SASS contains STL/LDL.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda

from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor


class SmemKernel:
    def __init__(self, threads: int, smem_bytes: int):
        self.threads = threads
        self.smem_bytes = smem_bytes

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, stream: cuda.CUstream):
        self.kernel(x, y).launch(grid=(1, 1, 1), block=(self.threads, 1, 1), smem=self.smem_bytes, stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        allocator = cutlass.memory.SmemAllocator()
        staged = allocator.allocate_tensor(cutlass.Float32, cute.make_layout(self.threads), byte_alignment=16)
        staged[tidx] = x[tidx]
        cute.arch.barrier()
        y[tidx] = staged[self.threads - 1 - tidx]


class LocalArrayKernel:
    """Holds 48 values per thread across a barrier while launch bounds cap registers at 32."""

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, stream: cuda.CUstream):
        # 32 resident blocks of 64 threads leave 65536 / 2048 = 32 registers per thread. (An
        # explicit carveout keeps the DSL from querying a device for its shared memory size.)
        self.kernel(x, y).launch(grid=(1, 1, 1), block=(64, 1, 1), min_blocks_per_mp=32,
                                 preferred_smem_carveout=100, stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        values = cute.make_rmem_tensor(cute.make_layout(48), cutlass.Float32)
        for i in cutlass.range_constexpr(48):
            values[i] = x[i * 64 + tidx]
        # Loads cannot move past the barrier, so all 48 values are live across it.
        cute.arch.barrier()
        for i in cutlass.range_constexpr(48):
            y[i * 64 + tidx] = values[47 - i]


def smem_job(threads: int = 128, smem_bytes: int = 4096) -> CompileJob:
    x, y = fake_tensor(cutlass.Float32, 1), fake_tensor(cutlass.Float32, 1)
    return CompileJob(SmemKernel(threads, smem_bytes), (x, y, fake_stream()), key=("test.smem", threads, smem_bytes))


def local_array_job() -> CompileJob:
    x, y = fake_tensor(cutlass.Float32, 1), fake_tensor(cutlass.Float32, 1)
    return CompileJob(LocalArrayKernel(), (x, y, fake_stream()), key=("test.local_array",))
