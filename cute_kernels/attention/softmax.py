"""Online softmax in base 2, with the softmax scale folded into the exponent.

For the rows of a score tile S (raw q.k, unscaled), visited one column block at a time, keep
per row the running max m (of raw scores) and running sum l = sum_j 2^((s_j - m) * scale_log2),
where scale_log2 = scale * log2(e). A new block with scores s' updates

    m' = max(m, max_j s'_j)
    l' = l * 2^((m - m') * scale_log2) + sum_j 2^((s'_j - m') * scale_log2)
    O' = O * 2^((m - m') * scale_log2) + P' V,   P'_j = 2^((s'_j - m') * scale_log2)

and at the end out = O / l and the natural-log log-sum-exp of the scaled scores is
lse = m * scale + ln(l). Taking the max of raw scores is right because scale > 0 (the kernels
check it). A row that has seen only -inf (fully masked so far) uses 0 in place of m, so no
-inf - -inf appears; its l stays 0, its output is 0 and its lse -inf.

Statistics are fp32 and per thread: each row of an m16n8 accumulator is split over the four
threads of a quad, which combine their maxima at every step (shuffles) and their sums once, at
the end. `reference_online_softmax` is the same recurrence in numpy, for tests.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute

__all__ = ["LOG2_E", "OnlineSoftmax", "quad_allreduce_max", "quad_allreduce_sum", "reference_online_softmax"]

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


@cute.jit
def quad_allreduce_max(x: cutlass.Float32) -> cutlass.Float32:
    """max over the 4 threads of a quad (lanes 4q..4q+3), returned to all four."""
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))
    return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))


@cute.jit
def quad_allreduce_sum(x: cutlass.Float32) -> cutlass.Float32:
    """Sum over the 4 threads of a quad, returned to all four."""
    x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
    return x + cute.arch.shuffle_sync_bfly(x, offset=1)


class OnlineSoftmax:
    """Running row statistics for `num_rows` rows held by this thread (see module docstring)."""

    def __init__(self, num_rows: int, scale_log2: cutlass.Float32):
        self.num_rows = num_rows
        self.scale_log2 = scale_log2
        self.row_max = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        self.row_sum = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        self.row_max.fill(-cutlass.Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def fold_row(self, acc_s_mn: cute.Tensor, r: cutlass.Constexpr) -> cutlass.Float32:
        """Fold row r of a block of raw scores into the statistics, turning it into P (in
        place), and return 2^((m_old - m_new) * scale_log2), the factor that row of O must be
        multiplied by. A row that has seen only -inf uses 0 as its max (its P and factor are 0)."""
        block_max = acc_s_mn[r, 0]
        for c in cutlass.range_constexpr(1, cute.size(acc_s_mn.shape[1])):
            block_max = cute.arch.fmax(block_max, acc_s_mn[r, c])
        block_max = quad_allreduce_max(block_max)
        old_max = self.row_max[r]
        new_max = cute.arch.fmax(old_max, block_max)
        safe_max = cutlass.Float32(0.0) if new_max == -cutlass.Float32.inf else new_max
        max_scaled = safe_max * self.scale_log2
        rescale = cute.math.exp2(old_max * self.scale_log2 - max_scaled, fastmath=True)
        block_sum = cutlass.Float32(0.0)
        for c in cutlass.range_constexpr(cute.size(acc_s_mn.shape[1])):
            p = cute.math.exp2(acc_s_mn[r, c] * self.scale_log2 - max_scaled, fastmath=True)
            acc_s_mn[r, c] = p
            block_sum = block_sum + p
        self.row_max[r] = new_max
        self.row_sum[r] = self.row_sum[r] * rescale + block_sum
        return rescale

    @cute.jit
    def step(self, acc_s_mn: cute.Tensor, acc_o_mn: cute.Tensor):
        """Fold one block of scores in: acc_s_mn (rows, cols) raw scores -> P (unnormalized
        probabilities, in place); acc_o_mn (rows, head dim) rescaled to the new row max."""
        for r in cutlass.range_constexpr(self.num_rows):
            rescale = self.fold_row(acc_s_mn, r)
            for c in cutlass.range_constexpr(cute.size(acc_o_mn.shape[1])):
                acc_o_mn[r, c] = acc_o_mn[r, c] * rescale

    @cute.jit
    def finalize(self, acc_o_mn: cute.Tensor, lse: cute.Tensor):
        """acc_o_mn /= l per row; lse[r] = natural-log log-sum-exp of the scaled scores.

        Rows with l == 0 (no key) get output 0 and lse -inf; NaN in l propagates to both.
        """
        for r in cutlass.range_constexpr(self.num_rows):
            total = quad_allreduce_sum(self.row_sum[r])
            inv = cutlass.Float32(0.0) if total == 0.0 else cute.arch.rcp_approx(total)
            for c in cutlass.range_constexpr(cute.size(acc_o_mn.shape[1])):
                acc_o_mn[r, c] = acc_o_mn[r, c] * inv
            row_max = self.row_max[r]
            safe_max = cutlass.Float32(0.0) if row_max == -cutlass.Float32.inf else row_max
            lse[r] = (
                -cutlass.Float32.inf
                if total == 0.0
                else (safe_max * self.scale_log2 + cute.math.log2(total, fastmath=True)) * LN_2
            )


def reference_online_softmax(scores, values, scale: float, block: int):
    """numpy float64: (out, lse) of softmax(scores * scale) @ values computed block by block
    with the recurrence above (the law the kernel implements; tests compare it to the direct
    formula). scores (rows, cols) with -inf for masked entries; values (cols, d)."""
    import numpy as np

    s = np.asarray(scores, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    rows = s.shape[0]
    scale_log2 = scale * LOG2_E
    m = np.full(rows, -np.inf)
    l_ = np.zeros(rows)
    o = np.zeros((rows, v.shape[1]))
    for start in range(0, s.shape[1], block):
        sb = s[:, start:start + block]
        new_m = np.maximum(m, sb.max(axis=1))
        safe = np.where(new_m == -np.inf, 0.0, new_m)
        rescale = np.exp2((m - safe) * scale_log2)
        p = np.exp2((sb - safe[:, None]) * scale_log2)
        l_ = l_ * rescale + p.sum(axis=1)
        o = o * rescale[:, None] + p @ v[start:start + block]
        m = new_m
    safe = np.where(m == -np.inf, 0.0, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(l_[:, None] == 0, 0.0, o / l_[:, None])
        lse = np.where(l_ == 0, -np.inf, safe * scale + np.log(l_))
    return out, lse
