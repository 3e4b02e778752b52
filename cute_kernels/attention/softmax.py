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

Score features (`features`): with a soft cap c the kernels first turn each raw score x into
t = tanh(x * scale / c) (`softcap_tanh`, in place: `apply_softcap`) and run this recurrence on
t with scale_log2 = c * log2(e), so 2^(t * scale_log2) = e^(c t): the max is still taken before
scaling (c > 0). Sinks enter once, in `finalize`: each row's denominator gains 2^(sink log2(e)
- m scale_log2), combined against max(m scale_log2, sink log2(e)) so that a sink far above the
scores neither overflows nor loses the row (lse = sink for a row that saw no key).

Statistics are fp32 and per thread: each row of an m16n8 accumulator is split over the four
threads of a quad, which combine their maxima at every step (shuffles) and their sums once, at
the end. `reference_online_softmax` is the same recurrence in numpy, for tests.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute

__all__ = ["LOG2_E", "OnlineSoftmax", "quad_allreduce_max", "quad_allreduce_sum", "reference_online_softmax",
           "softcap_tanh", "apply_softcap"]

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


@cute.jit
def softcap_tanh(x: cutlass.Float32) -> cutlass.Float32:
    """tanh(x) as 1 - 2 / (1 + 2^(2 x log2 e)) (one ex2 and one rcp on the MUFU): absolute error
    about 1e-7 everywhere, where tanh.approx.f32's relative 2^-11 would move a capped score
    c * t by up to c / 2048 (0.025 at Gemma 2's c = 50, a 2.5% error in its probability).
    +-inf give +-1 exactly, NaN stays NaN."""
    e = cute.math.exp2(x * cutlass.Float32(2.0 * LOG2_E), fastmath=True)
    return cutlass.Float32(1.0) - cutlass.Float32(2.0) * cute.arch.rcp_approx(e + cutlass.Float32(1.0))


@cute.jit
def apply_softcap(acc: cute.Tensor, score_scale: cutlass.Float32):
    """acc[i] = tanh(acc[i] * score_scale) for every register of a raw-score fragment, with
    score_scale = softmax scale / softcap (the recurrence then uses scale_log2 = softcap log2 e)."""
    for i in cutlass.range_constexpr(cute.size(acc)):
        acc[i] = softcap_tanh(acc[i] * score_scale)


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
    def finalize(self, acc_o_mn: cute.Tensor, lse: cute.Tensor, sink_log2=None):
        """acc_o_mn /= l per row; lse[r] = natural-log log-sum-exp of the scaled scores.

        Rows with l == 0 (no key) get output 0 and lse -inf; NaN in l propagates to both.
        sink_log2 (a Float32, sink * log2 e, or None): the sink joins every row's denominator
        (module docstring); a row with no key then has output 0 and lse = sink.
        """
        for r in cutlass.range_constexpr(self.num_rows):
            total = quad_allreduce_sum(self.row_sum[r])
            row_max = self.row_max[r]
            safe_max = cutlass.Float32(0.0) if row_max == -cutlass.Float32.inf else row_max
            top = safe_max * self.scale_log2
            factor = cutlass.Float32(1.0)
            if cutlass.const_expr(sink_log2 is not None):
                # l' = l 2^(m - top) + 2^(sink - top), top = max(m, sink) (0 when both are -inf);
                # O is scaled by 2^(m - top) / l'. A NaN anywhere reaches l' and so both results.
                m2 = row_max * self.scale_log2
                top = cute.arch.fmax(m2, sink_log2)
                top = cutlass.Float32(0.0) if top == -cutlass.Float32.inf else top
                factor = cute.math.exp2(m2 - top, fastmath=True)
                total = total * factor + cute.math.exp2(sink_log2 - top, fastmath=True)
            inv = cutlass.Float32(0.0) if total == 0.0 else cute.arch.rcp_approx(total) * factor
            for c in cutlass.range_constexpr(cute.size(acc_o_mn.shape[1])):
                acc_o_mn[r, c] = acc_o_mn[r, c] * inv
            lse[r] = (
                -cutlass.Float32.inf
                if total == 0.0
                else (top + cute.math.log2(total, fastmath=True)) * LN_2
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
