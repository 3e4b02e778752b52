"""Tiled MMAs and tiled copies: the TV layouts of a whole tile, and who owns which element.

``make_tiled_mma(atom, atom_layout, permutation)`` repeats an MMA atom over a grid of atoms
(``atom_layout``, CuTe's ``AtomLayoutMNK``: which thread block of the atom computes which
(m, n, k) atom position) and over values (when the ``permutation`` tile is larger than
``atom * atom_layout``), as CuTe's ``TiledMMA``:

* ``tv_layout_c``: ``(thread, value) -> m + TM*n`` over the ``TM x TN`` tile; ``tv_layout_a``:
  ``-> m + TM*k`` over ``TM x TK``; ``tv_layout_b``: ``-> n + TN*k`` over ``TN x TK``. Threads are
  physical (lane / thread in the block): atom thread ``v`` of atom ``(am, an, ak)`` is
  ``tiled_product(atom.thr_id, atom_layout)(v, am, an, ak)``.
* ``permutation``: ``(PM, PN, PK)``, each ``None`` (the atom grid), an int (a tile size; values
  repeat) or a :class:`Layout` mapping the logical index along that mode to the tile coordinate
  (CuTe's ``Tile<Layout...>`` permutations, e.g. to make the N values of a thread adjacent).

``make_tiled_copy(atom, thr_layout, val_layout)``: ``thr_layout`` maps (m, n) thread coordinates
to thread indices, ``val_layout`` (m, n) value coordinates to value indices; each thread owns a
``val_layout``-shaped block, blocks interleaved by threads (CuTe's raked product), and
``tv_layout`` is ``(thread, value) -> m + TM*n``.

Post-conditions (tested): every element of a register operand's tile has exactly one
``(thread, value)`` owner; ``owner`` and ``elements`` are inverse to each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import LayoutError
from .int_tuple import flatten, is_int, product
from .layout import Layout

__all__ = ["TiledMMA", "TiledCopy", "make_tiled_mma", "make_tiled_copy"]


def _as_atom_layout(atom_layout: Any) -> Layout:
    if atom_layout is None:
        atom_layout = (1, 1, 1)
    if isinstance(atom_layout, Layout):
        lay = atom_layout
    elif isinstance(atom_layout, tuple) and all(is_int(x) and x > 0 for x in atom_layout):
        lay = Layout(atom_layout)
    else:
        raise LayoutError(f"atom_layout must be a Layout or a tuple of positive ints, not {atom_layout!r}")
    shape = lay.shape if isinstance(lay.shape, tuple) else (lay.shape,)
    stride = lay.stride if isinstance(lay.stride, tuple) else (lay.stride,)
    if len(shape) > 3:
        raise LayoutError(f"atom_layout {lay} has rank {len(shape)}; at most 3 modes (M, N, K)")
    shape = tuple(shape) + (1,) * (3 - len(shape))
    stride = tuple(stride) + (0,) * (3 - len(stride))
    return Layout(shape, stride)


def _split_leaves(lay: Layout, rows: int) -> list[tuple[int, int, str]]:
    """Leaves ``(shape, stride, dim)`` of an atom layout indexed ``row + rows*col``: ``dim`` is
    ``"r"``, ``"c"`` or ``"0"`` (broadcast). Each leaf must stay within rows or within cols."""
    out = []
    for s, d in zip(flatten(lay.shape), flatten(lay.stride)):
        if d == 0 or s == 1:
            out.append((s, 0, "0"))
        elif d % rows == 0:
            out.append((s, d // rows, "c"))
        elif d * (s - 1) < rows:
            out.append((s, d, "r"))
        else:
            raise LayoutError(f"atom layout {lay}: leaf {s}:{d} straddles the row/column boundary at {rows}")
    return out


def _assemble(groups: list[list[tuple[int, int, str]]], perm_r: Any, perm_c: Any, tile_rows: int) -> list[tuple[Any, Any]]:
    """Turn per-mode leaf lists into (shape, stride) per mode of the final layout, composing the
    row leaves with ``perm_r`` and the column leaves with ``perm_c`` (each a Layout or None) and
    scaling columns by ``tile_rows``."""
    from .composition import composition

    refined: dict[tuple[int, int], tuple[Any, Any]] = {}
    for dim, perm, scale in (("r", perm_r, 1), ("c", perm_c, tile_rows)):
        pos = [(g, i) for g, leaves in enumerate(groups) for i, (_, _, dm) in enumerate(leaves) if dm == dim]
        if not pos:
            continue
        shapes = tuple(groups[g][i][0] for g, i in pos)
        strides = tuple(groups[g][i][1] for g, i in pos)
        lay = Layout(shapes, strides)
        if perm is not None:
            lay = composition(perm, lay)
        for k, (g, i) in enumerate(pos):
            sub = lay[k]
            stride = _scale(sub.stride, scale)
            refined[(g, i)] = (sub.shape, stride)
    modes = []
    for g, leaves in enumerate(groups):
        shp, std = [], []
        for i, (s, d, dim) in enumerate(leaves):
            if dim == "0":
                shp.append(s)
                std.append(0)
            else:
                a, b = refined[(g, i)]
                shp.append(a)
                std.append(b)
        # drop extent-1 leaves (idle atom-grid modes, unrepeated values): they change nothing
        kept = [(a, b) for a, b in zip(shp, std) if product(a) != 1] or [(1, 0)]
        if len(kept) == 1:
            modes.append(kept[0])
        else:
            modes.append((tuple(a for a, _ in kept), tuple(b for _, b in kept)))
    return modes


def _scale(stride: Any, k: int) -> Any:
    if isinstance(stride, tuple):
        return tuple(_scale(x, k) for x in stride)
    return stride * k


def _tv_table(tv: Layout) -> tuple[dict[int, list[tuple[int, int]]], int, int]:
    nt, nv = tv[0].size(), tv[1].size()
    owners: dict[int, list[tuple[int, int]]] = {}
    for t in range(nt):
        for v in range(nv):
            owners.setdefault(tv(t, v), []).append((t, v))
    return owners, nt, nv


@dataclass(frozen=True)
class TiledMMA:
    """An MMA atom tiled over threads and values (see the module docstring)."""

    atom: Any
    atom_layout: Layout
    permutation: tuple[Any, Any, Any]
    tile_mnk: tuple[int, int, int]
    thr_layout_vmnk: Layout
    tv_layout_a: Layout
    tv_layout_b: Layout
    tv_layout_c: Layout

    @property
    def num_threads(self) -> int:
        return self.thr_layout_vmnk.size()

    def tv_layout(self, operand: str) -> Layout:
        return {"A": self.tv_layout_a, "B": self.tv_layout_b, "C": self.tv_layout_c}[_operand(operand)]

    def tile(self, operand: str) -> tuple[int, int]:
        """(rows, cols) of the operand's tile: (M, K), (N, K) or (M, N)."""
        m, n, k = self.tile_mnk
        return {"A": (m, k), "B": (n, k), "C": (m, n)}[_operand(operand)]

    def owner(self, operand: str, row: int, col: int) -> list[tuple[int, int]]:
        """Every ``(thread, value)`` holding element ``(row, col)`` of the operand (one for a
        register operand; all threads for a shared-memory SS operand)."""
        rows, cols = self.tile(operand)
        if not (0 <= row < rows and 0 <= col < cols):
            raise LayoutError(f"({row}, {col}) is outside the {rows}x{cols} {operand} tile")
        owners, _, _ = _tv_table(self.tv_layout(operand))
        return owners.get(row + rows * col, [])

    def elements(self, thread: int, operand: str = "C") -> list[tuple[int, int]]:
        """The ``(row, col)`` elements ``thread`` holds, in value order."""
        tv = self.tv_layout(operand)
        rows, _ = self.tile(operand)
        nt, nv = tv[0].size(), tv[1].size()
        if not 0 <= thread < nt:
            raise LayoutError(f"thread {thread} is outside the tiled MMA's {nt} threads")
        return [(i % rows, i // rows) for i in (tv(thread, v) for v in range(nv))]

    def __str__(self) -> str:
        m, n, k = self.tile_mnk
        return (
            f"TiledMMA of {self.atom.name}: tile {m}x{n}x{k}, {self.num_threads} threads\n"
            f"  atom layout {self.atom_layout}, thr_layout_vmnk {self.thr_layout_vmnk}\n"
            f"  A (T,V)->(M,K): {self.tv_layout_a}\n"
            f"  B (T,V)->(N,K): {self.tv_layout_b}\n"
            f"  C (T,V)->(M,N): {self.tv_layout_c}"
        )

    __repr__ = __str__

    def to_text(self) -> str:
        from .render import tv_text

        return "\n\n".join([str(self)] + [tv_text(self.tv_layout(op), self.tile(op), f"{op}: {self.tv_layout(op)}") for op in "ABC"])

    def picture(self):
        from .render import _mma_picture

        proxy = _AtomView(self)
        return _mma_picture(proxy)

    def to_svg(self) -> str:
        from .render import to_svg

        return to_svg(self)

    def _repr_svg_(self) -> str | None:
        from .render import repr_svg

        return repr_svg(self)


@dataclass(frozen=True)
class _AtomView:
    """Presents a TiledMMA with an atom's attribute names, for the MMA picture."""

    tiled: TiledMMA

    def __getattr__(self, name: str):
        t = object.__getattribute__(self, "tiled")
        table = {
            "shape_mnk": t.tile_mnk,
            "a_layout": t.tv_layout_a,
            "b_layout": t.tv_layout_b,
            "c_layout": t.tv_layout_c,
            "name": f"TiledMMA({t.atom.name}, {t.atom_layout})",
            "ptx": t.atom.ptx,
        }
        if name in table:
            return table[name]
        return getattr(t.atom, name)


def _operand(op: str) -> str:
    op = op.upper()
    if op not in ("A", "B", "C"):
        raise LayoutError(f"operand must be 'A', 'B' or 'C', not {op!r}")
    return op


def _perm_size(p: Any, default: int, what: str) -> tuple[int, Any]:
    if p is None:
        return default, None
    if is_int(p):
        if p < default or p % default:
            raise LayoutError(f"permutation {what}={p} must be a multiple of the atom grid's {default}")
        return p, None
    if isinstance(p, Layout):
        n = p.size()
        if n % default:
            raise LayoutError(f"permutation {what}={p} has size {n}, not a multiple of the atom grid's {default}")
        return n, p
    raise LayoutError(f"permutation {what} must be None, an int or a Layout, not {p!r}")


def make_tiled_mma(atom: Any, atom_layout: Any = (1, 1, 1), permutation: Any = (None, None, None)) -> TiledMMA:
    """Tile ``atom`` (a record or its name) over ``atom_layout`` and ``permutation``; see the module
    docstring. Raises :class:`LayoutError` for a permutation that does not cover the atom grid,
    or an atom layout that leaves physical thread ids non-contiguous (SM70 quad pairs need the
    four-pair ``(2,2,1)``-style layouts to fill a warp)."""
    from .atoms import atom as lookup
    from .composition import composition
    from .inverse import right_inverse
    from .product import tiled_product

    if isinstance(atom, str):
        atom = lookup(atom)
    al = _as_atom_layout(atom_layout)
    am, an, ak = al.shape
    ma, na, ka = atom.shape_mnk
    perm = tuple(permutation) + (None,) * (3 - len(tuple(permutation)))
    tm, pm = _perm_size(perm[0], ma * am, "M")
    tn, pn = _perm_size(perm[1], na * an, "N")
    tk, pk = _perm_size(perm[2], ka * ak, "K")

    thr_vmnk = tiled_product(atom.thr_id, al)
    nthr = thr_vmnk.size()
    rinv = right_inverse(thr_vmnk)
    if rinv.size() != nthr:
        raise LayoutError(
            f"thread ids of {atom.name} over atom layout {al} are not contiguous ({thr_vmnk}); "
            "choose an atom layout that fills the lanes (e.g. (2,2,1) for SM70 quad pairs)"
        )
    identity = all(thr_vmnk(i) == i for i in range(nthr))

    def operand(lay: Layout, r_dim: int, c_dim: int, r_atom: int, tile_r: int, tile_c: int, perm_r, perm_c):
        # atom grid modes along M, N, K, and the atom's extent along each
        ext = {0: ma, 1: na, 2: ka}
        grid = list(zip(al.shape, (0, 1, 2)))
        thr_leaves = [lf for lf in _split_leaves(lay[0], r_atom)]
        val_leaves = [lf for lf in _split_leaves(lay[1], r_atom)]
        for size_, dim in grid:
            if dim == r_dim:
                thr_leaves.append((size_, ext[dim], "r"))
            elif dim == c_dim:
                thr_leaves.append((size_, ext[dim], "c"))
            else:
                thr_leaves.append((size_, 0, "0"))
        # value repeats when the permutation tile exceeds the atom grid
        grid_r = ext[r_dim] * al.shape[r_dim]
        grid_c = ext[c_dim] * al.shape[c_dim]
        val_leaves.append((tile_r // grid_r, grid_r, "r"))
        val_leaves.append((tile_c // grid_c, grid_c, "c"))
        (ts, td), (vs, vd) = _assemble([thr_leaves, val_leaves], perm_r, perm_c, tile_r)
        thr = Layout(ts, td)
        if not identity:
            # thr is indexed by (atom thread v, am, an, ak) colex; physical ids go through thr_vmnk
            thr = composition(Layout(ts, td), rinv)
        return Layout((thr.shape, vs), (thr.stride, vd))

    tv_a = operand(atom.a_layout, 0, 2, ma, tm, tk, pm, pk)
    tv_b = operand(atom.b_layout, 1, 2, na, tn, tk, pn, pk)
    tv_c = operand(atom.c_layout, 0, 1, ma, tm, tn, pm, pn)
    return TiledMMA(atom, al, (perm[0], perm[1], perm[2]), (tm, tn, tk), thr_vmnk, tv_a, tv_b, tv_c)


@dataclass(frozen=True)
class TiledCopy:
    """A copy atom tiled over threads and values (see the module docstring)."""

    atom: Any
    thr_layout: Layout
    val_layout: Layout
    tile_shape: tuple[int, int]
    tv_layout: Layout

    @property
    def num_threads(self) -> int:
        return self.thr_layout.size()

    def owner(self, row: int, col: int) -> list[tuple[int, int]]:
        """The ``(thread, value)`` that copies element ``(row, col)`` of the tile."""
        rows, cols = self.tile_shape
        if not (0 <= row < rows and 0 <= col < cols):
            raise LayoutError(f"({row}, {col}) is outside the {rows}x{cols} copy tile")
        owners, _, _ = _tv_table(self.tv_layout)
        return owners.get(row + rows * col, [])

    def elements(self, thread: int) -> list[tuple[int, int]]:
        """The ``(row, col)`` elements ``thread`` copies, in value order."""
        rows, _ = self.tile_shape
        nt, nv = self.tv_layout[0].size(), self.tv_layout[1].size()
        if not 0 <= thread < nt:
            raise LayoutError(f"thread {thread} is outside the tiled copy's {nt} threads")
        return [(i % rows, i // rows) for i in (self.tv_layout(thread, v) for v in range(nv))]

    def __str__(self) -> str:
        name = getattr(self.atom, "name", str(self.atom))
        return (
            f"TiledCopy of {name}: tile {self.tile_shape[0]}x{self.tile_shape[1]}, {self.num_threads} threads\n"
            f"  thr_layout {self.thr_layout}, val_layout {self.val_layout}\n"
            f"  (T,V)->(M,N): {self.tv_layout}"
        )

    __repr__ = __str__

    def to_text(self) -> str:
        from .render import tv_text

        return str(self) + "\n\n" + tv_text(self.tv_layout, self.tile_shape)

    def picture(self):
        from .render import _Picture, _tv_panel

        return _Picture([_tv_panel(self.tv_layout, self.tile_shape)], str(self).splitlines()[0])

    def _repr_svg_(self) -> str | None:
        from .render import repr_svg

        return repr_svg(self)


def make_tiled_copy(atom: Any, thr_layout: Any, val_layout: Any) -> TiledCopy:
    """Tile a copy ``atom`` (record or name) with ``thr_layout`` ((m, n) -> thread) and
    ``val_layout`` ((m, n) -> value); see the module docstring.

    Raises :class:`LayoutError` when ``thr_layout`` or ``val_layout`` is not a bijection onto
    ``[0, size)`` (two threads would copy one element, or a thread would be idle), or when the
    thread count is not a multiple of the atom's.
    """
    from .atoms import atom as lookup
    from .composition import with_shape
    from .inverse import right_inverse
    from .product import raked_product

    if isinstance(atom, str):
        atom = lookup(atom)
    thr = thr_layout if isinstance(thr_layout, Layout) else Layout(thr_layout)
    val = val_layout if isinstance(val_layout, Layout) else Layout(val_layout)
    for name, lay in (("thr_layout", thr), ("val_layout", val)):
        if sorted(lay(i) for i in range(lay.size())) != list(range(lay.size())):
            raise LayoutError(f"make_tiled_copy: {name} {lay} is not a bijection onto [0, {lay.size()})")
    n_atom = getattr(atom, "num_threads", 1)
    if thr.size() % n_atom:
        raise LayoutError(f"make_tiled_copy: {thr.size()} threads is not a multiple of {atom.name}'s {n_atom}")
    layout_mn = raked_product(thr, val)
    tv = with_shape(right_inverse(layout_mn), (thr.size(), val.size()))
    shape = layout_mn.shape
    tile = (product(shape[0]), product(shape[1]) if isinstance(shape, tuple) and len(shape) > 1 else 1)
    return TiledCopy(atom, thr, val, tile, tv)
