"""The Ampere-style Triton peer: it must be what it claims (mma.sync, no wgmma) and correct."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from cute_kernels.bench import triton_ampere
from cute_kernels.bench.suites import SUITES, select_impls


def _compiled(ptx: str):
    return SimpleNamespace(asm={"ptx": ptx})


def test_instruction_mix_refuses_wgmma_and_missing_mma():
    assert triton_ampere.instruction_mix(_compiled("mma.sync.aligned.m16n8k16.row.col")) is None
    assert "wgmma" in triton_ampere.instruction_mix(_compiled("mma.sync ... wgmma.mma_async.sync"))
    assert "no mma.sync" in triton_ampere.instruction_mix(_compiled("fma.rn.f32"))


def test_env_is_set_only_while_compiling(monkeypatch):
    monkeypatch.delenv(triton_ampere.ENV, raising=False)
    with triton_ampere._ampere_only():
        assert os.environ[triton_ampere.ENV] == "1"
    assert triton_ampere.ENV not in os.environ
    monkeypatch.setenv(triton_ampere.ENV, "0")
    with triton_ampere._ampere_only():
        pass
    assert os.environ[triton_ampere.ENV] == "0"


def test_only_the_ladder_suite_runs_it_by_default():
    from cute_kernels.bench.impls import FAMILY_IMPLS

    impls = FAMILY_IMPLS["gemm"]()
    assert "triton_ampere" in select_impls(impls, None, SUITES["ladder"].default)
    assert "triton_ampere" not in select_impls(impls, None, SUITES["gemm"].default)
    assert "triton_ampere" in select_impls(impls, "triton_ampere", SUITES["gemm"].default)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_ampere_peer_is_mma_sync_and_correct(dtype):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    dt = getattr(torch, dtype)
    m, n, k = 257, 391, 333  # edges in every dimension
    a = torch.randn(m, k, device="cuda", dtype=dt)
    b = torch.randn(n, k, device="cuda", dtype=dt).T  # K-major B, as the benchmark passes it
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
    compiled = triton_ampere.launch(a, b, out, triton_ampere.CONFIGS[2])
    assert triton_ampere.instruction_mix(compiled) is None
    ref = a.double() @ b.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err
