"""The `cute-kernels layout | atom | conflicts` subcommands, run through the real dispatcher."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

from cute_kernels.cli import main


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_layout_prints_grid(capsys):
    rc, out, _ = run(capsys, "layout", "(4,(2,2)):(2,(1,8))")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "(4,(2,2)):(2,(1,8))"
    assert lines[3].split("|")[1:5] == ["  0 ", "  1 ", "  8 ", "  9 "]


def test_layout_swizzled_with_dtype_and_svg(capsys, tmp_path):
    svg = tmp_path / "sw.svg"
    html = tmp_path / "sw.html"
    rc, out, _ = run(capsys, "layout", "Sw<3,4,3> o 0 o (8,64):(64,1)", "--dtype", "bf16", "--svg", str(svg), "--html", str(html))
    assert rc == 0
    assert "widest vector access: 128-bit vectors (8 elements)" in out
    # row 1 under the byte swizzle: chunk c of row 1 holds elements of chunk c^1
    row1 = [int(x) for x in out.splitlines()[5].split("|")[1:-1]]
    assert row1[:9] == [72, 73, 74, 75, 76, 77, 78, 79, 64]
    ET.fromstring(svg.read_text())
    page = html.read_text()  # the interactive page (tests/layouts/test_html.py drives it in a browser)
    assert '<script id="data" type="application/json">' in page and '"layout": "Sw<3,4,3> o 0 o (8,64):(64,1)"' in page


def test_atom_shows_three_tv_layouts(capsys):
    rc, out, _ = run(capsys, "atom", "SM80_16x8x16_F32BF16BF16F32_TN")
    assert rc == 0
    assert "A bf16" in out and "B bf16" in out and "C f32" in out
    assert "A: ((4,8),(2,2,2)):((32,1),(16,8,128))" in out
    assert " T0V0 " in out


def test_atom_large_omits_grids_and_lists(capsys):
    rc, out, _ = run(capsys, "atom", "SM90_64x256x16_F32BF16BF16_SS")
    assert rc == 0 and "grids omitted" in out
    rc, out, _ = run(capsys, "atom", "--list", "SM75")
    assert out.split() == ["SM75_U32x1_LDSM_N", "SM75_U32x2_LDSM_N", "SM75_U32x4_LDSM_N",
                           "SM75_U16x2_LDSM_T", "SM75_U16x4_LDSM_T", "SM75_U16x8_LDSM_T"]


def test_atom_html_is_text_and_svg(capsys, tmp_path):
    html = tmp_path / "atom.html"
    rc, _, _ = run(capsys, "atom", "SM80_16x8x16_F32BF16BF16F32_TN", "--html", str(html))
    assert rc == 0 and "<svg" in html.read_text()


def test_atom_smem_atom_by_name(capsys):
    rc, out, _ = run(capsys, "atom", "GMMA::Layout_K_SW128_Atom<bf16>")
    assert rc == 0 and "Sw<3,4,3> o 0 o (8,64):(64,1)" in out


def test_conflicts_headline_figures(capsys):
    rc, out, _ = run(capsys, "conflicts", "--smem", "Sw<3,4,3> o 0 o (8,64):(64,1)", "--dtype", "bf16", "--access", "ldmatrix_x4")
    assert rc == 0
    assert "wavefronts per instruction: 4 (ideal 4" in out and "conflict-free" in out
    rc, out, _ = run(capsys, "conflicts", "--smem", "(8,64):(64,1)", "--dtype", "bf16", "--access", "ldmatrix_x4")
    assert "wavefronts per instruction: 32 (ideal 4" in out and "8-way bank conflict" in out
    rc, out, _ = run(capsys, "conflicts", "--gmem", "(64,64):(64,1)", "--dtype", "bf16", "--access", "vec128")
    assert "sectors per request: 16 (ideal 16" in out and "efficiency 100.0%" in out


def test_errors_are_one_line(capsys):
    rc, _, err = run(capsys, "atom", "SM80_NOPE")
    assert rc == 2 and err.startswith("cute-kernels atom: no atom named 'SM80_NOPE'")
    rc, _, err = run(capsys, "conflicts", "--smem", "(8,6):(6,1)", "--access", "ldmatrix_x4")
    assert rc == 2 and "does not split" in err
    rc, _, err = run(capsys, "conflicts", "--access", "vec128")
    assert rc == 2


def test_layout_command_does_not_import_torch_or_dsl():
    code = (
        "import sys; from cute_kernels.cli import main; main(['layout', '(2,2):(1,2)']); "
        "bad = [m for m in ('torch', 'cutlass', 'hypothesis') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
