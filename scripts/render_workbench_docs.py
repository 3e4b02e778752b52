"""Regenerate docs/workbench.md and its pictures (docs/img/workbench/) from the code itself.

    python scripts/render_workbench_docs.py

Every ``>>>`` block is produced by running its statements (in one namespace, as doctest will) and
writing what the prompt shows; every console block by running the command through the real
``cute-kernels`` dispatcher; every picture by the renderer (the page's screenshot by headless
chromium, when it is installed). tests/layouts/test_docs.py runs the page as a doctest and
re-runs its console blocks, so the page cannot drift from what the workbench does.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cute_kernels.cli import main as cli_main  # noqa: E402
from cute_kernels.layouts import render  # noqa: E402

IMG = ROOT / "docs" / "img" / "workbench"
PAGE = ROOT / "docs" / "workbench.md"
NS: dict = {}  # the doctest namespace: one for the whole page


def picture(name: str, obj, dtype=None, **kw) -> str:
    """Write obj's SVG under docs/img/workbench and return the markdown that shows it."""
    IMG.mkdir(parents=True, exist_ok=True)
    (IMG / f"{name}.svg").write_text(render.to_svg(obj, dtype, **kw), encoding="utf-8")
    return f"![{name}](img/workbench/{name}.svg)"


def _run_cli(command: str, cwd: str) -> str:
    argv = shlex.split(command)[1:]
    buf = io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(buf):
            rc = cli_main(argv)
    finally:
        os.chdir(here)
    if rc:
        raise SystemExit(f"{command!r} exited {rc}")
    return buf.getvalue().rstrip()


def cli(command: str, head: int | None = None) -> str:
    """A console block: the command and what `cute-kernels` printed (its first ``head`` lines and
    '...' when cut). Commands run in a scratch directory, so files they write go nowhere."""
    with tempfile.TemporaryDirectory() as cwd:
        out = _run_cli(command, cwd)
    if head is not None and out.count("\n") >= head:
        out = "\n".join(out.splitlines()[:head]) + "\n..."
    return f"```console\n$ {command}\n{out}\n```"


def repl(*statements: str) -> str:
    """A doctest block: each statement run in NS; an expression's value shown as the prompt shows
    it (its repr), printed output as printed, an exception as doctest expects it."""
    lines = []
    for stmt in statements:
        first, *rest = stmt.split("\n")
        lines.append(f">>> {first}")
        lines += [f"... {r}" for r in rest]
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                try:
                    code = compile(stmt, "<doc>", "eval")
                except SyntaxError:
                    exec(compile(stmt, "<doc>", "exec"), NS)
                    value = None
                else:
                    value = eval(code, NS)
            out = buf.getvalue()
            if value is not None:
                out += repr(value) + "\n"  # what the prompt shows
        except Exception as err:  # noqa: BLE001 - shown as the doctest of an exception
            last = traceback.format_exception_only(type(err), err)[-1].rstrip()
            out = "Traceback (most recent call last):\n...\n" + last + "\n"
        lines += [line if line.strip() else "<BLANKLINE>" for line in out.rstrip("\n").split("\n") if out]
    return "```python\n" + "\n".join(lines) + "\n\n```"


def page_screenshot(name: str, page_path: Path, fragment: str) -> str:
    """A PNG of the interactive page in headless chromium (kept as it is when chromium is missing)."""
    target = IMG / f"{name}.png"
    browser = next((b for b in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if b), None)
    if browser is None:
        print(f"(no chromium: {target.name} not regenerated)")
    else:
        with tempfile.TemporaryDirectory() as profile:
            raw = Path(profile) / "shot.png"
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                            f"--user-data-dir={profile}", f"--screenshot={raw}", "--window-size=1100,430",
                            page_path.resolve().as_uri() + "#" + fragment], check=True, capture_output=True, timeout=180)
            from PIL import Image

            Image.open(raw).convert("RGB").quantize(64).save(target, optimize=True)
    return f"![{name}](img/workbench/{name}.png)"


def page() -> str:
    from cute_kernels.layouts import (
        Layout, atom, atom_names, complement, composition, explain, find_swizzle, gmma_smem_atom,
    )
    from cute_kernels.layouts.html import layout_page

    NS.clear()
    mma = atom("SM80_16x8x16_F32BF16BF16F32_TN")
    sw128 = gmma_smem_atom("K_SW128", "bf16")
    row_major = Layout((8, 64), (64, 1))
    found = find_swizzle((64, 64), "bf16", ["ldmatrix_x4"])
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "sw128.html"
        html.write_text(layout_page("Sw<3,4,3> o 0 o (8,64):(64,1)", "bf16", "ldmatrix_x4"), encoding="utf-8")
        shot = page_screenshot("layout_page", html, "hover=2,3")
    return f"""# The layout workbench

`cute_kernels.layouts` is CuTe's layout algebra in pure Python; this page is about the parts that
look at *hardware*: the MMA and copy atoms (`atoms`), tiling them over a block (`tiled`), the
memory-access analysis (`analysis`) and drawing all of it (`render`); then what no other layout
tool has: the F2 view (`f2`), a search for conflict-free swizzles (`swizzle_search`), `explain`
(the steps of an operation) and an interactive page (`html`). The `cute-kernels layout | atom |
conflicts` commands expose the same. None of it imports torch or the CuTe DSL, so it runs anywhere.
Every output and picture below is generated by `scripts/render_workbench_docs.py`, and the page is
a doctest (`tests/layouts/test_docs.py`), console blocks included.

{repl("from cute_kernels.layouts import *")}

## Atoms by CuTe's names

An atom is one instruction described as data, exactly as CuTe's `MMA_Traits` record it: the shape
M x N x K, the thread layout `thr_id`, and three TV layouts mapping `(thread, value)` to the
column-major index of the A (M x K), B (N x K) and C (M x N) tiles.

{repl('atom("SM80_16x8x16_F32BF16BF16F32_TN")')}

The registry covers SM70 `mma.sync.m8n8k4` (the quad pair: `thr_id = (4,2):(1,16)`, lanes 0-3 and
16-19; `_TN/_NT/_NN/_TT`, fp16 and fp32 accumulators), SM80 `m16n8k8`/`m16n8k16` (fp16, bf16) and
`m16n8k32` (s8/u8, and SM89 e4m3/e5m2), and SM90 `wgmma` 64 x N x 16 (fp16/bf16) and 64 x N x 32
(fp8, int8) for N = 8 .. 256 in steps of 8, in the `_SS` (both operands from shared-memory
descriptors: a stride-0 thread mode) and `_RS` (A in registers) forms. `atom_names()` lists all
{len(atom_names())} names. Copy atoms (`SM75_U32x4_LDSM_N`, `SM75_U16x8_LDSM_T`, `SM90_U32x4_STSM_N`,
`SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>`, `SM90_TMA_LOAD` and `copy_atoms.tma_atom(box, dtype)`) sit
in the same registry.

Drawn the CuTe way (A on the left, B above, C at the origin; each cell `T{{t}} V{{v}}`, coloured by
thread); in Jupyter, an atom displays as this picture (`_repr_svg_`):

{picture("sm80_16x8x16_bf16", mma)}

`cute-kernels atom NAME` prints the same record and its three grids:

{cli("cute-kernels atom SM80_16x8x8_F16F16F16F16_TN", head=24)}

The tests check every atom's TV layouts against ownership tables written from the PTX ISA's
fragment descriptions as plain formulas (for `m16n8k16` A: row = groupID + 8 * ((i >> 1) & 1),
col = 2 * threadID_in_group + (i & 1) + 8 * (i >> 2)), and, in the `compile` tier, against the
DSL's own atoms (`cute.nvgpu.warp`, `cute.nvgpu.warpgroup`) read at trace time.

## Layouts, as CuTe's `print_layout`

{cli('cute-kernels layout "(4,(2,2)):(2,(1,8))"')}

{picture("layout_4x2x2", Layout((4, (2, 2)), (2, (1, 8))))}

## Swizzles and the GMMA shared-memory atoms

`gmma_smem_atom(kind, dtype)` gives CuTe's `GMMA::Layout_{{K,MN}}_{{INTER,SW32,SW64,SW128}}_Atom<T>`.
As in CuTe and the DSL, a swizzle in a shared-memory layout acts on **byte addresses**: `Sw<3,4,3>`
is the 128-byte swizzle (bits 4-6 of the address XOR bits 7-9) for every element width. The
record carries both forms: `layout` (what CuTe prints) and `element_layout` (the same function on
element offsets, `Sw<3,3,3>` for 16-bit elements).

{repl('gmma_smem_atom("K_SW128", "bf16")')}

Coloured by bank group (the four banks of one 16-byte chunk), the swizzle is visible: every row
holds all eight groups, each row in its own order. This is what the atom displays as in Jupyter.

{picture("gmma_k_sw128_bf16", sw128)}

The same tile without the swizzle puts every row's chunk `c` in the same banks:

{picture("row_major_8x64_bf16", row_major, "bf16")}

## Bank conflicts

`bank_conflicts(smem_layout, access, dtype)` counts the wavefronts of each warp-wide instruction
needed to cover the tile. The model: 32 banks of 4 bytes; the word at byte address `a` lives in
bank `(a // 4) % 32`; an instruction is served in phases (all 32 threads for accesses up to 32
bits, half-warps for 64-bit, quarter-warps for 128-bit, and for `ldmatrix`/`stmatrix` one 8x8
matrix, eight lanes each addressing one 16-byte row, per phase); a phase takes as many wavefronts
as the most distinct words any one bank must deliver (threads reading the same word share it).
The ideal is `ceil(distinct words / 32)` per phase; the conflict degree is wavefronts / ideal.

{cli('cute-kernels conflicts --smem "Sw<3,4,3> o 0 o (8,64):(64,1)" --dtype bf16 --access ldmatrix_x4')}

{cli('cute-kernels conflicts --smem "(8,64):(64,1)" --dtype bf16 --access ldmatrix_x4')}

Each phase of the unswizzled read asks eight 128-byte-apart rows for the same four banks: eight
wavefronts instead of one. The Python API takes the same strings as the command line, and the
report reads the same at the prompt (in Jupyter it is an HTML table, with the worst instruction's
banks drawn below it: one row per phase, each cell the words that bank serves):

{repl("r = bank_conflicts('(8,64):(64,1)', 'ldmatrix_x4', 'bf16')", "r", "r.banks[0]")}

{picture("banks_row_major_ldmatrix", _BankPicture(NS["r"]))}

Padding each row by 16 bytes also fixes it:

{repl("bank_conflicts(Layout((8, 64), (72, 1)), 'ldmatrix_x4', 'bf16')")}

Named accesses: `ldmatrix_x1|x2|x4[_trans]`, `stmatrix_x1|x2|x4[_trans]`, `vec32|vec64|vec128`
(one vector per thread: `ld.shared.v4`, a 16-byte `cp.async`), `scalar`; or a copy atom (or its
name), or a TV layout `(thread, value) -> tile index` (or its text) for any pattern. Named patterns
cut the tile into vectors along its unit-stride mode; `ldmatrix` walks rows first (lane `t` reads
row `t % rows`: the matrices an MMA fragment needs), plain vectors walk along the row. A vector
that the layout makes non-contiguous or misaligned is an error (the instruction would be
illegal), not a number. `swizzle_unit="elements"` evaluates a composed layout as the pure function
it prints as; read that way, `Sw<3,4,3>` on bf16 permutes 32-byte chunks and leaves a 2-way conflict:

{repl("bank_conflicts(ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1))), 'ldmatrix_x4', 'bf16', swizzle_unit='elements')", "bank_conflicts('(8,64):(64,1)', 'SM75_U32x4_LDSM_N', 'bf16').way")}

## Coalescing and vector width

`coalescing(layout, dtype, access)` counts the 32-byte sectors and 128-byte lines of each warp
request to a global-memory tile (base 128-byte aligned unless `base=` says otherwise):

{cli('cute-kernels conflicts --gmem "(64,64):(64,1)" --dtype bf16 --access vec128')}

{repl("coalescing(Layout((64, 64), (64, 1)), 'bf16', Layout((32, 1), (1, 0)))  # one bf16 per thread down a column")}

`vector_width(layout, dtype)` is the widest power-of-two vector (up to 128 bits) whose every
aligned group of elements is contiguous and aligned in memory, along the layout's unit-stride
mode (`along="index"` uses the layout's own index order instead). For a plain layout it is read
off the coalesced modes, at any size:

{repl("vector_width(Layout((64, 64), (64, 1)), 'bf16')", "vector_width(Layout((8, 6), (8, 1)), 'bf16')", "vector_width(gmma_smem_atom('K_SW128', 'bf16'), 'bf16')", "vector_width('(100000,100000):(100000,1)', 'f32')")}

## Tiled MMAs: who owns element (m, n)

`make_tiled_mma(atom, atom_layout, permutation)` tiles an atom as CuTe's `TiledMMA`. Four warps of
`m16n8k16` in a 2 x 2 grid over a 32 x 32 tile, with the N permutation `(8,2,2):(1,16,8)` (CuTe's
`Tile<_32, Layout<Shape<_8,_2,_2>, Stride<_1,_16,_8>>, _16>`), which gives thread 0 the N values
0, 1, 8, 9 instead of 0, 1, 16, 17:

{repl("t = make_tiled_mma('SM80_16x8x16_F32BF16BF16F32_TN', (2, 2, 1), (32, Layout((8, 2, 2), (1, 16, 8)), 16))", "print(t)", "t.owner('C', 17, 10)  # (thread, value)", "t.elements(0, 'C')  # (m, n) in value order")}

`make_tiled_copy(atom, thr_layout, val_layout)` does the same for copies (each thread owns a
`val_layout` block, blocks interleaved across threads as CuTe's raked product), and a tiled copy
is itself an access pattern for the analysis, one instruction per warp:

{repl("tc = make_tiled_copy('SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>', Layout((32, 4), (4, 1)), Layout((1, 8)))", "tc.elements(1)", "coalescing(Layout((32, 32), (32, 1)), 'bf16', tc)", "bank_conflicts(Layout((32, 32), (32, 1)), make_tiled_copy('SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>', Layout((32, 4), (1, 32)), Layout((1, 8))), 'bf16')")}

## Copy atoms

`ldmatrix.x4`: lane `8j + r` addresses row `r` of matrix `j` (left); the registers it fills
(right), two 16-bit values per matrix per lane:

{picture("ldmatrix_x4", atom("SM75_U32x4_LDSM_N"))}

## Safe on any input

A layout is lazy, but drawing or analysing one touches every cell. Past a budget the renderers
draw the top-left corner and say so (only the drawn cells are evaluated, so
`cute-kernels layout "(100000,100000):(1,100000)"` prints a 64 x 64 corner at once), and the
enumerating analyses refuse with a message; `max_cells=` / `--max-cells` and `max_elements=`
raise the budgets (`cute_kernels.layouts.budget`):

{repl("print_layout(Layout((100000, 100000), (1, 100000)), max_cells=9)", "bank_conflicts(Layout((4096, 4096), (4096, 1)), 'ldmatrix_x4', 'bf16')")}

Coordinates of the wrong kind are the errors Python code expects (both are also `LayoutError`s),
and where the composition of two layouts is not a layout it says which condition failed:

{repl("Layout((4, 8), (8, 1))(-1)", "Layout((4, 8), (8, 1))('a')", "composition(Layout((3, 4), (1, 5)), Layout(2, 4))")}

Where B reaches beyond A, CuTe's DSL (and C++) and pycute compose differently; the default is the
DSL's and `semantics="pycute"` (or `with layout_semantics("pycute"):`) gives pycute's, as
[docs/layouts.md](layouts.md) (section 11) explains:

{repl("composition(Layout((8, 1), (1, 1)), Layout((8, 1, 2), (2, 32, 1)))", "composition(Layout((8, 1), (1, 1)), Layout((8, 1, 2), (2, 32, 1)), semantics='pycute')")}

## The F2 view

With power-of-two shapes, the bits of a layout's index are the bits of its coordinates, and the
layout adds one *column* per set bit. When no two columns share an output bit that sum is an XOR:
the layout is a linear map over GF(2), a bit matrix (the view Triton's linear layouts take). A
swizzle is linear too, so the 128-byte swizzled atom is a matrix; `f2` names the input bits by
mode (`m0..m2` the rows, `n0..n5` the columns) and the output bits of the element offset:

{repl("F = f2(gmma_smem_atom('K_SW128', 'bf16'))", "F", "F.to_cute()", "F.to_cute(dtype='bf16')")}

{picture("f2_sw128_bf16", NS["F"])}

`F.to_cute()` goes back: a plain `Layout` when the columns are disjoint, else the smallest
`Swizzle o Layout` that computes the map (here in element units, `Sw<3,3,3>`; with `dtype`, on
bytes as CuTe prints it). Composition and inversion over GF(2) are the matrix product and the
matrix inverse, and they agree with the algebra (property-tested in `tests/layouts/test_f2.py`):

{repl("A, B = Layout((8, 64), (64, 1)), Layout((4, 8), (8, 1))", "f2(composition(A, B)).columns == f2(A).compose(f2(B)).columns", "f2(right_inverse(gmma_smem_atom('K_SW128', 'bf16').element_layout)).columns == F.inverse().columns", "f2(Layout((4, 2), (1, 2)))")}

## Finding a conflict-free swizzle

`find_swizzle(tile, dtype, accesses)` searches CuTe's swizzled layouts `Sw<B,M,S> o 0 o base` of a
power-of-two tile for one that every access reads or writes without bank conflicts, vectors
intact. It scores each candidate with the F2 view instead of enumerating addresses: the map from
an access's (value, lane) bits to word addresses has some rank `w` and its bank bits rank `b`, and
linearity makes every phase take `2**(w - b)` wavefronts where `2**max(0, w - 5)` is ideal. The
winner is then checked by `bank_conflicts` (the report holds those figures). An `ldmatrix` read of
a K-major bf16 tile finds the 128-byte swizzle:

{repl("find_swizzle((64, 64), 'bf16', ['ldmatrix_x4'])")}

Its first eight rows, coloured by bank group (each row holds all eight 16-byte groups):

{picture("found_sw128_64x64", composition(found.layout, (8, 64)), "bf16")}

`"tma"` among the accesses restricts the family to what TMA writes, the GMMA atoms tiled over the
tile (the widest of the equally good ones: its rows are the TMA box's inner extent). A register
fragment store is an access too: `fragment_access` takes one instruction's worth of a TV layout,
here the two adjacent bf16 accumulators each thread of a tiled `m16n8k16` writes as one 32-bit store:

{repl("find_swizzle((64, 64), 'bf16', ['tma', 'ldmatrix_x4']).layout", "tiled = make_tiled_mma('SM80_16x8x16_F32BF16BF16F32_TN', (2, 2, 1), (32, 32, 16))", "store = fragment_access(tiled.tv_layout_c, 2)", "bank_conflicts(Layout((32, 32), (32, 1)), store, 'bf16').conflict_degree", "find_swizzle((32, 32), 'bf16', [store, 'ldmatrix_x4'])")}

## `explain`: the steps of an operation

`explain(op, *args)` runs an operation and returns its steps, recorded by the operation itself as
it runs: the divisibility walk of a composition (A's coalesced modes; for each mode of B, which
modes of A it steps over, takes elements from, or fails at), the modes and gaps of a complement,
how a divide or a product completes its tiler. It never raises for the operation; a refusal ends
with the step that failed:

{repl("explain(composition, Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1)))", "explain('composition', '(3,4):(1,5)', '2:4')", "explain(complement, Layout((2, 2), (1, 6)), 24)")}

In Jupyter an explanation displays as a table and a picture. For a composition: B's modes (rows)
against A's coalesced modes (columns), each cell what happened there (green: elements taken, grey:
stepped over, blue: the rest past the end, red: where it failed), and A's grid with the cells B
selects numbered in B's order:

{picture("explain_composition", explain(composition, Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1))))}

{picture("explain_refused", explain(composition, Layout((3, 4), (1, 5)), Layout(2, 4)))}

For a complement, the codomain with every offset written as `A(i) + C(k)`: copy `k` of A starts at
the complement's `C(k)`, so together they cover it once:

{picture("explain_complement", explain(complement, Layout((2, 2), (1, 6)), 24))}

## The interactive page

`--html FILE` on `layout` and `conflicts` writes one self-contained HTML file (no network: style,
script and data inline). Hovering a cell shows its coordinate, index, offset and bank and, with
`--access`, the thread that reads it as which value (instruction, phase); the layout is an
editable field that the page parses and evaluates itself (swizzles on byte addresses when a dtype
is set), recounting the access's bank conflicts live, so deleting the swizzle shows the 8-way
conflict it removed. The URL fragment drives it too (`#layout=...&dtype=bf16&hover=2,3`), which is
how `tests/layouts/test_html.py` checks it in headless chromium against the Python analysis.

{cli('cute-kernels layout "Sw<3,4,3> o 0 o (8,64):(64,1)" --dtype bf16 --access ldmatrix_x4 --max-cells 16 --html sw128.html')}

{shot}

## Text, SVG, HTML, TikZ, Jupyter

`render.print_layout(layout)` prints CuTe's grid; `render.to_svg(obj)`, `render.to_html(obj)`,
`render.to_latex(obj)` (a standalone TikZ document) and `render.to_png(obj, path)` (matplotlib)
draw layouts, composed layouts, smem atoms, MMA and copy atoms, tiled MMAs, F2 maps and
explanations with the same cells. On the command line: `--svg FILE`, `--html FILE`, `--latex FILE`
on `layout`, `atom` and `conflicts`. In Jupyter, atoms, GMMA smem atoms, tiled MMAs and tiled
copies display as their pictures (`_repr_svg_`, through `render.repr_svg`, which falls back to the
text form past {render.REPR_CELL_LIMIT} cells so that a 64 x 256 wgmma atom does not produce
megabytes of SVG), and the reports as tables.

## Regenerating this page

```console
$ python scripts/render_workbench_docs.py
```
"""


class _BankPicture:
    """A bank-conflict report's bank picture, for picture() (render.to_svg draws objects with .picture())."""

    def __init__(self, report):
        self.report = report

    def picture(self):
        from cute_kernels.layouts.render import _bank_picture

        return _bank_picture(self.report.banks, f"{self.report.access}: distinct words per bank, one row per phase")


def main() -> int:
    text = page()
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}; pictures under {IMG.relative_to(ROOT)}: "
          f"{', '.join(sorted(p.name for p in IMG.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
