"""How the fused kernels cover a row-major (rows, width) tensor: the row tiling, its thread-value
layout, and the heuristic that picks one per (width, dtype). Pure Python (no DSL, no torch), so
the workbench can show and check exactly what the kernels run.

A CTA covers a tile of `rows_per_cta` rows by `capacity` columns. The threads of one row are
`threads_per_row` consecutive threads (a power of two: an aligned group of lanes, or whole warps);
each holds `vecs_per_thread` vectors of `vec` contiguous elements of its row. Vector j of lane l
starts at column `(j * threads_per_row + l) * vec`, so for every j the lanes of a row read
consecutive vectors: a warp's request is whole 32-byte sectors (`coalescing` proves it), and each
vector is one 16-byte LDG.E.128 when `vec * element bytes == 16`.

`row_tv_layout(t)` is that placement as a CuTe TV layout: (thread, value) -> index of the
column-major (rows_per_cta, capacity) tile, thread = (lane in row, row), value = (element in
vector, vector). The kernels compose it with their global-memory tile (`to_cute` at trace time);
`vector_access_layout(t)` is one instruction's part of it (what `layouts.coalescing` measures).

Widths wider than one tile (softmax and cross-entropy over a large vocabulary) are walked in
chunks of `capacity` columns by the streaming kernels; `chunked_tiling` picks their tile.
"""

from __future__ import annotations

from dataclasses import dataclass

from cute_kernels.layouts import Layout

__all__ = ["RowTiling", "row_tv_layout", "vector_access_layout", "row_tiling", "chunked_tiling", "vector_elements",
           "value_budget", "min_blocks_per_sm", "SMEM_CARVEOUT_PERCENT", "MAX_STASH_BYTES", "check_stash",
           "smem_carveout", "MAX_THREADS"]

MAX_THREADS = 1024
# Threads per CTA the heuristic aims for when several rows share a CTA.
_CTA_THREADS = 128


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class RowTiling:
    """A CTA's tile: `rows_per_cta` rows of `capacity = threads_per_row * vec * vecs_per_thread`
    columns (see the module docstring).

    vec: elements per vector access (a power of two; 16 bytes / element size for 128-bit access).
    threads_per_row: a power of two up to 1024 (a row's threads are an aligned lane group or whole warps).
    rows_per_cta: rows per CTA; threads = threads_per_row * rows_per_cta (at most 1024, whole warps).
    vecs_per_thread: vectors each thread holds per row (per chunk, for the streaming kernels).
    """

    vec: int
    threads_per_row: int
    rows_per_cta: int = 1
    vecs_per_thread: int = 1

    def validate(self, element_bytes: int | None = None) -> "RowTiling":
        if not (isinstance(self.vec, int) and _pow2(self.vec) and self.vec <= 16):
            raise ValueError(f"RowTiling.vec must be a power of two up to 16, got {self.vec!r}")
        if not (isinstance(self.threads_per_row, int) and _pow2(self.threads_per_row)
                and self.threads_per_row <= MAX_THREADS):
            raise ValueError(f"RowTiling.threads_per_row must be a power of two up to {MAX_THREADS}, "
                             f"got {self.threads_per_row!r}")
        if not (isinstance(self.rows_per_cta, int) and self.rows_per_cta >= 1):
            raise ValueError(f"RowTiling.rows_per_cta must be a positive int, got {self.rows_per_cta!r}")
        if not (isinstance(self.vecs_per_thread, int) and 1 <= self.vecs_per_thread <= 32):
            raise ValueError(f"RowTiling.vecs_per_thread must be an int in [1, 32], got {self.vecs_per_thread!r}")
        if self.threads % 32 or self.threads > MAX_THREADS:
            raise ValueError(f"RowTiling: threads_per_row * rows_per_cta = {self.threads} must be a multiple of "
                             f"32 and at most {MAX_THREADS}")
        if element_bytes is not None and self.vec * element_bytes > 16:
            raise ValueError(f"RowTiling.vec = {self.vec} elements of {element_bytes} bytes exceeds a 16-byte access")
        return self

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta

    @property
    def capacity(self) -> int:
        """Columns of the tile: the widest row one pass over the tile covers."""
        return self.threads_per_row * self.vec * self.vecs_per_thread

    @property
    def values_per_thread(self) -> int:
        return self.vec * self.vecs_per_thread

    @property
    def warps_per_row(self) -> int:
        return max(1, self.threads_per_row // 32)

    @property
    def lanes_per_row(self) -> int:
        """Lanes of one warp that share a row (the butterfly's width)."""
        return min(32, self.threads_per_row)

    @property
    def tile_shape(self) -> tuple[int, int]:
        return (self.rows_per_cta, self.capacity)


def row_tv_layout(t: RowTiling) -> Layout:
    """(thread, value) -> index of the column-major (rows_per_cta, capacity) tile.

    thread = (lane l in its row, row r), value = (element e of a vector, vector j); the index is
    that of tile element (r, (j * threads_per_row + l) * vec + e).

    Post-conditions: a bijection onto [0, rows_per_cta * capacity); for fixed (thread, j) the vec
    elements are consecutive columns of one row (one vector access); for fixed (r, j, e)
    consecutive lanes are vec columns apart (coalesced).
    """
    t.validate()
    rows, tpr, vec, vpt = t.rows_per_cta, t.threads_per_row, t.vec, t.vecs_per_thread
    return Layout(((tpr, rows), (vec, vpt)), ((rows * vec, 1), (rows, rows * tpr * vec)))


def vector_access_layout(t: RowTiling) -> Layout:
    """The TV layout of one vector access of every thread (vector j = 0 of `row_tv_layout`; the
    others are the same access moved by j * threads_per_row * vec columns): what one LDG / STG
    instruction of the CTA reads, for `layouts.coalescing` and the workbench."""
    t.validate()
    rows, tpr, vec = t.rows_per_cta, t.threads_per_row, t.vec
    return Layout(((tpr, rows), vec), ((rows * vec, 1), rows))


def vector_elements(element_bytes: int, *divisors: int) -> int:
    """The widest vector (elements, at most 16 bytes) dividing every `divisors` entry: the width,
    row strides, and data pointers' offsets (in elements) of every tensor a kernel moves."""
    if element_bytes not in (1, 2, 4, 8):
        raise ValueError(f"element size must be 1, 2, 4 or 8 bytes, got {element_bytes}")
    vec = 16 // element_bytes
    for d in divisors:
        while vec > 1 and d % vec:
            vec //= 2
    return vec


def dense_blocks_per_sm(threads: int) -> int:
    """The CTAs per SM a one-pass row kernel (the norms' forward) is compiled for with
    `NormConfig.dense`: half again `min_blocks_per_sm` where that is at least 2 (a cap of about 80
    registers at 128 threads, 85 at 256). Why: the LayerNorm forward in 16-bit kept about 110
    registers at the plain cap, 4 CTAs of 128 threads an SM, so about 32 KB of a row block's loads
    in flight an SM, under what HBM needs at its latency; compiled for 6 it holds 80 registers
    with no spills. So did every norm forward tiling from 768 to 16384 wide, 16- and 32-bit, with
    and without residual (compiled for sm_90a on 2026-12-05); CI's SASS checks hold the four
    nearest the cap (`fused.norm_fwd` variants `*_dense`)."""
    base = min_blocks_per_sm(threads)
    return base * 3 // 2 if base >= 2 else base


def min_blocks_per_sm(threads: int) -> int:
    """The CTAs per SM a row kernel is compiled for (`min_blocks_per_mp`): enough that ptxas
    caps a thread at 128 registers (64 at 1024 threads), so several CTAs, and their loads, share
    an SM; a tiling that fits its values in `value_budget` needs no more."""
    return max(1, 512 // threads)


# Shared-memory carveout the row kernels prefer, in percent of the maximum (about 64 KB of the
# SM's 256 KB): they use under 2 KB a CTA, and the rest serves as L1, which the norms' backward
# re-reads its rows from. Given explicitly, it also spares the DSL a device query at compile time.
SMEM_CARVEOUT_PERCENT = 25

# Shared memory a streaming kernel may keep of its row (`rowkit.RowStash`): 224 KiB of the 227 KiB
# a Hopper CTA can have, the rest left to the reduction slots.
MAX_STASH_BYTES = 224 * 1024


def check_stash(owner: str, chunks, tiling: RowTiling, element_bytes: int, streaming: bool) -> None:
    """ValueError unless `chunks` is a stash a kernel of this tiling can hold: a non-negative int,
    only for a streaming (one row a CTA) tile, within MAX_STASH_BYTES."""
    if not (isinstance(chunks, int) and chunks >= 0):
        raise ValueError(f"{owner}.stash_chunks must be a non-negative int, got {chunks!r}")
    if chunks and not streaming:
        raise ValueError(f"{owner}: only a streaming tile (one row a CTA, walked in chunks) stashes chunks")
    if chunks and tiling.vec * element_bytes < 4:
        raise ValueError(f"{owner}: the stash is fetched with cp.async, which copies 4, 8 or 16 bytes; vectors of "
                         f"{tiling.vec * element_bytes} bytes cannot be stashed")
    size = chunks * tiling.capacity * element_bytes
    if size > MAX_STASH_BYTES:
        raise ValueError(f"{owner}: a stash of {chunks} chunks takes {size} bytes of shared memory, more than "
                         f"{MAX_STASH_BYTES}")


def smem_carveout(stash_chunks: int) -> int:
    """The carveout a row kernel launches with: sized to the stash when it has one, else mostly L1."""
    return 100 if stash_chunks else SMEM_CARVEOUT_PERCENT


def value_budget(threads: int) -> int:
    """fp32 values a thread may keep live in registers at `threads` threads per CTA: the
    register cap of `min_blocks_per_sm` (128, or 64 at 1024 threads) less room for addresses,
    predicates and temporaries."""
    return 96 if threads <= 512 else 48


def row_tiling(width: int, vec: int, *, arrays: float = 1.0) -> RowTiling | None:
    """The tiling that holds a whole row of `width` elements in registers, or None when the row is
    too wide for one CTA. `arrays`: row-sized arrays a thread of the kernel keeps live, in units
    of fp32 registers (x alone for a forward: 1; a 16-bit x and dy for a backward: 2 x 0.5),
    bounded by `value_budget`.

    Each thread holds up to 8 vectors (rounded to a power of two, so nearby widths share one
    compiled kernel), a row gets at least 4 threads when it has that many vectors (so a warp's
    request is whole sectors), and narrow rows share a CTA of 128 threads.
    """
    if width < 1:
        raise ValueError(f"row width must be positive, got {width}")
    if width % vec:
        raise ValueError(f"row width {width} is not a multiple of the vector width {vec}")
    nvec = width // vec
    tpr = max(min(_next_pow2(nvec), 4), _next_pow2(-(-nvec // 8)))
    while True:
        tpr = min(tpr, MAX_THREADS)
        vpt = _next_pow2(-(-nvec // tpr))
        if vpt * vec * arrays <= value_budget(tpr):
            break
        if tpr == MAX_THREADS:
            return None
        tpr *= 2
    rows = max(1, _CTA_THREADS // tpr)
    return RowTiling(vec, tpr, rows, vpt).validate()


def chunked_tiling(vec: int, *, threads: int = 256, values: int = 32) -> RowTiling:
    """The tile a streaming kernel walks a wide row with: one row per CTA, `threads` threads,
    `values` elements a thread per chunk (as 16-byte vectors where `vec` allows)."""
    vpt = max(1, values // vec)
    return RowTiling(vec, threads, 1, vpt).validate()
