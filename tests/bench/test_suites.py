"""suites: the named cases and the --impl selection."""

from __future__ import annotations

import pytest

from cute_kernels.bench.impls import Impl
from cute_kernels.bench.suites import SLOW_RUNGS, SUITES, select_impls


def test_default_suites_are_the_device_readme_cases():
    assert [c.name for c in SUITES["gemm"].cases] == [
        "2048x2048x2048", "4096x4096x4096", "8192x8192x8192", "8192x28672x8192", "8192x8192x28672",
        "4096x14336x4096", "16384x4096x4096"]
    att = [c.name for c in SUITES["attention"].cases]
    assert len(att) == 8 and att[:2] == ["B4_H32_S2048_D128", "B4_H32_S2048_D128_causal"]
    assert "B2_H16_S4096_D256_causal" in att and "B8_H16_S2048_D64" in att
    assert [c.m for c in SUITES["skinny"].cases] == [16, 64, 128]
    assert {(c.n, c.k) for c in SUITES["skinny"].cases} == {(8192, 8192)}
    assert [(c.name, c.dtype) for c in SUITES["fp8"].cases] == [
        ("4096x4096x4096", "fp8_e4m3"), ("8192x8192x8192", "fp8_e4m3"),
        ("4096x4096x4096_rowwise", "fp8_e4m3"), ("8192x8192x8192_rowwise", "fp8_e4m3")]
    shapes = SUITES["gemm_shapes"].cases
    assert len({c.name for c in shapes}) == len(shapes) > 150  # every model GEMM once
    assert {"1x4096x4096", "2048x2048x4100", "256x4096x16384", "12608x768x3072_bias", "8192x2048x8192_bn",
            "2048x8192x8192_am_bn", "4096x2x1024"} <= {c.name for c in shapes}
    assert {(c.name, c.dtype) for c in SUITES["ladder"].cases} == {
        (f"{s}x{s}x{s}", dt) for s in (4096, 8192) for dt in ("fp32", "fp16", "bf16")}
    assert [c.name for c in SUITES["copy"].cases] == ["16MiB", "64MiB", "256MiB", "1024MiB"]


def _impls():
    prep = lambda case, inputs: None  # noqa: E731
    names = [("naive", "ours"), ("simt_smem", "ours"), ("sm90_persistent", "ours"), ("cublas", "peer"), ("quack", "peer")]
    return {n: Impl(n, k, prep) for n, k in names}


def test_select_impls_keywords_and_names():
    impls = _impls()
    gemm = SUITES["gemm"]
    assert list(select_impls(impls, None, gemm.default)) == ["sm90_persistent", "cublas", "quack"]
    assert set(SLOW_RUNGS) <= set(select_impls(impls, "all", gemm.default))
    assert list(select_impls(impls, "ours", gemm.default)) == ["naive", "simt_smem", "sm90_persistent"]
    assert list(select_impls(impls, "peers", gemm.default)) == ["cublas", "quack"]
    assert list(select_impls(impls, "cublas,naive", gemm.default)) == ["naive", "cublas"]  # registry order
    assert list(select_impls(impls, None, SUITES["ladder"].default)) == ["naive", "simt_smem", "sm90_persistent", "cublas"]
    with pytest.raises(ValueError, match="unknown impl 'sm70_mma'.*known here: naive"):
        select_impls(impls, "sm70_mma", gemm.default)
    with pytest.raises(ValueError, match="at least one"):
        select_impls(impls, ",", gemm.default)


def test_parse_cases_with_dtype_suffix():
    cases = SUITES["ladder"].parse_cases("1024x512x256:bf16, 64x64x64")
    assert [(c.name, c.dtype) for c in cases] == [("1024x512x256", "bf16"), ("64x64x64", "fp32")]
    assert SUITES["attention"].parse_cases("B1_H2_S128_D64_causal")[0].causal
    with pytest.raises(ValueError):
        SUITES["gemm"].parse_cases("64x64x64:int3")


def test_select_impls_non_strict_ignores_unknown_names():
    impls = _impls()
    assert list(select_impls(impls, "cublas,fa4", SUITES["gemm"].default, strict=False)) == ["cublas"]
