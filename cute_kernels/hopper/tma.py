"""TMA (cp.async.bulk.tensor) atoms: loads into swizzled smem, optionally multicast, and stores.

A TMA atom pairs a tensor-map descriptor (built on the host from the global tensor, the smem
layout of one stage and the tile) with a coordinate tensor that the kernel slices per tile.
Multicast loads deliver one tile to every CTA on a line of the cluster: A is shared by the CTAs
of a cluster row (same M, different N), B by those of a cluster column.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync


def make_tma_load(gmem, smem_layout_staged, tile: tuple[int, int], num_multicast: int):
    """(atom, coordinate tensor) for loading `tile` of `gmem` into one stage of `smem_layout_staged`.

    `num_multicast` > 1 selects the multicast op; each CTA then issues 1/num_multicast of the tile.
    """
    op = cpasync.CopyBulkTensorTileG2SOp() if num_multicast == 1 else cpasync.CopyBulkTensorTileG2SMulticastOp()
    one_stage = cute.slice_(smem_layout_staged, (None, None, 0))
    return cpasync.make_tiled_tma_atom(op, gmem, one_stage, tile, num_multicast=num_multicast)


def make_tma_store(gmem, epi_layout_staged, epi_tile: tuple[int, int]):
    """(atom, coordinate tensor) for storing one `epi_tile` of smem to `gmem` (OOB rows/cols clipped)."""
    one_stage = cute.slice_(epi_layout_staged, (None, None, 0))
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), gmem, one_stage, epi_tile)


def prefetch(*atoms) -> None:
    """Prefetch the tensor-map descriptors (call from one warp before first use)."""
    for atom in atoms:
        cpasync.prefetch_descriptor(atom)


def multicast_masks(cluster_layout_mnk, cluster_coord_mnk, mcast_a: bool, mcast_b: bool):
    """(a_mask, b_mask): the CTAs receiving this CTA's A (its cluster row) and B (its column)."""
    a_mask = cute.make_layout_image_mask(cluster_layout_mnk, cluster_coord_mnk, mode=1) if mcast_a else 0
    b_mask = cute.make_layout_image_mask(cluster_layout_mnk, cluster_coord_mnk, mode=0) if mcast_b else 0
    return a_mask, b_mask


def partition_load(atom, cluster_layout_mnk, cluster_coord_mnk, operand_mode: int, s_staged, g_tiled):
    """(smem, gmem) TMA views of one operand for this CTA's slice of the multicast.

    `operand_mode` is 0 for A (multicast along cluster N, mode 1) and 1 for B (along cluster M).
    `s_staged` is (rows, K, stages) and `g_tiled` is (rows, K, RestRows, RestK, RestL).
    """
    other = 1 - operand_mode
    sel = [0, 0, 0]
    sel[other] = None
    mc_layout = cute.make_layout(cute.slice_(cluster_layout_mnk, tuple(sel)).shape)
    return cpasync.tma_partition(
        atom, cluster_coord_mnk[other], mc_layout, cute.group_modes(s_staged, 0, 2), cute.group_modes(g_tiled, 0, 2)
    )


def bulk_reduce_add_f32(gmem_ptr, smem_ptr, nbytes: int) -> None:
    """gmem[0 : nbytes) += smem[0 : nbytes) as fp32, one non-tensor bulk reduction
    (`cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32`) issued by the calling thread:
    contiguous bytes with no tensor map, so the L2 sees whole lines (a TMA box with 32-byte rows,
    or per-thread `red.global`, adds one 32-byte sector at a time). Both addresses 16-byte
    aligned, nbytes a multiple of 16; bracket with `cute.arch.cp_async_bulk_commit_group` and
    `cp_async_bulk_wait_group` (read=True before the shared memory is rewritten)."""
    from cutlass.experimental.primitives.nvvm_wrapper import CpReduceType, cp_reduce_async_bulk_global_shared_cta

    cp_reduce_async_bulk_global_shared_cta(gmem_ptr, smem_ptr, nbytes, type=CpReduceType.F32)
