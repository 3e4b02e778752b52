"""ceilings: the roofline, percent of ceiling, and reading ceilings from a record."""

from __future__ import annotations

import json

import pytest

from cute_kernels.bench.ceilings import load_ceilings, pct_ceiling, roofline_tflops

CEIL = {"bf16": 750.0, "hbm_gbps": 4000.0}


def test_roofline_is_min_of_math_and_bandwidth():
    # intensity 10 FLOP/B * 4000 GB/s = 40 TFLOP/s < 750
    assert roofline_tflops(CEIL, "bf16", 10e9, 1e9) == pytest.approx(40.0)
    assert roofline_tflops(CEIL, "bf16", 1e12, 1e9) == 750.0
    assert roofline_tflops({}, "bf16", 1e12, 1e9) is None
    assert roofline_tflops({"hbm_gbps": 4000.0}, "fp8_e4m3", 10e9, 1e9) == pytest.approx(40.0)


def test_pct_ceiling():
    # 1e12 FLOP in 2 ms = 500 TFLOP/s of a 750 roof
    assert pct_ceiling(CEIL, "bf16", 1e12, 1e9, 2.0) == pytest.approx(100 * 500 / 750)
    # a copy: 2 GB in 0.5 ms = 4000 GB/s = 100% of bandwidth
    assert pct_ceiling(CEIL, "bf16", 0.0, 2e9, 0.5) == pytest.approx(100.0)
    assert pct_ceiling({}, "bf16", 0.0, 2e9, 0.5) is None


def test_load_ceilings_from_result_or_plain_object(tmp_path):
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"date": "2026-11-30", "ceilings": {"bf16": 740.5, "hbm_gbps": 4310.0, "source": "x"}}))
    got = load_ceilings(res)
    assert got["bf16"] == 740.5 and got["hbm_gbps"] == 4310.0 and got["source"] == str(res)
    plain = tmp_path / "c.json"
    plain.write_text(json.dumps({"bf16": 700}))
    assert load_ceilings(plain)["bf16"] == 700
    empty = tmp_path / "e.json"
    empty.write_text("{}")
    with pytest.raises(ValueError, match="no numeric ceilings"):
        load_ceilings(empty)


def test_measure_ceilings_takes_the_best_round_of_each(monkeypatch):
    import torch

    from cute_kernels.bench.ceilings import measure_ceilings

    times = {"ceiling_bf16": iter([2.0, 1.0, 4.0]), "ceiling_fp32": iter([8.0, 8.0, 9.0]),
             "ceiling_copy": iter([0.5, 0.25, 0.5])}
    seen = []

    def timer(fn, label):
        out = fn()
        seen.append((label, out.dtype))
        return next(times[label])

    before = torch.get_float32_matmul_precision()
    got = measure_ceilings(timer, {"bf16", "fp32"}, device="cpu", size=64, copy_bytes=1 << 20)
    assert torch.get_float32_matmul_precision() == before
    assert got["bf16"] == pytest.approx(2 * 64**3 / 1.0 / 1e9)
    assert got["fp32"] == pytest.approx(2 * 64**3 / 8.0 / 1e9)
    assert got["hbm_gbps"] == pytest.approx(2 * (1 << 20) / 0.25 / 1e6)
    assert ("ceiling_bf16", torch.bfloat16) in seen and ("ceiling_fp32", torch.float32) in seen
