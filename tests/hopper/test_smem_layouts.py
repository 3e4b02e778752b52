"""GMMA smem atom choice (pure layouts; no DSL needed)."""

import pytest

from cute_kernels.hopper.smem_layouts import gmma_atom


@pytest.mark.parametrize(
    "major,dtype,extent,kind,shape",
    [
        ("K", "bf16", 64, "K_SW128", (8, 64)),
        ("K", "f16", 32, "K_SW64", (8, 32)),
        ("K", "e4m3", 128, "K_SW128", (8, 128)),
        ("MN", "bf16", 128, "MN_SW128", (64, 8)),
        ("MN", "f32", 32, "MN_SW128", (32, 8)),
        ("K", "bf16", 8, "K_INTER", (8, 8)),
    ],
)
def test_widest_swizzle_that_fits(major, dtype, extent, kind, shape):
    atom = gmma_atom(major, dtype, extent)
    assert atom.kind == kind
    assert tuple(atom.shape) == shape


def test_128b_atom_is_swizzle_343_on_bytes():
    atom = gmma_atom("K", "bf16", 64)
    assert "3,4,3" in str(atom.layout).replace(" ", "")
    assert atom.swizzle_bytes == 128


def test_rejects_unaligned_major_extent():
    with pytest.raises(ValueError, match="16 bytes"):
        gmma_atom("K", "bf16", 4)
    with pytest.raises(ValueError, match="major"):
        gmma_atom("M", "bf16", 64)
