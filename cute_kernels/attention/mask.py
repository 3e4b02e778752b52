"""Attention masks: which (query i, key j) pairs a row may attend to.

Definitions, for seqlen_q rows and seqlen_k columns:

- Sequence end: j < seqlen_k always (columns past the end are padding of the last K block).
- Causal, aligned top-left (PyTorch's `is_causal=True`): j <= i.
- Causal, aligned bottom-right (`torch.nn.attention.bias.causal_lower_right`, FlashAttention's
  convention): j <= i + (seqlen_k - seqlen_q), so the last query sees every key. With
  seqlen_q > seqlen_k the first seqlen_q - seqlen_k rows see no key at all: their output is 0
  and their log-sum-exp is -inf (PyTorch's math path would give NaN there; see docs/attention.md).
- Sliding window (FlashAttention's `window_size=(left, right)`): also
  i + base - window_left <= j <= i + base + window_right for the bounds that are given, where
  `base` is the diagonal's alignment offset (0 top-left, seqlen_k - seqlen_q bottom-right); a
  window without causality is aligned bottom-right, as in FlashAttention. Causality is the
  right bound 0.

Both causal alignments are one rule with a column `offset` (0 or seqlen_k - seqlen_q), which
kernels receive as a runtime value: one compiled kernel serves both. A window adds its bounds
to that offset: kernels see an upper offset (j <= i + offset) and a lower one (j >= i +
offset_lo), both runtime values.

`allowed` and `dense_mask` are the reference definitions (Python, torch; defined in the DSL-free
`mask_rule` and re-exported here); `apply_mask` is the kernel-side implementation on an
accumulator tile viewed as (rows, columns).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

# The rule itself is DSL-free (the PyTorch reference and the argument checks use it without the
# DSL); it is re-exported here beside its kernel-side implementation.
from .mask_rule import ALIGNMENTS, allowed, causal_offset, dense_mask, window_offsets

__all__ = ["ALIGNMENTS", "causal_offset", "window_offsets", "allowed", "dense_mask", "apply_mask",
           "apply_causal_mask_kq", "apply_window_mask_kq"]


@cute.jit
def apply_mask(acc_s_mn: cute.Tensor, coord_mn: cute.Tensor, row_base: cutlass.Int32, col_base: cutlass.Int32,
               seqlen_k: cutlass.Int32, offset: cutlass.Int32, causal: cutlass.Constexpr,
               offset_lo: cutlass.Int32 = 0, local: cutlass.Constexpr = False):
    """Set acc_s_mn[r, c] = -inf wherever (row, column) is not allowed.

    `acc_s_mn` is this thread's scores viewed (rows, columns); `coord_mn` the same view of the
    tile's identity tensor (tile-local (row, col) per element); row_base/col_base the tile's
    origin. Tested: the sequence end, with `causal` the upper diagonal (col <= row + offset),
    with `local` the lower one (col >= row + offset_lo). Rows past seqlen_q are never stored,
    so they need no mask.
    """
    for r in cutlass.range_constexpr(cute.size(acc_s_mn.shape[0])):
        col_limit = seqlen_k - col_base
        row = row_base + coord_mn[r, 0][0]
        if cutlass.const_expr(causal):
            col_limit = cutlass.min(col_limit, row + offset + 1 - col_base)
        if cutlass.const_expr(local):
            col_first = row + offset_lo - col_base
            for c in cutlass.range_constexpr(cute.size(acc_s_mn.shape[1])):
                col = coord_mn[0, c][1]
                if col >= col_limit or col < col_first:
                    acc_s_mn[r, c] = -cutlass.Float32.inf
        else:
            for c in cutlass.range_constexpr(cute.size(acc_s_mn.shape[1])):
                if coord_mn[0, c][1] >= col_limit:
                    acc_s_mn[r, c] = -cutlass.Float32.inf


@cute.jit
def apply_causal_mask_kq(acc_mn: cute.Tensor, coord_mn: cute.Tensor, key_base: cutlass.Int32,
                         query_base: cutlass.Int32, offset: cutlass.Int32):
    """The causal rule on a transposed score tile S^T (rows = keys j, columns = queries i), as
    the backward's dK/dV pass holds it: acc_mn[r, c] = -inf where j > i + offset."""
    for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
        # Query columns below j - offset may not see key j.
        first_query = key_base + coord_mn[r, 0][0] - offset - query_base
        for c in cutlass.range_constexpr(cute.size(acc_mn.shape[1])):
            if coord_mn[0, c][1] < first_query:
                acc_mn[r, c] = -cutlass.Float32.inf


@cute.jit
def apply_window_mask_kq(acc_mn: cute.Tensor, coord_mn: cute.Tensor, key_base: cutlass.Int32,
                         query_base: cutlass.Int32, offset_lo: cutlass.Int32):
    """The window's lower bound on a transposed score tile S^T (rows = keys j, columns =
    queries i): acc_mn[r, c] = -inf where j < i + offset_lo."""
    for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
        # Query columns past j - offset_lo may not see key j.
        last_query = key_base + coord_mn[r, 0][0] - offset_lo - query_base
        for c in cutlass.range_constexpr(cute.size(acc_mn.shape[1])):
            if coord_mn[0, c][1] > last_query:
                acc_mn[r, c] = -cutlass.Float32.inf
