"""sanitize: the entry point's listing, name checks and per-kernel outcome (CPU stand-ins)."""

from __future__ import annotations

import pytest

from cute_kernels.bench import sanitize
from cute_kernels.bench.cases import GemmCase
from cute_kernels.bench.impls import Prepared, Unsupported


def test_list_prints_the_registered_names(capsys, monkeypatch):
    monkeypatch.setattr(sanitize, "kernel_names", lambda: ["gemm.a", "elementwise.copy"])
    assert sanitize.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == ["gemm.a", "elementwise.copy"]


def test_unknown_name_exits_2(monkeypatch):
    monkeypatch.setattr(sanitize, "kernel_names", lambda: ["gemm.a"])
    assert sanitize.main(["gemm.b"]) == 2


def _stand_in(scale):
    def prepare(case, inputs):
        if case.dtype != "fp32":
            raise Unsupported("fp32 only")
        out = case.empty_out(inputs)
        return Prepared(lambda: out.copy_(scale * (inputs["a"] @ inputs["b"].T)), out=out)

    return prepare


@pytest.mark.parametrize("scale, ok", [(1.0, True), (1.5, False)])
def test_run_one_tries_cases_until_one_is_taken(monkeypatch, capsys, scale, ok):
    cases = [GemmCase(20, 12, 8, "bf16"), GemmCase(20, 12, 8, "fp32")]
    monkeypatch.setattr(sanitize, "_candidates", lambda name: (cases, _stand_in(scale)))
    monkeypatch.setattr(sanitize, "kernel_names", lambda: ["gemm.x"])
    assert sanitize.run_one("gemm.x", device="cpu") is ok
    line = capsys.readouterr().out
    assert "gemm.x 20x12x8 fp32" in line and line.splitlines()[0].endswith(" ok") is ok
    assert sanitize.main(["--device", "cpu", "all"]) == (0 if ok else 1)


def test_no_case_taken_is_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(sanitize, "_candidates", lambda name: ([GemmCase(4, 4, 4, "bf16")], _stand_in(1.0)))
    assert sanitize.run_one("gemm.x", device="cpu") is False
    assert "no small case is supported" in capsys.readouterr().out
