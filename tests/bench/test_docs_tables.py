"""docs_tables: generated blocks in the docs are filled from the newest result of their suite."""

from __future__ import annotations

from pathlib import Path

from cute_kernels.bench.docs_tables import fill_page, main, newest_result
from cute_kernels.bench.records import BenchResult, Record


def _write(results: Path, date: str, suite: str, rate: float) -> Path:
    recs = [Record("4096x4096x4096", "sm90_persistent", "bf16", tflops=rate, ms=0.2, rel_err=1.5e-3, kind="ours",
                   flops=1.37e11, ratio_to_best_peer=rate / 700.0),
            Record("4096x4096x4096", "cublas", "bf16", tflops=700.0, ms=0.19, rel_err=1.4e-3, flops=1.37e11)]
    result = BenchResult(date, "NVIDIA H200", {"torch": "2.11.0"}, suite, recs)
    return result.write(results / f"{date}-{suite}-h200.json")


def test_the_newest_result_of_the_suite_fills_the_block(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    _write(results, "2026-11-29", "gemm", 650.0)
    newest = _write(results, "2026-11-30", "gemm", 712.5)
    _write(results, "2026-12-01", "ladder", 1.0)  # another suite, newer: ignored
    assert newest_result(results, "gemm") == newest
    page = tmp_path / "page.md"
    page.write_text("# Page\n<!-- BEGIN GENERATED: results gemm sm90_persistent -->\nold text\n"
                    "<!-- END GENERATED -->\ntail\n")
    text, missing = fill_page(page, results)
    assert missing == []
    assert "old text" not in text and text.endswith("<!-- END GENERATED -->\ntail\n")
    assert "712.5" in text and "650.0" not in text  # the newest run, not an older one
    assert "cublas" not in text.split("<!-- BEGIN")[1]  # only the listed implementations
    assert "(results/2026-11-30-gemm-h200.json)" in text and "torch 2.11.0" in text


def test_a_block_without_results_is_left_alone_and_reported(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    page = tmp_path / "page.md"
    original = "<!-- BEGIN GENERATED: results attention -->\nplaceholder\n<!-- END GENERATED -->\n"
    page.write_text(original)
    assert main([str(page), "--results", str(tmp_path / "results")]) == 0
    assert page.read_text() == original
    assert "no results for suite 'attention'" in capsys.readouterr().err


def test_a_result_made_by_another_command_names_that_command(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    rec = Record("B8_S4096", "cute_kernels", "bf16", tflops=500.0, ms=90.0, rel_err=1e-2, kind="ours", flops=4.5e13)
    BenchResult("2026-11-30", "NVIDIA H200", {}, "transformer", [rec],
                settings={"command": "python examples/transformer_block.py"}).write(
        results / "2026-11-30-transformer-h200.json")
    page = tmp_path / "page.md"
    page.write_text("<!-- BEGIN GENERATED: results transformer -->\n<!-- END GENERATED -->\n")
    text, _ = fill_page(page, results)
    assert "Measured by `python examples/transformer_block.py`" in text


def test_a_summary_block_gives_the_ratios_not_the_table(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    _write(results, "2026-11-30", "gemm", 630.0)
    page = tmp_path / "page.md"
    page.write_text("<!-- BEGIN GENERATED: summary gemm -->\n<!-- END GENERATED -->\n")
    text, missing = fill_page(page, results)
    assert missing == [] and "| case" not in text  # no table
    assert "`cute-kernels bench gemm` on NVIDIA H200, 2026-11-30" in text and "1 case, 2 records" in text
    assert "`sm90_persistent`: 0.90x the fastest peer (geomean of 1), worst 0.90x (4096x4096x4096)" in text
    assert "(results/2026-11-30-gemm-h200.json)" in text


def test_a_classes_block_groups_gemm_shapes_by_class(tmp_path):
    from cute_kernels.bench.model_shapes import shape_class

    assert shape_class("1x128256x2048") == "M ≤ 16 (GEMV, decode)"
    assert shape_class("768x768x12608_am_bn") == "training dW = Xᵀ·dY"
    assert shape_class("12608x768x3072_bn") == "training dX = dY·W"
    assert shape_class("2048x2048x4100") == "K or N not a multiple of 8"
    assert shape_class("128x2048x8192") == "M 17-128 (decode batches)"
    assert shape_class("12608x2304x768_bias") == "forward with bias"
    assert shape_class("8192x3072x2048") == "forward (prefill, M ≥ 256)"
    ours = [("1x4096x4096", 0.5), ("8x4096x4096", 0.8), ("8192x3072x2048", 1.1)]
    recs = [Record(case, "auto", "bf16", tflops=1.0, ms=0.1, rel_err=1e-3, kind="ours", ratio_to_best_peer=ratio)
            for case, ratio in ours]
    recs += [Record(case, "cublas", "bf16", tflops=1.0, ms=0.1, rel_err=1e-3) for case, _ in ours]
    results = tmp_path / "results"
    BenchResult("2026-12-05", "NVIDIA H100", {}, "gemm_shapes", recs).write(results / "2026-12-05-gemm_shapes-h100.json.gz")
    page = tmp_path / "page.md"
    page.write_text("<!-- BEGIN GENERATED: classes gemm_shapes -->\n<!-- END GENERATED -->\n")
    text, missing = fill_page(page, results)
    assert missing == []
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`auto`" in line]
    # worst class first; the GEMV class holds two cases: geomean sqrt(0.5 * 0.8) = 0.63
    assert rows[0] == "| M ≤ 16 (GEMV, decode) | `auto` | 2 | 0.63x | 0.50x (1x4096x4096) | 2 | 2 |"
    assert rows[1] == "| forward (prefill, M ≥ 256) | `auto` | 1 | 1.10x | 1.10x (8192x3072x2048) | 0 | 0 |"
    assert "(results/2026-12-05-gemm_shapes-h100.json.gz)" in text
