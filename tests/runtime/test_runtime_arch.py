"""Arch detection and dtype mapping (no compilation)."""

import pytest

from cute_kernels.runtime import arch


def test_arch_from_capability():
    assert arch.arch_from_capability(9, 0) == "sm_90a"
    assert arch.arch_from_capability(10, 0) == "sm_100a"
    assert arch.arch_from_capability(8, 0) == "sm_80"
    assert arch.arch_from_capability(8, 9) == "sm_89"
    assert arch.arch_capability("sm_90a") == (9, 0)
    assert arch.arch_capability("sm_100a") == (10, 0)


def test_target_arch_from_env_without_device(monkeypatch):
    monkeypatch.setattr(arch, "has_cuda", lambda: False)
    monkeypatch.setenv("CUTE_DSL_ARCH", " SM_90a ")
    assert arch.target_arch() == "sm_90a"


def test_target_arch_without_device_or_env_names_the_variable(monkeypatch):
    monkeypatch.setattr(arch, "has_cuda", lambda: False)
    monkeypatch.delenv("CUTE_DSL_ARCH", raising=False)
    with pytest.raises(RuntimeError, match="CUTE_DSL_ARCH"):
        arch.target_arch()


def test_bad_arch_string(monkeypatch):
    monkeypatch.setattr(arch, "has_cuda", lambda: False)
    monkeypatch.setenv("CUTE_DSL_ARCH", "hopper")
    with pytest.raises(ValueError, match="sm_90a"):
        arch.target_arch()


def test_cutlass_dtype_round_trip():
    torch = pytest.importorskip("torch")
    cutlass = pytest.importorskip("cutlass")
    from cute_kernels.runtime import cutlass_dtype, torch_dtype

    expected = {
        torch.float32: cutlass.Float32,
        torch.float16: cutlass.Float16,
        torch.bfloat16: cutlass.BFloat16,
        torch.float8_e4m3fn: cutlass.Float8E4M3FN,
        torch.int8: cutlass.Int8,
        torch.int32: cutlass.Int32,
    }
    for t, c in expected.items():
        assert cutlass_dtype(t) is c
        assert torch_dtype(c) is t
    with pytest.raises(TypeError, match="complex64"):
        cutlass_dtype(torch.complex64)
