"""The interactive layout page, in a real headless browser (Debian's chromium, driven without a
driver: --dump-dom and --screenshot on URLs whose fragment sets the layout and the hovered cell).

The page evaluates layouts itself (in JavaScript), so the tests compare what the browser shows
with what the Python workbench computes: every cell's offset, the tooltip of a hovered cell
(coordinate, index, offset, bank, thread and value), and the live bank-conflict count, before and
after editing the layout. They skip only where no chromium can be found (CI installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.parse
from html import unescape
from pathlib import Path

import pytest

from cute_kernels.cli import main
from cute_kernels.layouts import Layout, bank_conflicts
from cute_kernels.layouts.analysis import element_offset_fn, warp_accesses
from cute_kernels.layouts.html import layout_page
from cute_kernels.layouts.parse import as_layout

SWIZZLED = "Sw<3,4,3> o 0 o (8,64):(64,1)"
BROWSER = next((b for b in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if b), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no chromium (CI installs Debian's chromium package)")


def _browser(tmp_path: Path, page: Path, fragment: str, *mode: str) -> str:
    url = page.resolve().as_uri() + "#" + fragment
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp_path / 'profile'}", *mode, url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _dom(tmp_path, page, **fragment) -> str:
    return _browser(tmp_path, page, urllib.parse.urlencode(fragment, quote_via=urllib.parse.quote), "--dump-dom")


def _text(dom: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert m, element_id
    return unescape(m.group(1))


def _cells(dom: str) -> dict[tuple[int, int], int]:
    return {(int(r), int(c)): int(v) for r, c, v in re.findall(r'<td data-r="(\d+)" data-c="(\d+)"[^>]*>(-?\d+)</td>', dom)}


def _expected_tooltip(layout_text: str, dtype: str, access: str, r: int, c: int) -> str:
    layout = as_layout(layout_text)
    rows = layout.shape[0] if isinstance(layout.shape[0], int) else None
    i = r + rows * c
    offset = element_offset_fn(layout, 16)(i)
    lanes = warp_accesses(layout, dtype, access)
    owner = next((k, t, v) for k, instr in enumerate(lanes) for t, offs in enumerate(instr) for v, o in enumerate(offs)
                 if o == offset)
    return (f"({r}, {c}) = index {i} \u2192 offset {offset} \u00b7 bank {(2 * offset // 4) % 32} (byte {2 * offset}) "
            f"\u00b7 thread {owner[1]}, value {owner[2]} (instruction {owner[0]}, phase {owner[1] // 8})")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("page") / "layout.html"
    assert main(["layout", SWIZZLED, "--dtype", "bf16", "--access", "ldmatrix_x4", "--html", str(path)]) == 0
    return path


def test_the_page_is_self_contained(page):
    html = page.read_text()
    assert "http://" not in html and "https://" not in html and " src=" not in html
    assert '<script id="data" type="application/json">' in html and '"name": "ldmatrix_x4"' in html


@needs_browser
def test_hover_shows_coordinate_index_bank_and_thread(tmp_path, page):
    dom = _dom(tmp_path, page, hover="2,3")
    assert _text(dom, "error") == ""
    assert _text(dom, "tooltip") == _expected_tooltip(SWIZZLED, "bf16", "ldmatrix_x4", 2, 3)
    assert _text(dom, "tooltip").startswith("(2, 3) = index 26 \u2192 offset 147 \u00b7 bank 9")
    assert _text(dom, "summary") == str(bank_conflicts(SWIZZLED, "ldmatrix_x4", "bf16"))
    offset = element_offset_fn(as_layout(SWIZZLED), 16)
    assert _cells(dom) == {(r, c): offset(r + 8 * c) for r in range(8) for c in range(64)}


@needs_browser
def test_editing_the_layout_recounts_the_conflicts(tmp_path, page):
    plain = "(8,64):(64,1)"
    dom = _dom(tmp_path, page, layout=plain, dtype="bf16", hover="5,17")
    assert _text(dom, "summary") == str(bank_conflicts(plain, "ldmatrix_x4", "bf16"))  # the 8-way conflict
    assert _text(dom, "tooltip") == _expected_tooltip(plain, "bf16", "ldmatrix_x4", 5, 17)
    nested = "Sw<2,4,-3> o 0 o ((2,4),(8,8)):((256,64),(1,8))"
    dom = _dom(tmp_path, page, layout=nested, dtype="bf16")
    offset = element_offset_fn(as_layout(nested), 16)
    assert _cells(dom) == {(r, c): offset(r + 8 * c) for r in range(8) for c in range(64)}
    assert _text(dom, "summary") == str(bank_conflicts(nested, "ldmatrix_x4", "bf16"))
    dom = _dom(tmp_path, page, layout="(8,64):(64,", dtype="bf16")
    assert _text(dom, "error").startswith("expected")


@needs_browser
def test_a_huge_layout_is_drawn_as_its_corner(tmp_path):
    path = tmp_path / "huge.html"
    path.write_text(layout_page(Layout((100000, 100000), (1, 100000))))
    dom = _dom(tmp_path, path)
    cells = _cells(dom)
    assert len(cells) == 128 * 128 and cells[(127, 127)] == 127 + 127 * 100000
    assert _text(dom, "note").startswith("showing rows 0-127 and columns 0-127 of the 100000 x 100000 grid")


@needs_browser
def test_screenshot_shows_the_grid_and_the_hovered_cell(tmp_path, page):
    from PIL import Image

    shot = tmp_path / "shot.png"
    _browser(tmp_path, page, "hover=2,3", f"--screenshot={shot}", "--window-size=1400,700")
    image = Image.open(shot).convert("RGB")
    counts = {colour: n for n, colour in image.getcolors(image.width * image.height)}
    coloured = 1 - counts.get((255, 255, 255), 0) / (image.width * image.height)
    magenta = counts.get((255, 0, 255), 0)  # the hovered cell's fill
    assert image.size == (1400, 700) and coloured > 0.2 and magenta > 300, (coloured, magenta)
