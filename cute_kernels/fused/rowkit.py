"""DSL building blocks the row kernels share: a thread's view of its row, predicated vector
copies, and row reductions (butterfly shuffles within a warp, shared memory across warps).

`RowSlice` is built inside a kernel from the tiling (`tiling.RowTiling`) and the thread and block
indices. It gives each thread its `(vec, vecs_per_thread)` view of any (rows, width) tensor, by
composing the tensor's (rows_per_cta, capacity) tile with the tiling's TV layout (converted from
`cute_kernels.layouts` by `to_cute`), plus the row and column numbers the predicates need.
Vectors lie wholly inside or outside the row (widths are multiples of `vec`), so one predicate
per vector suffices, and a row past the last is skipped entirely.

`RowStash` keeps a streaming kernel's leading chunks of its row in shared memory (fetched with
cp.async before the first pass), so its second pass does not read them from global memory again.

`RowReducer` combines one fp32 value per thread over the threads of each row: a butterfly over
the row's lanes, then, for rows of several warps, a pass through shared memory: every warp's
lane 0 stores its partial, one barrier, lane i of each of the row's warps reads warp i's partial
and a second butterfly folds them, so every thread holds the result (no broadcast needed). Each reduction of a kernel uses its own
shared-memory slot; kernels that loop over rows alternate two slots per reduction by iteration
parity, which one barrier per reduction makes safe (a slot is written again only after every
thread has passed the next reduction's barrier, hence finished reading it).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import cpasync

from cute_kernels.runtime import to_cute

from .tiling import RowTiling, row_tv_layout

__all__ = ["RowSlice", "RowReducer", "RowStash", "copy_vector", "reduction_slots_layout", "stash_layout",
           "broadcast_rows"]


def reduction_slots_layout(tiling: RowTiling, slots: int):
    """(rows_per_cta, warps_per_row, slots) fp32 partials, as a cute_kernels Layout."""
    from cute_kernels.layouts import Layout

    r, w = tiling.rows_per_cta, tiling.warps_per_row
    return Layout((r, w, slots), (w, 1, r * w))


def stash_layout(tiling: RowTiling, chunks: int):
    """(vec, vecs_per_thread, threads, chunks) elements of a streaming kernel's shared-memory stash,
    as a cute_kernels Layout: thread i's vector j of chunk c is `vec` contiguous elements, and the
    threads' vectors j lie side by side (a warp's 16-byte accesses cover 512 consecutive bytes:
    no bank conflicts)."""
    from cute_kernels.layouts import Layout

    v, vpt, n = tiling.vec, tiling.vecs_per_thread, tiling.threads
    return Layout((v, vpt, n, chunks), (1, v * n, v, v * n * vpt))


@cute.jit
def copy_vector(src: cute.Tensor, dst: cute.Tensor, elements: cutlass.Constexpr[int]):
    """Copy `elements` contiguous elements in accesses of at most 16 bytes (one LDG.E.128 /
    STG.E.128 each for 16 bytes); the element type is the source's (the destination's must match)."""
    bits = src.element_type.width
    piece = min(elements, 128 // bits)
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), src.element_type, num_bits_per_copy=piece * bits)
    if const_expr(piece == elements):
        cute.copy(atom, src, dst)
    else:
        for p in cutlass.range_constexpr(elements // piece):
            cute.copy(atom, cute.local_tile(src, (piece,), (p,)), cute.local_tile(dst, (piece,), (p,)))


@cute.jit
def broadcast_rows(mT: cute.Tensor, rows) -> cute.Tensor:
    """A (rows, N) view of a 1-D (N,) tensor with row stride 0 (a weight every row shares)."""
    return cute.make_tensor(mT.iterator, cute.make_layout((rows, mT.shape[0]), stride=(0, 1)))


class RowSlice:
    """This thread's part of row block `block` (rows block*rows_per_cta ...) and column chunk
    `chunk` (columns chunk*capacity ...); see the module docstring. Trace-time object."""

    def __init__(self, tiling: RowTiling, tidx, block, num_rows, width, chunk=0):
        self.tiling = tiling
        self.tv = to_cute(row_tv_layout(tiling))
        tpr = tiling.threads_per_row
        # With one row a CTA, the row index is the static 0 (a dynamic tidx // tpr would cost the
        # compiler its proof that every vector is aligned).
        single = tiling.rows_per_cta == 1
        self.lane = tidx if single else tidx % tpr
        self.row_in_cta = 0 if single else tidx // tpr
        self.block = block
        self.chunk = chunk
        self.tidx = tidx
        self.row = block * tiling.rows_per_cta + self.row_in_cta
        self.num_rows = num_rows
        self.width = width
        self.row_ok = self.row < num_rows

    def col(self, j: int):
        """First column of this thread's vector j (in the whole row)."""
        t = self.tiling
        return self.chunk * t.capacity + (j * t.threads_per_row + self.lane) * t.vec

    def view(self, mT: cute.Tensor) -> cute.Tensor:
        """(vec, vecs_per_thread) view of a (rows, width) tensor for this thread."""
        g = cute.local_tile(mT, self.tiling.tile_shape, (self.block, self.chunk))
        return cute.flatten(cute.composition(g, self.tv)[((self.lane, self.row_in_cta), None)])

    def fragment(self, dtype) -> cute.Tensor:
        """A register tensor of this thread's (vec, vecs_per_thread) values."""
        return cute.make_rmem_tensor((self.tiling.vec, self.tiling.vecs_per_thread), dtype)

    @cute.jit
    def load(self, src: cute.Tensor, dst: cute.Tensor, fill: cutlass.Constexpr = 0.0):
        """dst <- src for the vectors inside the tensor; the others are set to `fill`."""
        t = self.tiling
        # Fill first, then copy under the predicate (no else branch: a predicated load into
        # registers that already hold the fill, rather than a select between two values).
        dst.fill(fill)
        for j in cutlass.range_constexpr(t.vecs_per_thread):
            if self.row_ok and self.col(j) < self.width:
                copy_vector(src[(None, j)], dst[(None, j)], t.vec)

    @cute.jit
    def store(self, src: cute.Tensor, dst: cute.Tensor):
        """dst <- src for the vectors inside the tensor."""
        t = self.tiling
        for j in cutlass.range_constexpr(t.vecs_per_thread):
            if self.row_ok and self.col(j) < self.width:
                copy_vector(src[(None, j)], dst[(None, j)], t.vec)

    @cute.jit
    def load_shared(self, src: cute.Tensor, dst: cute.Tensor, fill: cutlass.Constexpr = 0.0):
        """As `load`, for a tensor every row shares (a weight: only the column predicate)."""
        t = self.tiling
        dst.fill(fill)
        for j in cutlass.range_constexpr(t.vecs_per_thread):
            if self.col(j) < self.width:
                copy_vector(src[(None, j)], dst[(None, j)], t.vec)

    @cute.jit
    def mask(self, j: cutlass.Constexpr[int]) -> Float32:
        """1.0 for a vector inside the row's width, 0.0 past it."""
        m = Float32(0.0)
        if self.col(j) < self.width:
            m = Float32(1.0)
        return m


class RowStash:
    """The first `chunks` chunks of a streaming kernel's row, fetched into shared memory with
    asynchronous copies (cp.async) before the first pass, so the first pass keeps the whole stash
    in flight at once (not one chunk a thread at a time) and the second pass reads the stashed
    chunks from shared memory, not from global memory again. Each thread reads back only what it
    copied: no barrier. `smem`: the tensor of `stash_layout(tiling, chunks)` in the row's dtype
    (None with `chunks` 0: then `load` is `RowSlice.load` and `fetch` does nothing). Vectors of at
    least 4 bytes (what cp.async copies). Trace-time object."""

    def __init__(self, tiling: RowTiling, smem, chunks: int, tidx):
        self.tiling, self.smem, self.chunks, self.tidx = tiling, smem, chunks, tidx

    @cute.jit
    def fetch(self, mT: cute.Tensor, block, num_rows, width):
        """Start the copies of this thread's vectors of the stashed chunks of row block `block`
        of mT (those inside the tensor), and wait for them."""
        t = self.tiling
        if const_expr(self.chunks):
            bits = mT.element_type.width * t.vec
            # cp.async.cg (L2 only) copies 16 bytes; 4- and 8-byte vectors need cp.async.ca
            mode = cpasync.LoadCacheMode.GLOBAL if const_expr(bits == 128) else cpasync.LoadCacheMode.ALWAYS
            atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=mode), mT.element_type, num_bits_per_copy=bits)
            for c in cutlass.range_constexpr(self.chunks):
                rs = RowSlice(t, self.tidx, block, num_rows, width, c)
                src = rs.view(mT)
                mine = self.smem[(None, None, self.tidx, c)]
                for j in cutlass.range_constexpr(t.vecs_per_thread):
                    if rs.row_ok and rs.col(j) < width:
                        cute.copy(atom, src[(None, j)], mine[(None, j)])
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)

    @cute.jit
    def load(self, rs: "RowSlice", src: cute.Tensor, frag: cute.Tensor, chunk, fill: cutlass.Constexpr = 0.0):
        """frag <- chunk `chunk` of the row, as `RowSlice.load` reads it (vectors outside the
        tensor set to `fill`): from the stash when it holds the chunk, else from `src` (this
        thread's view of the chunk in global memory)."""
        t = self.tiling
        if const_expr(not self.chunks):
            rs.load(src, frag, fill=fill)
        else:
            mine = self.smem[(None, None, self.tidx, chunk)]  # an address only, past the stash too
            frag.fill(fill)
            # Conditions only on DSL values in each branch (a dynamic branch may not carry the
            # trace-time RowSlice).
            for j in cutlass.range_constexpr(t.vecs_per_thread):
                inside = rs.row_ok and rs.col(j) < rs.width
                if chunk < self.chunks and inside:
                    copy_vector(mine[(None, j)], frag[(None, j)], t.vec)
                if chunk >= self.chunks and inside:
                    copy_vector(src[(None, j)], frag[(None, j)], t.vec)


class RowReducer:
    """fp32 all-reduce over the threads of each row (module docstring). `smem` is the
    (rows_per_cta, warps_per_row, slots) fp32 tensor of `reduction_slots_layout`, or None when a
    row fits in one warp."""

    def __init__(self, tiling: RowTiling, smem):
        self.tiling = tiling
        self.smem = smem
        lanes = tiling.lanes_per_row
        self.offsets = tuple(lanes >> k for k in range(1, lanes.bit_length()))

    @cute.jit
    def _lanes(self, val: Float32, is_max: cutlass.Constexpr[bool]) -> Float32:
        for i in cutlass.range_constexpr(len(self.offsets)):
            other = cute.arch.shuffle_sync_bfly(val, offset=self.offsets[i])
            if const_expr(is_max):
                val = cute.arch.fmax(val, other)
            else:
                val = val + other
        return val

    @cute.jit
    def _warps(self, val: Float32, slot, tidx, is_max: cutlass.Constexpr[bool]) -> Float32:
        """Combine the row's warps: lane 0 of each stores its partial, then lane i of every warp
        of the row reads warp i's partial and a full-warp butterfly folds them (one value a
        thread, whatever the number of warps)."""
        t = self.tiling
        if const_expr(t.warps_per_row > 1):
            smem = self.smem
            warp = tidx // 32
            lane = tidx % 32
            row = warp // t.warps_per_row
            if lane == 0:
                smem[row, warp % t.warps_per_row, slot] = val
            cute.arch.barrier()
            val = Float32(-Float32.inf) if const_expr(is_max) else Float32(0.0)
            if lane < t.warps_per_row:
                val = smem[row, lane, slot]
            for i in cutlass.range_constexpr(5):
                other = cute.arch.shuffle_sync_bfly(val, offset=16 >> i)
                if const_expr(is_max):
                    val = cute.arch.fmax(val, other)
                else:
                    val = val + other
        return val

    @cute.jit
    def sum(self, val: Float32, tidx, slot=0) -> Float32:
        return self._warps(self._lanes(val, False), slot, tidx, False)

    @cute.jit
    def max(self, val: Float32, tidx, slot=0) -> Float32:
        return self._warps(self._lanes(val, True), slot, tidx, True)

    @cute.jit
    def sum2(self, a: Float32, b: Float32, tidx, slot=0):
        """Two sums through one barrier (slots `slot` and `slot + 1`)."""
        a = self._lanes(a, False)
        b = self._lanes(b, False)
        t = self.tiling
        if const_expr(t.warps_per_row > 1):
            smem = self.smem
            warp = tidx // 32
            lane = tidx % 32
            row = warp // t.warps_per_row
            if lane == 0:
                smem[row, warp % t.warps_per_row, slot] = a
                smem[row, warp % t.warps_per_row, slot + 1] = b
            cute.arch.barrier()
            a = Float32(0.0)
            b = Float32(0.0)
            if lane < t.warps_per_row:
                a = smem[row, lane, slot]
                b = smem[row, lane, slot + 1]
            for i in cutlass.range_constexpr(5):
                a = a + cute.arch.shuffle_sync_bfly(a, offset=16 >> i)
                b = b + cute.arch.shuffle_sync_bfly(b, offset=16 >> i)
        return a, b
