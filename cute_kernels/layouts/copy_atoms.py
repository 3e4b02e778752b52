"""Copy atoms: ``ldmatrix``/``stmatrix`` (x1/x2/x4, with and without ``.trans``), ``cp.async`` and
the TMA box, with TV layouts in units of ``value_bits``.

``ldmatrix`` (CuTe ``SM75_U32x{1,2,4}_LDSM_N``, ``SM75_U16x{2,4,8}_LDSM_T``) loads one, two or four
8x8 matrices of 16-bit elements. The reference tile is those matrices, row-major, matrix ``j`` at
index ``64*j``: element ``(j, r, c)`` is ``64*j + 8*r + c``.

* Shared-memory side: lane ``8*j + r`` supplies the address of row ``r`` of matrix ``j``, 16
  contiguous bytes; lanes beyond ``8 * count`` supply none (stride-0 thread mode, as in CuTe).
  The hardware serves one matrix (eight lanes, eight 16-byte rows) per phase.
* Register side: lane ``t`` receives, in register ``j``, elements ``(j, t // 4, 2*(t % 4) + {0,1})``;
  with ``.trans`` it receives ``(j, 2*(t % 4) + {0,1}, t // 4)``: the transpose.

``stmatrix`` (CuTe ``SM90_U32x{1,2,4}_STSM_N``, ``SM90_U16x{2,4,8}_STSM_T``) is the same pair of
layouts with source and destination swapped.
"""

from __future__ import annotations

from .atoms import CopyAtom
from .errors import LayoutError
from .layout import Layout

_COUNT = {"U32x1": 1, "U32x2": 2, "U32x4": 4, "U16x2": 1, "U16x4": 2, "U16x8": 4}


def smem_rows_layout(count: int) -> Layout:
    """``(T32, V8) -> idx``: lane ``t < 8*count`` addresses row ``t`` (eight 16-bit values)."""
    if count == 4:
        return Layout((32, 8), (8, 1))
    return Layout(((8 * count, 4 // count), 8), ((8, 0), 1))


def fragment_layout(count: int, trans: bool) -> Layout:
    """``(T32, V) -> idx``: the register fragment, two 16-bit values per matrix per lane."""
    if trans:
        vals = (2, count) if count > 1 else 2
        vstr = (8, 64) if count > 1 else 8
        return Layout(((4, 8), vals), ((16, 1), vstr))
    vals = (2, count) if count > 1 else 2
    vstr = (1, 64) if count > 1 else 1
    return Layout((32, vals), (2, vstr))


def _matrix(m):
    arch, unit, kind, nt = m.group(1), m.group(2), m.group(3), m.group(4)
    count = _COUNT[unit]
    trans = nt == "T"
    if (unit.startswith("U16")) != trans:
        return None  # U32xN are the plain forms, U16xN the .trans ones
    rows, frag = smem_rows_layout(count), fragment_layout(count, trans)
    load = kind == "LDSM"
    if (arch == "SM75") != load:
        return None
    op = "ldmatrix" if load else "stmatrix"
    return CopyAtom(
        name=m.group(0),
        ptx=f"{op}.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.shared.b16",
        arch="sm_75" if load else "sm_90",
        num_threads=32,
        value_bits=16,
        src_layout=rows if load else frag,
        dst_layout=frag if load else rows,
        src_space="smem" if load else "rmem",
        dst_space="rmem" if load else "smem",
        smem_vector_bits=128,
        phase_threads=8,
        transpose=trans,
    )


def _matrix_names():
    out = []
    for arch, kind in (("SM75", "LDSM"), ("SM90", "STSM")):
        out += [f"{arch}_U32x{c}_{kind}_N" for c in (1, 2, 4)]
        out += [f"{arch}_U16x{2 * c}_{kind}_T" for c in (1, 2, 4)]
    return out


_CP_BYTES = {"uint32_t": 4, "uint64_t": 8, "uint128_t": 16}


def _cp_async(m):
    policy, ty = m.group(1), m.group(2)
    nbytes = _CP_BYTES[ty]
    if policy == "CACHEGLOBAL" and nbytes != 16:
        return None  # cp.async.cg only moves 16 bytes
    lay = Layout((1, nbytes), (0, 1))
    return CopyAtom(
        name=m.group(0),
        ptx=f"cp.async.{'cg' if policy == 'CACHEGLOBAL' else 'ca'}.shared.global [dst], [src], {nbytes}",
        arch="sm_80",
        num_threads=1,
        value_bits=8,
        src_layout=lay,
        dst_layout=lay,
        src_space="gmem",
        dst_space="smem",
        smem_vector_bits=8 * nbytes,
        phase_threads={4: 32, 8: 16, 16: 8}[nbytes],
        notes="one thread moves one vector; a warp issues 32 of them",
    )


def _cp_names():
    return ["SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>"] + [f"SM80_CP_ASYNC_CACHEALWAYS<{t}>" for t in _CP_BYTES]


def tma_atom(box: tuple[int, ...], dtype: str = "bf16", *, store: bool = False) -> CopyAtom:
    """A TMA copy of one ``box`` (elements, innermost mode first as in the tensor map) issued by a
    single thread. ``src``/``dst`` are ``(T1, V) -> idx`` over the box in colex order.

    Raises :class:`LayoutError` where the box breaks the tensor-map rules: 1 to 5 modes, each
    at most 256 elements, the inner mode a multiple of 16 bytes.
    """
    from .atoms import dtype_bits, dtype_name

    box = tuple(int(b) for b in box)
    bits = dtype_bits(dtype)
    if not 1 <= len(box) <= 5 or any(b < 1 or b > 256 for b in box):
        raise LayoutError(f"TMA box {box}: 1 to 5 modes of 1..256 elements each")
    if (box[0] * bits) % 128:
        raise LayoutError(f"TMA box {box}: the inner mode must span a multiple of 16 bytes ({box[0]} x {bits} bits)")
    n = 1
    for b in box:
        n *= b
    lay = Layout((1, n), (0, 1))
    name = "SM90_TMA_STORE" if store else "SM90_TMA_LOAD"
    return CopyAtom(
        name=name,
        ptx="cp.async.bulk.tensor" + (".shared::cta.global" if store else ".shared::cluster.global.mbarrier::complete_tx::bytes"),
        arch="sm_90",
        num_threads=1,
        value_bits=bits,
        src_layout=lay,
        dst_layout=lay,
        src_space="smem" if store else "gmem",
        dst_space="gmem" if store else "smem",
        smem_vector_bits=128,
        phase_threads=8,
        box=box,
        notes=f"box of {dtype_name(dtype)} elements {box}; the smem side follows the tensor map's swizzle",
    )


def _tma(m):
    return tma_atom((64, 64), "bf16", store=m.group(1) == "STORE")


FAMILIES = [
    (r"(SM75|SM90)_(U32x1|U32x2|U32x4|U16x2|U16x4|U16x8)_(LDSM|STSM)_(N|T)", _matrix, _matrix_names),
    (r"SM80_CP_ASYNC_(CACHEGLOBAL|CACHEALWAYS)<(uint32_t|uint64_t|uint128_t)>", _cp_async, _cp_names),
    (r"SM90_TMA_(LOAD|STORE)", _tma, lambda: ["SM90_TMA_LOAD", "SM90_TMA_STORE"]),
]
