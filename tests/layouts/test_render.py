"""Rendering: golden text / SVG / TikZ for small cases, SVG well-formed XML, colours by bank.

Regenerate the golden files after an intended change with ``UPDATE_GOLDEN=1 pytest tests/layouts/test_render.py``.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cute_kernels.layouts import render
from cute_kernels.layouts.atoms import atom
from cute_kernels.layouts.composed import ComposedLayout
from cute_kernels.layouts.layout import Layout
from cute_kernels.layouts.smem_atoms import gmma_smem_atom
from cute_kernels.layouts.swizzle import Swizzle
from cute_kernels.layouts.tiled import make_tiled_mma

GOLDEN = Path(__file__).parent / "golden"
SVG_NS = "{http://www.w3.org/2000/svg}"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8")


CASES = {
    "layout_4x2x2.txt": lambda: render.layout_text(Layout((4, (2, 2)), (2, (1, 8)))),
    "layout_sw32_bf16.txt": lambda: render.layout_text(gmma_smem_atom("K_SW32", "bf16")),
    "atom_sm80_16x8x8.txt": lambda: render.to_text(atom("SM80_16x8x8_F16F16F16F16_TN")),
    "atom_ldsm_x1.txt": lambda: render.to_text(atom("SM75_U32x1_LDSM_N")),
    "layout_4x2x2.svg": lambda: render.to_svg(Layout((4, (2, 2)), (2, (1, 8)))),
    "atom_sm70_8x8x4.svg": lambda: render.to_svg(atom("SM70_8x8x4_F16F16F16F16_TN")),
    "layout_sw32_bf16.tex": lambda: render.to_latex(gmma_smem_atom("K_SW32", "bf16")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    check_golden(name, CASES[name]())


def test_print_layout_matches_cute_grid(capsys):
    render.print_layout(Layout((2, 3), (3, 1)))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "(2,3):(3,1)"
    assert out[3] == "0  | 0 | 1 | 2 |"
    assert out[5] == "1  | 3 | 4 | 5 |"


@pytest.mark.parametrize("obj", [
    Layout((4, (2, 2)), (2, (1, 8))),
    ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1))),
    gmma_smem_atom("MN_SW128", "bf16"),
    atom("SM70_8x8x4_F32F16F16F32_TN"),
    atom("SM90_64x16x16_F32BF16BF16_RS"),
    atom("SM75_U16x8_LDSM_T"),
    make_tiled_mma("SM80_16x8x8_F16F16F16F16_TN", (2, 1, 1)),
])
def test_svg_is_valid_xml(obj):
    svg = render.to_svg(obj)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG_NS}svg"
    cells = list(root.iter(f"{SVG_NS}use"))  # one `use` of the cell shape per cell, rows grouped
    assert len(cells) > 4 and all(c.get("href") == "#c" for c in cells)
    assert root.find(f"{SVG_NS}defs/{SVG_NS}rect").get("id") == "c"
    html = render.to_html(obj)
    assert html.startswith("<div><pre>") and "<svg" in html
    tex = render.to_latex(obj)
    assert "\\begin{tikzpicture}" in tex and tex.count("\\node[cell") == len(cells)


def test_sw128_colours_by_bank():
    """Each row of the SW128 bf16 atom holds all eight bank groups once, in a row-specific order."""
    svg = render.to_svg(gmma_smem_atom("K_SW128", "bf16"))
    classes = dict(re.findall(r"\.(f\d+)\{fill:(#[0-9a-f]+)\}", svg))  # fill class -> colour
    rows = {y: [classes[c] for c in re.findall(r'<use href="#c" x="[^"]+" class="(f\d+)"', row)]
            for y, row in re.findall(r'<g transform="translate\(0 ([^)]+)\)">(.*?)</g>', svg, re.S)}
    assert len(rows) == 8
    firsts = []
    for cells in rows.values():
        chunks = [cells[8 * c] for c in range(8)]
        assert len(set(chunks)) == 8 and all(len(set(cells[8 * c : 8 * c + 8])) == 1 for c in range(8))
        firsts.append(chunks[0])
    assert len(set(firsts)) == 8  # chunk 0 of each row sits in a different bank group


def test_mma_picture_places_a_left_b_above_c_origin():
    pic = render._mma_picture(atom("SM80_16x8x16_F32BF16BF16F32_TN"))
    a, b, c = pic.panels
    assert (a.x, a.y, a.rows, a.cols) == (0, 17, 16, 16)
    assert (b.x, b.y, b.rows, b.cols) == (17, 0, 16, 8)
    assert (c.x, c.y, c.rows, c.cols) == (17, 17, 16, 8)
    assert c.cell(0, 0)[:2] == ("T0", "V0") and c.cell(8, 1)[:2] == ("T0", "V3")
    assert b.cell(1, 0)[:2] == ("T0", "V1")  # B drawn K x N: k=1, n=0 is lane 0's second value


def test_repr_hooks():
    a = atom("SM80_16x8x16_F32BF16BF16F32_TN")
    assert a._repr_svg_().startswith("<svg")
    assert gmma_smem_atom("K_SW128", "bf16")._repr_svg_().startswith("<svg")


def test_repr_hooks_skip_huge_pictures():
    assert render.repr_svg(atom("SM90_64x256x16_F32BF16BF16_SS")) is None
    assert atom("SM90_64x256x16_F32BF16BF16_SS")._repr_svg_() is None
    assert render.repr_html(Layout((128, 128))) is None
    html = render.repr_html(Layout((4, 4)))
    assert html.startswith("<div><pre>(4,4):(1,4)</pre><svg")
    ET.fromstring(html[html.index("<svg"):-len("</div>")])
