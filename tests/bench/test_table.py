"""table: the Markdown results table."""

from __future__ import annotations

from cute_kernels.bench.records import Record
from cute_kernels.bench.table import FUZZ_HEADERS, HEADERS, format_table


def test_table_rows_and_formatting():
    recs = [
        Record("4096x4096x4096", "sm90_persistent", "bf16", tflops=712.34, ms=0.19294, rel_err=2.5e-3, kind="ours",
               flops=2 * 4096**3, gbps=521.7, pct_ceiling=94.71, ratio_to_best_peer=1.0234, spread=0.0123),
        Record("4096x4096x4096", "cublas", "bf16", tflops=696.0, ms=0.19747, rel_err=2.4e-3, flops=2 * 4096**3,
               gbps=510.0, pct_ceiling=92.5, ratio_to_best_peer=1.0, spread=0.02),
        Record("4096x4096x4096", "naive", "bf16", tflops=None, ms=None, rel_err=0.5, ok=False, kind="ours",
               flops=2 * 4096**3, error="rel_err 0.5 above tolerance 0.01 " + "x" * 200),
    ]
    lines = format_table(recs).splitlines()
    assert len(lines) == 2 + len(recs)
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(HEADERS)
    assert len({len(line) for line in lines}) == 1  # aligned
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:11] == ["4096x4096x4096", "bf16", "sm90_persistent*", "0.1929", "712.3", "522", "94.7", "1.02x",
                          "2.5e-03", "1.2%", "ok"]
    failed = [c.strip() for c in lines[4].strip("|").split("|")]
    assert failed[3] == "-" and failed[4] == "-" and failed[8] == "5.0e-01"
    assert failed[10].startswith("FAIL: rel_err 0.5") and failed[10].endswith("...") and len(failed[10]) < 90


def test_copy_rows_show_no_tflops():
    rec = Record("256MiB", "torch_copy", "bf16", tflops=0.0, ms=0.125, rel_err=0.0, flops=0.0, gbps=4294.0)
    cells = [c.strip() for c in format_table([rec]).splitlines()[2].strip("|").split("|")]
    assert cells[4] == "-" and cells[5] == "4294"


def test_fuzz_records_get_the_fuzz_columns():
    recs = [Record("random_2000", "auto", "mixed", tflops=None, ms=None, rel_err=2.5e-3, kind="ours",
                   extra={"cases": 2000, "wrong": 0, "errors": 1, "seed": 17}),
            Record("fp16_d64", "cute_kernels", "float16", tflops=None, ms=None, rel_err=None, kind="ours",
                   extra={"cases": 150, "wrong": 3, "worst_error_to_bound": 0.814})]
    lines = format_table(recs).splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(FUZZ_HEADERS)
    assert [c.strip() for c in lines[2].strip("|").split("|")] == ["random_2000", "mixed", "auto*", "2000", "0", "1",
                                                                   "2.5e-03", "-", "17"]
    assert [c.strip() for c in lines[3].strip("|").split("|")][3:] == ["150", "3", "0", "-", "0.81", "-"]
    # a timed record among them keeps the timing columns for the whole table
    timed = Record("1x1x1", "cublas", "bf16", tflops=1.0, ms=0.5, rel_err=0.0)
    assert [c.strip() for c in format_table(recs + [timed]).splitlines()[0].strip("|").split("|")] == list(HEADERS)
