"""Softmax over the last dimension, forward and backward, for any row width.

    forward:  y = exp(x - max(x)) / sum(exp(x - max(x)))
    backward: dx = y * (dy - sum(dy * y))

in fp32 (exponentials as exp2 of log2(e)-scaled differences). Two forms, chosen per width by
`dispatch.softmax_tiling`:

- resident (`streaming=False`): the row fits the CTA's registers (`tiling.row_tiling`): one read
  of x, two row reductions (max, then sum), one write of y. Several narrow rows share a CTA.
- streaming (`streaming=True`), for rows wider than that: one CTA per row walks it in chunks of
  `tiling.capacity` columns. The forward keeps a running (max, sum) per thread over the chunks
  (sum rescaled by exp(old max - new max) whenever the max grows), combines the threads' pairs
  once at the end (the row max, then each thread's sum rescaled to it), and reads the row a second
  time to write y; the backward reads (dy, y) once for the dot product and again to write dx. The
  forward first copies the row's leading `stash_chunks` chunks into shared memory (cp.async, all
  in flight at once: `rowkit.RowStash`), and both of its passes read those chunks there.

NaN and Inf propagate as in torch.softmax: a NaN anywhere, or +inf, makes the row NaN, and a row
of -inf is NaN (0 / 0); -inf elsewhere gives 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from cute_kernels.runtime import to_cute

from .dtypes import CUTLASS_DTYPES, element_bytes
from .rowkit import RowReducer, RowSlice, RowStash, reduction_slots_layout, stash_layout
from .tiling import RowTiling, check_stash, min_blocks_per_sm, smem_carveout

__all__ = ["SoftmaxConfig", "SoftmaxForward", "SoftmaxBackward", "LOG2_E", "online_update", "combine"]

LOG2_E = math.log2(math.e)


@dataclass(frozen=True)
class SoftmaxConfig:
    """One compiled softmax kernel: tiling, x's (and dy's) dtype, y's dtype (None: x's), and the
    form (resident or streaming; module docstring)."""

    tiling: RowTiling
    dtype: str
    out_dtype: Optional[str] = None
    streaming: bool = False
    stash_chunks: int = 0  # streaming forward: the row's first chunks kept in shared memory

    def validate(self) -> "SoftmaxConfig":
        for name in ("dtype", "out_dtype"):
            value = getattr(self, name)
            if (value is not None or name == "dtype") and value not in CUTLASS_DTYPES:
                raise ValueError(f"SoftmaxConfig.{name} must be one of {sorted(CUTLASS_DTYPES)}, got {value!r}")
        self.tiling.validate(min(element_bytes(self.dtype), element_bytes(self.y_dtype)))
        if self.streaming and self.tiling.rows_per_cta != 1:
            raise ValueError("SoftmaxConfig: the streaming form takes one row a CTA (rows_per_cta=1)")
        check_stash("SoftmaxConfig", self.stash_chunks, self.tiling, element_bytes(self.dtype), self.streaming)
        return self

    @property
    def y_dtype(self) -> str:
        return self.out_dtype or self.dtype


@cute.jit
def chunk_max(frag: cute.Tensor) -> Float32:
    return frag.load().reduce(cute.ReductionOp.MAX, -Float32.inf, 0)


@cute.jit
def exp_sum(frag: cute.Tensor, shift: Float32) -> Float32:
    """sum(exp(x - shift)) over the fragment (x fp32), as exp2 of the log2(e)-scaled difference."""
    return cute.math.exp2((frag.load() - shift) * Float32(LOG2_E), fastmath=True).reduce(cute.ReductionOp.ADD, 0.0, 0)


@cute.jit
def online_update(x: cute.Tensor, run_max: Float32, run_sum: Float32):
    """Fold a chunk of fp32 values into a thread's running (max, sum of exp(x - max)).

    The shift is the new max, or 0 while it is -inf (a thread that has seen only -inf keeps sum
    0, and never forms -inf - -inf); a NaN anywhere in the chunk makes the sum NaN (the max may
    skip it), and +inf makes it NaN through inf - inf: both as torch.softmax."""
    new_max = cute.arch.fmax(run_max, chunk_max(x))
    shift = new_max
    if new_max == -Float32.inf:
        shift = Float32(0.0)
    run_sum = run_sum * cute.math.exp2((run_max - shift) * Float32(LOG2_E), fastmath=True) + exp_sum(x, shift)
    return new_max, run_sum


@cute.jit
def combine(reducer: RowReducer, run_max: Float32, run_sum: Float32, tidx):
    """(row max, row sum of exp(x - row max)) from every thread's running pair: each sum is
    rescaled to the row's max (a thread that saw only -inf contributes 0 * its sum; a row of -inf
    gets a NaN sum, so its softmax is NaN as torch's)."""
    row_max = reducer.max(run_max, tidx, 0)
    mine = run_sum * cute.math.exp2((run_max - row_max) * Float32(LOG2_E), fastmath=True)
    return row_max, reducer.sum(mine, tidx, 1)


class SoftmaxForward:
    """y = softmax(x) over rows of x (M, N) (module docstring)."""

    def __init__(self, config: SoftmaxConfig):
        self.config = config.validate()
        self.tiling = config.tiling
        self.smem_layout = reduction_slots_layout(self.tiling, 2)
        self.stash_layout = stash_layout(self.tiling, config.stash_chunks) if config.stash_chunks else None

    @cute.jit
    def __call__(self, mX: cute.Tensor, mY: cute.Tensor, stream):
        t = self.tiling
        smem = to_cute(self.smem_layout)

        @cute.struct
        class SharedStorage:
            partials: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(smem)], 16]
            # the row's stashed chunks (rowkit.RowStash); empty without a stash
            stash: cute.struct.Align[cute.struct.MemRange[mX.element_type, self.config.stash_chunks * t.capacity], 16]

        grid = (cute.ceil_div(mX.shape[0], t.rows_per_cta), 1, 1)
        self.kernel(mX, mY, SharedStorage).launch(
            grid=grid, block=[t.threads, 1, 1], min_blocks_per_mp=min_blocks_per_sm(t.threads),
            preferred_smem_carveout=smem_carveout(self.config.stash_chunks), stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mY: cute.Tensor, SharedStorage: cutlass.Constexpr):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        num_rows, width = mX.shape[0], mX.shape[1]
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        partials = storage.partials.get_tensor(to_cute(self.smem_layout))
        r_x = RowSlice(t, tidx, bidx, num_rows, width).fragment(mX.element_type)
        x = RowSlice(t, tidx, bidx, num_rows, width).fragment(Float32)
        r_y = RowSlice(t, tidx, bidx, num_rows, width).fragment(mY.element_type)
        if const_expr(not self.config.streaming):
            rs = RowSlice(t, tidx, bidx, num_rows, width)
            reducer = RowReducer(t, partials)
            rs.load(rs.view(mX), r_x, fill=-math.inf)
            x.store(r_x.load().to(Float32))
            row_max = reducer.max(chunk_max(x), tidx, 0)
            e = cute.math.exp2((x.load() - row_max) * Float32(LOG2_E), fastmath=True)
            total = reducer.sum(e.reduce(cute.ReductionOp.ADD, 0.0, 0), tidx, 1)
            r_y.store((e * (Float32(1.0) / total)).to(mY.element_type))
            rs.store(r_y, rs.view(mY))
        else:
            num_chunks = cute.ceil_div(width, t.capacity)
            run_max = -Float32.inf
            run_sum = Float32(0.0)
            # The row's first chunks go to shared memory at once (RowStash); both passes read
            # them there. Trace-time helpers (RowSlice, RowStash) are made inside the loops: a
            # dynamic loop carries only DSL values.
            stash_smem = (storage.stash.get_tensor(to_cute(self.stash_layout))
                          if const_expr(self.config.stash_chunks) else None)
            chunks = self.config.stash_chunks
            RowStash(t, stash_smem, chunks, tidx).fetch(mX, bidx, num_rows, width)
            for chunk in cutlass.range(num_chunks):
                rs = RowSlice(t, tidx, bidx, num_rows, width, chunk)
                RowStash(t, stash_smem, chunks, tidx).load(rs, rs.view(mX), r_x, chunk, fill=-math.inf)
                x.store(r_x.load().to(Float32))
                run_max, run_sum = online_update(x, run_max, run_sum)
            row_max, total = combine(RowReducer(t, partials), run_max, run_sum, tidx)
            inv = Float32(1.0) / total
            for chunk in cutlass.range(num_chunks):
                rs = RowSlice(t, tidx, bidx, num_rows, width, chunk)
                RowStash(t, stash_smem, chunks, tidx).load(rs, rs.view(mX), r_x, chunk, fill=-math.inf)
                e = cute.math.exp2((r_x.load().to(Float32) - row_max) * Float32(LOG2_E), fastmath=True)
                r_y.store((e * inv).to(mY.element_type))
                rs.store(r_y, rs.view(mY))


class SoftmaxBackward:
    """dx = y * (dy - sum(dy * y)) over rows (module docstring)."""

    def __init__(self, config: SoftmaxConfig):
        self.config = config.validate()
        self.tiling = config.tiling
        self.smem_layout = reduction_slots_layout(self.tiling, 1)

    @cute.jit
    def __call__(self, mY: cute.Tensor, mDY: cute.Tensor, mDX: cute.Tensor, stream):
        t = self.tiling
        smem = to_cute(self.smem_layout)

        @cute.struct
        class SharedStorage:
            partials: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(smem)], 16]

        grid = (cute.ceil_div(mY.shape[0], t.rows_per_cta), 1, 1)
        self.kernel(mY, mDY, mDX, SharedStorage).launch(
            grid=grid, block=[t.threads, 1, 1], min_blocks_per_mp=min_blocks_per_sm(t.threads),
            preferred_smem_carveout=smem_carveout(0), stream=stream)

    @cute.kernel
    def kernel(self, mY: cute.Tensor, mDY: cute.Tensor, mDX: cute.Tensor, SharedStorage: cutlass.Constexpr):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        num_rows, width = mY.shape[0], mY.shape[1]
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        partials = storage.partials.get_tensor(to_cute(self.smem_layout))
        r_y = RowSlice(t, tidx, bidx, num_rows, width).fragment(mY.element_type)
        r_dy = RowSlice(t, tidx, bidx, num_rows, width).fragment(mDY.element_type)
        r_dx = RowSlice(t, tidx, bidx, num_rows, width).fragment(mDX.element_type)
        if const_expr(not self.config.streaming):
            rs = RowSlice(t, tidx, bidx, num_rows, width)
            rs.load(rs.view(mY), r_y)
            rs.load(rs.view(mDY), r_dy)
            y = r_y.load().to(Float32)
            dy = r_dy.load().to(Float32)
            dot = RowReducer(t, partials).sum((dy * y).reduce(cute.ReductionOp.ADD, 0.0, 0), tidx, 0)
            r_dx.store((y * (dy - dot)).to(mDX.element_type))
            rs.store(r_dx, rs.view(mDX))
        else:
            num_chunks = cute.ceil_div(width, t.capacity)
            part = Float32(0.0)
            for chunk in cutlass.range(num_chunks):
                rs = RowSlice(t, tidx, bidx, num_rows, width, chunk)
                rs.load(rs.view(mY), r_y)
                rs.load(rs.view(mDY), r_dy)
                part = part + (r_dy.load().to(Float32) * r_y.load().to(Float32)).reduce(cute.ReductionOp.ADD, 0.0, 0)
            dot = RowReducer(t, partials).sum(part, tidx, 0)
            for chunk in cutlass.range(num_chunks):
                rs = RowSlice(t, tidx, bidx, num_rows, width, chunk)
                rs.load(rs.view(mY), r_y)
                rs.load(rs.view(mDY), r_dy)
                y = r_y.load().to(Float32)
                r_dx.store((y * (r_dy.load().to(Float32) - dot)).to(mDX.element_type))
                rs.store(r_dx, rs.view(mDX))


# ---- compile-only builds ----------------------------------------------------------------------------

def _fake(dtype: str, vec: int):
    from cute_kernels.runtime import fake_tensor

    return fake_tensor(CUTLASS_DTYPES[dtype], 2, leading_dim=1, assumed_align=min(16, vec * element_bytes(dtype)),
                       stride_divisibility=vec)


def forward_args(config: SoftmaxConfig, tvm_ffi: bool = True) -> tuple:
    from cute_kernels.runtime import fake_stream

    vec = config.tiling.vec
    return (_fake(config.dtype, vec), _fake(config.y_dtype, vec), fake_stream(tvm_ffi_env_stream=tvm_ffi))


def backward_args(config: SoftmaxConfig, tvm_ffi: bool = True) -> tuple:
    from cute_kernels.runtime import fake_stream

    vec = config.tiling.vec
    return (_fake(config.y_dtype, vec), _fake(config.dtype, vec), _fake(config.dtype, vec),
            fake_stream(tvm_ffi_env_stream=tvm_ffi))


def build_variant(width: int = 4096, dtype: str = "bfloat16", backward: bool = False, threads: Optional[int] = None,
                  values: Optional[int] = None, stash_chunks: Optional[int] = None):
    """The kernel dispatch picks for rows of `width`; `threads`, `values` (a thread's elements a
    chunk) and `stash_chunks` override a streaming tile (for sweeps and SASS reports)."""
    from cute_kernels.runtime import CompileJob

    from .dispatch import softmax_tiling, stash_chunks_for

    tiling, streaming = softmax_tiling(width, dtype, backward=backward)
    if streaming and (threads or values):
        vec = tiling.vec
        tiling = RowTiling(vec, threads or tiling.threads, 1, (values or tiling.values_per_thread) // vec)
    if stash_chunks is None:
        stash_chunks = stash_chunks_for(width, tiling, dtype) if streaming and not backward else 0
    config = SoftmaxConfig(tiling, dtype, streaming=streaming, stash_chunks=stash_chunks).validate()
    if backward:
        return CompileJob(SoftmaxBackward(config), backward_args(config, False), ("fused.softmax_bwd", config))
    return CompileJob(SoftmaxForward(config), forward_args(config, False), ("fused.softmax_fwd", config))


def _register() -> None:
    from cute_kernels.runtime import register_variant

    # The resident form is compiled by tests/fused/test_launch_compile.py; here the streaming one,
    # whose stash is fetched with 16-byte asynchronous copies and read back 16 bytes at a time.
    fwd = {"128256_bf16_streaming": {"width": 128256}}
    register_variant("fused.softmax_fwd", build_variant, configs=fwd,
                     requires={"LDG.E.128", "STG.E.128", "MUFU.EX2", "LDGSTS.E.BYPASS.LTC128B.128", "LDS.128"})
    bwd = {"128256_bf16_streaming": {"width": 128256, "backward": True}}
    register_variant("fused.softmax_bwd", build_variant, configs=bwd, requires={"LDG.E.128", "STG.E.128"})


_register()
