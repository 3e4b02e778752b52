"""SM80 (Ampere) and SM89 (Ada) warp-wide ``mma.sync.aligned.m16n8k{8,16,32}`` atoms.

All 32 lanes take part (``thr_id = 32:1``). The lane splits as ``lane = 4 * groupID +
threadID_in_group``, which is why every thread mode below is ``(4,8)``: the four threads of a
group walk K (A, B) or N (C) in pairs or quads of adjacent elements, the eight groups walk rows.
Only the K-major (``TN``: ``.row.col``) forms exist for these instructions.
"""

from __future__ import annotations

from .atoms import MmaAtom
from .layout import Layout

THR_ID = Layout(32, 1)

# (T32, V) -> (M16, K) for A, (N8, K) for B, (M16, N8) for C; index m + M*k etc.
A_16x8 = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))          # m16 k8,  16-bit
B_8x8 = Layout(((4, 8), 2), ((16, 1), 8))                      # n8  k8,  16-bit
A_16x16 = Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))  # m16 k16, 16-bit
B_8x16 = Layout(((4, 8), (2, 2)), ((16, 1), (8, 64)))          # n8  k16, 16-bit
A_16x32 = Layout(((4, 8), (4, 2, 2)), ((64, 1), (16, 8, 256)))  # m16 k32, 8-bit
B_8x32 = Layout(((4, 8), (4, 2)), ((32, 1), (8, 128)))         # n8  k32, 8-bit
C_16x8 = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))          # m16 n8, 16/32-bit

_AB = {8: (A_16x8, B_8x8), 16: (A_16x16, B_8x16), 32: (A_16x32, B_8x32)}

# CuTe type string -> (d, a, b, c) short dtype names
_TYPES = {
    8: ["F16F16F16F16", "F32F16F16F32", "F32BF16BF16F32"],
    16: ["F16F16F16F16", "F32F16F16F32", "F32BF16BF16F32"],
    32: ["S32S8S8S32", "S32S8U8S32", "S32U8S8S32", "S32U8U8S32"],
}
_FP8 = ["F32E4M3E4M3F32", "F32E4M3E5M2F32", "F32E5M2E4M3F32", "F32E5M2E5M2F32"]
_TOKEN = r"F32|F16|BF16|S32|S8|U8|E4M3|E5M2"


def _split(types: str) -> list[str]:
    import re

    return [t.lower() for t in re.findall(_TOKEN, types)]


def _build(m):
    arch_tag, k, types = m.group(1), int(m.group(2)), m.group(3)
    if arch_tag == "SM89" and (k != 32 or types not in _FP8):
        return None
    if arch_tag == "SM80" and types not in _TYPES.get(k, []):
        return None
    d, a, b, c = _split(types)
    a_lay, b_lay = _AB[k]
    return MmaAtom(
        name=m.group(0),
        ptx=f"mma.sync.aligned.m16n8k{k}.row.col.{d}.{a}.{b}.{c}",
        arch="sm_89" if arch_tag == "SM89" else "sm_80",
        shape_mnk=(16, 8, k),
        thr_id=THR_ID,
        a_layout=a_lay,
        b_layout=b_lay,
        c_layout=C_16x8,
        a_dtype=a,
        b_dtype=b,
        c_dtype=d,
    )


def _names():
    out = [f"SM80_16x8x{k}_{t}_TN" for k, ts in _TYPES.items() for t in ts]
    out += [f"SM89_16x8x32_{t}_TN" for t in _FP8]
    return out


FAMILIES = [(r"(SM80|SM89)_16x8x(8|16|32)_([A-Z0-9]+)_TN", _build, _names)]
