"""Online softmax for the wgmma accumulator, split so the O rescale can wait for a GEMM.

Same recurrence as `softmax` (base 2, scale folded into the exponent, fp32 statistics, a row's
max and sum combined over the 4 threads of a quad), but `update` only folds the scores in and
returns each row's rescale factor; `rescale` applies it to O. The split lets the intra-warpgroup
overlap keep O += P V of the previous block in flight while this block's exponentials run: O
is rescaled after that GEMM retires.

Also the trace-time register views of a wgmma accumulator fragment ((2, 2, N/8), 1, 1): as
(rows, columns) for softmax and masking, and (converted to 16 bits) as the RS A operand; their
index maps come from `sm90_layouts` (derived and tested on the CPU).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cute_kernels.runtime import to_cute

from .sm90_layouts import mn_view_layout, p_as_a_layout
from .softmax import OnlineSoftmax

__all__ = ["Sm90Softmax", "acc_mn_view", "acc_as_a", "mask_scores"]


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


@cute.jit
def mask_scores(acc_s_mn: cute.Tensor, coord_mn: cute.Tensor, row_base: cutlass.Int32, col_base: cutlass.Int32,
                seqlen_k: cutlass.Int32, offset: cutlass.Int32, causal: cutlass.Constexpr):
    """`mask.apply_mask`'s rule (columns past seqlen_k, and past row + offset when causal, get
    -inf), written as one select per score instead of a branch: with branches the compiler
    threads the (monotone) column tests into select chains quadratic in the row length, whose
    registers then serialize the in-flight wgmma."""
    for r in cutlass.range_constexpr(cute.size(acc_s_mn.shape[0])):
        col_limit = seqlen_k - col_base
        if cutlass.const_expr(causal):
            col_limit = cutlass.min(col_limit, row_base + coord_mn[r, 0][0] + offset + 1 - col_base)
        for c in cutlass.range_constexpr(cute.size(acc_s_mn.shape[1])):
            acc_s_mn[r, c] = cutlass.select_(coord_mn[0, c][1] >= col_limit, -cutlass.Float32.inf, acc_s_mn[r, c])


class Sm90Softmax(OnlineSoftmax):
    """`OnlineSoftmax` with its step split in two (see the module docstring); `finalize` is the
    base class's."""

    @cute.jit
    def update(self, acc_s_mn: cute.Tensor, row_scale: cute.Tensor):
        """Raw scores acc_s_mn (rows, cols) -> unnormalized probabilities, in place; row_scale[r]
        = 2^((m_old - m_new) * scale_log2), the factor O's row r must be multiplied by.

        A row that has seen only -inf uses 0 as its max (no -inf - -inf): its P is 0 and its
        scale 0 (O is still 0 there)."""
        for r in cutlass.range_constexpr(self.num_rows):
            row_scale[r] = self.fold_row(acc_s_mn, r)

    @cute.jit
    def rescale(self, acc_o_mn: cute.Tensor, row_scale: cute.Tensor):
        """O[r, :] *= row_scale[r]."""
        for r in cutlass.range_constexpr(self.num_rows):
            for c in cutlass.range_constexpr(cute.size(acc_o_mn.shape[1])):
                acc_o_mn[r, c] = acc_o_mn[r, c] * row_scale[r]
