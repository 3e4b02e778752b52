"""`cute-kernels demo` runs on a machine without a GPU: layouts, an atom, bank conflicts, SASS."""

from __future__ import annotations

import pytest

from cute_kernels.cli import main


@pytest.mark.compile
def test_demo_runs_without_a_gpu(capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "(4,(2,2)):(2,(1,8))" in out
    assert "SM80_16x8x16_F32BF16BF16F32_TN" in out
    assert "8-way bank conflict" in out and "conflict-free" in out
    assert "registers/thread:" in out and "occupancy (H100/H200):" in out
    assert "skipping the timed GEMM" in out
