"""`sm80_mma`: config validation, layouts' figures, supports() reasons (CPU); SASS (compile);
values against float64 torch (gpu)."""

from __future__ import annotations


import pytest
import torch

from cute_kernels.gemm.ampere_config import (
    WarpMmaConfig,
    analyse,
    gmem_copy_layouts,
    pick_vector,
    smem_operand_layout,
)
from cute_kernels.gemm.threadblock_swizzle import tile_order

# ---- CPU: configs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tile_m": 96}, "tile_m must be a positive power of two"),
        ({"stages": 0}, "stages must be a positive int"),
        ({"a_major": "x"}, "a_major must be one of"),
        ({"b_major": "m"}, "b_major must be one of"),
        ({"c_major": "k"}, "c_major must be one of"),
        ({"dtype": "float32"}, "dtype must be one of"),
        ({"vec_a": 16}, "exceeds a 16-byte access"),
        ({"out_dtype": "float32", "vec_c": 8}, "exceeds a 16-byte access"),
        ({"warps_m": 16, "warps_n": 8}, "threads > 1024"),
        ({"tile_m": 32, "warps_m": 4}, "must be a multiple of 16"),
        ({"tile_k": 8}, "tile_k 8 must be a multiple of 16"),
        ({"stages": 12}, "exceed the"),
        ({"has_c": 1}, "has_c must be a bool"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        WarpMmaConfig(**overrides).validate()


def test_default_config_is_valid_and_fits():
    cfg = WarpMmaConfig().validate()
    assert cfg.threads == 256
    assert cfg.warp_tile == (64, 64)
    assert cfg.smem_bytes() == (128 + 256) * 32 * 2 * 4


@pytest.mark.parametrize("cfg", [WarpMmaConfig(), WarpMmaConfig(a_major="m", b_major="k", c_major="m"),
                                 WarpMmaConfig(dtype="float16", out_dtype="float32", vec_c=4)])
def test_layouts_are_conflict_free_and_coalesced(cfg):
    report = analyse(cfg.validate())
    for key in ("smem_a", "smem_b", "smem_c"):
        assert report[key].conflict_free, (key, str(report[key]))
    for key in ("gmem_a", "gmem_b", "gmem_c"):
        assert report[key].efficiency == 1.0, (key, str(report[key]))


@pytest.mark.parametrize("bits, dtype", [(16, "bf16"), (32, "f32")])
@pytest.mark.parametrize("tile_n", [64, 128, 256])
def test_accumulator_writes_to_staging_tile_are_conflict_free(bits, dtype, tile_n):
    from cute_kernels.gemm.ampere_config import accumulator_write_access, smem_output_layout
    from cute_kernels.layouts import Layout
    from cute_kernels.layouts.analysis import bank_conflicts

    tv = accumulator_write_access()
    swizzled = smem_output_layout(128, tile_n, "n", bits)
    assert bank_conflicts(swizzled, tv, dtype, swizzle_unit="elements").conflict_free
    assert bank_conflicts(swizzled, f"vec{min(128, 8 * bits)}", dtype, swizzle_unit="elements").conflict_free
    plain = Layout((128, tile_n), (tile_n, 1))
    assert not bank_conflicts(plain, tv, dtype, swizzle_unit="elements").conflict_free


def test_staging_tile_is_a_bijection():
    from cute_kernels.gemm.ampere_config import smem_output_layout

    lay = smem_output_layout(128, 256, "n", 32)
    assert {lay(m, n) for m in range(128) for n in range(256)} == set(range(128 * 256))
    col = smem_output_layout(128, 256, "m", 16)
    assert len({col(m, n) for m in range(128) for n in range(256)}) == 128 * 256


def test_unswizzled_operand_tile_would_conflict():
    # The swizzle is what makes ldmatrix conflict-free: the same tile without it is not.
    from cute_kernels.layouts import Layout
    from cute_kernels.layouts.analysis import bank_conflicts

    plain = Layout((128, 32), (32, 1))
    assert not bank_conflicts(plain, "ldmatrix_x4", "bf16", swizzle_unit="elements").conflict_free


def test_smem_operand_layout_is_a_bijection():
    lay = smem_operand_layout(128, 32, 3, "k")
    offsets = {lay(m, k, s) for m in range(128) for k in range(32) for s in range(3)}
    assert offsets == set(range(128 * 32 * 3))


def test_gmem_copy_layouts_cover_tiles():
    cfg = WarpMmaConfig(a_major="m", vec_a=2).validate()
    thr, val = gmem_copy_layouts(cfg)["a"]
    assert thr.size() * val.size() * (cfg.tile_m * cfg.tile_k // (cfg.threads * cfg.vec_a)) == cfg.tile_m * cfg.tile_k
    from cute_kernels.gemm.ampere_config import _copy_layouts

    with pytest.raises(ValueError, match="do not tile"):
        _copy_layouts(16, 16, "cols", 8, 64, "A tile copy")
    with pytest.raises(ValueError, match="whole number"):
        _copy_layouts(16, 12, "cols", 8, 32, "A tile copy")


@pytest.mark.parametrize(
    "extent, strides, ptr, expect",
    [(64, [64, 4096], 0, 8), (36, [36], 0, 4), (34, [34], 0, 2), (33, [33], 0, 1), (64, [64], 4, 2), (64, [62], 0, 2)],
)
def test_pick_vector(extent, strides, ptr, expect):
    assert pick_vector(extent, strides, ptr, 2, 8) == expect


def test_grouped_tile_order_is_a_bijection():
    for tm, tn, r in ((7, 5, 3), (1, 9, 8), (16, 16, 8), (5, 1, 2)):
        order = tile_order(tm, tn, r)
        assert sorted(order) == [(m, n) for m in range(tm) for n in range(tn)]
    # grouped: the first `raster` launches walk m inside one column
    assert tile_order(8, 8, 4)[:4] == [(0, 0), (1, 0), (2, 0), (3, 0)]


# ---- CPU: the rung's answers ------------------------------------------------------------------


def _views(m, n, k, dtype=torch.bfloat16, a_major="k", b_major="n", batch=1):
    a = torch.empty(batch, m, k, dtype=dtype) if a_major == "k" else torch.empty(batch, k, m, dtype=dtype).transpose(1, 2)
    b = torch.empty(batch, k, n, dtype=dtype) if b_major == "n" else torch.empty(batch, n, k, dtype=dtype).transpose(1, 2)
    out = torch.empty(batch, m, n, dtype=dtype)
    return a, b, out


def test_supports_reasons():
    from cute_kernels.gemm.sm80_mma import RUNG

    assert RUNG.supports(*_views(64, 64, 64)) is None
    assert RUNG.supports(*_views(64, 64, 6)) is None  # 4-byte cp.async path
    why = RUNG.supports(*_views(64, 64, 7))
    assert why is not None and "cp.async" in why and "a" in why
    why = RUNG.supports(*_views(64, 7, 64))
    assert why is not None and why.startswith("b cannot")
    a, b, out = _views(16, 16, 16, dtype=torch.float32)
    assert "input dtype" in RUNG.supports(a, b, out)
    a, b, _ = _views(16, 16, 16)
    assert "output dtype" in RUNG.supports(a, b, torch.empty(1, 16, 16, dtype=torch.float64))


def test_config_for_picks_vectors_and_majors():
    from cute_kernels.gemm.sm80_mma import RUNG

    a, b, out = _views(64, 64, 12, a_major="k", b_major="k")
    cfg = RUNG.config_for(a, b, out, has_c=False)
    assert (cfg.a_major, cfg.b_major, cfg.c_major) == ("k", "k", "n")
    assert (cfg.vec_a, cfg.vec_b) == (4, 4)
    assert cfg.tile_n == 128  # narrow vectors -> the smaller warp tile
    cfg = RUNG.config_for(*_views(64, 64, 64), has_c=False)
    assert (cfg.vec_a, cfg.vec_b, cfg.vec_c, cfg.tile_n) == (8, 8, 8, 256)


def test_extent_one_mode_reads_along_the_other():
    from cute_kernels.gemm.sm80_mma import RUNG

    a, b, out = _views(64, 64, 1)  # a (1, 64, 1): both strides 1; K = 1 forbids K vectors
    assert RUNG.supports(a, b, out) is None
    cfg = RUNG.config_for(a, b, out, has_c=False)
    assert cfg.a_major == "m" and cfg.vec_a == 8


def test_no_unit_stride_is_a_reason():
    from cute_kernels.gemm.sm80_mma import RUNG

    a, b, out = _views(16, 16, 16)
    a = torch.empty(1, 32, 32, dtype=torch.bfloat16)[:, ::2, ::2]
    assert "neither of its last two modes" in RUNG.supports(a, b, out)


def test_tuning_environment_variable():
    from cute_kernels.gemm.sm80_mma import DEFAULT_CONFIG, TUNING_ENV, config_from_env

    assert config_from_env(environ={}) == DEFAULT_CONFIG
    cfg = config_from_env(environ={TUNING_ENV: "tile_k=64, stages=3"})
    assert (cfg.tile_k, cfg.stages, cfg.tile_n) == (64, 3, DEFAULT_CONFIG.tile_n)
    with pytest.raises(ValueError, match="not 'field=int'"):
        config_from_env(environ={TUNING_ENV: "dtype=float16"})
    with pytest.raises(ValueError, match="not an integer"):
        config_from_env(environ={TUNING_ENV: "stages=four"})
    with pytest.raises(ValueError, match="tile_k 8 must be a multiple of 16"):
        config_from_env(environ={TUNING_ENV: "tile_k=8"})


def test_call_rejects_unsupported_before_launch():
    from cute_kernels.gemm.sm80_mma import RUNG

    with pytest.raises(ValueError, match="sm80_mma cannot run"):
        RUNG(*_views(16, 16, 7))


# ---- compile: SASS through the registry ------------------------------------------------------


@pytest.mark.compile
@pytest.mark.parametrize("config", ["default", "bf16_tn", "bf16_am_bk_colout", "fp16_am_bn_c", "bf16_narrow_vectors"])
def test_sass(config, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from cute_kernels.runtime import compile_variant, get_variant

    variant = get_variant("gemm.sm80_mma")
    report = compile_variant("gemm.sm80_mma", config, arch="sm_90a")
    for op in ("HMMA", "LDSM", "LDGSTS"):
        assert report.has(op), op
    assert not report.has("LDL") and not report.has("STL")
    assert report.spill_store_bytes == 0
    assert variant.requires >= {"HMMA", "LDSM", "LDGSTS"}


@pytest.mark.compile
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dsl_mma_atom_matches_our_atom(dtype, monkeypatch):
    """The kernel issues the DSL's MmaF16BF16Op; its TV layouts must be the ones the workbench
    prints for our atom (so the fragments the docs show are the fragments the kernel uses)."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warp

    from cute_kernels.gemm.sm80_mma import mma_atom_name
    from cute_kernels.layouts.atoms import atom

    seen = {}
    dsl_type = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[dtype]

    @cute.jit
    def probe():
        mma = cute.make_mma_atom(warp.MmaF16BF16Op(dsl_type, cutlass.Float32, (16, 8, 16)))
        seen.update(a=str(mma.tv_layout_A), b=str(mma.tv_layout_B), c=str(mma.tv_layout_C), thr=str(mma.thr_id))

    cute.compile(probe)
    ours = atom(mma_atom_name(dtype))
    assert seen == {"a": str(ours.a_layout), "b": str(ours.b_layout), "c": str(ours.c_layout), "thr": str(ours.thr_id)}


# ---- GPU: values ---------------------------------------------------------------------------------

gpu = pytest.mark.gpu
_TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _operand(shape_mk, major_first: bool, dtype, batch):
    """N(0,1) of logical shape (batch, r, c); contiguous along c unless major_first."""
    r, c = shape_mk
    if major_first:
        return torch.randn(batch, c, r, device="cuda").to(dtype).transpose(1, 2)
    return torch.randn(batch, r, c, device="cuda").to(dtype)


def _run(m, n, k, *, dtype=torch.bfloat16, out_dtype=None, a_major="k", b_major="n", batch=1,
         alpha=1.0, beta=0.0, poison_inputs=False):
    from cute_kernels.gemm.sm80_mma import RUNG

    out_dtype = out_dtype or dtype
    a = _operand((m, k), a_major == "m", dtype, batch)
    b = _operand((k, n), b_major == "k", dtype, batch)
    c = torch.randn(batch, m, n, device="cuda").to(out_dtype) if beta else None
    out = torch.full((batch, m, n), float("nan"), device="cuda", dtype=out_dtype)
    assert RUNG.supports(a, b, out) is None
    RUNG(a, b, out, alpha=alpha, beta=beta, c=c)
    torch.cuda.synchronize()
    ref = alpha * torch.matmul(a.double(), b.double())
    if beta:
        ref = ref + beta * c.double()
    return out, ref


def _assert_close(out, ref):
    assert torch.isfinite(out).all(), "poisoned (NaN) outputs left unwritten or non-finite results"
    err = (out.double() - ref).norm() / ref.norm().clamp_min(1e-30)
    assert err < _TOL[out.dtype], f"relative error {err:.3g}"


@gpu
@pytest.mark.parametrize("a_major", ["k", "m"])
@pytest.mark.parametrize("b_major", ["n", "k"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_transposes(a_major, b_major, dtype):
    _assert_close(*_run(200, 264, 136, dtype=dtype, a_major=a_major, b_major=b_major))


@gpu
@pytest.mark.parametrize("m, n, k", [(256, 256, 256), (8, 328, 64), (264, 8, 40), (1, 8, 8), (130, 258, 2),
                                     (96, 104, 1000), (520, 40, 16), (64, 72, 1)])
def test_shapes(m, n, k):
    _assert_close(*_run(m, n, k))


@gpu
@pytest.mark.parametrize("m, n, k", [(127, 9, 254), (131, 67, 38), (13, 131, 94)])
def test_prime_and_unaligned_shapes(m, n, k):
    # K even but not a multiple of 8: the rung falls back to 4-byte cp.async and the small tile.
    _assert_close(*_run(m, n, k, a_major="k", b_major="k"))


@gpu
def test_padded_row_strides():
    from cute_kernels.gemm.sm80_mma import RUNG

    a = torch.randn(1, 100, 70, device="cuda").bfloat16()[:, :, :66]  # row stride 70
    b = torch.randn(1, 66, 90, device="cuda").bfloat16()[:, :, 2:82]  # base 4 bytes off 16
    out = torch.full((1, 100, 80), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert RUNG.supports(a, b, out) is None
    RUNG(a, b, out)
    torch.cuda.synchronize()
    _assert_close(out, torch.matmul(a.double(), b.double()))


@gpu
def test_matmul_api_reaches_the_rung():
    from cute_kernels.gemm import matmul

    a = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 40, device="cuda", dtype=torch.bfloat16)
    _assert_close(matmul(a, b, kernel="sm80_mma"), a.double() @ b.double())


@gpu
@pytest.mark.parametrize("m, n, k", [(130, 66, 34), (64, 36, 6)])
def test_narrow_vectors(m, n, k):
    _assert_close(*_run(m, n, k, a_major="k", b_major="k"))


@gpu
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_output_dtypes(out_dtype):
    _assert_close(*_run(192, 320, 96, dtype=torch.float16, out_dtype=out_dtype))


@gpu
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_column_major_output(beta):
    from cute_kernels.gemm.sm80_mma import RUNG

    a = torch.randn(2, 136, 72, device="cuda").bfloat16()
    b = torch.randn(2, 72, 88, device="cuda").bfloat16()
    out = torch.full((2, 88, 136), float("nan"), device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    c = torch.randn(2, 136, 88, device="cuda").bfloat16() if beta else None
    assert RUNG.config_for(a, b, out, has_c=bool(beta)).c_major == "m"
    RUNG(a, b, out, alpha=1.25, beta=beta, c=c)
    torch.cuda.synchronize()
    ref = 1.25 * torch.matmul(a.double(), b.double())
    if beta:
        ref = ref + beta * c.double()
    _assert_close(out, ref)


@gpu
def test_batched_and_alpha_beta():
    _assert_close(*_run(136, 200, 72, batch=3, alpha=0.5, beta=-1.5))
    _assert_close(*_run(64, 64, 64, batch=2, alpha=2.0, beta=0.25, out_dtype=torch.float32, dtype=torch.float16))


@gpu
def test_nan_inf_propagate():
    from cute_kernels.gemm.sm80_mma import RUNG

    a = torch.randn(1, 96, 80, device="cuda").bfloat16()
    b = torch.randn(1, 80, 72, device="cuda").bfloat16()
    a[0, 3, 5] = float("nan")
    b[0, 7, 9] = float("inf")
    out = torch.full((1, 96, 72), float("nan"), device="cuda", dtype=torch.bfloat16)
    RUNG(a, b, out)
    torch.cuda.synchronize()
    assert torch.isnan(out[0, 3]).all()
    col = torch.cat([out[0, :3, 9], out[0, 4:, 9]])
    assert not torch.isfinite(col).any()
    rest = out[0].clone()
    rest[3] = 0
    rest[:, 9] = 0
    assert torch.isfinite(rest).all()
