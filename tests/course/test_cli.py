"""scripts/course_figures.py: the command line over the figure registry."""

from __future__ import annotations

import pytest

from cute_kernels.course.__main__ import _select, main


def test_list_names_every_figure_with_its_page_and_needs(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "01-gpus.md" in out and "roofline" in out and "gpu" in out and "compile" in out


def test_only_takes_names_and_kinds():
    from cute_kernels.course.core import FIGURES

    assert _select("roofline,masks", ("cpu",)) == {"roofline", "masks"}
    assert _select("gpu", ("cpu",)) == {n for n, f in FIGURES.items() if f.needs == "gpu"}
    with pytest.raises(SystemExit, match="no figure or kind named 'nope'"):
        _select("nope", ("cpu",))


def test_a_mode_is_required(capsys):
    with pytest.raises(SystemExit):
        main([])


def test_gpu_measurements_are_stored_one_by_one_and_failures_recorded(tmp_path, monkeypatch):
    import json

    import cute_kernels.bench.environment as env
    from cute_kernels.course.__main__ import measure_gpu
    from cute_kernels.course.core import FIGURES, Figure

    monkeypatch.setattr(env, "device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(env, "versions", lambda device: {"torch": "2.11"})

    def bad():
        raise AssertionError("probe disagrees with its reference")

    monkeypatch.setitem(FIGURES, "zz_good", Figure("zz_good", "01-gpus.md", "gpu", lambda ctx: "", lambda: {"x": 1}))
    monkeypatch.setitem(FIGURES, "zz_bad", Figure("zz_bad", "01-gpus.md", "gpu", lambda ctx: "", bad))
    path, failed = measure_gpu({"zz_good", "zz_bad"}, tmp_path)
    data = json.loads(path.read_text())
    assert path.name == "gpu-h200.json" and failed == ["zz_bad"]
    assert data["figures"]["zz_good"] == {"x": 1} and "disagrees" in data["figures"]["zz_bad"]["error"]
    path, _ = measure_gpu({"zz_good"}, tmp_path, budget_s=-1)  # nothing starts: earlier numbers are kept
    assert json.loads(path.read_text())["figures"]["zz_good"] == {"x": 1}
