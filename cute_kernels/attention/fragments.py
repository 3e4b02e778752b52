"""Views of mma.sync register fragments that the attention kernels need.

An m16n8 accumulator fragment of a tiled MMA is shaped ((2, 2), MMA_M, MMA_N): per atom a
thread holds two adjacent columns (first mode) of two rows eight apart (second mode). Softmax
works on rows, and P = softmax(S) feeds the next MMA as its A operand, whose m16k16 fragment is
((2, 2, 2), MMA_M, MMA_K): the two n8 accumulator atoms of one k16 step, side by side. These are
index views over the same registers: nothing moves.
"""

from __future__ import annotations

import cutlass.cute as cute

__all__ = ["mn_view", "accumulator_as_a"]


def mn_view(t: cute.Tensor) -> cute.Tensor:
    """`t` (((2, 2), MMA_M, MMA_N), an accumulator or its coordinate tensor) as (rows, columns):
    rows ((2, MMA_M)), columns ((2, MMA_N)).

    Post-condition: element [r, c] is the element of `t` in row r, column c of this thread's
    share of the tile, rows and columns in increasing tile order.
    """
    s = t.layout.shape
    compact = cute.make_layout(s)
    d = compact.stride
    rows_cols = cute.make_layout(
        ((s[0][1], s[1]), (s[0][0], s[2])),
        stride=((d[0][1], d[1]), (d[0][0], d[2])),
    )
    return cute.make_tensor(t.iterator, cute.composition(t.layout, rows_cols))


def accumulator_as_a(t: cute.Tensor) -> cute.Tensor:
    """An accumulator-shaped fragment ((2, 2), MMA_M, MMA_N) (already converted to the MMA's
    input type) as the A operand of an m16n8k16 MMA: ((2, 2, 2), MMA_M, MMA_N / 2).

    Post-condition: k step k of the result holds accumulator columns [16k, 16k + 16) of this
    thread's rows, in the register order the A fragment expects. Needs MMA_N even.
    """
    divided = cute.logical_divide(t.layout, (None, None, 2))
    s, d = divided.shape, divided.stride
    a_layout = cute.make_layout(
        ((s[0], s[2][0]), s[1], s[2][1]),
        stride=((d[0], d[2][0]), d[1], d[2][1]),
    )
    return cute.make_tensor(t.iterator, a_layout)
