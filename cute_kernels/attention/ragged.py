"""Ragged tensor maps: packed sequences read by TMA, each clipped at its own end.

A packed (T, D, H, 1) tensor (sequences end to end along T) is viewed (T, D, H, T + 1): the last
mode has the row stride and the pointer moves back T rows, so row r of a sequence at offset o of
length S is element (T - S + r, :, h, o + S), at the address of row o + r, and rows r >= S fall
past mode 0 (T - S + r >= T): zero-filled loads, dropped stores. Every in-bounds box a kernel
asks for lies inside its sequence's own rows, so no row of a neighbour is read. `sm90_flash`'s
varlen forward and `sm90_bwd_mainloop`'s varlen backward use it.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

__all__ = ["ragged", "seq_rows"]


def ragged(t: cute.Tensor) -> cute.Tensor:
    """The packed (T, D, H, 1) tensor `t` as its ragged (T, D, H, T + 1) view (module docstring)."""
    rows, row_stride = t.shape[0], t.stride[0]
    layout = cute.make_layout((rows, t.shape[1], t.shape[2], rows + 1),
                              stride=(row_stride, t.stride[1], t.stride[2], row_stride))
    return cute.make_tensor(t.iterator - cutlass.Int64(rows) * row_stride, layout)


def seq_rows(t: cute.Tensor, head, offset, length) -> cute.Tensor:
    """Head `head`'s (S, D) rows of the sequence at `offset` of `length` rows, from a `ragged` view."""
    return cute.domain_offset((t.shape[0] - length, 0), t[None, None, head, offset + length])
