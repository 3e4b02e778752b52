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
