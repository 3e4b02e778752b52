"""Our atoms and GMMA smem atoms equal the CuTe DSL's own (nvidia-cutlass-dsl), read at trace time.

Inside a ``@cute.jit`` function the DSL's MMA atoms, tiled MMAs and smem layout atoms are static,
so their shapes and strides are Python ints; we record them and compare with ours as functions
(same thread and value counts, same offset at every (thread, value)). No GPU is needed: the DSL
traces for ``CUTE_DSL_ARCH=sm_90a`` (set by tests/conftest.py).
"""

from __future__ import annotations

import pytest

from cute_kernels.layouts.atoms import atom
from cute_kernels.layouts.layout import Layout
from cute_kernels.layouts.smem_atoms import SMEM_ATOM_KINDS, gmma_smem_atom
from cute_kernels.layouts.tiled import make_tiled_mma

pytestmark = pytest.mark.compile

SM80 = {
    "SM80_16x8x8_F16F16F16F16_TN": ("f16", "f16", (16, 8, 8)),
    "SM80_16x8x8_F32BF16BF16F32_TN": ("bf16", "f32", (16, 8, 8)),
    "SM80_16x8x16_F32F16F16F32_TN": ("f16", "f32", (16, 8, 16)),
    "SM80_16x8x16_F32BF16BF16F32_TN": ("bf16", "f32", (16, 8, 16)),
}
SM89 = {"SM89_16x8x32_F32E4M3E4M3F32_TN": ("e4m3", "f32")}
SM90_N = (8, 64, 120, 256)
TILED = [("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1), None), ("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2, 1), "permuted")]


def _plain(layout) -> Layout:
    return Layout(layout.shape, layout.stride)


def same_tv(ours: Layout, theirs: Layout) -> bool:
    """Same (thread, value) -> offset function: equal after coalescing each mode, or else equal
    at every point (the slow path, only taken when the factorizations differ)."""
    from cute_kernels.layouts.coalesce import coalesce

    nt, nv = ours[0].size(), ours[1].size()
    if (nt, nv) != (theirs[0].size(), theirs[1].size()):
        return False
    if coalesce(ours, (1, 1)) == coalesce(theirs, (1, 1)):
        return True
    return all(ours(t, v) == theirs(t, v) for t in range(nt) for v in range(nv))


@pytest.fixture(scope="module")
def dsl():
    """Trace one jit function that records every DSL layout we compare against."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import OperandMajorMode, warp, warpgroup

    types = {"f16": cutlass.Float16, "bf16": cutlass.BFloat16, "f32": cutlass.Float32,
             "e4m3": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2}
    out: dict = {}

    def record(key, a):
        out[key] = {
            "thr": _plain(a.thr_id),
            "shape": tuple(a.shape_mnk),
            "A": _plain(a.tv_layout_A),
            "B": _plain(a.tv_layout_B),
            "C": _plain(a.tv_layout_C),
        }

    @cute.jit
    def trace():
        for name, (ab, acc, mnk) in SM80.items():
            record(name, cute.make_mma_atom(warp.MmaF16BF16Op(types[ab], types[acc], mnk)))
        for name, (ab, acc) in SM89.items():
            record(name, cute.make_mma_atom(warp.MmaFP8Op(types[ab], types[acc], (16, 8, 32))))
        K = OperandMajorMode.K
        for n in SM90_N:
            for src, tag in ((warpgroup.OperandSource.SMEM, "SS"), (warpgroup.OperandSource.RMEM, "RS")):
                op = warpgroup.MmaF16BF16Op(types["bf16"], types["f32"], (64, n, 16), src, K, K)
                record(f"SM90_64x{n}x16_F32BF16BF16_{tag}", cute.make_mma_atom(op))
                op8 = warpgroup.MmaF8Op(types["e4m3"], types["e4m3"], types["f32"], (64, n, 32), src, K, K)
                record(f"SM90_64x{n}x32_F32E4M3E4M3_{tag}_TN", cute.make_mma_atom(op8))
        for name, layout, perm in TILED:
            op = warp.MmaF16BF16Op(types["bf16"], types["f32"], (16, 8, 16))
            p = (32, cute.make_layout((8, 2, 2), stride=(1, 16, 8)), 16) if perm else None
            t = cute.make_tiled_mma(op, layout, permutation_mnk=p)
            out[("tiled", name, layout, perm)] = {op_: _plain(getattr(t, f"tv_layout_{op_}_tiled")) for op_ in "ABC"}
        for kind in SMEM_ATOM_KINDS:
            for dt in ("e4m3", "bf16", "f32"):
                s = warpgroup.make_smem_layout_atom(getattr(warpgroup.SmemLayoutAtomKind, kind), types[dt])
                out[("smem", kind, dt)] = (str(s.inner), s.offset, _plain(s.outer))

    trace()
    return out


@pytest.mark.parametrize("name", [*SM80, *SM89] + [f"SM90_64x{n}x16_F32BF16BF16_{s}" for n in SM90_N for s in ("SS", "RS")]
                         + [f"SM90_64x{n}x32_F32E4M3E4M3_{s}_TN" for n in SM90_N for s in ("SS", "RS")])
def test_mma_atom_equals_dsl(dsl, name):
    ours, theirs = atom(name), dsl[name]
    assert ours.shape_mnk == theirs["shape"]
    assert ours.thr_id == theirs["thr"]
    for op in "ABC":
        assert same_tv(ours.layouts[op], theirs[op]), (op, ours.layouts[op], theirs[op])


@pytest.mark.parametrize("name,layout,perm", TILED)
def test_tiled_mma_equals_dsl(dsl, name, layout, perm):
    p = (32, Layout((8, 2, 2), (1, 16, 8)), 16) if perm else (None, None, None)
    ours = make_tiled_mma(name, layout, p)
    theirs = dsl[("tiled", name, layout, perm)]
    for op in "ABC":
        assert same_tv(ours.tv_layout(op), theirs[op]), (op, ours.tv_layout(op), theirs[op])


@pytest.mark.parametrize("kind", SMEM_ATOM_KINDS)
@pytest.mark.parametrize("dt", ["e4m3", "bf16", "f32"])
def test_smem_atom_equals_dsl(dsl, kind, dt):
    ours = gmma_smem_atom(kind, dt)
    sw, offset, outer = dsl[("smem", kind, dt)]
    o = ours.layout.outer
    assert sw == f"S<{o.bits},{o.base},{o.shift}>"
    assert offset == ours.layout.offset
    assert outer == ours.layout.inner
