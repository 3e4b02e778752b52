"""SM70 (Volta) ``mma.sync.aligned.m8n8k4``: one 8x8x4 product per *quad pair* of lanes.

A warp holds four quad pairs (lanes 0-3 with 16-19, 4-7 with 20-23, ...), each computing its own
8x8x4 product; the atom is one of them, so its logical thread ``t`` in ``[0, 8)`` is lane
``t % 4 + 16 * (t // 4)``: ``thr_id = (4,2):(1,16)``.

CuTe's BLAS-style suffix names the operand majors: ``T`` for A (and ``N`` for B) is K-major, so
``_TN`` is ``mma...row.col``; ``_NT`` is ``.col.row``; ``_NN`` is ``.col.col``; ``_TT`` is ``.row.row``.
"""

from __future__ import annotations

from .atoms import MmaAtom
from .layout import Layout

THR_ID = Layout((4, 2), (1, 16))
# (T8, V4) -> (M8, K4): the thread holds one row of K ("row") or one K column of four rows ("col")
K_MAJOR_8x4 = Layout((8, 4), (1, 8))
MN_MAJOR_8x4 = Layout(((4, 2), 4), ((8, 4), 1))
# (T8, V8) -> (M8, N8)
C_16BIT = Layout((8, 8), (1, 8))
C_32BIT = Layout(((2, 2, 2), (2, 2, 2)), ((1, 16, 4), (8, 2, 32)))

_MAJORS = {  # suffix -> (A layout, B layout, ptx A, ptx B, a_major, b_major)
    "TN": (K_MAJOR_8x4, K_MAJOR_8x4, "row", "col", "K", "K"),
    "NT": (MN_MAJOR_8x4, MN_MAJOR_8x4, "col", "row", "MN", "MN"),
    "NN": (MN_MAJOR_8x4, K_MAJOR_8x4, "col", "col", "MN", "K"),
    "TT": (K_MAJOR_8x4, MN_MAJOR_8x4, "row", "row", "K", "MN"),
}
_TYPES = {"F16F16F16F16": ("f16", "f16"), "F32F16F16F32": ("f32", "f32")}


def _build(m):
    acc, acc_c = _TYPES[m.group(1)]
    a_lay, b_lay, pa, pb, am, bm = _MAJORS[m.group(2)]
    return MmaAtom(
        name=m.group(0),
        ptx=f"mma.sync.aligned.m8n8k4.{pa}.{pb}.{acc_c}.f16.f16.{acc}",
        arch="sm_70",
        shape_mnk=(8, 8, 4),
        thr_id=THR_ID,
        a_layout=a_lay,
        b_layout=b_lay,
        c_layout=C_16BIT if acc == "f16" else C_32BIT,
        a_dtype="f16",
        b_dtype="f16",
        c_dtype=acc,
        a_major=am,
        b_major=bm,
        notes="one quad pair (lanes 0-3, 16-19); a warp runs four of them",
    )


def _names():
    return [f"SM70_8x8x4_{t}_{s}" for t in _TYPES for s in _MAJORS]


FAMILIES = [(r"SM70_8x8x4_(F16F16F16F16|F32F16F16F32)_(TN|NT|NN|TT)", _build, _names)]
