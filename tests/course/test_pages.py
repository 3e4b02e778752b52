"""docs/course/: 26 numbered pages, each a doctested session with at least one generated block.

Pages whose sessions need the CuTe DSL (they compile a kernel for sm_90a, or import a DSL module)
run in the `compile` tier; the others anywhere."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COURSE = ROOT / "docs" / "course"
PAGES = sorted(p.name for p in COURSE.glob("[0-9][0-9]-*.md"))
DSL_PAGES = {"02-programming-model.md", "07-registers-ilp.md", "11-gemm-simt.md", "16-warp-specialization.md"}


def _run(page: str, monkeypatch) -> doctest.TestResults:
    monkeypatch.chdir(ROOT)  # the sessions read docs/results/ relative to the repository root
    return doctest.testfile(str(COURSE / page), module_relative=False, verbose=False,
                            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)


def test_the_course_has_its_26_pages_in_order():
    assert [int(p[:2]) for p in PAGES] == list(range(1, 27))
    index = (COURSE / "index.md").read_text()
    assert [m for m in re.findall(r"\]\((\d\d-[\w-]+\.md)\)", index)] == PAGES


@pytest.mark.parametrize("page", [p for p in PAGES if p not in DSL_PAGES])
def test_page_session(page, monkeypatch):
    result = _run(page, monkeypatch)
    assert result.attempted > 0, f"{page} has no doctested code"
    assert result.failed == 0


@pytest.mark.compile
@pytest.mark.parametrize("page", sorted(DSL_PAGES))
def test_page_session_with_the_dsl(page, monkeypatch):
    result = _run(page, monkeypatch)
    assert result.attempted > 0, f"{page} has no doctested code"
    assert result.failed == 0


@pytest.mark.parametrize("page", PAGES)
def test_page_has_code_and_a_generated_figure_or_table(page):
    from cute_kernels.course.core import load_figures, page_blocks

    FIGURES = load_figures()

    text = (COURSE / page).read_text()
    assert "```python" in text, f"{page} shows no code"
    names = page_blocks(text)
    assert names, f"{page} has no generated block"
    for name in names:
        assert name in FIGURES, f"{page}: block {name!r} has no registered figure"
        assert FIGURES[name].page == page, f"{page}: block {name!r} is registered for {FIGURES[name].page}"
    assert "BEGIN GENERATED: course" not in text.split("<!-- END GENERATED -->")[-1]


def test_every_registered_figure_appears_on_its_page():
    from cute_kernels.course.core import load_figures, page_blocks

    FIGURES = load_figures()

    for name, fig in FIGURES.items():
        assert name in page_blocks((COURSE / fig.page).read_text()), f"figure {name!r} is not on {fig.page}"


def test_every_image_a_page_shows_exists_and_is_small():
    total = 0
    for page in PAGES:
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (COURSE / page).read_text()):
            path = (COURSE / target).resolve()
            assert path.is_file(), f"{page} shows {target}, which does not exist"
            assert path.stat().st_size < 100_000, f"{target} is {path.stat().st_size} bytes"
            total += path.stat().st_size
    assert total < 1_000_000
