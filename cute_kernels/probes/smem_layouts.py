"""The shared-memory layouts of the `SmemTranspose` probe, and how a warp touches them, as plain
`cute_kernels.layouts` objects (no DSL): the kernel converts them at trace time, the course
draws and analyses the same objects."""

from __future__ import annotations

from cute_kernels.layouts import ComposedLayout, Layout, Swizzle

__all__ = ["TILE", "ROWS_PER_PASS", "SMEM_LAYOUTS", "column_read", "row_write"]

TILE = 32
ROWS_PER_PASS = 8  # the block is 32 x 8 threads: each thread moves TILE / 8 = 4 elements
# (r, c) -> element offset of the tile in shared memory.
SMEM_LAYOUTS = {
    "row_major": Layout((TILE, TILE), (TILE, 1)),
    "padded": Layout((TILE, TILE), (TILE + 1, 1)),
    "swizzled": ComposedLayout(Swizzle(5, 0, 5), 0, Layout((TILE, TILE), (TILE, 1))),
}


def column_read() -> Layout:
    """The TV layout of one warp's shared-memory read in the write-out phase: lane t reads
    element (t, r) of the tile (column-major tile index t + 32 r); drawn for column r = 0, every
    column is alike. One value per lane: one 32-bit load per instruction."""
    return Layout((TILE, 1), (1, 0))


def row_write() -> Layout:
    """The TV layout of one warp's shared-memory write in the load phase: lane t writes element
    (r, t) of the tile (tile index r + 32 t), drawn for row r = 0."""
    return Layout((TILE, 1), (TILE, 0))
