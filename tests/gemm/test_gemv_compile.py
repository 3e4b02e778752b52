"""`gemm.gemv` compiles for sm_90a without a GPU: every registered variant (both majors of B, vector
widths of 16, 8, 4 and 2 bytes, the small side up to 8 and up to 16, a strided A, the fused
epilogue, a cluster split, the swapped role) issues HMMA, loads B with the vector width its
read plan promises, and keeps everything in registers (no local memory)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.compile


def _ldg_bits(report) -> set[int]:
    """Vector widths (bits) of the global loads in the SASS: LDG.E.128 -> 128, .64 -> 64, .U16 ->
    16, plain LDG.E -> 32 (cache-hint modifiers such as .NA, .EL, .LTC256B are ignored)."""
    widths = set()
    for op in report.opcodes:
        if not op.startswith("LDG"):
            continue
        parts = op.split(".")
        if "128" in parts:
            widths.add(128)
        elif "64" in parts:
            widths.add(64)
        elif "U16" in parts or "S16" in parts:
            widths.add(16)
        elif "U8" in parts or "S8" in parts:
            widths.add(8)
        else:
            widths.add(32)
    return widths


@pytest.mark.parametrize("variant", [
    "k16_s16", "k16_s8_prefetch", "k8", "k4_chunks2", "k2_s8", "r16", "r8_strided_a", "r4", "r2_strided_a",
    "epilogue_fp32", "cluster4_swapped_fp16",
])
def test_variant_sass(variant, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from cute_kernels.gemm.gemv import VARIANT_B_BITS
    from cute_kernels.runtime import check_variant, compile_variant, get_variant

    report = compile_variant("gemm.gemv", variant, arch="sm_90a")
    assert check_variant(report, get_variant("gemm.gemv")) == []
    assert report.has("HMMA"), report.summary()
    assert report.spill_store_bytes == 0 and report.spill_load_bytes == 0 and report.local_memory == 0
    assert VARIANT_B_BITS[variant] in _ldg_bits(report), (variant, sorted(_ldg_bits(report)), report.summary())
    # at most 168 registers: 12 warps per SM at least (a streaming kernel lives on resident warps)
    assert report.registers <= 168, report.summary()
    cfg = get_variant("gemm.gemv").config(variant)
    if cfg.get("cluster_k", 1) > 1:  # the cluster reduction: barriers and remote shared-memory loads
        assert report.has("UCGABAR_ARV") and report.has("UCGABAR_WAIT"), report.summary()
    if cfg.get("big_major") == "r":  # pairs of k interleaved into the fragments
        assert report.has("PRMT"), report.summary()


def test_dsl_mma_atom_matches_the_layouts_the_mapping_uses(monkeypatch):
    """The kernel's MMA (the DSL's MmaF16BF16Op m16n8k16) has the TV layouts of the atom the CPU
    simulation (tests/gemm/test_gemv_layouts.py) evaluates the mapping with."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warp

    from cute_kernels.layouts.atoms import atom

    for dsl_type, name in ((cutlass.BFloat16, "SM80_16x8x16_F32BF16BF16F32_TN"),
                           (cutlass.Float16, "SM80_16x8x16_F32F16F16F32_TN")):
        seen = {}

        @cute.jit
        def probe():
            mma = cute.make_mma_atom(warp.MmaF16BF16Op(dsl_type, cutlass.Float32, (16, 8, 16)))
            seen.update(a=str(mma.tv_layout_A), b=str(mma.tv_layout_B), c=str(mma.tv_layout_C))

        cute.compile(probe)
        ours = atom(name)
        assert seen == {"a": str(ours.a_layout), "b": str(ours.b_layout), "c": str(ours.c_layout)}
