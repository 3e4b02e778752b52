"""Warpgroup MMA (wgmma.mma_async) from shared memory.

A tiled MMA of `atom_layout_mnk` warpgroups, each issuing 64 x tile_n x k instructions
(k = 16 for 16-bit inputs, 32 for 8-bit); `mma_k_tile` issues one smem stage's worth
(tile_k / k instructions) back to back, asynchronously: the caller commits the group and
waits on it (`wait_group(n)` keeps n groups in flight).
"""

from __future__ import annotations

import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup


def operand_major(major: str):
    """'K' or 'MN' -> the DSL OperandMajorMode."""
    return cute.nvgpu.OperandMajorMode.K if major == "K" else cute.nvgpu.OperandMajorMode.MN


def make_tiled_mma(a_dtype, b_dtype, a_major: str, b_major: str, acc_dtype, atom_layout_mnk, tile_n: int):
    """The tiled wgmma over `atom_layout_mnk` warpgroups, each computing 64 x tile_n."""
    return sm90_utils.make_trivial_tiled_mma(
        a_dtype, b_dtype, operand_major(a_major), operand_major(b_major), acc_dtype, atom_layout_mnk,
        tiler_mn=(64, tile_n),
    )


def instr_k(tiled_mma) -> int:
    return cute.size(tiled_mma.shape_mnk, mode=[2])


def mma_k_tile(tiled_mma, acc, tCrA, tCrB, stage, *, zero_init: bool = False) -> None:
    """acc (+)= A_stage . B_stage over every k block of one smem stage.

    With `zero_init` the first instruction overwrites acc (no separate zero fill); afterwards
    the MMA is left accumulating. Asynchronous: the caller commits the group and waits on it.
    Call it from straight-line code (peel the first k tile) so the ACCUMULATE flag is static.
    """
    for kb in range(cute.size(tCrA, mode=[2])):
        if zero_init:
            tiled_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, stage)], tCrB[(None, None, kb, stage)], acc)
    if zero_init:
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)


fence = warpgroup.fence
commit_group = warpgroup.commit_group
wait_group = warpgroup.wait_group
