"""Epilogue through shared memory: accumulators -> (scale, convert) -> smem -> TMA store.

The CTA tile is stored in `epi_tile` sub-tiles through a ring of `stages` smem buffers: the
consumer threads write a sub-tile with stmatrix (16-bit outputs) or plain stores, fence the
async proxy, sync on a named barrier, and one warp issues the TMA store; a buffer is reused
only after the store that read it has drained (PipelineTmaStore acquire).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warp


def make_r2s_copy(c_layout_enum, c_dtype, acc_dtype, tiled_mma):
    """The tiled register->smem copy for C fragments of `tiled_mma` (stmatrix when 16-bit)."""
    store_atom = sm90_utils.get_smem_store_op(c_layout_enum, elem_ty_d=c_dtype, elem_ty_acc=acc_dtype)
    # The thread/value partition always comes from the 16-bit stmatrix atom, whatever the output
    # width: the epilogue walks the retiled accumulator in epi-tile-sized contiguous chunks, which
    # holds for that partition (a 1-element universal atom would order values differently).
    shape_atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(c_layout_enum.is_m_major_c(), 4), cutlass.Float16)
    return cute.make_tiled_copy_S(store_atom, cute.make_tiled_copy_C_atom(shape_atom, tiled_mma))

