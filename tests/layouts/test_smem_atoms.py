"""GMMA shared-memory layout atoms: CuTe's shapes, and byte-swizzle == element-swizzle."""

from __future__ import annotations

import pytest

from cute_kernels.layouts.errors import LayoutError
from cute_kernels.layouts.smem_atoms import SMEM_ATOM_KINDS, gmma_smem_atom, smem_atom


@pytest.mark.parametrize("kind", SMEM_ATOM_KINDS)
@pytest.mark.parametrize("dtype,nbytes", [("e4m3", 1), ("bf16", 2), ("f32", 4)])
def test_atom_shapes_and_units(kind, dtype, nbytes):
    a = gmma_smem_atom(kind, dtype)
    w = a.swizzle_bytes // nbytes
    assert a.layout.inner.shape == ((8, w) if kind.startswith("K") else (w, 8))
    assert str(a.layout.outer) == f"Sw<{a.swizzle_bits},4,3>"
    assert a.layout.size() == 8 * w
    for i in range(a.layout.size()):
        byte = a.layout.outer(a.layout.inner(i) * nbytes)
        assert byte % nbytes == 0 and byte // nbytes == a.element_layout(i)
    # a bijection onto the atom's span: swizzles permute within each 128-byte row group
    assert sorted(a.element_layout(i) for i in range(a.layout.size())) == list(range(a.layout.size()))


def test_sw128_row_chunks_rotate():
    a = gmma_smem_atom("K_SW128", "bf16")
    # row r, 16-byte chunk c lands in chunk c ^ r (the 128-byte swizzle)
    for r in range(8):
        for c in range(8):
            assert a.element_layout(r, 8 * c) == 64 * r + 8 * (c ^ r)


def test_lookup_by_name():
    assert smem_atom("GMMA::Layout_MN_SW64_Atom<half>").name == "GMMA::Layout_MN_SW64_Atom<f16>"
    with pytest.raises(LayoutError):
        smem_atom("Layout_K_SW256_Atom<bf16>")
    with pytest.raises(LayoutError, match="8-, 16- or 32-bit"):
        gmma_smem_atom("K_SW128", "f64")
