"""Search for a shared-memory layout that every given access reads or writes without bank
conflicts, at full vector width, and return it as a CuTe swizzle.

``find_swizzle(tile, dtype, accesses)`` tries CuTe's swizzled layouts ``Sw<B,M,S> o 0 o base`` of a
``rows x cols`` tile (``base`` K-major: ``(rows, cols):(cols, 1)``, or MN-major), and scores each
candidate with the F2 view instead of enumerating addresses:

1. Each access is run once, by :func:`~cute_kernels.layouts.analysis.warp_accesses`, on the plain
   base layout; its first phase gives a linear map from the bits of (value, lane) to the bits of
   the tile index, and the other phases must be translates of it (else the access is scored by
   enumeration instead).
2. A candidate's F2 view maps tile-index bits to element-offset bits; shifted to bytes, the map
   from (value, lane, word-in-element) bits to word addresses has rank ``w`` and its bank bits
   (word bits 0-4) rank ``b``. Linearity makes every bank serve the same number of words, so a
   phase takes ``2**(w - b)`` wavefronts where ``2**max(0, w - 5)`` is ideal: the conflict degree
   is their ratio, and a swizzle is legal for the access only if it leaves the bits inside each
   lane's vector alone.
3. The best candidate (worst degree, then total, then fewest swizzle bits and shortest shift) is
   checked by :func:`~cute_kernels.layouts.analysis.bank_conflicts` (the report holds those
   figures) and its vector width by :func:`~cute_kernels.layouts.analysis.vector_width`.

An access named ``"tma"`` is a TMA copy: the hardware writes whole swizzle atoms, so the family
shrinks to the layouts TMA can write, the GMMA atoms ``Sw<B,4,3>`` (INTER, SW32, SW64, SW128)
tiled over the tile (``tile_to_shape``), and among equally good atoms the widest wins (its rows are
the TMA box's inner extent: more bytes per request). Other accesses are anything
:func:`~cute_kernels.layouts.analysis.parse_access` takes: ``"ldmatrix_x4"``, ``"stmatrix_x4"``,
``"vec128"``, a copy atom or a TV layout, e.g. :func:`fragment_access` of an MMA's C fragment for
a register store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .analysis import BankConflictReport, VectorWidth, bank_conflicts, parse_access, vector_width, warp_accesses
from .atoms import dtype_bits, dtype_name
from .composed import ComposedLayout
from .display import Report
from .errors import LayoutError
from .f2 import F2Layout, _basis, f2
from .int_tuple import product
from .inverse import right_inverse
from .layout import Layout, make_layout
from .swizzle import Swizzle

__all__ = ["SwizzleSearch", "find_swizzle", "fragment_access", "predicted_conflict_degree"]


def _log2(n: int) -> int:
    if n < 1 or n & (n - 1):
        raise LayoutError(f"find_swizzle works on power-of-two tiles and vectors (the F2 view); {n} is not one")
    return n.bit_length() - 1


def fragment_access(tv: Layout, values: int) -> Layout:
    """One store (or load) instruction of a register fragment: the thread mode of the TV layout
    ``tv`` with its first ``values`` values, e.g. the two adjacent accumulators of an ``m16n8``
    C fragment that a thread writes as one 32-bit store."""
    if len(tv) != 2:
        raise LayoutError(f"a TV layout has two modes (thread, value); {tv} has {len(tv)}")
    from .composition import composition

    return make_layout(tv[0], composition(tv[1], Layout(values)))


@dataclass(frozen=True)
class _AccessMap:
    """An access as a linear map: ``columns`` are the tile-index images of its value bits (the
    first ``value_bits``) and lane bits; None when the access is not linear (then enumerated)."""

    access: Any
    name: str
    vector: int                # elements per lane vector
    columns: tuple[int, ...] | None
    value_bits: int
    starts: tuple[int, ...] = ()  # tile index of each phase's first element
    rows: int = 1                 # the tile's rows, and the mode the base is contiguous along
    mode: int | None = 0          # (None for a TV access, which fixes its own placement)


def _access_map(access: Any, base: Layout, dtype: str) -> _AccessMap:
    acc = parse_access(access, dtype)
    bits = dtype_bits(dtype)
    vector = max(1, acc.vector_bits // bits) if acc.vector_bits else 1
    instrs = warp_accesses(base, dtype, acc, swizzle_unit="elements")
    inverse = right_inverse(base)
    idx = [[[inverse(o) for o in offs] for offs in lanes] for lanes in instrs]
    pt = acc.phase_threads
    first = idx[0][:pt]
    active = [t for t, offs in enumerate(first) if offs]
    nlanes = len(active)
    if nlanes & (nlanes - 1) or active != list(range(nlanes)) or vector & (vector - 1):
        return _AccessMap(access, acc.name, vector, None, 0)
    vb, lb = _log2(vector), _log2(nlanes)
    origin = first[0][0]
    columns = tuple(first[0][1 << k] ^ origin for k in range(vb)) + tuple(first[1 << k][0] ^ origin for k in range(lb))
    lin = F2Layout(columns, max((c.bit_length() for c in columns), default=0), tuple(f"x{i}" for i in range(len(columns))), ())
    starts = []
    for lanes in idx:
        for p in range(0, len(lanes), pt):
            phase = [offs for offs in lanes[p : p + pt] if offs]
            if not phase:
                continue
            if len(phase) != nlanes:
                return _AccessMap(access, acc.name, vector, None, 0)
            start = phase[0][0]
            starts.append(start)
            for t, offs in enumerate(phase):
                for j, o in enumerate(offs):
                    if o ^ start != lin(j | (t << vb)):
                        return _AccessMap(access, acc.name, vector, None, 0)
    rows = product(base.shape[0])
    mode = _unit_mode(base, rows) if acc.tv is None else None
    return _AccessMap(access, acc.name, vector, columns, vb, tuple(starts), rows, mode)


def _unit_mode(offset: Any, rows: int) -> int | None:
    """The mode along which elements 0 and 1 are adjacent, as the analysis decides it."""
    if rows > 1 and abs(offset(1) - offset(0)) == 1:
        return 0
    if abs(offset(rows) - offset(0)) == 1:
        return 1
    return None


def predicted_conflict_degree(layout: Any, access_map: _AccessMap, dtype: str) -> float | None:
    """The conflict degree of one access on ``layout`` (a plain layout, or ``Swizzle o 0 o Layout``
    with the swizzle on byte addresses) from ranks over GF(2) (module docstring, step 2); ``inf``
    when the layout breaks the access's vectors or splits an element, None when the access is not
    linear and must be enumerated."""
    if access_map.columns is None:
        return None
    nbytes = dtype_bits(dtype) // 8
    k = _log2(nbytes)
    sw, inner = (layout.outer, layout.inner) if isinstance(layout, ComposedLayout) else (None, layout)
    if sw is not None and (not isinstance(sw, Swizzle) or layout.offset != 0):
        return None
    view = f2(inner)

    def address(index_bits: int) -> int:  # byte address of a tile index, the swizzle applied
        b = view(index_bits) << k
        return sw(b) if sw is not None else b

    if sw is not None and access_map.mode is not None:  # named accesses follow the unit-stride mode
        mode = _unit_mode(lambda i: address(i) / nbytes, access_map.rows)
        if mode is None:
            return float("inf")
        if mode != access_map.mode:
            return None  # the placement itself changes: enumerate
    columns = [address(c) for c in access_map.columns]
    v, vector_bytes = access_map.value_bits, access_map.vector * nbytes
    if columns[:v] != [nbytes << j for j in range(v)] or any(c & (vector_bytes - 1) for c in columns[v:]):
        return float("inf")  # a lane's vector is no longer contiguous and aligned
    if any(address(start) & (vector_bytes - 1) for start in access_map.starts):
        return float("inf")  # nor is some phase's first vector
    words = [c >> 2 for c in columns + [4 << j for j in range(max(0, k - 2))]]
    w = len(_basis(words))
    b = len(_basis([x & 31 for x in words]))
    return 2.0 ** (w - b - max(0, w - 5))


@dataclass(frozen=True, repr=False)
class SwizzleSearch(Report):
    """What :func:`find_swizzle` found: ``layout`` (tile coordinates -> element offsets, the swizzle
    on byte addresses, CuTe's smem convention), its ``swizzle``, one verified
    :class:`BankConflictReport` per access, the ``vector`` width, and the runners-up."""

    layout: Any
    swizzle: Swizzle
    dtype: str
    tile: tuple[int, int]
    major: str
    accesses: tuple[str, ...]
    reports: tuple[BankConflictReport, ...]
    vector: VectorWidth
    candidates: int
    runners_up: tuple[tuple[str, float], ...]
    tma: bool = False

    @property
    def conflict_free(self) -> bool:
        return all(r.conflict_free for r in self.reports)

    def __str__(self) -> str:
        rows, cols = self.tile
        lines = [f"find_swizzle: {rows}x{cols} {self.dtype} tile, {self.major}-major, for {', '.join(self.accesses)}",
                 f"  found {self.layout}  (swizzle {self.swizzle} on byte addresses)"]
        for r in self.reports:
            lines.append(f"  {r.access}: {r.wavefronts} wavefront(s) per instruction (ideal {r.ideal_wavefronts}), "
                         f"{'conflict-free' if r.conflict_free else f'{r.conflict_degree:g}x conflict'}")
        lines.append(f"  widest vector access: {self.vector}")
        lines.append(f"  {self.candidates} candidate(s) scored by F2 ranks; the winner checked by bank_conflicts")
        return "\n".join(lines)

    def table(self) -> list[tuple[str, str]]:
        rows = [("layout", str(self.layout)), ("swizzle (bytes)", str(self.swizzle))]
        rows += [(r.access, f"{r.conflict_degree:g}x ({r.wavefronts} wavefronts, ideal {r.ideal_wavefronts})") for r in self.reports]
        rows += [("vector width", str(self.vector)), ("candidates", str(self.candidates))]
        return rows

    def picture_svg(self) -> str | None:
        from .render import to_svg

        return to_svg(self.layout, self.dtype, max_cells=4096)


def _base(tile: tuple[int, int], major: str) -> Layout:
    rows, cols = tile
    if major == "K":
        return Layout((rows, cols), (cols, 1))
    if major == "MN":
        return Layout((rows, cols), (1, rows))
    raise LayoutError(f"find_swizzle: major must be 'K' (contiguous along the columns) or 'MN', not {major!r}")


def _tma_candidates(tile: tuple[int, int], major: str, dtype: str) -> list[tuple[Swizzle, Any]]:
    from .product import tile_to_shape
    from .smem_atoms import gmma_smem_atom

    out = []
    for kind in ("INTER", "SW32", "SW64", "SW128"):
        try:
            atom = gmma_smem_atom(f"{major}_{kind}", dtype)
            layout = tile_to_shape(atom.layout, tile)
        except LayoutError:
            continue  # the atom does not tile this shape
        out.append((atom.layout.outer, layout))
    return out


def _swizzle_candidates(tile: tuple[int, int], major: str, dtype: str, min_base: int) -> list[tuple[Swizzle, Any]]:
    base = _base(tile, major)
    total = _log2(product(tile) * dtype_bits(dtype) // 8)  # bits of a byte address in the tile
    out = [(Swizzle(0, min_base, 3), ComposedLayout(Swizzle(0, min_base, 3), 0, base))]
    for bits in range(1, 6):
        for shift in range(bits, total):
            for m in range(min_base, total - bits - shift + 1):
                for sign in (1, -1):
                    sw = Swizzle(bits, m, sign * shift)
                    out.append((sw, ComposedLayout(sw, 0, base)))
    return out


def find_swizzle(tile: Sequence[int], dtype: Any, accesses: Sequence[Any], *, major: str = "K",
                 keep: int = 5) -> SwizzleSearch:
    """A swizzled shared-memory layout for the ``rows x cols`` ``tile`` of ``dtype`` on which every
    access in ``accesses`` is as free of bank conflicts as any CuTe swizzle of the base layout
    allows, vectors intact (see the module docstring; ``"tma"`` restricts the family to what TMA
    writes). ``keep`` runners-up are listed.

    Post-conditions: each ``result.reports[i]`` is ``bank_conflicts(result.layout, accesses[i],
    dtype)`` (TMA aside); no candidate of the family has a lower worst conflict degree (by the F2
    prediction, which the tests check against the enumerating analysis).
    """
    tile = tuple(int(t) for t in tile)
    if len(tile) != 2:
        raise LayoutError(f"find_swizzle: a tile is (rows, cols), not {tile}")
    dtype = dtype_name(dtype)
    for t in tile:
        _log2(t)
    tma = any(isinstance(a, str) and a.strip().lower() == "tma" for a in accesses)
    others = [a for a in accesses if not (isinstance(a, str) and a.strip().lower() == "tma")]
    if not others and not tma:
        raise LayoutError("find_swizzle: give at least one access (e.g. 'ldmatrix_x4', 'tma', a TV layout)")
    base = _base(tile, major)
    maps = [_access_map(a, base, dtype) for a in others]
    nbytes = dtype_bits(dtype) // 8
    min_base = _log2(max([m.vector * nbytes for m in maps] + [nbytes, 16 if tma else 1]))
    family = _tma_candidates(tile, major, dtype) if tma else _swizzle_candidates(tile, major, dtype, min_base)
    if not family:
        raise LayoutError(f"find_swizzle: no GMMA atom tiles a {tile[0]}x{tile[1]} {major}-major {dtype} tile for TMA")
    scored = []
    for sw, layout in family:
        degrees = []
        for m in maps:
            d = predicted_conflict_degree(layout, m, dtype)
            if d is None:  # not linear: enumerate
                try:
                    d = bank_conflicts(layout, m.access, dtype).conflict_degree
                except LayoutError:
                    d = float("inf")
            degrees.append(d)
        # Ties: fewer swizzle bits and shorter shifts; for TMA the widest atom (longer rows per request).
        simpler = (-sw.bits,) if tma else (sw.bits, abs(sw.shift), sw.base, sw.shift < 0)
        cost = (max(degrees, default=1.0), sum(degrees), *simpler)
        scored.append((cost, sw, layout))
    scored.sort(key=lambda x: x[0])
    best_cost, sw, layout = scored[0]
    if best_cost[0] == float("inf"):
        raise LayoutError(f"find_swizzle: every candidate breaks a vector of {', '.join(m.name for m in maps)}")
    reports = tuple(bank_conflicts(layout, m.access, dtype) for m in maps)
    names = tuple(["tma"] if tma else []) + tuple(m.name for m in maps)
    runners = tuple((str(lay), c[0]) for c, _, lay in scored[1 : 1 + keep])
    return SwizzleSearch(layout, sw, dtype, tile, major, names, reports, vector_width(layout, dtype),
                         len(family), runners, tma)
