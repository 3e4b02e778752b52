"""sm80_flash without a GPU: its layouts (pure Python) and one compiled variant's SASS."""

from __future__ import annotations

import pytest

from cute_kernels.layouts import Layout, composition
from cute_kernels.layouts.analysis import bank_conflicts


def test_configs_validate_and_tile_each_head_dim():
    pytest.importorskip("cutlass")
    from cute_kernels.attention.sm80_flash import FlashSm80Config, config_for

    for d in range(16, 257, 16):
        c = config_for(d, "bfloat16", True, local=d % 32 == 0)
        assert c.smem_bytes <= 227 * 1024 and c.block_m % (16 * c.num_warps) == 0
        assert c.local == (d % 32 == 0)
    with pytest.raises(ValueError, match="multiple of 16"):
        FlashSm80Config(head_dim=72).validate()
    with pytest.raises(ValueError, match=r"block_m = 48 must be a multiple of 16 \* num_warps = 64"):
        FlashSm80Config(block_m=48, num_warps=4).validate()
    with pytest.raises(ValueError, match="dtype"):
        FlashSm80Config(dtype="float32").validate()
    with pytest.raises(ValueError, match="local must be a bool"):
        FlashSm80Config(local=1).validate()


def test_backward_configs_cover_every_head_dim_they_claim():
    """bwd_config_for serves every multiple of 16 up to 128 and of 32 up to 256 (what
    `supports_backward` admits); above 128 a second group of warps splits the head dim."""
    pytest.importorskip("cutlass")
    from cute_kernels.attention.api import AttentionProblem
    from cute_kernels.attention.sm80_flash_bwd import FlashSm80BwdConfig, bwd_config_for
    from cute_kernels.attention.sm80_flash_bwd_launch import supports_backward

    import torch

    for d in range(16, 257, 16):
        problem = AttentionProblem(1, 1, 1, 8, 8, d, d, torch.bfloat16, None, 0.1, 4, None)
        why = supports_backward(problem)
        assert (why is None) == (d <= 128 or d % 32 == 0), (d, why)
        if why is None:
            c = bwd_config_for(d, "bfloat16", False, True)
            assert c.local and c.col_warps == (1 if d <= 128 else 2) and c.threads == 128 * c.col_warps
    with pytest.raises(ValueError, match="multiple of 16 \\* col_warps = 32"):
        FlashSm80BwdConfig(head_dim=144, col_warps=2).validate()
    with pytest.raises(ValueError, match="col_warps must be 1 or 2"):
        FlashSm80BwdConfig(col_warps=4).validate()


@pytest.mark.parametrize("d", [64, 96, 128])
def test_smem_layouts_are_bijections_and_vt_is_the_transpose(d):
    pytest.importorskip("cutlass")
    from cute_kernels.attention.sm80_flash import FlashSm80Layouts, config_for

    lay = FlashSm80Layouts(config_for(d, "bfloat16", False))
    c = lay.config
    kv, vt = lay.smem_kv_layout, lay.smem_vt_layout
    offsets = {kv(r + c.block_n * col) for r in range(c.block_n) for col in range(d)}
    assert offsets == set(range(c.block_n * d))
    for r in range(0, c.block_n, 7):
        for col in range(0, d, 5):
            assert vt(col + d * r) == kv(r + c.block_n * col)
    # Every 8-element chunk a thread copies stays contiguous after the swizzle (one 128-bit access).
    for r in range(c.block_n):
        for chunk in range(0, d, 8):
            base = kv(r + c.block_n * chunk)
            assert base % 8 == 0
            assert [kv(r + c.block_n * (chunk + e)) for e in range(8)] == list(range(base, base + 8))
    assert lay.copy_thread_layout.size() == c.threads
    assert lay.copy_value_layout == Layout((1, 8), (8, 1))


@pytest.mark.parametrize("d", [48, 64, 80, 96, 128, 256])
def test_smem_traffic_is_bank_conflict_free(d):
    """The cp.async row writes (the kernels' copy tiling), the ldmatrix reads of Q/K and the
    ldmatrix.trans reads of V^T all run at the ideal wavefront count on the swizzled tiles."""
    pytest.importorskip("cutlass")
    from cute_kernels.attention.sm80_blocks import copy_layouts, smem_tile_layout, transposed
    from cute_kernels.layouts.tiled import make_tiled_copy

    rows = 64
    tile = smem_tile_layout(rows, d)
    thr, val = copy_layouts(128, d)
    copy = make_tiled_copy("SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>", thr, val)
    # One copy pass covers (thr rows, thr cols * 8); later passes shift by whole swizzle periods.
    pass_shape = (thr.shape[0], thr.shape[1] * 8)
    first_pass = composition(tile, Layout(pass_shape, (1, rows)))
    for layout, access in ((first_pass, copy), (tile, "ldmatrix_x4"), (transposed(tile, rows, d), "ldmatrix_x4_trans")):
        report = bank_conflicts(layout, access, "bf16", swizzle_unit="elements")
        assert report.conflict_degree == 1.0, (access, report)


@pytest.mark.compile
def test_variant_uses_tensor_cores_ldmatrix_cp_async_without_spills():
    from cute_kernels.runtime import check_variant, compile_variant, get_variant

    import cute_kernels.attention.sm80_flash  # noqa: F401,F811  (registers the variant)

    report = compile_variant("attention.sm80_flash", "d64_float16_causal")
    assert check_variant(report, get_variant("attention.sm80_flash")) == []
    assert report.spill_store_bytes == 0 and report.local_memory == 0
    assert report.dynamic_smem >= 2 * 64 * (128 + 2 * 64)


# (variant, config, threads per CTA): the windowed forward (dense and packed), and the backward's
# windowed, head-dim-split (D 192, 256) and packed kernels.
NEW_VARIANTS = [
    ("attention.sm80_flash", "d128_bfloat16_causal_local", 128),
    ("attention.sm80_flash_varlen", "d128_bfloat16_causal_local", 128),
    ("attention.sm80_flash_bwd_dq", "d128_bfloat16_causal_local", 128),
    ("attention.sm80_flash_bwd_dkdv", "d128_bfloat16_causal_local", 128),
    ("attention.sm80_flash_bwd_dq", "d256_bfloat16_causal_local", 256),
    ("attention.sm80_flash_bwd_dkdv", "d256_bfloat16_causal_local", 256),
    ("attention.sm80_flash_bwd_dkdv", "d192_float16_causal", 256),
    ("attention.sm80_flash_bwd_dkdv_varlen", "d256_bfloat16_causal", 256),
]


@pytest.mark.compile
@pytest.mark.parametrize("variant, config, threads", NEW_VARIANTS)
def test_window_varlen_and_wide_backward_variants_run_on_tensor_cores_without_spills(variant, config, threads):
    from cute_kernels.runtime import check_variant, compile_variant, get_variant

    report = compile_variant(variant, config)
    assert check_variant(report, get_variant(variant)) == []  # HMMA, LDSM, LDGSTS present; no LDL/STL
    (kernel,) = report.kernels
    ops = kernel.sass.histogram
    assert ops["HMMA"] > 0 and ops["LDSM"] > 0 and ops["LDL"] == 0 and ops["STL"] == 0
    assert report.spill_store_bytes == 0 and report.local_memory == 0
    assert kernel.block_dim == (threads, 1, 1)
