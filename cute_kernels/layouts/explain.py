"""``explain(op, *args)``: the steps an operation of the algebra takes, in words and in a picture.

The steps are not re-derived here: the operations themselves record them while they run
(:mod:`~cute_kernels.layouts.trace`), so what ``explain`` says is what the code did. For a
composition they are the divisibility walk (A's coalesced modes, and for each mode of B which of
A's modes it steps over, takes elements from, or fails at); for a complement, the modes sorted by
stride and the gaps it fills; for a divide or a product, how the tiler is completed and then the
composition's walk. A refused operation ends with the step that failed and the error, instead of
raising.

The picture (``to_svg()``, ``_repr_svg_`` in Jupyter): for a composition, a grid of B's modes
(rows) against A's coalesced modes (columns), each cell what that mode of B did in that mode of
A (green: elements taken, grey: stepped over, blue: the rest past the end, red: where it failed),
and, when it succeeded, A's grid with the cells B selects numbered in B's order; for a
complement, the codomain with A's offsets and the complement's; for a divide, A's grid coloured
by tile; for a product, the result's grid coloured by copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .display import Drawable, Report
from .errors import LayoutError
from .layout import Layout
from .trace import Step, recording

__all__ = ["Explanation", "explain"]

_STATUS_FILL = {"take": "#ccebc5", "skip": "#dddddd", "last": "#b3cde3", "fail": "#fb8072"}
_TILE_FILLS = ("#afafff", "#afffaf", "#ffafaf", "#ffffaf", "#afffff", "#ffafff", "#d7d7ff", "#ffd7af")
_MAX_PICTURE_CELLS = 1024


def _operation(op: Any) -> tuple[str, Callable]:
    import cute_kernels.layouts as public

    if callable(op):
        return getattr(op, "__name__", str(op)), op
    if isinstance(op, str) and callable(getattr(public, op, None)):
        return op, getattr(public, op)
    raise LayoutError(f"explain: {op!r} is not an operation of cute_kernels.layouts")


@dataclass(frozen=True, repr=False)
class Explanation(Report, Drawable):
    """The recorded steps of ``op(*args)``: ``steps`` (each a sentence and data), ``result`` (None
    when refused) and ``error`` (the :class:`LayoutError`, None when it succeeded)."""

    op: str
    args: tuple
    steps: tuple[Step, ...]
    result: Any = None
    error: LayoutError | None = None
    kwargs: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def failed_step(self) -> int | None:
        """1-based number of the step that failed, if one did."""
        return next((i + 1 for i, s in enumerate(self.steps) if s.kind == "fail"), None)

    def _call(self) -> str:
        args = ", ".join(str(a) for a in self.args)
        kw = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.op}({args}{kw})"

    def __str__(self) -> str:
        lines = [self._call()]
        lines += [f"  {i}. {s.text}" for i, s in enumerate(self.steps, 1)]
        if self.ok:
            lines.append(f"  = {self.result}")
        else:
            at = f" at step {self.failed_step}" if self.failed_step else ""
            lines.append(f"  refused{at}: {self.error}")
        return "\n".join(lines)

    def table(self) -> list[tuple[str, str]]:
        rows = [(f"{i}. {s.kind}", s.text) for i, s in enumerate(self.steps, 1)]
        return rows + [("result" if self.ok else "refused", str(self.result if self.ok else self.error))]

    def picture_svg(self) -> str | None:
        try:
            return self.to_svg()
        except LayoutError:
            return None

    def _repr_svg_(self):
        return self.picture_svg()

    # ---- pictures -----------------------------------------------------------------------------
    def picture(self):
        from .render import _Picture

        panels = []
        if any(s.kind == "flatten" for s in self.steps):
            panels += _walk_panels(self)
        if self.op == "complement" or (self.op not in ("composition",) and not panels and any(s.kind == "gap" for s in self.steps)):
            panels += _complement_panels(self)
        if self.ok and self.op.endswith("divide") and isinstance(self.args[0], Layout):
            panels += _divide_panels(self, top=_bottom(panels))
        elif self.ok and self.op.endswith("product") and isinstance(self.result, Layout):
            panels += _grid_panels(self.result, "the product: cells coloured by copy", top=_bottom(panels))
        if not panels:
            if isinstance(self.result, Layout):
                panels = _grid_panels(self.result, "the result", top=0)
            else:
                raise LayoutError(f"explain: no picture for {self.op}")
        return _Picture(panels, self._call() if self.ok else f"{self._call()}: refused")


def _bottom(panels) -> float:
    return max((p.y + p.rows + 2 for p in panels), default=0)


def _walk_panels(ex: Explanation) -> list:
    from .render import _Panel, layout_grid

    flat = next(s.data["flat"] for s in ex.steps if s.kind == "flatten")
    lhs = next(s.data["lhs"] for s in ex.steps if s.kind == "flatten")
    rhs = next(s.data["rhs"] for s in ex.steps if s.kind == "flatten")
    modes = list(flat) if isinstance(flat.shape, tuple) else [flat]
    walks = [s for s in ex.steps if s.kind in ("leaf", "fail") and "walk" in s.data]
    cells = {}
    for r, s in enumerate(walks):
        for m, kind, label in s.data["walk"]:
            cells[(r, m)] = (kind, label)

    def cell(r: int, c: int):
        kind, label = cells.get((r, c), ("", ""))
        return label, kind, _STATUS_FILL.get(kind, "#ffffff")

    names = [f"{m.shape}:{m.stride}" for m in modes]
    rows = [f"{s.data.get('shape', '')}:{s.data.get('stride', '')}" if "shape" in s.data else "carry" for s in walks]
    panels = [_Panel(0, 0, len(walks), len(modes), cell, "B's modes (rows) walking A's coalesced modes (columns)",
                     col_names=names, row_names=rows)]
    if ex.ok and isinstance(rhs, Layout) and lhs.size() <= _MAX_PICTURE_CELLS:
        hits: dict[int, list[int]] = {}
        for i in range(min(rhs.size(), _MAX_PICTURE_CELLS)):
            j = rhs(i)
            if isinstance(j, int) and 0 <= j < lhs.size():
                hits.setdefault(j, []).append(i)
        grid_rows, grid_cols, offset = layout_grid(lhs)

        def grid_cell(r: int, c: int):
            j = r + grid_rows * c
            got = hits.get(j)
            return str(offset(r, c)), (f"B{got[0]}" + ("+" if len(got) > 1 else "")) if got else "", \
                (_TILE_FILLS[got[0] % 8] if got else "#ffffff")

        panels.append(_Panel(0, len(walks) + 2, grid_rows, grid_cols, grid_cell,
                             "A's grid: offsets, and where B's indices land (B{i})"))
    return panels


def _complement_panels(ex: Explanation) -> list:
    """The codomain, each offset written as ``A(i) + C(k)``: copy ``k`` of A starts at the
    complement's ``C(k)``, so together they cover it once (cell: A{i} over C{k}, colour by k)."""
    from .coalesce import filter as filter_
    from .render import _Panel

    if not ex.ok or not isinstance(ex.result, Layout) or not isinstance(ex.args[0], Layout):
        return []
    a, c = filter_(ex.args[0]), ex.result
    n = min(a.size() * c.size(), _MAX_PICTURE_CELLS)
    where = {}
    for k in range(c.size()):
        for i in range(a.size()):
            o = a(i) + c(k)
            if o < n:
                where.setdefault(o, (i, k))
    width = max(w for w in range(1, min(16, n) + 1) if n % w == 0)  # full rows where n allows
    width = width if width >= 8 or n <= 16 else min(16, n)
    rows = -(-n // width)

    def cell(r: int, col: int):
        got = where.get(r * width + col)
        if got is None:
            return "", "", "#ffffff"
        i, k = got
        return f"A{i}", f"C{k}", _TILE_FILLS[k % 8]

    return [_Panel(0, 0, rows, width, cell,
                   f"offsets 0..{n - 1} (row-major, {width} per row) as A(i) + C(k): copy k of A starts at C(k)")]


def _image_size(layout: Layout) -> int:
    from .coalesce import filter as filter_

    return filter_(layout).size()


def _divide_panels(ex: Explanation, top: float) -> list:
    from .render import _Panel, layout_grid

    a, result = ex.args[0], ex.result
    if a.size() > _MAX_PICTURE_CELLS or not isinstance(result, Layout) or len(result) < 2:
        return []
    # result(t, r) = a(M(t, r)) with M a bijection of a's domain: colour a's cells by tile r.
    tile = result[0].size()
    where: dict[int, tuple[int, int]] = {}
    inverse = {a(j): j for j in range(a.size())} if len({a(j) for j in range(a.size())}) == a.size() else None
    if inverse is None:
        return []
    for i in range(min(result.size(), a.size())):
        o = result(i)
        if o in inverse:
            where[inverse[o]] = (i % tile, i // tile)
    grid_rows, grid_cols, offset = layout_grid(a)

    def cell(r: int, c: int):
        got = where.get(r + grid_rows * c)
        if got is None:
            return str(offset(r, c)), "", "#ffffff"
        t, k = got
        return str(offset(r, c)), f"t{k}.{t}", _TILE_FILLS[k % 8]

    return [_Panel(0, top, grid_rows, grid_cols, cell, "A's grid by tile: t{tile}.{index in the tile}")]


def _grid_panels(layout: Layout, title: str, top: float) -> list:
    from .render import _Panel, layout_grid

    if layout.size() > _MAX_PICTURE_CELLS:
        return []
    grid_rows, grid_cols, offset = layout_grid(layout)
    first = layout[0].size() if isinstance(layout.shape, tuple) else layout.size()

    def cell(r: int, c: int):
        i = r + grid_rows * c
        return str(offset(r, c)), "", _TILE_FILLS[(i // first) % 8]

    return [_Panel(0, top, grid_rows, grid_cols, cell, title)]


def explain(op: Any, *args: Any, **kwargs: Any) -> Explanation:
    """Run ``op(*args, **kwargs)`` (an operation of :mod:`cute_kernels.layouts` or its name;
    layouts may be given as text) and return its :class:`Explanation`: the recorded steps, the
    result or the error. Never raises a :class:`LayoutError` for the operation itself."""
    from .parse import as_layout

    name, fn = _operation(op)
    args = tuple(as_layout(a) if isinstance(a, str) else a for a in args)
    with recording() as steps:
        try:
            result, error = fn(*args, **kwargs), None
        except LayoutError as err:
            result, error = None, err
    return Explanation(name, args, tuple(steps), result, error, dict(kwargs))
