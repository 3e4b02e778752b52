"""fragments: the register views, evaluated at trace time on coordinate tensors (static, so no
GPU is needed) and compared with the MMA atom's layouts from cute_kernels.layouts."""

from __future__ import annotations

import pytest

cutlass = pytest.importorskip("cutlass")

import cutlass.cute as cute  # noqa: E402
from cutlass.cute.nvgpu import warp  # noqa: E402

from cute_kernels.attention.fragments import accumulator_as_a, mn_view  # noqa: E402

pytestmark = pytest.mark.compile

THREADS = (0, 5, 31, 37, 100)


def views(num_warps: int, tile_m: int, tile_n: int):
    """Per thread: (mn_view rows, mn_view cols, P-as-A coords, A-partition coords)."""
    found = {}

    @cute.jit
    def trace():
        tiled_mma = cute.make_tiled_mma(warp.MmaF16BF16Op(cutlass.BFloat16, cutlass.Float32, (16, 8, 16)),
                                        (num_warps, 1, 1), permutation_mnk=(16 * num_warps, 16, 16))
        ident = cute.make_identity_tensor((tile_m, tile_n))
        for t in THREADS:
            thr = tiled_mma.get_slice(t)
            c = thr.partition_C(ident)
            v = mn_view(c)
            a_view = accumulator_as_a(c)
            a_part = thr.partition_A(ident)
            found[t] = (
                [[tuple(v[r, col]) for col in range(cute.size(v.shape[1]))] for r in range(cute.size(v.shape[0]))],
                [tuple(a_view[i]) for i in range(cute.size(a_view))],
                [tuple(a_part[i]) for i in range(cute.size(a_part))],
            )

    trace()
    return found


@pytest.mark.parametrize("num_warps, tile_m, tile_n", [(4, 64, 32), (8, 128, 64), (4, 128, 16)])
def test_mn_view_rows_and_columns(num_warps, tile_m, tile_n):
    for t, (grid, _, _) in views(num_warps, tile_m, tile_n).items():
        rows = [{rc[0] for rc in row} for row in grid]
        cols = [{grid[r][c][1] for r in range(len(grid))} for c in range(len(grid[0]))]
        assert all(len(r) == 1 for r in rows) and all(len(c) == 1 for c in cols)
        row_ids = [next(iter(r)) for r in rows]
        col_ids = [next(iter(c)) for c in cols]
        # m16n8 accumulator: rows g and g + 8 of each warp's 16-row slab, columns 2q, 2q + 1 of each n8.
        lane, warp_id = t % 32, (t // 32) % num_warps
        assert set(row_ids) == {16 * warp_id + lane // 4 + 8 * h + 16 * num_warps * i
                                for h in (0, 1) for i in range(tile_m // (16 * num_warps))}
        assert set(col_ids) == {2 * (lane % 4) + e + 8 * j for e in (0, 1) for j in range(tile_n // 8)}


@pytest.mark.parametrize("num_warps, tile_m, tile_n", [(4, 64, 32), (8, 128, 64)])
def test_accumulator_as_a_is_the_a_operand_register_order(num_warps, tile_m, tile_n):
    for t, (_, p_as_a, a_coords) in views(num_warps, tile_m, tile_n).items():
        assert p_as_a == a_coords


@pytest.mark.filterwarnings("ignore:This static loop")  # a trace-time walk over threads, not kernel code
@pytest.mark.parametrize("threads, rows, head_dim", [(128, 64, 128), (128, 64, 96), (128, 64, 80)])
def test_copy_partition_rows_are_uniform(threads, rows, head_dim):
    """`sm80_blocks.load_rows` predicates a whole (CPY, r, CPY_COLS) slice on its first element's
    row: every element of the slice must share that row, and the slices must tile the tile."""
    from cutlass.cute.nvgpu import cpasync

    from cute_kernels.attention.sm80_blocks import copy_layouts
    from cute_kernels.runtime import to_cute

    seen = []

    @cute.jit
    def trace():
        thr_l, val_l = copy_layouts(threads, head_dim)
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.BFloat16, num_bits_per_copy=128)
        tiled = cute.make_tiled_copy_tv(atom, to_cute(thr_l), to_cute(val_l))
        ident = cute.make_identity_tensor((rows, head_dim))
        for t in cutlass.range_constexpr(threads):
            part = tiled.get_slice(t).partition_S(ident)
            n_rows = cute.size(part.shape[1])
            seen.append((cute.size(part.shape[0]), n_rows, [tuple(part[0, r, 0])[0] for r in range(n_rows)],
                         [tuple(part[i]) for i in range(cute.size(part))]))

    trace()
    covered = set()
    # Column-major flat index i = v + vals * (r + n_rows * col); slice r's first element,
    # part[0, r, 0], is the one load_rows tests.
    slices = [(firsts[r], [flat[i] for i in range(len(flat)) if (i // vals) % n_rows == r])
              for vals, n_rows, firsts, flat in seen for r in range(n_rows)]
    for row, coords in slices:
        assert {c[0] for c in coords} == {row}
        covered.update(coords)
    assert covered == {(r, c) for r in range(rows) for c in range(head_dim)}
