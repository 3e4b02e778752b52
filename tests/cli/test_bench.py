"""`cute-kernels bench`: argument parsing, validation, and a CPU run end to end."""

from __future__ import annotations

import json

import pytest

from cute_kernels.cli import build_parser, main


def parse(*argv):
    return build_parser("bench").parse_args(["bench", *argv])


def test_parses_defaults_and_options():
    args = parse("gemm")
    assert (args.suite, args.impl, args.rounds, args.warmup_ms, args.rep_ms, args.timer) == ("gemm", None, 5, 25.0, 100.0, "auto")
    args = parse("attention", "--impl", "sdpa_flash,fa4", "--cases", "B1_H2_S128_D64", "--json", "a.json",
                 "--plot", "a.png", "--compare", "o1.json", "--compare", "o2.json", "--rounds", "3")
    assert args.impl == "sdpa_flash,fa4" and args.cases == "B1_H2_S128_D64" and args.compare == ["o1.json", "o2.json"]
    assert (args.json, args.plot, args.rounds) == ("a.json", "a.png", 3)


def test_rejects_unknown_suite(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("matmul")
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["gemm", "--rounds", "0"], "--rounds"),
    (["all", "--json", "x.json"], "--out-dir"),
    (["gemm", "--ceilings", "c.json", "--no-ceilings"], "contradict"),
])
def test_validation_errors(argv, message):
    with pytest.raises(SystemExit, match=message):
        main(["bench", *argv])


def test_unknown_impl_is_a_clear_error(capsys):
    assert main(["bench", "gemm", "--device", "cpu", "--impl", "nope", "--cases", "16x16x16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cute-kernels bench: --impl: unknown impl 'nope'; known here: naive,") and err.count("\n") == 1


def test_list(capsys):
    assert main(["bench", "copy", "--list"]) == 0
    out = capsys.readouterr().out
    assert "16MiB:bf16" in out and "torch_copy" in out and "cute_kernels" in out


def test_cpu_run_writes_json_and_plot_and_compares(tmp_path, capsys):
    argv = ["bench", "gemm", "--device", "cpu", "--impl", "cublas", "--cases", "64x32x16,32x32x32:fp32",
            "--rounds", "2", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (json_path,) = tmp_path.glob("*-gemm-cpu.json")
    assert json_path.with_suffix(".png").stat().st_size > 1000
    data = json.loads(json_path.read_text())
    assert data["suite"] == "gemm" and data["device"] == "cpu"
    assert [(r["case"], r["impl"], r["dtype"]) for r in data["records"]] == [
        ("64x32x16", "cublas", "bf16"), ("32x32x32", "cublas", "fp32")]
    assert all(r["ok"] and r["ms"] > 0 and r["rel_err"] < 1e-2 for r in data["records"])
    assert "| 64x32x16" in out and f"wrote {json_path}" in out

    # A doctored earlier run at 1 ns per call: every case is a regression, exit status 3.
    for r in data["records"]:
        r["ms"] = 1e-6
        r["spread"] = 0.01
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert main(argv[:-2] + ["--compare", str(old)]) == 3
    assert "2 regression(s) in 2 matched" in capsys.readouterr().out


def test_overhead_impl_names_apply_per_case(capsys):
    assert main(["bench", "overhead", "--device", "cpu", "--impl", "cublas,nope"]) == 2
    assert "unknown impl(s) ['nope'] for overhead" in capsys.readouterr().err
