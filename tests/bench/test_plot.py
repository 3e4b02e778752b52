"""plot: a valid, small PNG for compute, memory and host-overhead results (Agg)."""

from __future__ import annotations

import pytest

from cute_kernels.bench.plot import MAX_PNG_BYTES, plot_result
from cute_kernels.bench.records import BenchResult, Record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _gemm_result():
    recs = []
    for i, size in enumerate((2048, 4096, 8192, 16384)):
        flops, nbytes = 2.0 * size**3, 6.0 * size**2
        for impl, kind, rate in (("sm90_persistent", "ours", 650 + 10 * i), ("cublas", "peer", 700), ("quack", "peer", 600)):
            ms = flops / rate / 1e9
            recs.append(Record(f"{size}x{size}x{size}", impl, "bf16", tflops=rate, ms=ms, rel_err=2e-3, kind=kind,
                               flops=flops, bytes=nbytes, gbps=nbytes / ms / 1e6))
    recs.append(Record("2048x2048x2048", "naive", "bf16", None, None, 0.3, ok=False, kind="ours", flops=1.0, bytes=1.0))
    return BenchResult("2026-11-30", "NVIDIA H200", {}, "gemm", recs, ceilings={"bf16": 760.0, "hbm_gbps": 4300.0})


def _copy_result():
    recs = [Record(f"{m}MiB", impl, "bf16", tflops=0.0, ms=2 * m / 4000.0, rel_err=0.0, flops=0.0,
                   bytes=2.0 * (m << 20), gbps=bw, kind=kind)
            for m in (16, 64, 256) for impl, kind, bw in (("cute_kernels", "ours", 3900.0), ("torch_copy", "peer", 3800.0))]
    return BenchResult("2026-11-30", "NVIDIA H200", {}, "copy", recs, ceilings={"hbm_gbps": 4300.0})


def _overhead_result():
    recs = [Record("256x256x256", "cute_kernels", "bf16", tflops=0.0, ms=0.021, rel_err=1e-3, kind="ours"),
            Record("256x256x256", "cublas", "bf16", tflops=0.0, ms=0.018, rel_err=1e-3)]
    return BenchResult("2026-11-30", "NVIDIA H200", {}, "overhead", recs)


def _many_cases_result():
    """More cases than bars can show (`plot.MANY_CASES`): the left pane draws sorted ratios."""
    from cute_kernels.bench.plot import MANY_CASES

    recs = []
    for i in range(MANY_CASES + 10):
        flops, nbytes, ms = 2.0e12, 6.0e8, 1.0 + i / 100
        recs += [Record(f"{1000 + i}x4096x4096", "auto", "bf16", tflops=flops / ms / 1e9, ms=ms, rel_err=2e-3, kind="ours",
                        flops=flops, bytes=nbytes, ratio_to_best_peer=1.0 / ms),
                 Record(f"{1000 + i}x4096x4096", "cublas", "bf16", tflops=flops / 1e9, ms=1.0, rel_err=2e-3,
                        flops=flops, bytes=nbytes)]
    return BenchResult("2026-12-05", "NVIDIA H100", {}, "gemm_shapes", recs, ceilings={"bf16": 800.0})


@pytest.mark.parametrize("make", [_gemm_result, _copy_result, _overhead_result, _many_cases_result])
def test_plot_writes_a_small_png(tmp_path, make):
    path = plot_result(make(), tmp_path / "sub" / "plot.png")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert 2_000 < len(data) <= MAX_PNG_BYTES
    from PIL import Image

    with Image.open(path) as image:
        image.verify()
        assert image.size[0] >= 400 and image.size[1] >= 250


def test_plot_refuses_an_impossible_budget(tmp_path):
    with pytest.raises(RuntimeError, match="bytes"):
        plot_result(_gemm_result(), tmp_path / "p.png", max_bytes=100)


def test_report_entry_redraws_plots_from_json(tmp_path, capsys):
    from cute_kernels.bench.report import main

    path = _gemm_result().write(tmp_path / "2026-11-30-gemm-h200.json")
    assert main([str(path), "--compare", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| 4096x4096x4096" in out and "0 regression(s)" in out
    assert (tmp_path / "2026-11-30-gemm-h200.png").read_bytes()[:8] == PNG_MAGIC
