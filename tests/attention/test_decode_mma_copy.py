"""decode_mma's multi-page K/V blocks, evaluated at trace time on identity tensors (static, no
GPU): a page's copy partition drops into the block's partition row for row, which is what
`PagedDecodeMma.load_kv` relies on."""

from __future__ import annotations

import pytest

cutlass = pytest.importorskip("cutlass")

import cutlass.cute as cute  # noqa: E402

from cute_kernels.runtime import to_cute  # noqa: E402

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("head_dim, page_size", [(64, 16), (80, 16)])
def test_page_partition_rows_map_into_the_block_partition(head_dim, page_size):
    from cute_kernels.attention.decode_mma import DecodeMmaConfig, PagedDecodeMma

    config = DecodeMmaConfig(head_dim=head_dim, page_size=page_size, heads_per_cta=4)
    lay = PagedDecodeMma(config).layouts
    bn, pages = config.block_n, config.pages_per_block
    assert pages > 1 or bn <= page_size
    found = []

    @cute.jit
    def trace():
        # The partition is the TV layouts' (the kernel's atom is cp.async; any 128-bit atom tiles alike).
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.BFloat16, num_bits_per_copy=128)
        copy = cute.make_tiled_copy_tv(atom, to_cute(lay.copy_thread_layout), to_cute(lay.copy_value_layout))
        for t in cutlass.range_constexpr(32):
            thr = copy.get_slice(t)
            block = thr.partition_S(cute.make_identity_tensor((bn, head_dim)))
            page = thr.partition_S(cute.make_identity_tensor((page_size, head_dim)))
            rows = int(cute.size(page.shape[1]))
            for p in cutlass.range_constexpr(pages):
                for j in cutlass.range_constexpr(rows):
                    for col in cutlass.range_constexpr(int(cute.size(page.shape[2]))):
                        for v in cutlass.range_constexpr(int(cute.size(page.shape[0]))):
                            pr, pc = (int(x) for x in page[v, j, col])
                            br, bc = (int(x) for x in block[v, p * rows + j, col])
                            found.append((br, bc, p * page_size + pr, pc))

    trace()
    assert found and all(br == want_r and bc == pc for br, bc, want_r, pc in found)
    # Every element of the block is covered exactly once.
    assert len({(br, bc) for br, bc, _, _ in found}) == bn * head_dim == len(found)
