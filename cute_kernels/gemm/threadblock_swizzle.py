"""Threadblock swizzle: the order in which output tiles are handed to blocks, for L2 reuse.

Blocks are launched in index order and roughly one wave (one block per SM, 132 on an H200) runs
at a time. Row-by-row order makes a wave span few rows of A but many columns of B; *grouped*
order walks `raster` tile-rows at a time, column by column, so a wave covers a near-square
patch of the output and each A row-panel and B column-panel it loads is reused by many blocks
while still in L2.

`grouped_tile(t, tiles_m, tiles_n, raster)` is the map, written with integer arithmetic and a
`minimum` (Python's `min`, or `cutlass.min` inside a kernel) so the same function runs on Python
ints (tests, docs) and on DSL integers.
"""

from __future__ import annotations

__all__ = ["grouped_tile", "tile_order"]


def grouped_tile(t, tiles_m, tiles_n, raster: int, minimum=min):
    """(m_tile, n_tile) of the t-th launched block, for t in [0, tiles_m * tiles_n).

    Tiles are taken in groups of `raster` consecutive tile-rows (the last group may be
    narrower); inside a group, m runs fastest, then n.
    Post-condition: a bijection of [0, tiles_m * tiles_n) onto the tile grid.
    """
    group = t // (raster * tiles_n)
    first_m = group * raster
    width = minimum(tiles_m - first_m, raster)
    local = t - group * raster * tiles_n
    return first_m + local % width, local // width


def tile_order(tiles_m: int, tiles_n: int, raster: int) -> list[tuple[int, int]]:
    """The whole launch order, for printing and tests."""
    return [grouped_tile(t, tiles_m, tiles_n, raster) for t in range(tiles_m * tiles_n)]
