"""MMA and copy atoms as data: one record per instruction, looked up by CuTe's own names.

An *atom* is the smallest unit of work one instruction does, described the way CuTe's
``MMA_Traits`` / ``Copy_Traits`` describe it:

* ``thr_id``: logical thread index ``t`` of the atom -> lane (warp) or thread (warpgroup).
  The identity ``32:1`` for ``mma.sync``; ``(4,2):(1,16)`` for the SM70 quad pair (lanes 0-3 and
  16-19).
* ``a_layout``: the TV layout of A, ``(thread, value) -> m + M*k`` in the M x K tile (column-major
  index). ``b_layout``: ``(thread, value) -> n + N*k`` in the N x K tile. ``c_layout``:
  ``(thread, value) -> m + M*n`` in the M x N tile. A stride-0 thread mode (the SM90 ``SS`` forms)
  means every thread sees the whole operand: it lives in shared memory behind a descriptor.

Post-conditions (tested against tables derived from the PTX ISA's fragment descriptions):
for a register operand, ``(t, v) -> element`` is a bijection from ``[0, T) x [0, V)`` onto the
operand tile; ``size(a_layout) == T * M * K / T`` and likewise for B and C.

``atom(name)`` returns the record; ``atom_names(kind=...)`` lists the registry. Nothing here
imports torch or the DSL; the records build :class:`~cute_kernels.layouts.layout.Layout` objects.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

from .errors import LayoutError
from .layout import Layout

__all__ = [
    "MmaAtom",
    "CopyAtom",
    "atom",
    "atom_names",
    "dtype_bits",
    "dtype_name",
    "DTYPE_BITS",
]

# Element widths in bits, by the short names CuTe's atom names use (lower case).
DTYPE_BITS: dict[str, int] = {
    "f64": 64,
    "f32": 32,
    "tf32": 32,
    "s32": 32,
    "u32": 32,
    "f16": 16,
    "bf16": 16,
    "s16": 16,
    "u16": 16,
    "e4m3": 8,
    "e5m2": 8,
    "s8": 8,
    "u8": 8,
}

# Aliases accepted wherever a dtype is named: torch/numpy/DSL spellings.
_ALIASES = {
    "float64": "f64", "double": "f64", "float": "f32", "float32": "f32", "tfloat32": "tf32",
    "int32": "s32", "uint32": "u32", "float16": "f16", "half": "f16", "bfloat16": "bf16",
    "int16": "s16", "uint16": "u16", "float8_e4m3fn": "e4m3", "float8e4m3fn": "e4m3",
    "float8_e5m2": "e5m2", "float8e5m2": "e5m2", "int8": "s8", "uint8": "u8",
}


def dtype_name(dtype: Any) -> str:
    """The short name (``"bf16"``, ``"f32"``, ``"e4m3"``...) of a dtype given as a name, or as a
    torch/numpy/DSL dtype object (read by its printed name; nothing is imported)."""
    if isinstance(dtype, str):
        key = dtype.strip().lower()
    else:
        key = str(getattr(dtype, "__name__", dtype)).lower()
    key = key.rsplit(".", 1)[-1].replace("<class '", "").rstrip("'>")
    key = _ALIASES.get(key, key)
    if key not in DTYPE_BITS:
        raise LayoutError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BITS))}")
    return key


def dtype_bits(dtype: Any) -> int:
    """Width in bits of ``dtype`` (a name such as ``"bf16"`` or a torch/numpy/DSL dtype)."""
    return DTYPE_BITS[dtype_name(dtype)]


@dataclass(frozen=True)
class MmaAtom:
    """One MMA instruction as CuTe's ``MMA_Traits`` records it (see the module docstring).

    ``a_source`` is ``"rmem"`` (registers) or ``"smem"`` (a shared-memory descriptor, SM90 SS/RS
    B); ``a_major``/``b_major`` are ``"K"`` or ``"MN"``: which mode is contiguous in memory for
    operands read from shared memory, and for SM70 which PTX ``.row``/``.col`` the fragment
    uses.
    """

    name: str
    ptx: str
    arch: str
    shape_mnk: tuple[int, int, int]
    thr_id: Layout
    a_layout: Layout
    b_layout: Layout
    c_layout: Layout
    a_dtype: str
    b_dtype: str
    c_dtype: str
    a_source: str = "rmem"
    b_source: str = "rmem"
    a_major: str = "K"
    b_major: str = "K"
    notes: str = ""

    kind = "mma"

    @property
    def num_threads(self) -> int:
        return self.thr_id.size()

    @property
    def layouts(self) -> dict[str, Layout]:
        """``{"A": a_layout, "B": b_layout, "C": c_layout}``."""
        return {"A": self.a_layout, "B": self.b_layout, "C": self.c_layout}

    def with_majors(self, a_major: str | None = None, b_major: str | None = None) -> "MmaAtom":
        """The same SM90 instruction with other operand majors (CuTe's ``GMMA::Major`` template
        arguments; the name does not change). Only shared-memory operands may be MN-major."""
        out = dataclasses.replace(self, a_major=a_major or self.a_major, b_major=b_major or self.b_major)
        out.validate()
        return out

    def validate(self) -> None:
        """Raise :class:`LayoutError` if the record is inconsistent: layouts of the wrong size or
        codomain, an unknown major or source, or an MN-major register operand on SM90."""
        m, n, k = self.shape_mnk
        t = self.num_threads
        for op, lay, rows, cols in (("A", self.a_layout, m, k), ("B", self.b_layout, n, k), ("C", self.c_layout, m, n)):
            if lay[0].size() != t:
                raise LayoutError(f"{self.name}: {op} layout {lay} has {lay[0].size()} threads, atom has {t}")
            if lay.cosize() > rows * cols:
                raise LayoutError(f"{self.name}: {op} layout {lay} reaches past the {rows}x{cols} tile")
        for major in (self.a_major, self.b_major):
            if major not in ("K", "MN"):
                raise LayoutError(f"{self.name}: major must be 'K' or 'MN', not {major!r}")
        if self.arch.startswith("sm_90"):
            if self.a_source == "rmem" and self.a_major != "K":
                raise LayoutError(f"{self.name}: a register A operand (RS) must be K-major")
            if self.a_dtype in ("e4m3", "e5m2", "s8", "u8") and (self.a_major, self.b_major) != ("K", "K"):
                raise LayoutError(f"{self.name}: 8-bit wgmma operands must be K-major (the _TN forms)")

    def __str__(self) -> str:
        m, n, k = self.shape_mnk
        return (
            f"{self.name}  ({self.ptx}, {self.arch})\n"
            f"  shape MNK {m}x{n}x{k}, {self.num_threads} threads, thr_id {self.thr_id}\n"
            f"  A {self.a_dtype:<5} {self.a_source} {self.a_major}-major  (T,V)->(M,K): {self.a_layout}\n"
            f"  B {self.b_dtype:<5} {self.b_source} {self.b_major}-major  (T,V)->(N,K): {self.b_layout}\n"
            f"  C {self.c_dtype:<5} rmem            (T,V)->(M,N): {self.c_layout}"
        )

    # The REPL shows the whole record: name, instruction and the three TV layouts.
    __repr__ = __str__

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def to_svg(self, **kw) -> str:
        from .render import mma_atom_svg

        return mma_atom_svg(self, **kw)

    def _repr_svg_(self) -> str | None:
        from .render import repr_svg

        return repr_svg(self)

    def to_latex(self, **kw) -> str:
        from .render import mma_atom_latex

        return mma_atom_latex(self, **kw)


@dataclass(frozen=True)
class CopyAtom:
    """One copy instruction as CuTe's ``Copy_Traits`` records it, in units of ``value_bits``.

    * ``src_layout`` / ``dst_layout``: ``(thread, value) -> index`` into the atom's reference tile
      (the same element index space for both sides; for ``ldmatrix`` the tile is the loaded
      8x8 matrices, row-major, matrix ``j`` at ``64*j``).
    * ``smem_vector_bits``: how many contiguous bits one thread addresses in shared memory per
      access (128 for ``ldmatrix``/``stmatrix`` rows and ``cp.async``); ``phase_threads``: how many
      threads the hardware serves per shared-memory phase (8 for ``ldmatrix``: one 8x8 matrix).
    * ``transpose``: ``.trans`` forms, whose register fragment is the transpose of the rows read.
    """

    name: str
    ptx: str
    arch: str
    num_threads: int
    value_bits: int
    src_layout: Layout
    dst_layout: Layout
    src_space: str
    dst_space: str
    smem_vector_bits: int = 128
    phase_threads: int = 8
    transpose: bool = False
    box: tuple[int, ...] | None = None
    notes: str = ""

    kind = "copy"

    @property
    def smem_layout(self) -> Layout:
        """The TV layout on the shared-memory side (source of a load, destination of a store)."""
        return self.src_layout if self.src_space == "smem" else self.dst_layout

    @property
    def layouts(self) -> dict[str, Layout]:
        return {"src": self.src_layout, "dst": self.dst_layout}

    def __str__(self) -> str:
        box = f", box {self.box}" if self.box else ""
        return (
            f"{self.name}  ({self.ptx}, {self.arch}{box})\n"
            f"  {self.num_threads} threads, values of {self.value_bits} bits\n"
            f"  src {self.src_space:<4} (T,V)->idx: {self.src_layout}\n"
            f"  dst {self.dst_space:<4} (T,V)->idx: {self.dst_layout}"
        )

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def to_svg(self, **kw) -> str:
        from .render import copy_atom_svg

        return copy_atom_svg(self, **kw)

    def _repr_svg_(self) -> str | None:
        from .render import repr_svg

        return repr_svg(self)


# ---- registry ---------------------------------------------------------------------------------
# Each table module exposes `FAMILIES`: a list of (regex, builder) where builder(match) -> atom.
# Families with a parameter sweep (wgmma N = 8..256) are generated on lookup, not stored.

@dataclass(frozen=True)
class _Family:
    pattern: "re.Pattern[str]"
    build: Callable[["re.Match[str]"], Any]
    names: Callable[[], list[str]] = field(default=lambda: [])


def _families() -> list[_Family]:
    from . import atoms_sm70, atoms_sm80, atoms_sm90, copy_atoms

    out: list[_Family] = []
    for mod in (atoms_sm70, atoms_sm80, atoms_sm90, copy_atoms):
        for pattern, build, names in mod.FAMILIES:
            out.append(_Family(re.compile(pattern + r"\Z"), build, names))
    return out


@lru_cache(maxsize=None)
def _registry() -> tuple[_Family, ...]:
    return tuple(_families())


@lru_cache(maxsize=4096)
def atom(name: str):
    """The atom record for CuTe's name ``name`` (``"SM80_16x8x16_F32BF16BF16F32_TN"``,
    ``"SM90_64x128x16_F32BF16BF16_SS"``, ``"SM75_U32x4_LDSM_N"``...).

    Post-condition: ``atom(n).name == n`` and the record passes its ``validate()``.
    Raises :class:`LayoutError` for an unknown name, listing near matches.
    """
    if not isinstance(name, str):
        raise LayoutError(f"atom names are strings, not {type(name).__name__}")
    for fam in _registry():
        m = fam.pattern.match(name)
        if m:
            rec = fam.build(m)
            if rec is None:
                break
            if hasattr(rec, "validate"):
                rec.validate()
            return rec
    prefix = name.split("_")[0]
    near = [n for n in atom_names() if n.startswith(prefix)][:8]
    hint = f"; e.g. {', '.join(near)}" if near else ""
    raise LayoutError(f"no atom named {name!r}{hint} (atom_names() lists them all)")


def atom_names(kind: str | None = None, arch: str | None = None) -> list[str]:
    """Every registered atom name (wgmma N sweeps included), optionally only ``kind`` ("mma" or
    "copy") or only one ``arch`` prefix ("sm_80", "sm_90a"...)."""
    names: list[str] = []
    for fam in _registry():
        names.extend(fam.names())
    if kind is None and arch is None:
        return names
    out = []
    for n in names:
        rec = atom(n)
        if kind is not None and rec.kind != kind:
            continue
        if arch is not None and not rec.arch.startswith(arch):
            continue
        out.append(n)
    return out
