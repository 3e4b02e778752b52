"""Building blocks the sm80 attention kernels share (forward and backward).

- `assume_aligned_rows`: a (..., D) tensor whose non-unit strides are multiples of 8 elements,
  said so to the compiler (which then emits 128-bit accesses).
- `smem_tile_layout`: the swizzled shared-memory layout of a (rows, D) tile, from
  `cute_kernels.layouts` (`Swizzle(B, 3, 3)` over 16-byte chunks, conflict-free for both the
  row-wise cp.async writes and the ldmatrix reads), and `transposed` views of it.
- `load_rows`: cp.async of a tile's rows below a bound, zero-filling the rest.
- `smem_operand`: an MMA operand in shared memory with its ldmatrix copy and register fragment.
- `gemm_ss` / `gemm_rs`: acc += A B^T over the k steps of a tiled mma.sync, operands loaded
  with ldmatrix one k step ahead; A from shared memory (ss) or already in registers (rs).
- `store_tile`: an fp32 accumulator tile converted, staged through shared memory and written
  with 128-bit stores, rows past a bound predicated off.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp

from cute_kernels.layouts import Layout, composition, tile_to_shape

__all__ = ["smem_atom_width", "smem_tile_layout", "transposed", "copy_layouts", "assume_aligned_rows",
           "load_rows", "smem_operand", "gemm_ss", "gemm_rs", "store_tile"]


def smem_atom_width(head_dim: int) -> int:
    """Elements per swizzle row: the widest of 64/32/16 (128/64/32 bytes) dividing head_dim."""
    for w in (64, 32, 16):
        if head_dim % w == 0:
            return w
    raise ValueError(f"head dim {head_dim} is not a multiple of 16")


def smem_tile_layout(rows: int, head_dim: int):
    """(rows, head_dim) 16-bit elements: the K-major swizzled atom tiled row-major (a
    `cute_kernels.layouts.ComposedLayout` on element offsets)."""
    from cute_kernels.layouts.smem_atoms import gmma_smem_atom

    kind = {64: "K_SW128", 32: "K_SW64", 16: "K_SW32"}[smem_atom_width(head_dim)]
    # The element-offset form: a DSL smem tensor of 16-bit elements indexes elements.
    return tile_to_shape(gmma_smem_atom(kind, "bf16").element_layout, (rows, head_dim))


def transposed(layout, rows: int, cols: int):
    """The (cols, rows) view of a (rows, cols) layout: element (c, r) is element (r, c)."""
    return composition(layout, Layout((cols, rows), (rows, 1)))


def copy_layouts(threads: int, head_dim: int) -> tuple[Layout, Layout]:
    """(thread layout, value layout) of a gmem <-> smem pass: thread -> (row, 16-byte chunk),
    each thread moving 1 x 8 elements (one 128-bit access) per chunk."""
    chunks = smem_atom_width(head_dim) // 8
    return Layout((threads // chunks, chunks), (chunks, 1)), Layout((1, 8), (8, 1))


def assume_aligned_rows(t: cute.Tensor) -> cute.Tensor:
    """`t` with every stride but the last asserted a multiple of 8 elements (host-checked)."""
    stride = tuple(cute.assume(s, divby=8) for s in t.stride[:-1]) + (t.stride[-1],)
    return cute.make_tensor(t.iterator, cute.make_layout(t.shape, stride=stride))


@cute.jit
def load_rows(gmem_load: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor, coord: cute.Tensor,
              rows_left: cutlass.Int32):
    """cp.async the tile rows below `rows_left`; zero the rest (0 times a garbage row could be
    NaN). src/dst/coord: this thread's (CPY, CPY_ROWS, CPY_COLS) partitions of the gmem tile,
    the smem tile and the tile's identity tensor."""
    for r in cutlass.range_constexpr(cute.size(dst.shape[1])):
        if coord[0, r, 0][0] < rows_left:
            cute.copy(gmem_load, src[None, r, None], dst[None, r, None])
        else:
            dst[None, r, None].fill(0)


def smem_operand(tiled_mma: cute.TiledMma, smem: cute.Tensor, operand: str, dtype, tidx, *, transpose: bool):
    """(tiled ldmatrix copy, this thread's smem partition, register view, register fragment) for
    operand "A" ((M, K) tile) or "B" ((N, K) tile) of `tiled_mma` held in `smem`.

    ldmatrix reads 8x8 matrices whose rows are contiguous in K; a tile contiguous in M or N
    (a `transposed` view of a row-major buffer) needs `transpose=True` (`ldmatrix.trans`).
    """
    thr_mma = tiled_mma.get_slice(tidx)
    if operand == "A":
        regs = thr_mma.make_fragment_A(thr_mma.partition_A(smem))
    elif operand == "B":
        regs = thr_mma.make_fragment_B(thr_mma.partition_B(smem))
    else:
        raise ValueError(f"operand must be 'A' or 'B', got {operand!r}")
    atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=transpose, num_matrices=4), dtype)
    tiled = cute.make_tiled_copy_A(atom, tiled_mma) if operand == "A" else cute.make_tiled_copy_B(atom, tiled_mma)
    thr = tiled.get_slice(tidx)
    return tiled, thr.partition_S(smem), thr.retile(regs), regs


@cute.jit
def gemm_ss(tiled_mma: cute.TiledMma, acc: cute.Tensor, a, b, prefetch: cutlass.Constexpr = True):
    """acc += A B^T with both operands in shared memory. a, b: (tiled ldmatrix copy, smem
    partition, register view, register fragment) of each operand. prefetch: load k step k + 1
    under the MMAs of step k (else each step's operands just before its MMAs, as `gemm_rs`)."""
    copy_a, a_smem, a_view, a_regs = a
    copy_b, b_smem, b_view, b_regs = b
    steps = cute.size(a_smem.shape[2])
    cute.copy(copy_a, a_smem[None, None, 0], a_view[None, None, 0])
    cute.copy(copy_b, b_smem[None, None, 0], b_view[None, None, 0])
    for k in cutlass.range_constexpr(steps):
        if cutlass.const_expr(k + 1 < steps and prefetch):
            cute.copy(copy_a, a_smem[None, None, k + 1], a_view[None, None, k + 1])
            cute.copy(copy_b, b_smem[None, None, k + 1], b_view[None, None, k + 1])
        if cutlass.const_expr(k > 0 and not prefetch):
            cute.copy(copy_a, a_smem[None, None, k], a_view[None, None, k])
            cute.copy(copy_b, b_smem[None, None, k], b_view[None, None, k])
        cute.gemm(tiled_mma, acc, a_regs[None, None, k], b_regs[None, None, k], acc)


@cute.jit
def gemm_rs(tiled_mma: cute.TiledMma, acc: cute.Tensor, a_regs: cute.Tensor, b,
            prefetch: cutlass.Constexpr = True):
    """acc += A B^T with A already in registers (an A-shaped fragment) and B in shared memory.
    prefetch=False loads each k step's B just before its MMAs: half the live B registers (for a
    wide N, whose B fragment per k step is large), less latency hidden."""
    copy_b, b_smem, b_view, b_regs = b
    steps = cute.size(a_regs.shape[2])
    cute.copy(copy_b, b_smem[None, None, 0], b_view[None, None, 0])
    for k in cutlass.range_constexpr(steps):
        if cutlass.const_expr(k + 1 < steps and prefetch):
            cute.copy(copy_b, b_smem[None, None, k + 1], b_view[None, None, k + 1])
        if cutlass.const_expr(k > 0 and not prefetch):
            cute.copy(copy_b, b_smem[None, None, k], b_view[None, None, k])
        cute.gemm(tiled_mma, acc, a_regs[None, None, k], b_regs[None, None, k], acc)


@cute.jit
def store_tile(acc: cute.Tensor, dtype: cutlass.Constexpr, staging: cute.Tensor, gmem_store: cute.TiledCopy,
               tiled_mma: cute.TiledMma, g_tile: cute.Tensor, tile_shape: cutlass.Constexpr,
               rows_left: cutlass.Int32, tidx: cutlass.Int32):
    """acc (an fp32 C fragment of the `tile_shape` = (rows, D) tile) -> `dtype` -> `staging` (smem, free for
    the caller to overwrite) -> 128-bit stores into g_tile (the (rows, D) gmem tile) of the rows
    below rows_left. Synchronizes the CTA before and after the staging write."""
    r_acc = cute.make_fragment_like(acc, dtype)
    r_acc.store(acc.load().to(dtype))
    # Outstanding cp.async into the staging buffer must land, and every warp be done reading it.
    cute.arch.cp_async_wait_group(0)
    cute.arch.barrier()
    r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype), tiled_mma)
    thr_r2s = r2s.get_slice(tidx)
    cute.copy(r2s, thr_r2s.retile(r_acc), thr_r2s.partition_D(staging))
    cute.arch.barrier()
    thr_store = gmem_store.get_slice(tidx)
    t_s, t_g = thr_store.partition_S(staging), thr_store.partition_D(g_tile)
    t_c = thr_store.partition_D(cute.make_identity_tensor(tile_shape))
    t_r = cute.make_fragment_like(t_g, dtype)
    cute.copy(gmem_store, t_s, t_r)
    for r in cutlass.range_constexpr(cute.size(t_g.shape[1])):
        if t_c[0, r, 0][0] < rows_left:
            cute.copy(gmem_store, t_r[None, r, None], t_g[None, r, None])
