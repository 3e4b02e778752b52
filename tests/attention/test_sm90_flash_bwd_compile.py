"""sm90_flash backward without a GPU: the registered variants compile for sm_90a with the
instructions the design relies on (HGMMA from shared memory and from registers, TMA loads,
stmatrix for dS^T, fp32 reductions for dQ, setmaxnreg) and no local-memory spills; the
support checks refuse what the kernel does not take, with a reason."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.compile


def _compiled(config: str):
    """(report, its one kernel, count(opcode prefix)) of a backward variant compiled for sm_90a,
    checked against the variant's required instructions, with no spills or local memory."""
    pytest.importorskip("cutlass")
    from cute_kernels.runtime import check_variant, compile_variant, get_variant

    import cute_kernels.attention.sm90_flash_bwd  # noqa: F401  (registers the variants)

    report = compile_variant("attention.sm90_flash_bwd", config)
    assert check_variant(report, get_variant("attention.sm90_flash_bwd")) == []
    assert report.spill_store_bytes == 0 and report.local_memory == 0
    (kernel,) = report.kernels
    ops = kernel.sass.opcodes
    return report, kernel, lambda prefix: sum(v for op, v in ops.items() if op.startswith(prefix))


@pytest.mark.parametrize("config", ["d64_float16_causal", "d128_bfloat16_causal", "d128_float16_causal_gqa",
                                    "d128_bfloat16_tma", "d128_bfloat16_causal_tma_early_defer",
                                    "d64_float16_causal_gqa_tma_early_defer", "d64_float16_local",
                                    "d128_bfloat16_causal_local_gqa", "d128_bfloat16_causal_varlen",
                                    "d64_float16_local_softcap_gqa_varlen", "d80_bfloat16_causal",
                                    "d32_float16_gqa"])
def test_variant_uses_wgmma_tma_and_reductions_without_spills(config):
    report, kernel, count = _compiled(config)
    import cute_kernels.attention.sm90_flash_bwd as bwd
    d = int(config.split("_")[0][1:])
    # S^T and dP^T (D/16 steps each), dQ (128/16 steps, both operands transposed), dV and dK
    # (64/16 steps each, A from registers).
    expected = {}
    for n, steps in ((64, 2 * d // 16), (d, 2 * 64 // 16), (d // 2, 128 // 16)):
        expected[n] = expected.get(n, 0) + steps
    for n, steps in expected.items():
        assert count(f"HGMMA.64x{n}x16") == steps, f"N = {n}"
    assert count("UTMALDG") >= 6 and count("UTMALDG.1D") == 2  # K, V, Q, dO; lse2 and D (flat)
    if "_tma" not in config:
        # dQ: (64 x D) / 256 threads, two adjacent columns per 8-byte reduction
        assert count("REDG.E.ADD.F32x2") == 8 * d // 64 and count("REDG.E.ADD.F32.") == 0
        assert count("UTMAREDG") == 0
    else:
        # dQ: one TMA reduce-add per warpgroup of its (64, D/2) half, in (64, 8) boxes of the
        # (Sq, D, B * Hq) accumulator (rows past Sq clipped).
        assert count("UTMAREDG.3D.ADD") == d // 16 and count("REDG.E") == 0
    assert count("STSM") > 0 and count("USETMAXREG") == 2
    c = bwd.bwd_config_for(d, "bfloat16", True, wide_q=False, dq_writer=False)  # as the variants
    assert kernel.dynamic_smem >= c.smem_bytes - 2048


@pytest.mark.parametrize("config", ["d192_bfloat16_causal", "d192_float16_gqa", "d256_bfloat16_causal",
                                    "d256_bfloat16_local_softcap_gqa_loop", "d256_float16_defer",
                                    "d128_bfloat16_causal_split", "d256_bfloat16_varlen", "d160_float16_causal"])
def test_head_split_variant_shares_keys_and_splits_the_head_dim_without_spills(config):
    """`head_split`: both warpgroups take the same 64 keys; S^T and dP^T split by queries (N =
    32 each), dV, dK and dQ by the head dim (N = D / 2), all five GEMMs from shared memory; P^T
    and dS^T stored with stmatrix."""
    report, kernel, count = _compiled(config)
    import cute_kernels.attention.sm90_flash_bwd as bwd
    assert count("STL") == 0 and count("LDL") == 0
    d = int(config.split("_")[0][1:])
    # S^T and dP^T: D/16 k steps each at N = 32; dV, dK (64 queries) and dQ (64 keys): 4 each at N = D/2.
    assert count("HGMMA.64x32x16") == 2 * d // 16
    assert count(f"HGMMA.64x{d // 2}x16") == 12
    assert count("HGMMA") == 2 * d // 16 + 12
    assert count("REDG.E.ADD.F32x2") == d // 8 and count("STSM") == 4 and count("USETMAXREG") == 2
    config_args = bwd.BWD_VARIANT_CONFIGS[config]
    c = bwd.build_variant(**config_args).key[1]
    assert c.head_split and c.block_n == 64 and kernel.dynamic_smem >= c.smem_bytes - 2048


@pytest.mark.parametrize("config", ["d64_float16", "d128_bfloat16", "d192_bfloat16", "d256_float16"])
def test_preprocess_uses_vector_loads_and_shuffles(config):
    pytest.importorskip("cutlass")
    from cute_kernels.runtime import check_variant, compile_variant, get_variant

    import cute_kernels.attention.sm90_bwd_prep  # noqa: F401  (registers the variant)

    report = compile_variant("attention.sm90_bwd_prep", config)
    assert check_variant(report, get_variant("attention.sm90_bwd_prep")) == []
    ops = report.kernels[0].sass.opcodes
    assert ops.get("LDG.E.128", 0) == 2  # 8 elements of dO and of O per thread
    d = int(config.split("_")[0][1:])
    # A row's threads: D / 8 rounded up to a power of two, summed in log2 of it butterfly steps.
    assert ops.get("SHFL.BFLY", 0) == (d // 8 - 1).bit_length()


def _problem(d=128, dv=None, dtype_name="bfloat16"):
    torch = pytest.importorskip("torch")
    from cute_kernels.attention.api import AttentionProblem

    return AttentionProblem(batch=1, heads_q=2, heads_kv=2, seqlen_q=10, seqlen_k=10, head_dim=d,
                            head_dim_v=d if dv is None else dv, dtype=getattr(torch, dtype_name), causal=None,
                            scale=0.125)


def test_supports_backward_names_what_it_refuses():
    pytest.importorskip("cutlass")
    from cute_kernels.attention.sm90_flash_bwd import supports_backward

    assert supports_backward(_problem(64)) is None and supports_backward(_problem(128)) is None
    assert "multiples of 16" in supports_backward(_problem(72))
    for d in (32, 80, 160, 192, 256):
        assert supports_backward(_problem(d)) is None, d
    assert supports_backward(_problem(96)) is None  # Phi-3's head dim (32-byte swizzled operands)
    assert "value head dim" in supports_backward(_problem(128, dv=64))
    assert "float32" in supports_backward(_problem(128, dtype_name="float32"))
    # Sliding windows are taken (both bounds, or one).
    from dataclasses import replace

    assert supports_backward(replace(_problem(64), window_left=5, window_right=3)) is None
    assert supports_backward(replace(_problem(128), window_left=None, window_right=0)) is None


def test_window_config_flags_and_scalars():
    pytest.importorskip("cutlass")
    from dataclasses import replace

    from cute_kernels.attention.problem_checks import launch_scalars, mask_flags, window_scalars
    from cute_kernels.attention.sm90_flash_bwd import FlashSm90BwdConfig, bwd_config_for

    with pytest.raises(ValueError, match="local must be a bool"):
        FlashSm90BwdConfig(local=1).validate()
    assert bwd_config_for(64, "float16", True, local=True).local
    # Sq = Sk = 10, window (4, 2) aligned bottom-right (base 0): j <= i + 2 and j >= i - 4.
    p = replace(_problem(64), window_left=4, window_right=2)
    assert mask_flags(p) == (True, True) and launch_scalars(p)[1] == 2 and window_scalars(p) == (-4, True)


def test_config_validation_is_clear():
    pytest.importorskip("cutlass")
    from cute_kernels.attention.sm90_flash_bwd import FlashSm90BwdConfig

    with pytest.raises(ValueError, match="head_dim must be a multiple of 16"):
        FlashSm90BwdConfig(head_dim=72).validate()
    with pytest.raises(ValueError, match="stages must be 1 to 3"):
        FlashSm90BwdConfig(stages=5).validate()
    with pytest.raises(ValueError, match="block_n must be 128"):
        FlashSm90BwdConfig(block_n=64).validate()
    with pytest.raises(ValueError, match="head dim 256 needs head_split|head_dim 256 needs head_split"):
        FlashSm90BwdConfig(head_dim=256).validate()
    with pytest.raises(ValueError, match="block_n must be 64 with head_split"):
        FlashSm90BwdConfig(head_dim=256, head_split=True).validate()
    with pytest.raises(ValueError, match="neither early_dv"):
        FlashSm90BwdConfig(head_dim=192, head_split=True, block_n=64, early_dv=True).validate()
    with pytest.raises(ValueError, match="ds_buffers must be 2 without head_split"):
        FlashSm90BwdConfig(ds_buffers=1).validate()
    with pytest.raises(ValueError, match="ds_buffers must be 1 or 2"):
        FlashSm90BwdConfig(head_dim=192, head_split=True, block_n=64, ds_buffers=3).validate()
    with pytest.raises(ValueError, match="shared memory"):
        FlashSm90BwdConfig(head_dim=256, head_split=True, block_n=64, stages=3).validate()
    assert FlashSm90BwdConfig(head_dim=64, dtype="float16").validate().tx_bytes_qdo == 2 * 2 * 64 * 64 + 512
    with pytest.raises(ValueError, match="block_m must be 64 or 128"):
        FlashSm90BwdConfig(block_m=80).validate()
    with pytest.raises(ValueError, match="block_m 128 takes head dims up to 64"):
        FlashSm90BwdConfig(block_m=128).validate()
    with pytest.raises(ValueError, match="two ways of adding dQ"):
        FlashSm90BwdConfig(dq_writer=True, dq_tma_reduce=True).validate()
    with pytest.raises(ValueError, match="do not fit beside head_split"):
        FlashSm90BwdConfig(head_dim=256, head_split=True, block_n=64, ds_buffers=1, dq_writer=True).validate()
    assert FlashSm90BwdConfig(dq_writer=True, deterministic=True).validate().dq_stage_floats == 2 * 64 * 64


def test_the_default_tile_per_head_dim():
    """128 keys a CTA up to D = 128; 64 keys and the head dim split above, with one dS^T / P^T
    buffer at 256 (two would not fit beside two Q/dO stages), every default within sm_90's
    shared memory."""
    pytest.importorskip("cutlass")
    from cute_kernels.attention.sm90_flash_bwd import _SMEM_LIMIT, bwd_config_for

    tiles = {d: bwd_config_for(d, "bfloat16", True) for d in (64, 96, 128, 192, 256)}
    assert {d: (c.block_n, c.head_split, c.ds_buffers) for d, c in tiles.items()} == {
        64: (128, False, 2), 96: (128, False, 2), 128: (128, False, 2), 192: (64, True, 2), 256: (64, True, 1)}
    assert all(c.smem_bytes <= _SMEM_LIMIT for c in tiles.values())
    assert tiles[192].s_cols == 32 and tiles[128].s_cols == 64
    # The dQ writer warp wherever its tiles fit beside head_split's buffers; not for packed sequences
    writer = {d for d in range(16, 257, 16) if bwd_config_for(d, "bfloat16", False).dq_writer}
    assert writer == set(range(16, 209, 16)) and not bwd_config_for(128, "bfloat16", True, varlen=True).dq_writer
    assert all(bwd_config_for(d, "bfloat16", True).smem_bytes <= _SMEM_LIMIT for d in range(16, 257, 16))
    assert bwd_config_for(64, "bfloat16", True, deterministic=True).dq_writer


@pytest.mark.parametrize("config", ["d128_bfloat16_causal_dq_writer_unmasked_interior",
                                    "d64_float16_causal_local_varlen_unmasked_interior"])
def test_unmasked_interior_variant_holds_a_second_step_without_the_mask(config):
    """`unmasked_interior`: the step twice, behind one branch on `block_info.tile_unmasked` (so
    twice the MMAs and exponentials of the plain variant), the second copy without the mask's
    selects; no spills."""
    report, _, count = _compiled(config)
    import cute_kernels.attention.sm90_flash_bwd as bwd

    c = bwd.build_variant(**bwd.BWD_VARIANT_CONFIGS[config]).key[1]  # the compiled config
    d = c.head_dim
    # per step: S^T and dP^T (D/16 k-steps each), dV and dK (block_m/16 each), dQ_blk (128/16 over the keys)
    per_step = 2 * d // 16 + 2 * c.block_m // 16 + 128 // 16
    assert count("HGMMA.") == 2 * per_step and count("MUFU.EX2") == 2 * (64 * c.block_m // 128)
    assert report.spill_load_bytes == report.spill_store_bytes == 0
    from cute_kernels.runtime import compile_variant

    masked_only = compile_variant("attention.sm90_flash_bwd", {**bwd.BWD_VARIANT_CONFIGS[config],
                                                               "unmasked_interior": False})
    assert count("FSEL") == masked_only.kernels[0].sass.opcodes.get("FSEL", 0)  # the copy selects nothing


@pytest.mark.parametrize("config", ["d128_bfloat16_causal_deterministic", "d64_float16_local_gqa_loop_deterministic"])
def test_deterministic_variant_waits_for_its_turn_and_counts_itself(config):
    """`deterministic`: before a step's dQ reductions one thread polls the Q block's counter
    with acquire loads (LDG.E.STRONG.GPU, L1 invalidated), the consumers meet; after them a
    gpu-scope fence and one release add of 1 (REDG.E.ADD.S32); no spills."""
    report, _, count = _compiled(config)
    assert count("LDG.E.STRONG.GPU") == 1 and count("REDG.E.ADD.S32.STRONG.GPU") == 1
    assert count("MEMBAR.ALL.GPU") >= 1 and count("CCTL.IVALL") >= 1
    d = int(config.split("_")[0][1:])
    assert count("REDG.E.ADD.F32x2") == 8 * d // 64  # dQ's reductions themselves unchanged
    lines = report.sass.splitlines()
    poll = next(i for i, line in enumerate(lines) if "LDG.E.STRONG.GPU" in line)
    # The poll is a loop: a branch back to its label within a few instructions.
    label = next(line.strip().rstrip(":") for line in reversed(lines[:poll]) if line.strip().startswith(".L_"))
    assert any("BRA" in line and label in line for line in lines[poll:poll + 8])


@pytest.mark.parametrize("config", ["d64_bfloat16_wide_q", "d64_float16_causal_local_gqa_loop_deterministic_wide_q",
                                    "d32_bfloat16_causal_gqa_wide_q"])
def test_wide_q_variant_takes_128_queries_a_step_without_spills(config):
    """`block_m` 128 (`wide_q`): S^T and dP^T of 64 keys x 128 queries a warpgroup (m64n128,
    D/16 steps each), dV and dK with 128/16 steps, dQ m64nD (the warpgroups split the 128 rows),
    so (128 x D) / 256 threads' reductions, two columns each."""
    _, kernel, count = _compiled(config)
    d = int(config.split("_")[0][1:])
    expected = {}
    for n, steps in ((128, 2 * d // 16), (d, 2 * 128 // 16 + 128 // 16)):
        expected[n] = expected.get(n, 0) + steps
    for n, steps in expected.items():
        assert count(f"HGMMA.64x{n}x16") == steps, f"N = {n}"
    assert count("REDG.E.ADD.F32x2") == 8 * d // 32 and count("UTMAREDG") == 0
    assert kernel.dynamic_smem >= 2 * 2 * (2 * 128 * d + 2 * 2 * 128 * d + 2 * 128 * 128) // 2 - 2048


@pytest.mark.parametrize("config", ["d128_bfloat16_dq_writer", "d96_float16_causal_local_gqa_loop_dq_writer",
                                    "d64_bfloat16_causal_wide_q_dq_writer",
                                    "d128_bfloat16_causal_deterministic_dq_writer",
                                    "d192_bfloat16_causal_split_dq_writer", "d128_bfloat16_causal_varlen_dq_writer"])
def test_dq_writer_variant_stages_dq_tiles_for_one_bulk_reduction_each(config):
    """`dq_writer`: the consumers store dQ_blk in fragment order with 16-byte shared stores (one
    per 4 values) and reduce nothing themselves; the writer warp issues one bulk reduction per
    warpgroup tile (unrolled over both) and meets the consumers at named barriers. Deterministic:
    the writer, not the consumers, polls the Q block's counter and counts with one release add."""
    _, kernel, count = _compiled(config)
    import cute_kernels.attention.sm90_flash_bwd as bwd

    d = int(config.split("_")[0][1:])
    c = bwd.build_variant(**bwd.BWD_VARIANT_CONFIGS[config]).key[1]  # the compiled config (head_split above 128)
    assert count("UBLKRED.G.S.ADD.F32") == 2 and count("REDG.E.ADD.F32") == 0 and count("UTMAREDG") == 0
    assert count("STS.128") == (c.block_m * d) // 256 // 4 and count("STS.64") == 0
    assert count("BAR.ARV") >= 4
    assert count("REDG.E.ADD.S32.STRONG.GPU") == count("LDG.E.STRONG.GPU") == (1 if c.deterministic else 0)
    assert kernel.dynamic_smem >= c.smem_bytes - 2048
