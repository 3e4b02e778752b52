"""Size budgets: how much of a layout the workbench draws or enumerates before it stops.

A layout is lazy (``(100000,100000):(1,100000)`` is two tuples), but drawing or analysing it
touches every cell. Past these budgets the renderers show a corner of the grid and say so
(:func:`clip`), and the enumerating analyses refuse with a message that names the budget and how
to raise it (:func:`check`). Every limit is also an argument (``max_cells=``, ``max_elements=``)
and a CLI flag (``--max-cells``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LayoutError

__all__ = ["TEXT_CELLS", "PICTURE_CELLS", "REPR_CELLS", "ELEMENTS", "Clip", "clip", "check"]

TEXT_CELLS = 4096        # cells of a printed grid (64 x 64)
PICTURE_CELLS = 16384    # cells of an SVG, TikZ, PNG or HTML picture (128 x 128)
REPR_CELLS = 4096        # cells Jupyter's _repr_svg_ draws before falling back to text
ELEMENTS = 1 << 20       # elements an analysis (bank conflicts, coalescing...) enumerates


@dataclass(frozen=True)
class Clip:
    """The top-left ``rows x cols`` corner of a ``total_rows x total_cols`` grid that fits a budget."""

    rows: int
    cols: int
    total_rows: int
    total_cols: int
    budget: int

    @property
    def clipped(self) -> bool:
        return (self.rows, self.cols) != (self.total_rows, self.total_cols)

    def note(self, flag: str = "max_cells=") -> str:
        """One line saying what is shown, or '' when everything is."""
        if not self.clipped:
            return ""
        return (
            f"(showing rows 0-{self.rows - 1} and columns 0-{self.cols - 1} of the {self.total_rows} x "
            f"{self.total_cols} grid: {self.total_rows * self.total_cols} cells, more than the budget of "
            f"{self.budget}; pass {flag} (--max-cells N) to draw more)"
        )


def clip(rows: int, cols: int, budget: int) -> Clip:
    """The corner to draw: all of the grid when it fits, else at most ``budget`` cells, as square
    as the grid allows (a wide grid keeps its first rows, a tall one its first columns)."""
    if budget < 1:
        raise LayoutError(f"a cell budget must be positive, got {budget}")
    if rows * cols <= budget:
        return Clip(rows, cols, rows, cols, budget)
    side = max(1, int(budget ** 0.5))
    if rows <= side:
        r, c = rows, min(cols, budget // rows)
    elif cols <= side:
        r, c = min(rows, budget // cols), cols
    else:
        r = c = side
    return Clip(r, c, rows, cols, budget)


def check(count: int, budget: int, what: str, hint: str) -> None:
    """Raise :class:`LayoutError` when ``count`` exceeds ``budget``, naming both and the way out."""
    if count > budget:
        raise LayoutError(f"{what} has {count} elements, more than the budget of {budget}; {hint}")
