"""Online softmax for the wgmma accumulator, split so the O rescale can wait for a GEMM.

Same recurrence as `softmax` (base 2, scale folded into the exponent, fp32 statistics, a row's
max and sum combined over the 4 threads of a quad), but `update` only folds the scores in and
returns each row's rescale factor; `rescale` applies it to O. The split lets the intra-warpgroup
overlap keep O += P V of the previous block in flight while this block's exponentials run: O
is rescaled after that GEMM retires.

With a rescale threshold t > 0 (FA4's conditional rescale) a row keeps its running max until a
block raises it by more than t (log2 units), so P = 2^(s - m) stays below 2^t, and `update`
leaves that row's factor exactly 1: when every factor of a warp is 1, `rescale` skips O's
multiplies. The statistics stay consistent (l and O both run against the kept max), so
out = O / l and lse = m * scale + ln(l) are unchanged. With `poly_pairs` some exponentials
come from `exp2_poly` (FMA and integer units) instead of the MUFU.

`to_16bit` converts fp32 registers two at a time (cvt.rn.{bf16x2,f16x2}.f32): the DSL's
tensor conversion went one element at a time (plus a byte permute to pack) for D = 256's
80-column S tile, where it pairs them at 128 columns.

Also the trace-time register views of a wgmma accumulator fragment ((2, 2, N/8), 1, 1): as
(rows, columns) for softmax and masking, and (converted to 16 bits) as the RS A operand; their
index maps come from `sm90_layouts` (derived and tested on the CPU).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm

from cute_kernels.runtime import to_cute

from .sm90_layouts import mn_view_layout, p_as_a_layout
from .softmax import OnlineSoftmax, quad_allreduce_max

__all__ = ["Sm90Softmax", "acc_mn_view", "acc_as_a", "mask_scores", "to_16bit", "exp2_poly"]


def _columns(t: cute.Tensor) -> int:
    return 8 * cute.size(t.layout.shape[0][2])


def acc_mn_view(t: cute.Tensor) -> cute.Tensor:
    """`t` (an accumulator fragment or its coordinate tensor, ((2, 2, N/8), 1, 1)) as (2 rows,
    (2, N/8) columns), in increasing tile order."""
    return cute.make_tensor(t.iterator, cute.composition(t.layout, to_cute(mn_view_layout(_columns(t)))))


def acc_as_a(t: cute.Tensor) -> cute.Tensor:
    """A 16-bit copy of the accumulator, ((2, 2, N/8), 1, 1), as the A operand of N/16 wgmma
    k-steps: ((2, 2, 2), 1, N/16); step kb holds columns [16 kb, 16 kb + 16)."""
    return cute.make_tensor(t.iterator, cute.composition(t.layout, to_cute(p_as_a_layout(_columns(t)))))


def _cvt_pair(a: cutlass.Float32, b: cutlass.Float32, dtype) -> cutlass.Int32:
    """Two fp32 values -> one 32-bit register holding (a, b) rounded to nearest in 16 bits (a in
    the low half). NaN stays NaN and overflow gives inf, as the scalar conversion does."""
    kind = "bf16x2" if dtype is cutlass.BFloat16 else "f16x2"
    return cutlass.Int32(llvm.inline_asm(
        cutlass.Int32.mlir_type, [cutlass.Float32(b).ir_value(), cutlass.Float32(a).ir_value()],
        f"cvt.rn.{kind}.f32 $0, $1, $2;", "=r,f,f", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


# 2^f on [0, 1) as 1 + f (c1 + f (c2 + f c3)): a relative-error fit (max 8.6e-5, below fp16's and
# bf16's rounding of P); the constant term is exactly 1, so that x = -127 (and -inf, clamped
# there) gives exactly 0 below.
_POLY_EXP2 = ("0f3F31F32A", "0f3E691BF4", "0f3D9DD4FF")  # c1 = 0.6951166, c2 = 0.2276457, c3 = 0.0770664


def exp2_poly(x: cutlass.Float32) -> cutlass.Float32:
    """2^x for x <= 0 (NaN -> NaN) on the FMA and integer units, no MUFU: x clamped at -127
    (NaN kept), j = floor(x) read from the low bits of x + 1.5 * 2^23 rounded down, f = x - j in
    [0, 1), and 2^x = poly(f) * 2^j with 2^j built from j's bits (j = -127 gives the bit
    pattern of 0.0, so -inf and x <= -127 give exactly 0; a NaN f makes the product NaN)."""
    c1, c2, c3 = _POLY_EXP2
    return cutlass.Float32(llvm.inline_asm(
        cutlass.Float32.mlir_type, [cutlass.Float32(x).ir_value()],
        "{\n.reg .f32 xc, r, j, f, t, s;\n.reg .b32 e;\n"
        "max.NaN.f32 xc, $1, 0fC2FE0000;\n"
        "add.rm.ftz.f32 r, xc, 0f4B400000;\n"
        "sub.ftz.f32 j, r, 0f4B400000;\n"
        "sub.ftz.f32 f, xc, j;\n"
        f"fma.rn.ftz.f32 t, f, {c3}, {c2};\n"
        f"fma.rn.ftz.f32 t, f, t, {c1};\n"
        "fma.rn.ftz.f32 t, f, t, 0f3F800000;\n"
        "mov.b32 e, r;\n"
        "shl.b32 e, e, 23;\n"
        "add.s32 e, e, 1065353216;\n"
        "mov.b32 s, e;\n"
        "mul.ftz.f32 $0, t, s;\n}",
        "=f,f", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def to_16bit(src: cute.Tensor, dst: cute.Tensor):
    """dst[i] = src[i] rounded to dst's 16-bit type, for compact register fragments of equal
    size (an even count): register pairs (2k, 2k + 1) are converted by one instruction."""
    dst_pairs = cute.recast_tensor(dst, cutlass.Int32)
    for k in cutlass.range_constexpr(cute.size(dst_pairs)):
        dst_pairs[k] = _cvt_pair(src[2 * k], src[2 * k + 1], dst.element_type)


@cute.jit
def mask_scores(acc_s_mn: cute.Tensor, coord_mn: cute.Tensor, row_base: cutlass.Int32, col_base: cutlass.Int32,
                seqlen_k: cutlass.Int32, offset: cutlass.Int32, causal: cutlass.Constexpr,
                offset_lo: cutlass.Int32 = 0, local: cutlass.Constexpr = False):
    """`mask.apply_mask`'s rule (columns past seqlen_k, past row + offset when causal, and below
    row + offset_lo when local get -inf), written as selects instead of a branch: with branches
    the compiler threads the (monotone) column tests into select chains quadratic in the row
    length, whose registers then serialize the in-flight wgmma."""
    for r in cutlass.range_constexpr(cute.size(acc_s_mn.shape[0])):
        row = row_base + coord_mn[r, 0][0]
        col_limit = seqlen_k - col_base
        if cutlass.const_expr(causal):
            col_limit = cutlass.min(col_limit, row + offset + 1 - col_base)
        if cutlass.const_expr(local):
            col_first = row + offset_lo - col_base
            for c in cutlass.range_constexpr(cute.size(acc_s_mn.shape[1])):
                col = coord_mn[0, c][1]
                keep = (col < col_limit) & (col >= col_first)
                acc_s_mn[r, c] = cutlass.select_(keep, acc_s_mn[r, c], -cutlass.Float32.inf)
        else:
            for c in cutlass.range_constexpr(cute.size(acc_s_mn.shape[1])):
                acc_s_mn[r, c] = cutlass.select_(coord_mn[0, c][1] >= col_limit, -cutlass.Float32.inf,
                                                 acc_s_mn[r, c])


class Sm90Softmax(OnlineSoftmax):
    """`OnlineSoftmax` with its step split in two (see the module docstring); `finalize` is the
    base class's. `threshold`: the rescale threshold t (0: exact, every block); `poly_pairs`:
    of every 4 register pairs of a row, how many take their exp2 from `exp2_poly` (FMA units)
    instead of the MUFU."""

    def __init__(self, num_rows: int, scale_log2: cutlass.Float32, threshold: float = 0.0, poly_pairs: int = 0):
        super().__init__(num_rows, scale_log2)
        self.threshold = float(threshold)
        self.poly_pairs = int(poly_pairs)

    @cute.jit
    def update(self, acc_s_mn: cute.Tensor, row_scale: cute.Tensor):
        """Raw scores acc_s_mn (rows, cols) -> unnormalized probabilities, in place; row_scale[r]
        = 2^((m_old - m_new) * scale_log2), the factor O's row r must be multiplied by (exactly
        1 for a row whose kept max did not move, with a threshold).

        A row that has seen only -inf uses 0 as its max (no -inf - -inf): its P is 0 and its
        scale 0 (O is still 0 there)."""
        for r in cutlass.range_constexpr(self.num_rows):
            if cutlass.const_expr(self.threshold == 0.0 and self.poly_pairs == 0):
                row_scale[r] = self.fold_row(acc_s_mn, r)
            else:
                self._fold_row(acc_s_mn, r, row_scale)

    @cute.jit
    def _fold_row(self, acc_s_mn: cute.Tensor, r: cutlass.Constexpr, row_scale: cute.Tensor):
        """`fold_row` with the options: with a threshold the running max is kept unless this
        block raises it by more than t (row_scale[r] is then exactly 1); with `poly_pairs` some
        exponentials are `exp2_poly`'s."""
        block_max = acc_s_mn[r, 0]
        for c in cutlass.range_constexpr(1, cute.size(acc_s_mn.shape[1])):
            block_max = cute.arch.fmax(block_max, acc_s_mn[r, c])
        block_max = quad_allreduce_max(block_max)
        old_max = self.row_max[r]
        if cutlass.const_expr(self.threshold > 0.0):
            # From -inf any finite max moves (inf > t); -inf - -inf is NaN, which compares false.
            grow = (block_max - old_max) * self.scale_log2 > cutlass.Float32(self.threshold)
            new_max = cutlass.select_(grow, block_max, old_max)
        else:
            new_max = cute.arch.fmax(old_max, block_max)
        safe_max = cutlass.Float32(0.0) if new_max == -cutlass.Float32.inf else new_max
        max_scaled = safe_max * self.scale_log2
        rescale = cute.math.exp2(old_max * self.scale_log2 - max_scaled, fastmath=True)
        if cutlass.const_expr(self.threshold > 0.0):
            rescale = cutlass.select_(grow, rescale, cutlass.Float32(1.0))
        block_sum = cutlass.Float32(0.0)
        for c in cutlass.range_constexpr(cute.size(acc_s_mn.shape[1])):
            x = acc_s_mn[r, c] * self.scale_log2 - max_scaled
            if cutlass.const_expr((c // 2) % 4 < self.poly_pairs):
                p = exp2_poly(x)
            else:
                p = cute.math.exp2(x, fastmath=True)
            acc_s_mn[r, c] = p
            block_sum = block_sum + p
        self.row_max[r] = new_max
        self.row_sum[r] = self.row_sum[r] * rescale + block_sum
        row_scale[r] = rescale

    @cute.jit
    def rescale(self, acc_o_mn: cute.Tensor, row_scale: cute.Tensor):
        """O[r, :] *= row_scale[r]; with a threshold, skipped (one warp vote) when every
        row_scale of the warp is 1."""
        if cutlass.const_expr(self.threshold == 0.0):
            self._rescale(acc_o_mn, row_scale)
        else:
            moved = cutlass.Boolean(False)
            for r in cutlass.range_constexpr(self.num_rows):
                moved = moved | (row_scale[r] != cutlass.Float32(1.0))
            if cute.arch.vote_any_sync(moved):
                self._rescale(acc_o_mn, row_scale)

    @cute.jit
    def _rescale(self, acc_o_mn: cute.Tensor, row_scale: cute.Tensor):
        for r in cutlass.range_constexpr(self.num_rows):
            for c in cutlass.range_constexpr(cute.size(acc_o_mn.shape[1])):
                acc_o_mn[r, c] = acc_o_mn[r, c] * row_scale[r]
