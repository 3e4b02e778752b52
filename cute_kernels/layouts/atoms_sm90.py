"""SM90 (Hopper) warpgroup MMA ``wgmma.mma_async.sync.aligned.m64nNkK``.

128 threads (four warps, ``thr_id = 128:1``) compute a 64xNxK product; N runs from 8 to 256 in
steps of 8, K is 16 for 16-bit inputs and 32 for 8-bit ones.

* ``_SS``: A and B both come from shared memory through 64-bit matrix descriptors. Their TV
  layouts have a stride-0 thread mode: every thread "holds" the whole operand, which is how CuTe
  says the operand is not partitioned across threads.
* ``_RS``: A comes from registers, with the ``m16n8k16`` fragment of warp ``w`` on rows
  ``16w .. 16w+15``; B still from shared memory.
* The accumulator: warp ``w`` owns rows ``16w + groupID (+8)``, thread ``threadID_in_group``
  columns ``2*tig + {0,1} + 8*j`` for ``j < N/8``.

16-bit forms may read A and B MN-major from shared memory (CuTe's ``GMMA::Major`` template
arguments, not part of the name: see :meth:`MmaAtom.with_majors`); 8-bit forms are K-major only,
hence their ``_TN`` suffix.
"""

from __future__ import annotations

import re

from .atoms import MmaAtom
from .composition import composition
from .layout import Layout

THR_ID = Layout(128, 1)
N_VALUES = tuple(range(8, 257, 8))


def ss_layout(rows: int, k: int) -> Layout:
    """``(T128, (rows, K)) -> row + rows*k`` with a stride-0 thread mode (shared-memory operand)."""
    return Layout((128, (rows, k)), (0, (1, rows)))


def rs_a_layout(k: int) -> Layout:
    """Register A of ``m64nNk{k}``: ``(T128, V) -> m + 64*k``. K=16: two adjacent 16-bit values
    per 32-bit register; K=32: four adjacent 8-bit values."""
    if k == 16:
        return Layout(((4, 8, 4), (2, 2, 2)), ((128, 1, 16), (64, 8, 512)))
    return Layout(((4, 8, 4), (4, 2, 2)), ((256, 1, 16), (64, 8, 1024)))


def c_layout(n: int) -> Layout:
    """Accumulator of ``m64nN``: ``(T128, V) -> m + 64*n`` with ``N/2`` values per thread."""
    return Layout(((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512)))


GATE_BLOCK = 8  # columns per gate (and per up) block of a gated product: one accumulator column block
GATE_UP_OFFSET = 4  # values from a gate value to its up value in the accumulator's value order


def gate_selector(n: int) -> Layout:
    """Which of a thread's ``m64nN`` accumulator values are gate elements when the product's
    columns alternate blocks of 8 gate and 8 up columns (the SwiGLU epilogue,
    ``hopper.epilogue.gate_view``): ``V' -> V``, from the values of the half-width ``m64n(N/2)``
    accumulator to the values of ``c_layout(n)`` holding their gate element, the even 8-column
    blocks; each one's up element is ``GATE_UP_OFFSET`` values further, in the same thread, so
    ``c_layout(n)`` composed with this selector puts every gated value where ``c_layout(n // 2)``
    puts the output (``gate_layouts``)."""
    if n % (2 * GATE_BLOCK):
        raise ValueError(f"gate_selector: N = {n} must be a multiple of {2 * GATE_BLOCK}")
    return Layout((2, 2, n // 16), (1, 2, 2 * GATE_UP_OFFSET))


def gate_layouts(n: int) -> tuple[Layout, int]:
    """(gate, up_offset): ``gate`` maps ``(T128, V')`` to ``m + 64*col`` of the product element
    each thread gates into its output value ``V'`` (``c_layout(n // 2)``'s values) for a 64xN
    gate-up product; its up element is ``up_offset`` further (8 columns)."""
    full = c_layout(n)
    gate = composition(Layout(full.shape[1], full.stride[1]), gate_selector(n))
    return Layout((full.shape[0], gate.shape), (full.stride[0], gate.stride)), 64 * GATE_BLOCK


_T16 = {"F16F16F16": ("f16", "f16"), "F32F16F16": ("f32", "f16"), "F32BF16BF16": ("f32", "bf16")}
_T8 = [f"{d}{a}{b}" for d in ("F16", "F32") for a in ("E4M3", "E5M2") for b in ("E4M3", "E5M2")]
_T8 += [f"S32{a}{b}" for a in ("S8", "U8") for b in ("S8", "U8")]
_TOKEN = r"F32|F16|BF16|S32|S8|U8|E4M3|E5M2"


def _record(name: str, n: int, k: int, d: str, a: str, b: str, src: str) -> MmaAtom:
    return MmaAtom(
        name=name,
        ptx=f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{d}.{a}.{b}",
        arch="sm_90a",
        shape_mnk=(64, n, k),
        thr_id=THR_ID,
        a_layout=ss_layout(64, k) if src == "SS" else rs_a_layout(k),
        b_layout=ss_layout(n, k),
        c_layout=c_layout(n),
        a_dtype=a,
        b_dtype=b,
        c_dtype=d,
        a_source="smem" if src == "SS" else "rmem",
        b_source="smem",
    )


def _build16(m):
    n, types, src = int(m.group(1)), m.group(2), m.group(3)
    if n not in N_VALUES or types not in _T16:
        return None
    d, a = _T16[types]
    return _record(m.group(0), n, 16, d, a, a, src)


def _build8(m):
    n, types, src = int(m.group(1)), m.group(2), m.group(3)
    if n not in N_VALUES or types not in _T8:
        return None
    d, a, b = (t.lower() for t in re.findall(_TOKEN, types))
    return _record(m.group(0), n, 32, d, a, b, src)


def _names16():
    return [f"SM90_64x{n}x16_{t}_{s}" for t in _T16 for s in ("SS", "RS") for n in N_VALUES]


def _names8():
    return [f"SM90_64x{n}x32_{t}_{s}_TN" for t in _T8 for s in ("SS", "RS") for n in N_VALUES]


FAMILIES = [
    (r"SM90_64x(\d+)x16_([A-Z0-9]+)_(SS|RS)", _build16, _names16),
    (r"SM90_64x(\d+)x32_([A-Z0-9]+)_(SS|RS)_TN", _build8, _names8),
]
