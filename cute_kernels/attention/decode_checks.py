"""The decode split kernels' index checks on the device (`decode`'s docstring): a sequence's
length and every block-table entry it reads are clamped into range, so no read leaves the
caches, and what was clamped is recorded in an int32 error buffer with plain stores (only when
something is wrong: no atomics, no cost on the good path). `paged.raise_paged_decode_errors`
reads the buffer on the host.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

__all__ = ["ERROR_SLOTS", "BAD_PAGE", "BAD_LENGTH", "checked_length", "checked_page"]

# The device error buffer (int32): [bad page flag, its batch, its table column, its value,
# bad length flag, its batch, its value, unused].
ERROR_SLOTS = 8
BAD_PAGE, BAD_LENGTH = 0, 4


@cute.jit
def checked_length(mSeqlensK: cute.Tensor, batch, reach, mErr: cute.Tensor | None):
    """seqlens_k[batch] clamped into [0, reach] (the block table's keys); a clamped length is
    recorded in mErr (None: no check)."""
    n = mSeqlensK[batch]
    if cutlass.const_expr(mErr is not None):
        if n < 0 or n > reach:
            mErr[BAD_LENGTH] = 1
            mErr[BAD_LENGTH + 1] = batch
            mErr[BAD_LENGTH + 2] = n
        n = cutlass.max(cutlass.min(n, reach), 0)
    return n


@cute.jit
def checked_page(mBlockTable: cute.Tensor, batch, col, num_pages, mErr: cute.Tensor | None):
    """block_table[batch, col] clamped into [0, num_pages); a clamped entry is recorded in mErr
    (None: no check)."""
    page = mBlockTable[batch, col]
    if cutlass.const_expr(mErr is not None):
        if page < 0 or page >= num_pages:
            mErr[BAD_PAGE] = 1
            mErr[BAD_PAGE + 1] = batch
            mErr[BAD_PAGE + 2] = col
            mErr[BAD_PAGE + 3] = page
        page = cutlass.max(cutlass.min(page, num_pages - 1), 0)
    return page
