"""Rotary position embedding of q and k, in one launch, in place or into separate outputs.

q (B, S, Hq, D) and k (B, S, Hk, D), any strides with the head dim contiguous; the first
`rotary_dim` = R features of every head rotate, the rest are left as they are. For the token at
(b, s), position p = position_ids[b, s] (a (B, S) integer tensor) or p = offset + s, and pair i
(0 <= i < R/2) rotates by the angle whose cosine and sine are cos[p, i], sin[p, i] (tables of
shape (P, R/2)):

    half-split (GPT-NeoX, Llama):   pairs (i, i + R/2)
    interleaved (GPT-J):            pairs (2i, 2i + 1)
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)          in fp32, stored in x's dtype

With `inverse` the angle is negated (sin -> -sin): the backward, since a rotation's gradient is
the opposite rotation of the incoming gradient.

Grid: (token blocks, B, Hq + Hk); block z below Hq rotates q's head z, the others k's head
z - Hq. A CTA covers `rows_per_cta` tokens of one head; each token's R/2 pairs are spread over
`threads_per_row` threads, `vec` consecutive pairs a vector (`tiling.RowTiling` over a width of
R/2 pairs: for the half-split form each thread loads a vector from each half, for the interleaved
form one vector of 2 vec elements). A position outside [0, P) rotates by NaN (the host checks
position ids unless told not to), so it cannot read outside the tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from .dtypes import CUTLASS_DTYPES, element_bytes
from .rowkit import RowSlice, broadcast_rows
from .tiling import SMEM_CARVEOUT_PERCENT, RowTiling, min_blocks_per_sm

__all__ = ["RopeConfig", "Rope", "POSITION_DTYPES"]

POSITION_DTYPES = {"int64": cutlass.Int64, "int32": cutlass.Int32}


@dataclass(frozen=True)
class RopeConfig:
    """One compiled RoPE kernel: the tiling over R/2 pairs, dtypes, R (static), the pairing,
    and whether positions come from a tensor (`position_dtype`) or an offset (None)."""

    tiling: RowTiling
    dtype: str
    table_dtype: str
    rotary_dim: int
    interleaved: bool = False
    position_dtype: str | None = None
    inverse: bool = False  # rotate by minus the angle (the backward: sin negated)

    def validate(self) -> "RopeConfig":
        for name in ("dtype", "table_dtype"):
            if getattr(self, name) not in CUTLASS_DTYPES:
                raise ValueError(f"RopeConfig.{name} must be one of {sorted(CUTLASS_DTYPES)}, got {getattr(self, name)!r}")
        if self.position_dtype is not None and self.position_dtype not in POSITION_DTYPES:
            raise ValueError(f"RopeConfig.position_dtype must be None or one of {sorted(POSITION_DTYPES)}")
        if not (isinstance(self.rotary_dim, int) and self.rotary_dim >= 2 and self.rotary_dim % 2 == 0):
            raise ValueError(f"RopeConfig.rotary_dim must be a positive even int, got {self.rotary_dim!r}")
        t = self.tiling.validate(min(element_bytes(self.dtype), element_bytes(self.table_dtype)))
        half = self.rotary_dim // 2
        if half % t.vec or t.capacity < half:
            raise ValueError(f"RopeConfig: tiling {t} does not cover {half} pairs in whole vectors")
        if self.interleaved and 2 * t.vec * element_bytes(self.dtype) > 32:
            raise ValueError("RopeConfig: an interleaved vector of 2 * vec elements exceeds 32 bytes")
        return self

    @property
    def pair_tiling(self) -> RowTiling:
        """The tiling of x in the interleaved form: vectors of 2 vec elements (a pair each)."""
        t = self.tiling
        return RowTiling(2 * t.vec, t.threads_per_row, t.rows_per_cta, t.vecs_per_thread)


class Rope:
    """In-place rotary embedding of q and k (module docstring)."""

    def __init__(self, config: RopeConfig):
        self.config = config.validate()
        self.tiling = config.tiling

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mQo: cute.Tensor, mKo: cute.Tensor, mCos: cute.Tensor,
                 mSin: cute.Tensor, mPos, offset: Int32, stream):
        """mQ (B, S, Hq, D), mK (B, S, Hk, D) in; mQo, mKo their rotated outputs (the same tensors
        to rotate in place); mCos, mSin (P, R/2); mPos (B, S) or None."""
        t = self.tiling
        grid = (cute.ceil_div(mQ.shape[1], t.rows_per_cta), mQ.shape[0], mQ.shape[2] + mK.shape[2])
        self.kernel(mQ, mK, mQo, mKo, mCos, mSin, mPos, offset).launch(
            grid=grid, block=[t.threads, 1, 1], min_blocks_per_mp=min_blocks_per_sm(t.threads),
            preferred_smem_carveout=SMEM_CARVEOUT_PERCENT, stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mQo: cute.Tensor, mKo: cute.Tensor, mCos: cute.Tensor,
               mSin: cute.Tensor, mPos, offset: Int32):
        bidx, batch, head = cute.arch.block_idx()
        hq = mQ.shape[2]
        if head < hq:
            self.rotate(mQ[batch, None, head, None], mQo[batch, None, head, None], mCos, mSin, mPos, offset, bidx,
                        batch)
        else:
            self.rotate(mK[batch, None, head - hq, None], mKo[batch, None, head - hq, None], mCos, mSin, mPos,
                        offset, bidx, batch)

    @cute.jit
    def rotate(self, mX: cute.Tensor, mOut: cute.Tensor, mCos: cute.Tensor, mSin: cute.Tensor, mPos, offset: Int32,
               block, batch):
        """Rotate tokens block*rows_per_cta ... of one head: mX (S, D) into mOut (S, D)."""
        c, t = self.config, self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        seqlen = mX.shape[0]
        half = c.rotary_dim // 2
        rs = RowSlice(t, tidx, block, seqlen, half)
        pos = Int32(0)
        if rs.row_ok:
            if const_expr(mPos is not None):
                pos = Int32(mPos[batch, rs.row])
            else:
                pos = offset + rs.row
        # A position outside the tables reads row 0 and rotates by NaN (never out of bounds).
        row = Int32(0)
        poison = Float32(float("nan"))
        if pos >= 0 and pos < mCos.shape[0]:
            row = pos
            poison = Float32(0.0)
        r_cos = rs.fragment(mCos.element_type)
        r_sin = rs.fragment(mSin.element_type)
        rs.load(rs.view(broadcast_rows(mCos[row, None], seqlen)), r_cos)
        rs.load(rs.view(broadcast_rows(mSin[row, None], seqlen)), r_sin)
        cos = r_cos.load().to(Float32) + poison
        sin = r_sin.load().to(Float32) + poison
        if const_expr(c.inverse):
            sin = -sin
        rows = cute.make_layout((seqlen, half), stride=(mX.stride[0], 1))
        rows_out = cute.make_layout((seqlen, half), stride=(mOut.stride[0], 1))
        if const_expr(not c.interleaved):
            r1 = rs.fragment(mX.element_type)
            r2 = rs.fragment(mX.element_type)
            rs.load(rs.view(cute.make_tensor(mX.iterator, rows)), r1)
            rs.load(rs.view(cute.make_tensor(mX.iterator + half, rows)), r2)
            x1 = r1.load().to(Float32)
            x2 = r2.load().to(Float32)
            r1.store((x1 * cos - x2 * sin).to(mX.element_type))
            r2.store((x2 * cos + x1 * sin).to(mX.element_type))
            rs.store(r1, rs.view(cute.make_tensor(mOut.iterator, rows_out)))
            rs.store(r2, rs.view(cute.make_tensor(mOut.iterator + half, rows_out)))
        else:
            # x as (S, R) with vectors of 2 vec elements: element 2i + h of a vector is half h of pair i.
            pt = c.pair_tiling
            ps = RowSlice(pt, tidx, block, seqlen, c.rotary_dim)
            xs = cute.make_tensor(mX.iterator, cute.make_layout((seqlen, c.rotary_dim), stride=(mX.stride[0], 1)))
            xo = cute.make_tensor(mOut.iterator,
                                  cute.make_layout((seqlen, c.rotary_dim), stride=(mOut.stride[0], 1)))
            r_x = ps.fragment(mX.element_type)
            ps.load(ps.view(xs), r_x)
            f = ps.fragment(Float32)
            f.store(r_x.load().to(Float32))
            cs = rs.fragment(Float32)
            sn = rs.fragment(Float32)
            cs.store(cos)
            sn.store(sin)
            for j in cutlass.range_constexpr(t.vecs_per_thread):
                for i in cutlass.range_constexpr(t.vec):
                    a = f[2 * i, j]
                    b = f[2 * i + 1, j]
                    f[2 * i, j] = a * cs[i, j] - b * sn[i, j]
                    f[2 * i + 1, j] = b * cs[i, j] + a * sn[i, j]
            r_x.store(f.load().to(mX.element_type))
            ps.store(r_x, ps.view(xo))


# ---- compile-only builds ----------------------------------------------------------------------------

def kernel_args(config: RopeConfig, tvm_ffi: bool = True) -> tuple:
    from cute_kernels.runtime import fake_stream, fake_tensor

    c = config
    vec = c.tiling.vec * (2 if c.interleaved else 1)
    qk = lambda: fake_tensor(CUTLASS_DTYPES[c.dtype], 4, leading_dim=3,  # noqa: E731
                             assumed_align=min(16, vec * element_bytes(c.dtype)), stride_divisibility=vec)
    table = lambda: fake_tensor(CUTLASS_DTYPES[c.table_dtype], 2, leading_dim=1,  # noqa: E731
                                assumed_align=min(16, c.tiling.vec * element_bytes(c.table_dtype)),
                                stride_divisibility=c.tiling.vec)
    pos = None
    if c.position_dtype is not None:
        pos = fake_tensor(POSITION_DTYPES[c.position_dtype], 2, leading_dim=1, assumed_align=4)
    return (qk(), qk(), qk(), qk(), table(), table(), pos, Int32(0), fake_stream(tvm_ffi_env_stream=tvm_ffi))


def build_variant(rotary_dim: int = 128, dtype: str = "bfloat16", interleaved: bool = False,
                  position_dtype: str | None = None, table_dtype: str = "float32"):
    from cute_kernels.runtime import CompileJob

    from .dispatch import rope_tiling

    config = RopeConfig(rope_tiling(rotary_dim, dtype, table_dtype, interleaved=interleaved), dtype, table_dtype,
                        rotary_dim, interleaved, position_dtype).validate()
    return CompileJob(Rope(config), kernel_args(config, False), ("fused.rope", config))


def _register() -> None:
    from cute_kernels.runtime import register_variant

    configs = {"half_128_bf16": {},
               "interleaved_64_fp32_ids": {"rotary_dim": 64, "dtype": "float32", "interleaved": True,
                                           "position_dtype": "int32"}}
    register_variant("fused.rope", build_variant, configs=configs, requires={"LDG.E.128", "STG.E.128"})


_register()
