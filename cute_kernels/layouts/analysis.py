"""Memory-access analysis of layouts, in pure Python: bank conflicts, coalescing, vector width.

The models (also in docs/workbench.md):

**Shared memory.** 32 banks of 4 bytes; the 4-byte word at byte address ``a`` lives in bank
``(a // 4) % 32``. A warp-wide instruction is served in *phases* of threads, and each phase takes
as many *wavefronts* as the most distinct words any one bank must deliver (threads reading the same
word share it: broadcast). The phases are the hardware's: all 32 threads for accesses of up to 32
bits, half-warps for 64-bit accesses, quarter-warps (8 threads) for 128-bit ones, and for
``ldmatrix``/``stmatrix`` one 8x8 matrix per phase (eight lanes, eight 16-byte rows). The *ideal*
number of wavefronts of a phase is ``ceil(distinct words / 32)``; the *conflict degree* is
wavefronts / ideal (1.0 means conflict-free), and ``way`` is the largest number of distinct
words one bank had to serve in one phase (an ``n``-way conflict).

**Global memory.** A warp request touches 32-byte sectors and 128-byte lines; the figures are
the distinct sectors and lines of one warp-wide instruction, and the efficiency is useful bytes
over bytes moved (``sectors * 32``). The base address is assumed 128-byte aligned (``base`` moves
it, in bytes).

**Vector width.** The widest power-of-two vector (at most 128 bits) such that every aligned group
of ``n`` consecutive indices of the layout maps to ``n`` consecutive, ``n``-aligned offsets.

**Swizzle units.** A layout ``Sw<B,M,S> o off o L`` used for shared memory follows CuTe's
convention for ``smem_ptr_flag`` layouts and the DSL's swizzled pointers: the swizzle acts on the
*byte* address, so ``Sw<3,4,3>`` is the 128-byte swizzle for every element width. Pass
``swizzle_unit="elements"`` to evaluate the composed layout as the pure function it prints as.

**Access patterns.** ``access`` names how a warp reads a rank-2 tile: ``"ldmatrix_x1|x2|x4"``
(``_trans``), ``"stmatrix_x1|x2|x4"``, ``"vec32|vec64|vec128"`` (one vector per thread, e.g.
``ld.shared.v4.b32`` or ``cp.async`` 16 bytes), ``"scalar"`` (one element per thread), a
:class:`~cute_kernels.layouts.atoms.CopyAtom`, an :class:`Access`, a TV layout
``(thread, value) -> tile index`` (one instruction per warp of its threads), or a
:class:`~cute_kernels.layouts.tiled.TiledCopy` (its TV layout). Named patterns cut the tile into vectors along its contiguous
(unit-stride) mode; ``ldmatrix``/``stmatrix`` walk the rows first (lane ``t`` reads row ``t %
rows`` of the vector column ``t // rows``: the matrices an MMA fragment needs), plain vectors walk
the contiguous mode first (consecutive threads read consecutive vectors). Successive
instructions continue where the previous one stopped until the tile is covered. Each of these can
be given as text too, as on the command line: a copy atom's name (``"SM75_U32x4_LDSM_N"``) or a TV
layout (``"((8,4),8):((32,1),4)"``); the tile layouts likewise (``"(8,64):(64,1)"``).

**Budgets.** The analyses enumerate every element of the tile; past ``max_elements`` (default
:data:`~cute_kernels.layouts.budget.ELEMENTS`) they refuse with a message instead of running for
minutes. ``vector_width`` of a plain layout is computed from its coalesced modes, at any size.

The reports print as the tables the docs show (``repr`` is that text, so the prompt shows it) and
display in Jupyter as an HTML table (``_repr_html_``), the bank-conflict report with a picture of
the worst instruction's banks.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from . import budget
from .atoms import CopyAtom, dtype_bits, dtype_name
from .display import Report
from .errors import LayoutError
from .int_tuple import flatten, is_int, product
from .layout import Layout
from .parse import as_layout

__all__ = [
    "Access",
    "BankConflictReport",
    "CoalescingReport",
    "VectorWidth",
    "bank_conflicts",
    "coalescing",
    "vector_width",
    "parse_access",
    "element_offset_fn",
    "warp_accesses",
    "wavefronts",
    "NUM_BANKS",
    "BANK_BYTES",
]

NUM_BANKS = 32
BANK_BYTES = 4
SECTOR_BYTES = 32
LINE_BYTES = 128


@dataclass(frozen=True)
class Access:
    """A warp-wide access pattern.

    * ``vector_bits``: contiguous bits one thread addresses (0 means one element).
    * ``phase_threads``: threads the hardware serves per phase (8 for ``ldmatrix``, 8/16/32 for
      128/64/<=32-bit vectors).
    * ``active_threads``: lanes that supply an address (``8 * count`` for ``ldmatrix.xN``).
    * ``order``: ``"rows"`` (rows fastest: ``ldmatrix``) or ``"contiguous"`` (consecutive threads
      along the contiguous mode).
    * ``tv``: optional TV layout ``(thread, value) -> tile index`` replacing the named placement
      (one instruction; values of a thread must be contiguous in memory).
    """

    name: str
    vector_bits: int
    phase_threads: int
    active_threads: int = 32
    order: str = "contiguous"
    tv: Layout | None = None

    def validate(self) -> None:
        if self.order not in ("rows", "contiguous"):
            raise LayoutError(f"access {self.name}: order must be 'rows' or 'contiguous', not {self.order!r}")
        if self.vector_bits < 0 or self.vector_bits > 128 or (self.vector_bits & (self.vector_bits - 1)):
            raise LayoutError(f"access {self.name}: vector_bits {self.vector_bits} is not a power of two <= 128")
        if not 1 <= self.phase_threads <= 32 or not 1 <= self.active_threads <= 32:
            raise LayoutError(f"access {self.name}: phase_threads and active_threads must be in 1..32")


def _phase_for_bits(bits: int) -> int:
    return 8 if bits > 64 else 16 if bits > 32 else 32


_NAMED = re.compile(r"(ldmatrix|stmatrix|ldsm|stsm)_?x([124])(_?t|_?trans)?\Z|vec(8|16|32|64|128)\Z|scalar\Z|u(32|64|128)\Z|cp_?async(_16b?)?\Z")
ACCESS_FORMS = ("ldmatrix_x1|x2|x4[_trans], stmatrix_x1|x2|x4[_trans], vec32|vec64|vec128, scalar, cp_async, "
                "a copy atom's name (SM75_U32x4_LDSM_N, SM90_U32x4_STSM_N, SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>...) "
                "or a TV layout (thread, value) -> tile index such as '((8,4),8):((32,1),4)'")


def _access_from_text(text: str, dtype: Any) -> Access | None:
    """A copy atom by name, or a TV layout in CuTe's notation; None when the text is neither."""
    from .atoms import atom

    if text[:2].upper() == "SM":
        try:
            rec = atom(text)
        except LayoutError:
            rec = None
        if isinstance(rec, CopyAtom):
            return parse_access(rec, dtype)
        if rec is not None:
            raise LayoutError(f"{text} is an MMA atom, not an access; give its operand's TV layout "
                              f"(atom({text!r}).c_layout) or a copy atom")
    if ":" in text:
        try:
            tv = as_layout(text)
        except LayoutError as err:
            raise LayoutError(f"access {text!r} looks like a TV layout but does not parse: {err}") from None
        return parse_access(tv, dtype)
    return None


def parse_access(access: Any, dtype: Any = None) -> Access:
    """An :class:`Access` for a name, a copy atom (or its name), an :class:`Access` or a TV layout
    (or its text); see the module docstring. ``dtype`` fixes the width of ``"scalar"`` and of
    TV-layout values."""
    if isinstance(access, Access):
        access.validate()
        return access
    if isinstance(access, Layout):
        if dtype is None:
            raise LayoutError("a TV-layout access needs dtype to know the width of its values")
        nvals = product(access.shape[1]) if isinstance(access.shape, tuple) and len(access.shape) == 2 else None
        if nvals is None:
            raise LayoutError(f"access TV layout {access} must be rank 2: (thread, value)")
        bits = nvals * dtype_bits(dtype)
        if bits > 128 or bits & (bits - 1):
            raise LayoutError(f"access TV layout {access}: {nvals} values x {dtype_bits(dtype)} bits is not a legal vector")
        nthr = product(access.shape[0])
        if nthr > 32 and nthr % 32:
            raise LayoutError(f"access TV layout {access}: {nthr} threads is neither one warp nor whole warps")
        return Access(f"tv {access}", bits, _phase_for_bits(bits), min(nthr, 32), "contiguous", access)
    if hasattr(access, "tv_layout") and isinstance(getattr(access, "tv_layout"), Layout):  # a TiledCopy
        return parse_access(access.tv_layout, dtype)
    if isinstance(access, CopyAtom):
        if access.num_threads == 32 and access.phase_threads == 8 and access.smem_vector_bits == 128:
            count = {8: 1, 16: 2, 32: 4}[len({access.smem_layout(t, 0) for t in range(32)})]
            kind = "ldmatrix" if access.src_space == "smem" else "stmatrix"
            return Access(f"{kind}_x{count}{'_trans' if access.transpose else ''}", 128, 8, 8 * count, "rows")
        bits = access.smem_vector_bits
        return Access(f"vec{bits} ({access.name})", bits, _phase_for_bits(bits), 32, "contiguous")
    if not isinstance(access, str):
        raise LayoutError(f"cannot read an access pattern from {type(access).__name__}")
    key = access.strip().lower().replace(".", "_").replace("-", "_")
    m = _NAMED.match(key)
    if not m:
        found = _access_from_text(access.strip(), dtype)
        if found is not None:
            return found
        raise LayoutError(f"unknown access {access!r}; use {ACCESS_FORMS}")
    if m.group(1):
        count = int(m.group(2))
        kind = "ldmatrix" if m.group(1) in ("ldmatrix", "ldsm") else "stmatrix"
        trans = "_trans" if m.group(3) else ""
        return Access(f"{kind}_x{count}{trans}", 128, 8, 8 * count, "rows")
    if key == "scalar":
        bits = dtype_bits(dtype) if dtype is not None else 0
        return Access("scalar", 0, 32 if bits <= 32 else 16, 32, "contiguous")
    bits = int(m.group(4) or m.group(5) or 128)
    return Access(f"vec{bits}", bits, _phase_for_bits(bits), 32, "contiguous")


# ---- evaluating layouts to element offsets ---------------------------------------------------

def element_offset_fn(layout: Any, bits: int, swizzle_unit: str = "bytes") -> Callable[[int], int]:
    """``i -> element offset`` of ``layout`` at its ``i``-th (colex) coordinate, applying an outer
    swizzle to byte addresses when ``swizzle_unit == "bytes"`` (see the module docstring)."""
    from .composed import ComposedLayout
    from .swizzle import Swizzle

    if swizzle_unit not in ("bytes", "elements"):
        raise LayoutError(f"swizzle_unit must be 'bytes' or 'elements', not {swizzle_unit!r}")
    if hasattr(layout, "element_layout"):  # a GMMA SmemAtom record: its element form is exact
        layout = layout.element_layout
        swizzle_unit = "elements"
    if (
        swizzle_unit == "bytes"
        and isinstance(layout, ComposedLayout)
        and isinstance(layout.outer, Swizzle)
        and isinstance(layout.inner, Layout)
    ):
        if bits % 8:
            raise LayoutError(f"a byte-address swizzle needs whole-byte elements, not {bits} bits")
        nbytes = bits // 8
        sw, off, inner = layout.outer, layout.offset, layout.inner

        def f(i: int) -> int:
            b = sw((off + inner(i)) * nbytes)
            if b % nbytes:
                raise LayoutError(f"{layout}: swizzle {sw} on byte addresses splits a {bits}-bit element")
            return b // nbytes

        return f
    return lambda i: layout(i)


def _tile_shape(layout: Any) -> tuple[int, int]:
    shape = layout.shape
    if not isinstance(shape, tuple) or len(shape) != 2:
        raise LayoutError(f"named access patterns read a rank-2 tile; {layout} has shape {shape}")
    return product(shape[0]), product(shape[1])


def _contiguous_mode(offset: Callable[[int], int], rows: int, cols: int) -> int:
    """The mode along which the first two elements are adjacent in memory (0 or 1)."""
    o0 = offset(0)
    if rows > 1 and abs(offset(1) - o0) == 1:
        return 0
    if cols > 1 and abs(offset(rows) - o0) == 1:
        return 1
    raise LayoutError("the tile has no unit-stride mode: a vector access needs contiguous elements")


def warp_accesses(layout: Any, dtype: Any, access: Any, *, swizzle_unit: str = "bytes",
                  max_elements: int = budget.ELEMENTS) -> list[list[list[int]]]:
    """The element offsets each lane reads, instruction by instruction: ``out[i][t]`` is the list
    of offsets lane ``t`` addresses in instruction ``i`` (empty for an idle lane).

    Raises :class:`LayoutError` if a lane's vector is not contiguous and aligned in memory (the
    instruction would be illegal), the tile does not split into the access's vectors, or it has
    more than ``max_elements`` elements.
    """
    layout = as_layout(layout)
    bits = dtype_bits(dtype)
    acc = parse_access(access, dtype)
    count = product(acc.tv.shape) if acc.tv is not None else layout.size()
    budget.check(count, max_elements, f"the access of tile {layout}",
                 "analyse a tile of it (composition(layout, (rows, cols))) or pass max_elements=")
    offset = element_offset_fn(layout, bits, swizzle_unit)
    n = max(1, acc.vector_bits // bits) if acc.vector_bits else 1
    if acc.vector_bits and acc.vector_bits < bits:
        raise LayoutError(f"access {acc.name}: a {acc.vector_bits}-bit vector is narrower than one {bits}-bit element")
    if acc.tv is not None:
        tv = acc.tv
        # one instruction per warp of the TV layout's threads
        nthr, nval = product(tv.shape[0]), product(tv.shape[1])
        instrs = []
        for w in range(0, nthr, 32):
            lanes = [[offset(tv(t, v)) for v in range(nval)] for t in range(w, min(w + 32, nthr))]
            instrs.append(lanes + [[] for _ in range(32 - len(lanes))])
    else:
        rows, cols = _tile_shape(layout)
        cmode = _contiguous_mode(offset, rows, cols)
        ext_c, ext_r = (rows, cols) if cmode == 0 else (cols, rows)
        if ext_c % n:
            raise LayoutError(f"access {acc.name}: the contiguous mode ({ext_c} elements) does not split into {n}-element vectors")
        nvec_c = ext_c // n
        total = nvec_c * ext_r

        def coord(q: int, j: int) -> int:
            if acc.order == "rows":
                r, vc = q % ext_r, q // ext_r
            else:
                vc, r = q % nvec_c, q // nvec_c
            c = vc * n + j
            return c + rows * r if cmode == 0 else r + rows * c

        instrs = []
        for start in range(0, total, acc.active_threads):
            lanes = []
            for t in range(32):
                q = start + t
                if t < acc.active_threads and q < total:
                    lanes.append([offset(coord(q, j)) for j in range(n)])
                else:
                    lanes.append([])
            instrs.append(lanes)
    for lanes in instrs:
        for t, offs in enumerate(lanes):
            if len(offs) > 1 and (offs != list(range(offs[0], offs[0] + len(offs))) or offs[0] % len(offs)):
                raise LayoutError(
                    f"access {acc.name}: lane {t}'s {len(offs) * bits}-bit vector covers offsets {offs}, "
                    "which are not contiguous and aligned under this layout"
                )
    return instrs


def _phases(byte_addresses: Sequence[Sequence[int]], phase_threads: int):
    """Per phase: ``{bank: {word, ...}}`` and the set of words, for the phases that touch memory."""
    for p in range(0, len(byte_addresses), phase_threads):
        banks: dict[int, set[int]] = defaultdict(set)
        words: set[int] = set()
        for lane in byte_addresses[p : p + phase_threads]:
            for a in lane:
                w = a // BANK_BYTES
                words.add(w)
                banks[w % NUM_BANKS].add(w)
        if words:
            yield banks, words


def wavefronts(byte_addresses: Sequence[Sequence[int]], phase_threads: int) -> tuple[int, int, int]:
    """``(wavefronts, ideal, way)`` of one warp-wide shared-memory instruction, where
    ``byte_addresses[t]`` lists the bytes lane ``t`` touches (empty if idle). See the module
    docstring for the model."""
    total = ideal = way = 0
    for banks, words in _phases(byte_addresses, phase_threads):
        deepest = max(len(s) for s in banks.values())
        total += deepest
        ideal += math.ceil(len(words) / NUM_BANKS)
        way = max(way, deepest)
    return total, ideal, way


def bank_words(byte_addresses: Sequence[Sequence[int]], phase_threads: int) -> tuple[tuple[int, ...], ...]:
    """Per phase, the number of distinct words each of the 32 banks serves (the wavefronts of a
    phase are its largest entry)."""
    return tuple(tuple(len(banks.get(b, ())) for b in range(NUM_BANKS)) for banks, _ in _phases(byte_addresses, phase_threads))


@dataclass(frozen=True, repr=False)
class BankConflictReport(Report):
    """Result of :func:`bank_conflicts`. Per-instruction figures are over the warp-wide
    instructions needed to cover the tile; ``wavefronts`` is the worst instruction, and
    ``banks`` holds, per phase of that instruction, the distinct words each bank serves."""

    access: str
    dtype: str
    instructions: int
    phases: int
    wavefronts: int
    ideal_wavefronts: int
    mean_wavefronts: float
    way: int
    per_instruction: tuple[int, ...]
    banks: tuple[tuple[int, ...], ...] = ()

    @property
    def conflict_degree(self) -> float:
        """Worst instruction's wavefronts over its ideal: 1.0 is conflict-free."""
        return self.wavefronts / self.ideal_wavefronts if self.ideal_wavefronts else 1.0

    @property
    def conflict_free(self) -> bool:
        return self.wavefronts == self.ideal_wavefronts

    def _verdict(self) -> str:
        return "conflict-free" if self.conflict_free else f"{self.way}-way bank conflict"

    def __str__(self) -> str:
        return (
            f"{self.access} on {self.dtype}: {self.instructions} instruction(s), {self.phases} phase(s) each\n"
            f"  wavefronts per instruction: {self.wavefronts} (ideal {self.ideal_wavefronts}, "
            f"mean {self.mean_wavefronts:g})\n"
            f"  conflict degree {self.conflict_degree:g}x: {self._verdict()}"
        )

    def table(self) -> list[tuple[str, str]]:
        return [
            ("instructions", str(self.instructions)), ("phases per instruction", str(self.phases)),
            ("wavefronts (worst instruction)", str(self.wavefronts)), ("ideal", str(self.ideal_wavefronts)),
            ("mean wavefronts", f"{self.mean_wavefronts:g}"), ("conflict degree", f"{self.conflict_degree:g}x"),
            ("verdict", self._verdict()),
        ]

    def picture_svg(self) -> str | None:
        if not self.banks:
            return None
        from .render import bank_svg

        return bank_svg(self.banks, f"worst instruction: distinct words per bank, one row per phase ({self.access})")


def bank_conflicts(smem_layout: Any, access: Any, dtype: Any = "bf16", *, swizzle_unit: str = "bytes",
                   max_elements: int = budget.ELEMENTS) -> BankConflictReport:
    """Wavefronts and conflict degree of reading (or writing) the tile ``smem_layout`` (coordinates
    -> element offsets in shared memory, a layout or its text) with ``access``, in the 32-bank
    model of the module docstring.

    Post-conditions: ``wavefronts >= ideal_wavefronts``; ``conflict_degree == 1.0`` iff no bank
    serves two distinct words within one phase of any instruction.
    """
    bits = dtype_bits(dtype)
    acc = parse_access(access, dtype)
    instrs = warp_accesses(smem_layout, dtype, acc, swizzle_unit=swizzle_unit, max_elements=max_elements)
    nbytes = max(1, bits // 8)
    def byte_addresses(lanes):
        return [[o * nbytes + b for o in offs for b in range(0, nbytes, BANK_BYTES)] for offs in lanes]

    per, ideals, way = [], [], 0
    for lanes in instrs:
        w, ideal, wy = wavefronts(byte_addresses(lanes), acc.phase_threads)
        per.append(w)
        ideals.append(ideal)
        way = max(way, wy)
    worst = max(range(len(per)), key=lambda i: (per[i] / max(ideals[i], 1), per[i]))
    phases = math.ceil(acc.active_threads / acc.phase_threads)
    return BankConflictReport(
        access=acc.name,
        dtype=dtype_name(dtype),
        instructions=len(per),
        phases=phases,
        wavefronts=per[worst],
        ideal_wavefronts=ideals[worst],
        mean_wavefronts=sum(per) / len(per),
        way=way,
        per_instruction=tuple(per),
        banks=bank_words(byte_addresses(instrs[worst]), acc.phase_threads),
    )


@dataclass(frozen=True, repr=False)
class CoalescingReport(Report):
    """Result of :func:`coalescing`: per warp-wide request, worst and mean over the tile."""

    access: str
    dtype: str
    requests: int
    sectors: int
    lines: int
    ideal_sectors: int
    mean_sectors: float
    bytes_per_request: int

    @property
    def efficiency(self) -> float:
        """Useful bytes over bytes moved, for the worst request."""
        return self.bytes_per_request / (self.sectors * SECTOR_BYTES) if self.sectors else 1.0

    def __str__(self) -> str:
        return (
            f"{self.access} on {self.dtype}: {self.requests} warp request(s) of {self.bytes_per_request} bytes\n"
            f"  sectors per request: {self.sectors} (ideal {self.ideal_sectors}, mean {self.mean_sectors:g}), "
            f"lines per request: {self.lines}\n"
            f"  efficiency {100 * self.efficiency:.1f}%"
        )

    def table(self) -> list[tuple[str, str]]:
        return [
            ("warp requests", str(self.requests)), ("bytes per request", str(self.bytes_per_request)),
            ("sectors (worst request)", str(self.sectors)), ("ideal sectors", str(self.ideal_sectors)),
            ("mean sectors", f"{self.mean_sectors:g}"), ("128-byte lines", str(self.lines)),
            ("efficiency", f"{100 * self.efficiency:.1f}%"),
        ]


def coalescing(layout: Any, dtype: Any = "bf16", access: Any = "vec128", *, base: int = 0,
               max_elements: int = budget.ELEMENTS) -> CoalescingReport:
    """32-byte sectors and 128-byte lines per warp request when a warp reads the global-memory tile
    ``layout`` (coordinates -> element offsets, a layout or its text) with ``access``, the tile
    starting at byte ``base`` (128-byte aligned when 0).

    Post-conditions: ``sectors >= ideal_sectors = ceil(bytes / 32)`` for a 32-byte aligned request;
    ``lines <= sectors <= 4 * lines``.
    """
    bits = dtype_bits(dtype)
    acc = parse_access(access, dtype)
    instrs = warp_accesses(layout, dtype, acc, swizzle_unit="elements", max_elements=max_elements)
    worst = None
    total_sectors = 0
    for lanes in instrs:
        addrs = {base + (o * bits) // 8 + b for offs in lanes for o in offs for b in range(max(1, bits // 8))}
        if not addrs:
            continue
        sectors = len({a // SECTOR_BYTES for a in addrs})
        lines = len({a // LINE_BYTES for a in addrs})
        total_sectors += sectors
        key = (sectors, lines, len(addrs))
        if worst is None or key > worst:
            worst = key
    if worst is None:
        raise LayoutError("coalescing: the access reads nothing")
    sectors, lines, nbytes = worst
    return CoalescingReport(
        access=acc.name,
        dtype=dtype_name(dtype),
        requests=len(instrs),
        sectors=sectors,
        lines=lines,
        ideal_sectors=math.ceil(nbytes / SECTOR_BYTES),
        mean_sectors=total_sectors / len(instrs),
        bytes_per_request=nbytes,
    )


@dataclass(frozen=True, repr=False)
class VectorWidth(Report):
    """The widest legal vector access: ``bits`` and ``elements`` (``bits == elements * dtype bits``)."""

    bits: int
    elements: int

    def __str__(self) -> str:
        return f"{self.bits}-bit vectors ({self.elements} element{'s' if self.elements != 1 else ''})"

    def table(self) -> list[tuple[str, str]]:
        return [("bits per vector", str(self.bits)), ("elements per vector", str(self.elements))]


def _contiguous_first(layout: Any) -> Any:
    """The same layout with its domain reordered so that its unit-stride leaf comes first (the
    layout itself when it has none): vectors run along the direction memory is contiguous."""
    from .composed import ComposedLayout
    from .int_tuple import flatten

    inner = layout.inner if isinstance(layout, ComposedLayout) and isinstance(layout.inner, Layout) else layout
    if not isinstance(inner, Layout):
        return layout
    shapes, strides = list(flatten(inner.shape)), list(flatten(inner.stride))
    unit = [i for i, (s, d) in enumerate(zip(shapes, strides)) if d == 1 and s > 1]
    if not unit:
        return layout
    k = unit[0]
    order = [k] + [i for i in range(len(shapes)) if i != k]
    flat = Layout(tuple(shapes[i] for i in order), tuple(strides[i] for i in order))
    return layout.with_inner(flat) if isinstance(layout, ComposedLayout) else flat


def vector_width(
    layout: Any, dtype: Any = "bf16", *, max_bits: int = 128, swizzle_unit: str = "bytes", along: str = "contiguous",
    max_elements: int = budget.ELEMENTS,
) -> VectorWidth:
    """The widest vector a thread may use to access ``layout``'s elements (a layout or its text).

    ``along="index"`` vectorizes the layout's own index order (CuTe's ``max_common_vector`` with a
    compact register layout); ``along="contiguous"`` (the default) first moves the unit-stride
    leaf of the layout to the front, so a row-major tile vectorizes along its rows.
    ``n`` elements (a power of two, ``n * bits <= max_bits``) are legal when, for every ``k``,
    indices ``k*n .. k*n + n-1`` map to consecutive offsets starting at a multiple of ``n`` (the
    alignment hardware vectors need, assuming an aligned base pointer).
    A plain layout is decided from its coalesced modes at any size; a swizzled one is enumerated,
    up to ``max_elements`` elements.
    Post-condition: the result divides ``size(layout)`` and is at least one element.
    """
    if along not in ("contiguous", "index"):
        raise LayoutError(f"vector_width: along must be 'contiguous' or 'index', not {along!r}")
    layout = as_layout(layout)
    if hasattr(layout, "element_layout"):
        layout, swizzle_unit = layout.element_layout, "elements"
    if along == "contiguous":
        layout = _contiguous_first(layout)
    bits = dtype_bits(dtype)
    if max_bits < bits:
        raise LayoutError(f"vector_width: max_bits {max_bits} is narrower than one {bits}-bit element")
    limit = 1 << (max_bits // bits).bit_length() - 1  # the widest power of two allowed
    n = _plain_vector(layout, limit)
    if n is None:
        n = _enumerated_vector(layout, bits, swizzle_unit, limit, max_elements)
    return VectorWidth(n * bits, n)


def _plain_vector(layout: Any, limit: int) -> int | None:
    """The widest vector of a plain layout with integer strides, from ``coalesce(layout)`` (None for
    other layouts). On coalesced modes ``s0:d0, s1:d1, ...``, ``n > 1`` elements are legal exactly
    when ``d0 == 1``, ``n`` divides ``s0`` (a group never straddles into the next mode, which
    cannot continue it: coalescing would have merged it) and every other stride is a multiple of
    ``n`` (each group starts aligned)."""
    from .coalesce import coalesce

    if not isinstance(layout, Layout) or not all(is_int(d) for d in flatten(layout.stride)):
        return None
    flat = coalesce(layout)
    shapes, strides = flatten(flat.shape), flatten(flat.stride)
    if shapes[0] == 1 or strides[0] != 1:
        return 1
    n = 1
    while 2 * n <= limit and shapes[0] % (2 * n) == 0 and all(d % (2 * n) == 0 for d in strides[1:]):
        n *= 2
    return n


def _enumerated_vector(layout: Any, bits: int, swizzle_unit: str, limit: int, max_elements: int) -> int:
    """The same answer, by evaluating every element (the reference :func:`_plain_vector` is tested against)."""
    size = layout.size()
    budget.check(size, max_elements, f"vector_width of {layout}", "pass max_elements= or analyse a tile of it")
    offset = element_offset_fn(layout, bits, swizzle_unit)
    offs = [offset(i) for i in range(size)]
    n = 1
    while 2 * n <= limit and size % (2 * n) == 0:
        m = 2 * n
        if all(offs[k] % m == 0 and offs[k + 1 : k + m] == list(range(offs[k] + 1, offs[k] + m)) for k in range(0, size, m)):
            n = m
        else:
            break
    return n
