"""Drawing layouts: text grids (CuTe's ``print_layout``), SVG for Jupyter, and TikZ for papers.

Every picture is a set of *panels*, grids of labelled, coloured cells placed in cell units; the
SVG and TikZ back ends draw the same panels, so the two agree cell for cell.

* A layout of rank 2 is drawn as its (rows, cols) grid, each cell labelled with the offset of
  that coordinate (rank 1 draws as one column; higher ranks fold modes 1.. into the columns).
  With a ``dtype``, cells are coloured by shared-memory *bank group* (the four banks of one 16-byte
  chunk, ``(offset * bytes // 16) % 8``) so swizzles show as permuted colour stripes; without one,
  by ``offset % 8``.
* A TV layout over an M x N tile is drawn on that tile, each cell labelled ``T{t}`` / ``V{v}`` and
  coloured by thread (eight colours cycling with ``t % 8``, as CuTe's ``print_latex``).
* An MMA atom is drawn the CuTe way: A (M x K) on the left, B (K x N, transposed) above, C
  (M x N) at the origin between them. Shared-memory operands (stride-0 thread modes) are grey.

Every grid is held to a budget (:mod:`~cute_kernels.layouts.budget`): past ``max_cells`` the top-
left corner is drawn and a line (the picture's title) says which part of how large a grid it is;
only the drawn cells are evaluated, so a 10^10-element layout prints as quickly as a small one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable
from xml.sax.saxutils import escape

from . import budget
from .errors import LayoutError
from .int_tuple import flatten, product
from .layout import Layout

__all__ = [
    "print_layout",
    "layout_text",
    "tv_text",
    "to_text",
    "to_svg",
    "to_html",
    "to_latex",
    "to_png",
    "repr_svg",
    "repr_html",
    "REPR_CELL_LIMIT",
    "layout_svg",
    "tv_svg",
    "mma_atom_svg",
    "copy_atom_svg",
    "layout_latex",
    "bank_svg",
    "mma_atom_latex",
    "THREAD_COLORS",
    "BANK_COLORS",
]

# Eight pastel fills, readable under black text; threads cycle through them with t % 8.
THREAD_COLORS = ("#afafff", "#afffaf", "#ffafaf", "#ffffaf", "#afffff", "#ffafff", "#d7d7ff", "#ffd7af")
# Eight fills for the eight 16-byte bank groups of a 128-byte shared-memory row.
BANK_COLORS = ("#fbb4ae", "#b3cde3", "#ccebc5", "#decbe4", "#fed9a6", "#ffffcc", "#e5d8bd", "#fddaec")
SMEM_GREY = "#dddddd"


# ---- evaluation helpers -------------------------------------------------------------------------

def _grid_shape(layout: Any) -> tuple[int, int]:
    shape = layout.shape
    if not isinstance(shape, tuple):
        return shape, 1
    if len(shape) == 1:
        return product(shape[0]), 1
    return product(shape[0]), product(shape[1:])


def _values(layout: Any, dtype: Any, swizzle_unit: str | None) -> tuple[int, int, Callable[[int, int], int]]:
    """(rows, cols, f(r, c) -> offset). The composed/swizzle convention is analysis.py's: with a
    dtype a swizzle acts on byte addresses, without one the layout is evaluated as printed."""
    from .analysis import element_offset_fn
    from .atoms import dtype_bits

    if hasattr(layout, "element_layout"):
        layout, swizzle_unit = layout.element_layout, "elements"
    rows, cols = _grid_shape(layout)
    if dtype is None:
        f = lambda i: layout(i)  # noqa: E731
    else:
        f = element_offset_fn(layout, dtype_bits(dtype), swizzle_unit or "bytes")
    return rows, cols, lambda r, c: f(r + rows * c)


def layout_grid(layout: Any) -> tuple[int, int, Callable[[int, int], int]]:
    """``(rows, cols, f)`` of a layout's picture: ``f(r, c)`` is the offset drawn in cell (r, c)."""
    return _values(layout, None, None)


def _tv_owners(tv: Layout, tile: tuple[int, int]) -> dict[int, list[tuple[int, int]]]:
    """tile index -> [(thread, value), ...] for a TV layout ``(T, V) -> m + M*n``."""
    if len(tv) != 2:
        raise LayoutError(f"a TV layout has two modes (thread, value); {tv} has {len(tv)}")
    nt, nv = tv[0].size(), tv[1].size()
    budget.check(nt * nv, budget.ELEMENTS, f"TV layout {tv}", "draw a smaller tile of threads and values")
    owners: dict[int, list[tuple[int, int]]] = {}
    thr_strides = flatten(tv[0].stride) if hasattr(tv[0], "stride") else (1,)
    if all(d == 0 for d in thr_strides):
        # a shared-memory operand: every thread sees the same values, evaluate thread 0 only
        for v in range(nv):
            owners.setdefault(tv(0, v), []).extend((t, v) for t in range(nt))
    else:
        for t in range(nt):
            for v in range(nv):
                owners.setdefault(tv(t, v), []).append((t, v))
    limit = tile[0] * tile[1]
    bad = [i for i in owners if not 0 <= i < limit]
    if bad:
        raise LayoutError(f"TV layout {tv} reaches index {max(bad)} outside the {tile[0]}x{tile[1]} tile")
    return owners


# ---- text -----------------------------------------------------------------------------------------

def _text_grid(title: str, rows: int, cols: int, label: Callable[[int, int], str],
               max_cells: int = budget.TEXT_CELLS) -> str:
    shown = budget.clip(rows, cols, max_cells)
    rows, cols = shown.rows, shown.cols
    labels = [[label(r, c) for c in range(cols)] for r in range(rows)]
    w = max([len(x) for row in labels for x in row] + [len(str(cols - 1))])
    rw = len(str(rows - 1))
    sep = " " * (rw + 2) + "+" + "+".join("-" * (w + 2) for _ in range(cols)) + "+"
    head = " " * (rw + 2) + " " + " ".join(f"{c:^{w + 2}}" for c in range(cols))
    lines = [title, head.rstrip(), sep]
    for r in range(rows):
        lines.append(f"{r:>{rw}}  |" + "|".join(f" {x:>{w}} " for x in labels[r]) + "|")
        lines.append(sep)
    if shown.clipped:
        lines.append(shown.note())
    return "\n".join(lines)


def layout_text(layout: Any, dtype: Any = None, *, swizzle_unit: str | None = None,
                max_cells: int = budget.TEXT_CELLS) -> str:
    """The grid CuTe's ``print_layout`` prints: the layout, then each coordinate's offset (past
    ``max_cells`` cells, the top-left corner and a line saying so)."""
    layout = _as_drawable(layout)
    rows, cols, f = _values(layout, dtype, swizzle_unit)
    return _text_grid(str(layout), rows, cols, lambda r, c: str(f(r, c)), max_cells)


def print_layout(layout: Any, dtype: Any = None, *, swizzle_unit: str | None = None,
                 max_cells: int = budget.TEXT_CELLS) -> None:
    """Print :func:`layout_text` (CuTe's ``print_layout``)."""
    print(layout_text(layout, dtype, swizzle_unit=swizzle_unit, max_cells=max_cells))


def _as_drawable(obj: Any) -> Any:
    """A layout given as CuTe's text (``"(8,64):(64,1)"``, a GMMA atom name) becomes the object."""
    if isinstance(obj, str):
        from .parse import as_layout

        return as_layout(obj)
    return obj


def _tv_label(owners: list[tuple[int, int]] | None, nthreads: int) -> str:
    if not owners:
        return "."
    t, v = owners[0]
    if len(owners) == nthreads and nthreads > 1:
        return f"T*V{v}"
    return f"T{t}V{v}" + ("+" if len(owners) > 1 else "")


def tv_text(tv: Layout, tile: tuple[int, int], title: str | None = None, max_cells: int = budget.TEXT_CELLS) -> str:
    """The ``rows x cols`` tile with each cell's owner ``T{t}V{v}`` (``T*`` when every thread
    holds it, ``+`` when several do; ``.`` when none)."""
    owners = _tv_owners(tv, tile)
    nt = tv[0].size()
    return _text_grid(title or f"{tv}  (T,V) -> {tile[0]}x{tile[1]}", tile[0], tile[1],
                      lambda r, c: _tv_label(owners.get(r + tile[0] * c), nt), max_cells)


def to_text(obj: Any, dtype: Any = None, *, max_cells: int = budget.TEXT_CELLS) -> str:
    """Text picture of a layout, composed layout, smem atom, MMA or copy atom, or tiled MMA;
    each grid is clipped to ``max_cells`` cells (see :mod:`~cute_kernels.layouts.budget`)."""
    obj = _as_drawable(obj)
    kind = getattr(obj, "kind", None)
    if kind == "mma":
        m, n, k = obj.shape_mnk
        parts = [str(obj)]
        for op, lay, tile in (("A", obj.a_layout, (m, k)), ("B", obj.b_layout, (n, k)), ("C", obj.c_layout, (m, n))):
            parts.append(tv_text(lay, tile, f"{op}: {lay}  (T,V) -> {tile[0]}x{tile[1]}"))
        return "\n\n".join(parts)
    if kind == "copy":
        w = _copy_width(obj)
        n = obj.src_layout.cosize()
        tile = (max(1, -(-n // w)), w)
        return "\n\n".join([str(obj)] + [tv_text(_row_major_tv(lay, w, tile[0]), tile, f"{side}: {lay}") for side, lay in obj.layouts.items()])
    if hasattr(obj, "to_text"):  # TiledMMA, TiledCopy
        return obj.to_text()
    if hasattr(obj, "element_layout"):
        return str(obj) + "\n\n" + layout_text(obj.element_layout, obj.dtype, swizzle_unit="elements", max_cells=max_cells)
    return layout_text(obj, dtype, max_cells=max_cells)


# ---- panels: the shared picture model ------------------------------------------------------------

@dataclass
class _Panel:
    x: float
    y: float
    rows: int
    cols: int
    cell: Callable[[int, int], tuple[str, str, str]]  # -> (line1, line2, fill)
    title: str = ""
    row_label: str = ""
    col_label: str = ""
    col_names: list[str] | None = None  # header labels instead of 0, 1, 2...
    row_names: list[str] | None = None


@dataclass
class _Picture:
    panels: list[_Panel] = field(default_factory=list)
    title: str = ""

    def extent(self) -> tuple[float, float]:
        w = max((p.x + p.cols for p in self.panels), default=0)
        h = max((p.y + p.rows for p in self.panels), default=0)
        return w, h


def _layout_panel(layout: Any, dtype: Any, swizzle_unit: str | None, x=0.0, y=0.0, title="",
                  max_cells: int = budget.PICTURE_CELLS) -> _Panel:
    from .atoms import dtype_bits

    rows, cols, f = _values(layout, dtype, swizzle_unit)
    shown = budget.clip(rows, cols, max_cells)
    rows, cols = shown.rows, shown.cols
    if shown.clipped:
        title = f"{title}  {shown.note()}".strip()
    nbytes = dtype_bits(dtype) // 8 if dtype is not None else 0

    def cell(r: int, c: int):
        o = f(r, c)
        if nbytes:
            byte = o * nbytes
            return str(o), f"b{(byte // 4) % 32}", BANK_COLORS[(byte // 16) % 8]
        return str(o), "", THREAD_COLORS[o % 8]

    return _Panel(x, y, rows, cols, cell, title)


def _tv_panel(tv: Layout, tile: tuple[int, int], x=0.0, y=0.0, title="", transpose=False) -> _Panel:
    owners = _tv_owners(tv, tile)
    nt = tv[0].size()

    def cell(r: int, c: int):
        if transpose:
            r, c = c, r
        own = owners.get(r + tile[0] * c)
        if not own:
            return "", "", "#ffffff"
        t, v = own[0]
        if len(own) == nt and nt > 1:
            return "smem", f"V{v}", SMEM_GREY
        return f"T{t}", f"V{v}", THREAD_COLORS[t % 8]

    rows, cols = (tile[1], tile[0]) if transpose else tile
    return _Panel(x, y, rows, cols, cell, title)


def _copy_width(atom: Any) -> int:
    return 8 if atom.value_bits == 16 and atom.num_threads == 32 else min(16, atom.src_layout.cosize())


def _row_major_tv(tv: Layout, width: int, rows: int) -> Any:
    """View a TV layout whose index is row-major with ``width`` columns as one indexing the
    ``rows x width`` tile column-major (the picture's convention)."""

    class _View:
        def __init__(self):
            self._tv = tv

        def __len__(self):
            return 2

        def __getitem__(self, i):
            return tv[i]

        def __call__(self, t, v):
            i = tv(t, v)
            return (i // width) + rows * (i % width)

        def __str__(self):
            return str(tv)

    return _View()


# ---- SVG ----------------------------------------------------------------------------------------

_CW, _CH, _PAD, _HEAD = 44, 28, 30, 28


def _svg(pic: _Picture) -> str:
    w, h = pic.extent()
    # wide enough for the titles too (monospace: about 0.6 em a character)
    titles = [len(pic.title) * 7.3] + [p.x * _CW + len(p.title) * 6.7 for p in pic.panels]
    width = int(max(w * _CW, *titles) + 2 * _PAD)
    height = int(h * _CH + 2 * _PAD + _HEAD)
    # Shared attributes live in the style sheet and one cell shape (`<use>` of #c takes the
    # cell's x and a fill class, each row of cells a group placed by its y): a cell costs a
    # short `use` and its text, which keeps pictures of a few hundred cells near 45 KB. Text
    # is centred unless a class says otherwise.
    body, fills = [], {}
    if pic.title:
        body.append(f'<text class="t" x="{_PAD}" y="{_PAD - 8}" font-size="12">{escape(pic.title)}</text>')
    for p in pic.panels:
        x0 = _PAD + p.x * _CW
        y0 = _PAD + _HEAD + p.y * _CH
        if p.title:
            body.append(f'<text class="t" x="{x0:g}" y="{y0 - 16:g}" font-size="11">{escape(p.title)}</text>')
        for c in range(p.cols):
            name = escape(p.col_names[c]) if p.col_names else c
            body.append(f'<text class="h" x="{x0 + (c + 0.5) * _CW:g}" y="{y0 - 4:g}">{name}</text>')
        for r in range(p.rows):
            name = escape(p.row_names[r]) if p.row_names else r
            body.append(f'<g transform="translate(0 {y0 + r * _CH:g})">')
            body.append(f'<text class="r" x="{x0 - 4:g}" y="{0.65 * _CH:g}">{name}</text>')
            for c in range(p.cols):
                l1, l2, fill = p.cell(r, c)
                x = x0 + c * _CW
                body.append(f'<use href="#c" x="{x:g}" class="{fills.setdefault(fill, f"f{len(fills)}")}"/>')
                xm = f"{x + _CW / 2:g}"
                if l2:
                    body.append(f'<text x="{xm}" y="12">{escape(l1)}'
                                f'<tspan x="{xm}" dy="11">{escape(l2)}</tspan></text>')
                else:
                    body.append(f'<text x="{xm}" y="18">{escape(l1)}</text>')
            body.append("</g>")
    classes = "".join(f".{name}{{fill:{fill}}}" for fill, name in fills.items())
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="10">',
        "<style>text{text-anchor:middle}text.t{text-anchor:start}text.h{fill:#666}"
        f"text.r{{text-anchor:end;fill:#666}}{classes}</style>",
        f'<defs><rect id="c" width="{_CW}" height="{_CH}" stroke="#000" stroke-width="0.5"/></defs>',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        *body,
    ]
    out.append("</svg>")
    return "\n".join(out)


def layout_svg(layout: Any, dtype: Any = None, *, swizzle_unit: str | None = None, title: str | None = None,
               max_cells: int = budget.PICTURE_CELLS) -> str:
    """SVG of a layout's grid of offsets (coloured by bank group when ``dtype`` is given)."""
    layout = _as_drawable(layout)
    pic = _Picture([_layout_panel(layout, dtype, swizzle_unit, max_cells=max_cells)],
                   title if title is not None else str(layout))
    return _svg(pic)


def tv_svg(tv: Layout, tile: tuple[int, int], *, title: str | None = None) -> str:
    """SVG of a TV layout ``(T, V) -> m + M*n`` on its ``tile``, cells ``T{t} V{v}`` by thread."""
    return _svg(_Picture([_tv_panel(tv, tile)], title if title is not None else str(tv)))


def _mma_picture(atom: Any) -> _Picture:
    m, n, k = atom.shape_mnk
    gap = 1
    a = _tv_panel(atom.a_layout, (m, k), 0, k + gap, f"A {atom.a_dtype} (M x K)")
    b = _tv_panel(atom.b_layout, (n, k), k + gap, 0, f"B {atom.b_dtype} (K x N)", transpose=True)
    c = _tv_panel(atom.c_layout, (m, n), k + gap, k + gap, f"C {atom.c_dtype} (M x N)")
    return _Picture([a, b, c], f"{atom.name}  {atom.ptx}")


_CONFLICT_FILLS = ("#ffffff", "#ccebc5", "#fed9a6", "#fdae61", "#f46d43", "#d73027")


def _bank_picture(banks: Any, title: str = "") -> _Picture:
    rows = [tuple(r) for r in banks]

    def cell(r: int, c: int):
        n = rows[r][c]
        return (str(n) if n else ""), "", _CONFLICT_FILLS[min(n, len(_CONFLICT_FILLS) - 1)]

    panel = _Panel(0, 0, len(rows), len(rows[0]) if rows else 0, cell, "bank", "phase")
    return _Picture([panel], title)


def bank_svg(banks: Any, title: str = "") -> str:
    """SVG of a shared-memory instruction's banks: one row per phase, one column per bank, each
    cell the number of distinct words that bank serves (1 is conflict-free; the row's largest
    entry is the phase's wavefronts), coloured from white (unused) to red (deep conflicts)."""
    return _svg(_bank_picture(banks, title))


def mma_atom_svg(atom: Any) -> str:
    """SVG of an MMA atom: A left, B above, C at the origin; cells ``T{t} V{v}`` by thread."""
    return _svg(_mma_picture(atom))


def _copy_picture(atom: Any) -> _Picture:
    w = _copy_width(atom)
    rows = max(1, -(-atom.src_layout.cosize() // w))
    panels = []
    for i, (side, lay) in enumerate(atom.layouts.items()):
        space = atom.src_space if side == "src" else atom.dst_space
        panels.append(_tv_panel(_row_major_tv(lay, w, rows), (rows, w), i * (w + 2), 0, f"{side} ({space})"))
    return _Picture(panels, f"{atom.name}  {atom.ptx}")


def copy_atom_svg(atom: Any) -> str:
    """SVG of a copy atom: the source and destination TV layouts side by side."""
    return _svg(_copy_picture(atom))


def _picture(obj: Any, dtype: Any = None, max_cells: int = budget.PICTURE_CELLS) -> _Picture:
    obj = _as_drawable(obj)
    kind = getattr(obj, "kind", None)
    if kind == "mma":
        return _mma_picture(obj)
    if kind == "copy":
        return _copy_picture(obj)
    if hasattr(obj, "picture"):
        return obj.picture()
    if hasattr(obj, "element_layout"):
        return _Picture([_layout_panel(obj.element_layout, obj.dtype, "elements", max_cells=max_cells)],
                        f"{obj.name}  {obj.layout}")
    return _Picture([_layout_panel(obj, dtype, None, max_cells=max_cells)], str(obj))


def to_svg(obj: Any, dtype: Any = None, *, max_cells: int = budget.PICTURE_CELLS) -> str:
    """SVG of any drawable: Layout, ComposedLayout, SmemAtom, MmaAtom, CopyAtom, TiledMMA (or a
    layout's text); a layout grid past ``max_cells`` cells is drawn as its top-left corner."""
    return _svg(_picture(obj, dtype, max_cells))


def to_html(obj: Any, dtype: Any = None, *, max_cells: int = budget.PICTURE_CELLS) -> str:
    """An HTML fragment: the text form in a ``<pre>`` and the SVG below it (for ``_repr_html_``)."""
    obj = _as_drawable(obj)
    return f"<div><pre>{escape(str(obj))}</pre>{to_svg(obj, dtype, max_cells=max_cells)}</div>"


# Jupyter calls _repr_svg_/_repr_html_ on every displayed value: past this many cells the picture
# would be megabytes, so the hooks return None and Jupyter shows the text form instead.
REPR_CELL_LIMIT = budget.REPR_CELLS


def _cells(pic: _Picture) -> int:
    return sum(p.rows * p.cols for p in pic.panels)


def _cell_estimate(obj: Any) -> int:
    """Cells of obj's picture, computed without drawing it."""
    if getattr(obj, "kind", None) == "mma" or hasattr(obj, "tile_mnk"):
        m, n, k = getattr(obj, "tile_mnk", None) or obj.shape_mnk
        return m * n + m * k + n * k
    if getattr(obj, "kind", None) == "copy":
        return 2 * obj.src_layout.cosize()
    if hasattr(obj, "picture"):  # builds its picture lazily (an F2 map: bits, not 2**bits cells)
        return 0
    size = getattr(obj, "size", None)
    return size() if callable(size) else 0


def repr_svg(obj: Any, dtype: Any = None) -> str | None:
    """What a ``_repr_svg_`` hook should return: the SVG, or None past :data:`REPR_CELL_LIMIT` cells
    (or for a value the renderer cannot draw, such as a layout with a basis stride)."""
    try:
        if _cell_estimate(obj) > REPR_CELL_LIMIT:
            return None
        pic = _picture(obj, dtype)
        if _cells(pic) > REPR_CELL_LIMIT:
            return None
        return _svg(pic)
    except (LayoutError, TypeError):
        return None


def repr_html(obj: Any, dtype: Any = None) -> str | None:
    """What a ``_repr_html_`` hook should return: text and SVG, or None where :func:`repr_svg` is None."""
    svg = repr_svg(obj, dtype)
    if svg is None:
        return None
    return f"<div><pre>{escape(str(obj))}</pre>{svg}</div>"


def html_page(obj: Any, dtype: Any = None) -> str:
    """A standalone HTML page around :func:`to_html` (for ``--html FILE``)."""
    title = escape(getattr(obj, "name", None) or str(obj))
    return f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>\n<body>\n{to_html(obj, dtype)}\n</body></html>\n"


# ---- PNG (matplotlib, imported only when asked for) ---------------------------------------------

def to_png(obj: Any, path: str, dtype: Any = None, *, dpi: int = 100, max_cells: int = budget.PICTURE_CELLS) -> None:
    """Rasterize :func:`to_svg`'s picture to a PNG file with matplotlib (cell for cell the same
    panels). Raises ImportError naming matplotlib when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("to_png needs matplotlib (pip install matplotlib)") from err
    pic = _picture(obj, dtype, max_cells)
    w, h = pic.extent()
    cw, ch = _CW / 100, _CH / 100  # inches per cell at dpi 100
    fig = plt.figure(figsize=(w * cw + 0.8, h * ch + 0.9))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(-0.8, w + 0.4)
    ax.set_ylim(h + 0.4, -1.6)
    ax.axis("off")
    if pic.title:
        ax.text(-0.7, -1.3, pic.title, fontsize=9, family="monospace", va="center")
    for p in pic.panels:
        if p.title:
            ax.text(p.x, p.y - 0.55, p.title, fontsize=8, family="monospace", va="center")
        for r in range(p.rows):
            for c in range(p.cols):
                l1, l2, fill = p.cell(r, c)
                ax.add_patch(Rectangle((p.x + c, p.y + r), 1, 1, facecolor=fill, edgecolor="black", linewidth=0.4))
                label = f"{l1}\n{l2}" if l2 else l1
                ax.text(p.x + c + 0.5, p.y + r + 0.5, label, fontsize=6, family="monospace", ha="center", va="center")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


# ---- TikZ ---------------------------------------------------------------------------------------

def _tikz(pic: _Picture) -> str:
    colors: dict[str, str] = {}

    def cname(fill: str) -> str:
        if fill not in colors:
            colors[fill] = f"c{len(colors)}"
        return colors[fill]

    body = []
    for p in pic.panels:
        if p.title:
            body.append(f"\\node[anchor=south west] at ({p.x:g},{-p.y + 1.2:g}) {{\\texttt{{{_tex(p.title)}}}}};")
        for r in range(p.rows):
            for c in range(p.cols):
                l1, l2, fill = p.cell(r, c)
                x, y = p.x + c, -(p.y + r)
                text = f"{_tex(l1)}\\\\{_tex(l2)}" if l2 else _tex(l1)
                body.append(
                    f"\\node[cell,fill={cname(fill)}] at ({x + 0.5:g},{y + 0.5:g}) {{{text}}};"
                )
    defs = [f"\\definecolor{{{n}}}{{HTML}}{{{f.lstrip('#').upper()}}}" for f, n in colors.items()]
    return "\n".join(
        [
            "% generated by cute_kernels.layouts.render",
            "\\documentclass[tikz,border=4pt]{standalone}",
            "\\usepackage{tikz}",
            *defs,
            "\\begin{document}",
            "\\begin{tikzpicture}[x=1.2cm,y=0.8cm,every node/.style={font=\\tiny\\ttfamily,align=center},",
            "  cell/.style={draw,minimum width=1.2cm,minimum height=0.8cm,inner sep=0pt}]",
            f"% {_tex(pic.title)}",
            *body,
            "\\end{tikzpicture}",
            "\\end{document}",
            "",
        ]
    )


def _tex(s: str) -> str:
    return s.replace("\\", "/").replace("_", "\\_").replace("#", "\\#").replace("%", "\\%").replace("&", "\\&").replace("<", "$<$").replace(">", "$>$")


def layout_latex(layout: Any, dtype: Any = None, *, swizzle_unit: str | None = None,
                 max_cells: int = budget.PICTURE_CELLS) -> str:
    """A standalone TikZ document of :func:`layout_svg`'s picture."""
    layout = _as_drawable(layout)
    return _tikz(_Picture([_layout_panel(layout, dtype, swizzle_unit, max_cells=max_cells)], str(layout)))


def mma_atom_latex(atom: Any) -> str:
    """A standalone TikZ document of :func:`mma_atom_svg`'s picture (CuTe's ``print_latex``)."""
    return _tikz(_mma_picture(atom))


def to_latex(obj: Any, dtype: Any = None, *, max_cells: int = budget.PICTURE_CELLS) -> str:
    """TikZ (a standalone LaTeX document) of any drawable, cell for cell the same as :func:`to_svg`."""
    return _tikz(_picture(obj, dtype, max_cells))
