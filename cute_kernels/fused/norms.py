"""RMSNorm and LayerNorm, forward and backward, with the residual add fused in.

Forward, per row of x (M, N):

    s = x + residual                       (when a residual is given; s is written out too)
    RMSNorm:   rstd = 1 / sqrt(mean(s^2) + eps),            y = s * rstd * (w + offset)
    LayerNorm: mu = mean(s), rstd = 1 / sqrt(mean((s - mu)^2) + eps),  y = (s - mu) * rstd * w + b

in fp32, the row held in registers (`tiling.row_tiling`): one read of x (and residual) and one
write of y (and s), plus rstd (and mu) per row for the backward. LayerNorm's variance is the exact
second pass over the registers, not E[s^2] - mu^2. `offset` is 1 for Gemma's `(1 + weight)`.

Backward, per row, with xhat = (s - mu) * rstd (mu = 0 for RMSNorm) and g = dy * (w + offset):

    ds = rstd * (g - xhat * mean(g * xhat) - mean(g))      (mean(g) for LayerNorm only)
         + dsum                                            (the gradient reaching s directly)
    dw += dy * xhat,  db += dy                             (summed over rows)

The backward's CTAs loop over row blocks (a grid of about `ctas_per_sm` per SM) and keep their
dw / db partial sums in registers; each thread writes its partial row to an fp32 (P, N) buffer
that the host sums (P = grid * rows_per_cta). ds is the gradient of both x and the residual.

With `prefetch`, an iteration first issues the loads of the CTA's next row block (x, dy, dsum
and its statistics, into a second set of registers) and then computes the current one from the
registers the previous iteration filled. Why: a CTA of the plain loop has loads in flight only
between an iteration's start and its first use of them, then none through the reduction, the
second pass and the stores; at two CTAs an SM that is about 32 KB in flight part of the time,
less than HBM's bandwidth-latency product an SM needs (about 36 KB), so the loop ran at about
half the copy bandwidth (RMSNorm backward, 16384 x 4096 bf16: 2.0 TB/s on the H200). It costs
the registers of one more row block's raw values (`dispatch.norm_backward_prefetch` counts them,
and leaves it off where the tiling would change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from cute_kernels.runtime import to_cute

from .dtypes import CUTLASS_DTYPES, element_bytes
from .rowkit import RowReducer, RowSlice, broadcast_rows, reduction_slots_layout
from .tiling import SMEM_CARVEOUT_PERCENT, RowTiling, dense_blocks_per_sm, min_blocks_per_sm

__all__ = ["NormConfig", "NormForward", "NormBackward", "KINDS"]

KINDS = ("rms", "layer")


@dataclass(frozen=True)
class NormConfig:
    """What one compiled norm kernel serves.

    kind: "rms" or "layer". dtype: x's (and dy's, y's) dtype name ("bfloat16", "float16",
    "float32"). weight_dtype / residual_dtype: their dtype names, or None without one. has_bias:
    LayerNorm's bias (the weight's dtype). offset: added to the weight in fp32 (1.0 for Gemma).
    save_stats: the forward writes rstd (and mean) for a backward.
    """

    kind: str
    tiling: RowTiling
    dtype: str
    weight_dtype: Optional[str] = None
    residual_dtype: Optional[str] = None
    has_bias: bool = False
    offset: float = 0.0
    save_stats: bool = True
    out_dtype: Optional[str] = None  # forward: y's dtype (None: dtype)
    has_dsum: bool = False  # backward: a gradient arrives at the residual sum (residual_dtype's)
    weight_grad: bool = True  # backward: write dw partials (needs a weight)
    bias_grad: bool = True  # backward: write db partials (needs has_bias)
    prefetch: bool = False  # backward: load the next row block while this one computes (module docstring)
    dense: bool = False  # forward: compiled for more CTAs an SM (`tiling.dense_blocks_per_sm`)

    def validate(self) -> "NormConfig":
        if self.kind not in KINDS:
            raise ValueError(f"NormConfig.kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("dtype", "weight_dtype", "residual_dtype", "out_dtype"):
            value = getattr(self, name)
            if (value is not None or name == "dtype") and value not in CUTLASS_DTYPES:
                raise ValueError(f"NormConfig.{name} must be one of {sorted(CUTLASS_DTYPES)}, got {value!r}")
        if self.has_bias and (self.kind != "layer" or self.weight_dtype is None):
            raise ValueError("NormConfig.has_bias needs kind='layer' and a weight")
        if self.offset != 0.0 and self.weight_dtype is None:
            raise ValueError("NormConfig.offset needs a weight")
        if self.has_dsum and self.residual_dtype is None:
            raise ValueError("NormConfig.has_dsum needs residual_dtype (dsum's dtype)")
        used = [d for d in (self.dtype, self.weight_dtype, self.residual_dtype, self.out_dtype) if d]
        widest = max(element_bytes(d) for d in used)
        narrowest = min(element_bytes(d) for d in used)
        self.tiling.validate(narrowest)
        if self.tiling.vec * widest > 32:
            raise ValueError(f"NormConfig: vec = {self.tiling.vec} is too wide for {widest}-byte elements")
        return self

    @property
    def layer(self) -> bool:
        return self.kind == "layer"

    @property
    def y_dtype(self) -> str:
        return self.out_dtype or self.dtype


# Shared-memory slots of the row reductions: the forward's one (RMS) or two (LayerNorm's mean,
# then variance); the backward's one or two sums through one barrier, doubled by loop parity.
FORWARD_SLOTS, BACKWARD_SLOTS = 2, 4


class NormForward:
    """y (and s, rstd, mean) from x (and residual, w, b): module docstring."""

    def __init__(self, config: NormConfig):
        self.config = config.validate()
        self.tiling = config.tiling
        self.smem_layout = reduction_slots_layout(self.tiling, FORWARD_SLOTS)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mRes: Optional[cute.Tensor], mW: Optional[cute.Tensor],
                 mB: Optional[cute.Tensor], mY: cute.Tensor, mS: Optional[cute.Tensor],
                 mRstd: Optional[cute.Tensor], mMean: Optional[cute.Tensor], eps: Float32, stream):
        t = self.tiling
        smem = to_cute(self.smem_layout)

        @cute.struct
        class SharedStorage:
            partials: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(smem)], 16]

        grid = (cute.ceil_div(mX.shape[0], t.rows_per_cta), 1, 1)
        blocks = dense_blocks_per_sm(t.threads) if const_expr(self.config.dense) else min_blocks_per_sm(t.threads)
        self.kernel(mX, mRes, mW, mB, mY, mS, mRstd, mMean, eps, SharedStorage).launch(
            grid=grid, block=[t.threads, 1, 1], min_blocks_per_mp=blocks,
            preferred_smem_carveout=SMEM_CARVEOUT_PERCENT, stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mRes: Optional[cute.Tensor], mW: Optional[cute.Tensor],
               mB: Optional[cute.Tensor], mY: cute.Tensor, mS: Optional[cute.Tensor],
               mRstd: Optional[cute.Tensor], mMean: Optional[cute.Tensor], eps: Float32,
               SharedStorage: cutlass.Constexpr):
        c, t = self.config, self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        num_rows, width = mX.shape[0], mX.shape[1]
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        reducer = RowReducer(t, storage.partials.get_tensor(to_cute(self.smem_layout)))
        rs = RowSlice(t, tidx, bidx, num_rows, width)

        # Loads first, all in flight together: x, residual, then the weights (shared by all rows).
        r_x = rs.fragment(mX.element_type)
        rs.load(rs.view(mX), r_x)
        if const_expr(mRes is not None):
            r_res = rs.fragment(mRes.element_type)
            rs.load(rs.view(mRes), r_res)
        if const_expr(mW is not None):
            r_w = rs.fragment(mW.element_type)
            rs.load_shared(rs.view(broadcast_rows(mW, num_rows)), r_w)
        if const_expr(mB is not None):
            r_b = rs.fragment(mB.element_type)
            rs.load_shared(rs.view(broadcast_rows(mB, num_rows)), r_b)

        s = rs.fragment(Float32)
        s.store(r_x.load().to(Float32))
        if const_expr(mRes is not None):
            s.store(s.load() + r_res.load().to(Float32))
            r_s = rs.fragment(mS.element_type)
            r_s.store(s.load().to(mS.element_type))
            rs.store(r_s, rs.view(mS))

        inv_n = Float32(1.0) / Float32(width)
        mean = Float32(0.0)
        if const_expr(c.layer):
            mean = reducer.sum(s.load().reduce(cute.ReductionOp.ADD, 0.0, 0), tidx, 0) * inv_n
            # Masked vectors hold 0, not mean: leave them out of the centered squares.
            sq = Float32(0.0)
            for j in cutlass.range_constexpr(t.vecs_per_thread):
                m = rs.mask(j)
                for e in cutlass.range_constexpr(t.vec):
                    d = (s[e, j] - mean) * m
                    sq = sq + d * d
            var = reducer.sum(sq, tidx, 1) * inv_n
        else:
            var = reducer.sum((s.load() * s.load()).reduce(cute.ReductionOp.ADD, 0.0, 0), tidx, 0) * inv_n
        rstd = cute.math.rsqrt(var + eps, fastmath=False)

        y = (s.load() - mean) * rstd
        if const_expr(mW is not None):
            w = r_w.load().to(Float32)
            if const_expr(c.offset != 0.0):
                w = w + Float32(c.offset)
            y = y * w
        if const_expr(mB is not None):
            y = y + r_b.load().to(Float32)
        r_y = rs.fragment(mY.element_type)
        r_y.store(y.to(mY.element_type))
        rs.store(r_y, rs.view(mY))
        if rs.lane == 0 and rs.row_ok:
            if const_expr(mRstd is not None):
                mRstd[rs.row] = rstd
            if const_expr(mMean is not None):
                mMean[rs.row] = mean


class NormBackward:
    """ds (the gradient of x and of the residual) and the dw / db partials: module docstring."""

    def __init__(self, config: NormConfig):
        self.config = config.validate()
        self.tiling = config.tiling
        self.smem_layout = reduction_slots_layout(self.tiling, BACKWARD_SLOTS)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: Optional[cute.Tensor], mDY: cute.Tensor, mRstd: cute.Tensor,
                 mMean: Optional[cute.Tensor], mDSum: Optional[cute.Tensor], mDX: cute.Tensor,
                 mDW: Optional[cute.Tensor], mDB: Optional[cute.Tensor], grid_ctas: Int32, stream):
        """mX: the normalized input s (M, N); mDW, mDB: fp32 (grid_ctas * rows_per_cta, N) partials."""
        t = self.tiling
        smem = to_cute(self.smem_layout)

        @cute.struct
        class SharedStorage:
            partials: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(smem)], 16]

        self.kernel(mX, mW, mDY, mRstd, mMean, mDSum, mDX, mDW, mDB, SharedStorage).launch(
            grid=(grid_ctas, 1, 1), block=[t.threads, 1, 1], min_blocks_per_mp=min_blocks_per_sm(t.threads),
            preferred_smem_carveout=SMEM_CARVEOUT_PERCENT, stream=stream)

    @cute.jit
    def scaled(self, dy, r_w):
        """g = dy * (w + offset), or dy without a weight."""
        g = dy
        if const_expr(r_w is not None):
            w = r_w.load().to(Float32)
            if const_expr(self.config.offset != 0.0):
                w = w + Float32(self.config.offset)
            g = dy * w
        return g

    @cute.jit
    def fetch(self, rs: RowSlice, mX: cute.Tensor, mDY: cute.Tensor, mDSum: Optional[cute.Tensor],
              mRstd: cute.Tensor, mMean: Optional[cute.Tensor], r_x, r_dy, r_ds):
        """Load row block `rs` of x, dy (and dsum) into the fragments; return its (rstd, mean)
        (0 for a row past the last, and mean 0 for RMSNorm)."""
        rs.load(rs.view(mX), r_x)
        rs.load(rs.view(mDY), r_dy)
        if const_expr(mDSum is not None):
            rs.load(rs.view(mDSum), r_ds)
        rstd = Float32(0.0)
        mean = Float32(0.0)
        if rs.row_ok:
            rstd = mRstd[rs.row]
            if const_expr(mMean is not None):
                mean = mMean[rs.row]
        return rstd, mean

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: Optional[cute.Tensor], mDY: cute.Tensor, mRstd: cute.Tensor,
               mMean: Optional[cute.Tensor], mDSum: Optional[cute.Tensor], mDX: cute.Tensor,
               mDW: Optional[cute.Tensor], mDB: Optional[cute.Tensor], SharedStorage: cutlass.Constexpr):
        c, t = self.config, self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        num_rows, width = mX.shape[0], mX.shape[1]
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        partials = storage.partials.get_tensor(to_cute(self.smem_layout))
        inv_n = Float32(1.0) / Float32(width)

        # The weight is the same for every row: load it once, in this CTA's first row block's slice.
        # It stays in its own dtype in registers (converted at each use: cheaper than fp32 registers).
        rs0 = RowSlice(t, tidx, bidx, num_rows, width)
        r_w = None
        if const_expr(mW is not None):
            r_w = rs0.fragment(mW.element_type)
            rs0.load_shared(rs0.view(broadcast_rows(mW, num_rows)), r_w)
        if const_expr(mDW is not None):
            acc_w = rs0.fragment(Float32)
            acc_w.fill(0.0)
        if const_expr(mDB is not None):
            acc_b = rs0.fragment(Float32)
            acc_b.fill(0.0)

        # Register fragments are allocated once, before the loop (an allocation inside a dynamic
        # loop would live in local memory).
        r_x = rs0.fragment(mX.element_type)
        r_dy = rs0.fragment(mDY.element_type)
        r_dx = rs0.fragment(mDX.element_type)
        r_ds = rs0.fragment(mDSum.element_type) if const_expr(mDSum is not None) else None

        num_blocks = cute.ceil_div(num_rows, t.rows_per_cta)
        parity = Int32(0)
        rstd, mean = Float32(0.0), Float32(0.0)
        if const_expr(c.prefetch):
            # the next block's registers, and the first block fetched before the loop
            r_xn = rs0.fragment(mX.element_type)
            r_dyn = rs0.fragment(mDY.element_type)
            r_dsn = rs0.fragment(mDSum.element_type) if const_expr(mDSum is not None) else None
            rstd, mean = self.fetch(rs0, mX, mDY, mDSum, mRstd, mMean, r_x, r_dy, r_ds)
        for block in cutlass.range(bidx, num_blocks, grid):
            # Trace-time helpers are made inside the loop: a dynamic loop carries only DSL values.
            reducer = RowReducer(t, partials)
            rs = RowSlice(t, tidx, block, num_rows, width)
            rstd_next, mean_next = Float32(0.0), Float32(0.0)
            if const_expr(c.prefetch):
                ahead = RowSlice(t, tidx, block + grid, num_rows, width)
                rstd_next, mean_next = self.fetch(ahead, mX, mDY, mDSum, mRstd, mMean, r_xn, r_dyn, r_dsn)
            else:
                rstd, mean = self.fetch(rs, mX, mDY, mDSum, mRstd, mMean, r_x, r_dy, r_ds)
            # Before the reduction: the accumulators and this thread's partial sums. After it, x and
            # dy are loaded again (from L1: this CTA read them a moment ago) rather than kept live
            # across the barrier: a loaded value could be kept by the compiler as fp32, and half
            # the registers leave room for twice the rows in flight. (With prefetch they are live
            # anyway, in their own dtype, until the next block's replace them.)
            xhat = (r_x.load().to(Float32) - mean) * rstd
            dy = r_dy.load().to(Float32)
            if const_expr(mDW is not None):
                acc_w.store(acc_w.load() + dy * xhat)
            if const_expr(mDB is not None):
                acc_b.store(acc_b.load() + dy)
            g = self.scaled(dy, r_w)
            slot = parity * 2
            if const_expr(c.layer):
                dot, gsum = reducer.sum2((g * xhat).reduce(cute.ReductionOp.ADD, 0.0, 0),
                                         g.reduce(cute.ReductionOp.ADD, 0.0, 0), tidx, slot)
            else:
                dot = reducer.sum((g * xhat).reduce(cute.ReductionOp.ADD, 0.0, 0), tidx, slot)
            if const_expr(not c.prefetch):
                rs.load(rs.view(mX), r_x)
                rs.load(rs.view(mDY), r_dy)
            xhat = (r_x.load().to(Float32) - mean) * rstd
            g = self.scaled(r_dy.load().to(Float32), r_w)
            if const_expr(c.layer):
                dx = (g - xhat * (dot * inv_n) - gsum * inv_n) * rstd
            else:
                dx = (g - xhat * (dot * inv_n)) * rstd
            if const_expr(mDSum is not None):
                dx = dx + r_ds.load().to(Float32)
            r_dx.store(dx.to(mDX.element_type))
            rs.store(r_dx, rs.view(mDX))
            parity = 1 - parity
            if const_expr(c.prefetch):
                r_x.store(r_xn.load())
                r_dy.store(r_dyn.load())
                if const_expr(mDSum is not None):
                    r_ds.store(r_dsn.load())
                rstd, mean = rstd_next, mean_next

        # This thread's partial row: bidx * rows_per_cta + its row in the CTA.
        part = RowSlice(t, tidx, bidx, grid * t.rows_per_cta, width)
        if const_expr(mDW is not None):
            part.store(acc_w, part.view(mDW))
        if const_expr(mDB is not None):
            part.store(acc_b, part.view(mDB))


# ---- compile-only builds: the TVM-FFI function the host layer launches, from fake tensors ----------

def _fake(dtype: str, ndim: int, vec: int, *, rows_stride: bool = True):
    """A fake (M, N) or (N,) tensor of `dtype` whose unit-stride mode is the last, aligned for
    `vec`-element vectors (the row stride a multiple of vec)."""
    from cute_kernels.runtime import fake_tensor

    align = min(16, vec * element_bytes(dtype))
    return fake_tensor(CUTLASS_DTYPES[dtype], ndim, leading_dim=ndim - 1, assumed_align=align,
                       stride_divisibility=vec if ndim > 1 else 1)


def forward_args(config: NormConfig, tvm_ffi: bool = True) -> tuple:
    """Fake arguments of `NormForward(config)` (None for the tensors the config leaves out)."""
    from cute_kernels.runtime import fake_stream, fake_tensor

    c, vec = config, config.tiling.vec
    stats = lambda: fake_tensor(Float32, 1, leading_dim=0, assumed_align=4) if c.save_stats else None  # noqa: E731
    return (_fake(c.dtype, 2, vec),
            _fake(c.residual_dtype, 2, vec) if c.residual_dtype else None,
            _fake(c.weight_dtype, 1, vec) if c.weight_dtype else None,
            _fake(c.weight_dtype, 1, vec) if c.has_bias else None,
            _fake(c.y_dtype, 2, vec),
            _fake(c.residual_dtype, 2, vec) if c.residual_dtype else None,
            stats(),
            stats() if c.layer else None,
            Float32(1e-6), fake_stream(tvm_ffi_env_stream=tvm_ffi))


def backward_args(config: NormConfig, tvm_ffi: bool = True) -> tuple:
    """Fake arguments of `NormBackward(config)`: x and dy in `dtype`, dsum in the residual's."""
    from cute_kernels.runtime import fake_stream, fake_tensor

    c, vec = config, config.tiling.vec
    stat = lambda: fake_tensor(Float32, 1, leading_dim=0, assumed_align=4)  # noqa: E731
    return (_fake(c.dtype, 2, vec),
            _fake(c.weight_dtype, 1, vec) if c.weight_dtype else None,
            _fake(c.dtype, 2, vec),
            stat(),
            stat() if c.layer else None,
            _fake(c.residual_dtype, 2, vec) if c.has_dsum else None,
            _fake(c.dtype, 2, vec),
            _fake("float32", 2, vec) if c.weight_dtype and c.weight_grad else None,
            _fake("float32", 2, vec) if c.has_bias and c.bias_grad else None,
            Int32(1), fake_stream(tvm_ffi_env_stream=tvm_ffi))


def build_variant(kind: str = "rms", width: int = 4096, dtype: str = "bfloat16", residual: bool = True,
                  backward: bool = False, weight_dtype: str | None = "same", prefetch: bool = False,
                  dense: bool = False):
    """A CompileJob for the norm kernel serving rows of `width` (the heuristic's tiling);
    `prefetch`: the backward's (`NormConfig.prefetch`, where the tiling admits it); `dense`: the
    forward's (`NormConfig.dense`)."""
    from cute_kernels.runtime import CompileJob

    from .dispatch import norm_backward_prefetch, norm_tiling

    wdt = dtype if weight_dtype == "same" else weight_dtype
    bias = kind == "layer" and wdt is not None
    tiling = norm_tiling(width, dtype, wdt, bias=bias, residual=residual, backward=backward)
    if prefetch and not (backward and norm_backward_prefetch(tiling, dtype, wdt, bias=bias, residual=residual)):
        raise ValueError(f"no prefetching norm backward for rows of {width} {dtype} (residual={residual})")
    config = NormConfig(kind, tiling, dtype, weight_dtype=wdt, residual_dtype=dtype if residual else None,
                        has_bias=bias, has_dsum=backward and residual, prefetch=prefetch, dense=dense)
    config.validate()
    if backward:
        return CompileJob(NormBackward(config), backward_args(config, False), ("fused.norm_bwd", config))
    return CompileJob(NormForward(config), forward_args(config, False), ("fused.norm_fwd", config))


def _register() -> None:
    from cute_kernels.runtime import register_variant

    # The widest tilings of each form (where spills would show first) and the mixed-dtype paths.
    fwd = {
        "rms_4096_bf16_residual": {"kind": "rms", "width": 4096},
        "rms_8192_bf16_fp32_weight": {"kind": "rms", "width": 8192, "weight_dtype": "float32", "residual": False},
        "layer_8192_fp32": {"kind": "layer", "width": 8192, "dtype": "float32", "residual": False},
        # `dense`: compiled for more CTAs an SM; these are the tilings nearest the lower cap
        "layer_4096_bf16_dense": {"kind": "layer", "width": 4096, "residual": False, "dense": True},
        "layer_8192_bf16_residual_dense": {"kind": "layer", "width": 8192, "dense": True},
        "layer_768_bf16_dense": {"kind": "layer", "width": 768, "residual": False, "dense": True},
        "rms_2048_fp32_dense": {"kind": "rms", "width": 2048, "dtype": "float32", "residual": False, "dense": True},
    }
    register_variant("fused.norm_fwd", build_variant, configs=fwd, requires={"LDG.E.128", "STG.E.128"})
    bwd = {
        "rms_8192_bf16_residual": {"kind": "rms", "width": 8192, "backward": True},
        "layer_8192_bf16": {"kind": "layer", "width": 8192, "backward": True, "residual": False},
        "layer_4096_fp32_residual": {"kind": "layer", "width": 4096, "dtype": "float32", "backward": True},
        "rms_8192_bf16_residual_prefetch": {"kind": "rms", "width": 8192, "backward": True, "prefetch": True},
        "rms_4096_bf16_prefetch": {"kind": "rms", "width": 4096, "backward": True, "residual": False,
                                   "prefetch": True},
        "layer_4096_bf16_residual_prefetch": {"kind": "layer", "width": 4096, "backward": True, "prefetch": True},
    }
    register_variant("fused.norm_bwd", build_variant, configs=bwd, requires={"LDG.E.128", "STG.E.128"})


_register()
