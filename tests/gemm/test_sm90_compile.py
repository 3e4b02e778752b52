"""What tests/runtime/test_variants.py (every registered variant compiles, its `requires`
opcodes present, no LDL/STL) does not check for the sm90 rungs: the MMA's operand types in the
SASS (fp8 builds issue QGMMA .E4M3 / .E5M2, not a 16-bit HGMMA) and that the fused epilogue
reads global memory only when its spec asks for C or a bias. Reuses the registry's compile
cache, so the builds are the ones test_variants compiles."""

import re

import pytest

pytestmark = pytest.mark.compile


def _sass(name, config):
    from cute_kernels.runtime import compile_variant

    return compile_variant(name, config, arch="sm_90a")


@pytest.mark.parametrize("config,types", [("e4m3", "E4M3.E4M3"), ("e5m2_fp32out", "E5M2.E5M2")])
def test_fp8_builds_issue_fp8_wgmma(config, types):
    report = _sass("gemm.sm90_persistent_fp8", config)
    mmas = set(re.findall(r"\b([QH]GMMA\.[\w.]+)", report.sass))
    assert mmas and all(m.startswith("QGMMA") and m.endswith("F32." + types) for m in mmas), mmas


@pytest.mark.parametrize("config,loads", [("default", False), ("epi_c_bias_n_gelu", True)])
def test_epilogue_reads_global_memory_only_when_fused(config, loads):
    report = _sass("gemm.sm90_persistent", config)
    n_ldg = report.histogram["LDG"]
    assert (n_ldg > 0) == loads, f"{config}: {n_ldg} LDG"


@pytest.mark.parametrize("variant,config,per_thread", [
    ("gemm.sm90_persistent", "pingpong_128x128_1x2_bias", 1), ("gemm.sm90_persistent", "tile_128x192_1x2_bias_gelu", 1),
    ("gemm.sm90_persistent", "skinny_swap_64x16", 1),
    ("gemm.sm90_persistent_fp8", "e4m3_rowwise", 2),  # one scale per row and one per column
])
def test_bias_and_row_scales_are_read_once_per_tile(variant, config, per_thread):
    # hopper.epilogue.StagedVector: each epilogue thread loads its share of the tile's slice of
    # each vector from global memory once per tile (`per_thread` loads), and every accumulator
    # element reads the slices from shared memory; read per element, the builds issued one
    # predicated global load per accumulator value and vector (128 in the ping-pong 128x128
    # bias build, 128 in the fp8 row-wise one)
    report = _sass(variant, config)
    assert report.histogram["LDG"] == per_thread, report.histogram["LDG"]
    assert report.histogram["LDS"] > 0
