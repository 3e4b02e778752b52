"""SwiGLU, `silu(gate) * up`, forward and backward, as one fused elementwise kernel.

    forward:  out = g * s * u,            s = sigmoid(g) = 1 / (1 + exp(-g))
    backward: dg = dout * u * s * (1 + g * (1 - s)),   du = dout * g * s

in fp32, stored in the tensors' dtype. gate, up and out are (rows, I) tensors with their own row
strides, so the two halves of one (rows, 2I) gate-up projection are taken as they lie; with
`interleaved=True` gate and up come from one (rows, 2I) tensor whose columns alternate
(g0, u0, g1, u1, ...), the layout a GEMM with interleaved gate/up weights writes. The backward
writes dgate and dup in the same layout as its inputs (two tensors, or one interleaved).

Hook for the GEMM epilogue: the gate/up GEMM that fuses this activation (the lead's GEMM work)
computes exactly `forward` on its fp32 accumulator pairs and never writes gate and up; this kernel
is what runs when that epilogue is absent, and its `backward` is the one the fused GEMM's
autograd needs either way (from the saved gate/up GEMM output or a recomputation).

Grid: (row blocks, column chunks): a CTA covers `rows_per_cta` rows by `capacity` columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .dtypes import CUTLASS_DTYPES, element_bytes
from .rowkit import RowSlice
from .softmax import LOG2_E
from .tiling import SMEM_CARVEOUT_PERCENT, RowTiling, min_blocks_per_sm

__all__ = ["SwigluConfig", "SwigluForward", "SwigluBackward"]


@dataclass(frozen=True)
class SwigluConfig:
    """tiling: over the I columns of gate/up (vec = elements of gate per vector); interleaved:
    gate and up alternate in one tensor (module docstring)."""

    tiling: RowTiling
    dtype: str
    interleaved: bool = False

    def validate(self) -> "SwigluConfig":
        if self.dtype not in CUTLASS_DTYPES:
            raise ValueError(f"SwigluConfig.dtype must be one of {sorted(CUTLASS_DTYPES)}, got {self.dtype!r}")
        self.tiling.validate(element_bytes(self.dtype))
        if self.interleaved and 2 * self.tiling.vec * element_bytes(self.dtype) > 32:
            raise ValueError("SwigluConfig: an interleaved vector of 2 * vec elements exceeds 32 bytes")
        return self

    @property
    def pair_tiling(self) -> RowTiling:
        t = self.tiling
        return RowTiling(2 * t.vec, t.threads_per_row, t.rows_per_cta, t.vecs_per_thread)


@cute.jit
def _sigmoid(g):
    return Float32(1.0) / (Float32(1.0) + cute.math.exp2(g * Float32(-LOG2_E), fastmath=True))


def _grid(t: RowTiling, rows, cols):
    return (cute.ceil_div(rows, t.rows_per_cta), cute.ceil_div(cols, t.capacity), 1)


class _Pairs:
    """Loads and stores of (gate, up) pairs for one CTA tile, in either layout (trace-time)."""

    def __init__(self, config: SwigluConfig, tidx, bidx, chunk, rows, cols):
        self.config = config
        self.rs = RowSlice(config.tiling, tidx, bidx, rows, cols, chunk)
        if config.interleaved:
            self.ps = RowSlice(config.pair_tiling, tidx, bidx, rows, 2 * cols, chunk)

    @cute.jit
    def load(self, mA: cute.Tensor, mB, g: cute.Tensor, u: cute.Tensor, dtype):
        """g, u (fp32 fragments) <- gate and up; mB is None in the interleaved layout."""
        if const_expr(not self.config.interleaved):
            ra = self.rs.fragment(dtype)
            rb = self.rs.fragment(dtype)
            self.rs.load(self.rs.view(mA), ra)
            self.rs.load(self.rs.view(mB), rb)
            g.store(ra.load().to(Float32))
            u.store(rb.load().to(Float32))
        else:
            t = self.config.tiling
            rp = self.ps.fragment(dtype)
            self.ps.load(self.ps.view(mA), rp)
            for j in cutlass.range_constexpr(t.vecs_per_thread):
                for i in cutlass.range_constexpr(t.vec):
                    g[i, j] = rp[2 * i, j].to(Float32)
                    u[i, j] = rp[2 * i + 1, j].to(Float32)

    @cute.jit
    def store(self, a: cute.Tensor, b: cute.Tensor, mA: cute.Tensor, mB, dtype):
        """gate-shaped a and up-shaped b (fp32 fragments) -> mA, mB (or interleaved into mA)."""
        if const_expr(not self.config.interleaved):
            ra = self.rs.fragment(dtype)
            rb = self.rs.fragment(dtype)
            ra.store(a.load().to(dtype))
            rb.store(b.load().to(dtype))
            self.rs.store(ra, self.rs.view(mA))
            self.rs.store(rb, self.rs.view(mB))
        else:
            t = self.config.tiling
            rp = self.ps.fragment(dtype)
            for j in cutlass.range_constexpr(t.vecs_per_thread):
                for i in cutlass.range_constexpr(t.vec):
                    rp[2 * i, j] = a[i, j].to(dtype)
                    rp[2 * i + 1, j] = b[i, j].to(dtype)
            self.ps.store(rp, self.ps.view(mA))


class SwigluForward:
    """out = silu(gate) * up (module docstring)."""

    def __init__(self, config: SwigluConfig):
        self.config = config.validate()
        self.tiling = config.tiling

    @cute.jit
    def __call__(self, mGate: cute.Tensor, mUp, mOut: cute.Tensor, stream):
        """mGate (rows, I) (or (rows, 2I) interleaved, mUp None); mUp (rows, I); mOut (rows, I)."""
        t = self.tiling
        self.kernel(mGate, mUp, mOut).launch(
            grid=_grid(t, mOut.shape[0], mOut.shape[1]), block=[t.threads, 1, 1],
            min_blocks_per_mp=min_blocks_per_sm(t.threads), preferred_smem_carveout=SMEM_CARVEOUT_PERCENT,
            stream=stream)

    @cute.kernel
    def kernel(self, mGate: cute.Tensor, mUp, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, chunk, _ = cute.arch.block_idx()
        pairs = _Pairs(self.config, tidx, bidx, chunk, mOut.shape[0], mOut.shape[1])
        g = pairs.rs.fragment(Float32)
        u = pairs.rs.fragment(Float32)
        pairs.load(mGate, mUp, g, u, mGate.element_type)
        gv = g.load()
        r_o = pairs.rs.fragment(mOut.element_type)
        r_o.store((gv * _sigmoid(gv) * u.load()).to(mOut.element_type))
        pairs.rs.store(r_o, pairs.rs.view(mOut))


class SwigluBackward:
    """(dgate, dup) from dout, gate and up (module docstring)."""

    def __init__(self, config: SwigluConfig):
        self.config = config.validate()
        self.tiling = config.tiling

    @cute.jit
    def __call__(self, mDOut: cute.Tensor, mGate: cute.Tensor, mUp, mDGate: cute.Tensor, mDUp, stream):
        t = self.tiling
        self.kernel(mDOut, mGate, mUp, mDGate, mDUp).launch(
            grid=_grid(t, mDOut.shape[0], mDOut.shape[1]), block=[t.threads, 1, 1],
            min_blocks_per_mp=min_blocks_per_sm(t.threads), preferred_smem_carveout=SMEM_CARVEOUT_PERCENT,
            stream=stream)

    @cute.kernel
    def kernel(self, mDOut: cute.Tensor, mGate: cute.Tensor, mUp, mDGate: cute.Tensor, mDUp):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, chunk, _ = cute.arch.block_idx()
        pairs = _Pairs(self.config, tidx, bidx, chunk, mDOut.shape[0], mDOut.shape[1])
        rs = pairs.rs
        r_d = rs.fragment(mDOut.element_type)
        rs.load(rs.view(mDOut), r_d)
        g = rs.fragment(Float32)
        u = rs.fragment(Float32)
        pairs.load(mGate, mUp, g, u, mGate.element_type)
        d = r_d.load().to(Float32)
        gv = g.load()
        uv = u.load()
        s = _sigmoid(gv)
        g.store(d * uv * s * (Float32(1.0) + gv * (Float32(1.0) - s)))
        u.store(d * gv * s)
        pairs.store(g, u, mDGate, mDUp, mDGate.element_type)


# ---- compile-only builds ----------------------------------------------------------------------------

def _fake(config: SwigluConfig, pair: bool):
    from cute_kernels.runtime import fake_tensor

    vec = config.tiling.vec * (2 if pair else 1)
    return fake_tensor(CUTLASS_DTYPES[config.dtype], 2, leading_dim=1,
                       assumed_align=min(16, vec * element_bytes(config.dtype)), stride_divisibility=vec)


def forward_args(config: SwigluConfig, tvm_ffi: bool = True) -> tuple:
    from cute_kernels.runtime import fake_stream

    il = config.interleaved
    return (_fake(config, il), None if il else _fake(config, False), _fake(config, False),
            fake_stream(tvm_ffi_env_stream=tvm_ffi))


def backward_args(config: SwigluConfig, tvm_ffi: bool = True) -> tuple:
    from cute_kernels.runtime import fake_stream

    il = config.interleaved
    return (_fake(config, False), _fake(config, il), None if il else _fake(config, False), _fake(config, il),
            None if il else _fake(config, False), fake_stream(tvm_ffi_env_stream=tvm_ffi))


def build_variant(width: int = 14336, dtype: str = "bfloat16", interleaved: bool = False, backward: bool = False):
    from cute_kernels.runtime import CompileJob

    from .dispatch import swiglu_tiling

    config = SwigluConfig(swiglu_tiling(width, dtype, interleaved=interleaved, backward=backward), dtype,
                          interleaved).validate()
    if backward:
        return CompileJob(SwigluBackward(config), backward_args(config, False), ("fused.swiglu_bwd", config))
    return CompileJob(SwigluForward(config), forward_args(config, False), ("fused.swiglu_fwd", config))


def _register() -> None:
    from cute_kernels.runtime import register_variant

    # The widest tiles (interleaved pairs are compiled by tests/fused/test_launch_compile.py).
    configs = {"14336_bf16": {}}
    register_variant("fused.swiglu_fwd", build_variant, configs=configs, requires={"LDG.E.128", "STG.E.128"})
    bwd = {k: dict(v, backward=True) for k, v in configs.items()}
    register_variant("fused.swiglu_bwd", build_variant, configs=bwd, requires={"LDG.E.128", "STG.E.128"})


_register()
