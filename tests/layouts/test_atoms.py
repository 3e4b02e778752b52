"""Atom TV layouts against ownership tables written from the PTX ISA's fragment descriptions.

Each `ptx_*` function below is the ISA's "which lane and register hold which element" table
(PTX ISA 9.7.14.5, "Matrix Fragments for mma.m8n8k4 / m16n8k8 / m16n8k16 / m16n8k32", and the
wgmma "Register Fragments" section for m64nNk16 / m64nNk32),
as plain formulas in (lane, register index): ``groupID = lane // 4``, ``threadID_in_group =
lane % 4``, and for wgmma ``warp = thread // 32``. The atoms' CuTe layouts must reproduce them.
"""

from __future__ import annotations

import pytest

from cute_kernels.layouts.atoms import atom, atom_names, dtype_bits
from cute_kernels.layouts.errors import LayoutError
from cute_kernels.layouts.layout import Layout


def gid(lane):
    return lane // 4


def tig(lane):
    return lane % 4


# ---- mma.m16n8k{8,16,32} (PTX ISA "Matrix Fragments for mma.m16n8k*") -------------------------

def ptx_a_m16n8k8(lane, i):
    return gid(lane) + 8 * (i >> 1), tig(lane) * 2 + (i & 1)


def ptx_b_m16n8k8(lane, i):  # (n, k)
    return gid(lane), tig(lane) * 2 + i


def ptx_a_m16n8k16(lane, i):
    return gid(lane) + 8 * ((i >> 1) & 1), tig(lane) * 2 + (i & 1) + 8 * (i >> 2)


def ptx_b_m16n8k16(lane, i):
    return gid(lane), tig(lane) * 2 + (i & 1) + 8 * (i >> 1)


def ptx_a_m16n8k32(lane, i):  # 8-bit A: four bytes per register
    return gid(lane) + 8 * ((i >> 2) & 1), tig(lane) * 4 + (i & 3) + 16 * (i >> 3)


def ptx_b_m16n8k32(lane, i):
    return gid(lane), tig(lane) * 4 + (i & 3) + 16 * (i >> 2)


def ptx_c_m16n8(lane, i):
    return gid(lane) + 8 * (i >> 1), tig(lane) * 2 + (i & 1)


def check_table(layout: Layout, nthreads: int, nvals: int, rows: int, formula, thr_to_lane=lambda t: t):
    """layout(t, v) == row + rows * col for the PTX (row, col) of lane thr_id(t), register v;
    and the map is a bijection onto the tile."""
    assert layout[0].size() == nthreads and layout[1].size() == nvals
    seen = set()
    for t in range(nthreads):
        for v in range(nvals):
            r, c = formula(thr_to_lane(t), v)
            assert layout(t, v) == r + rows * c, (t, v, r, c)
            seen.add((r, c))
    assert len(seen) == nthreads * nvals


@pytest.mark.parametrize("types", ["F16F16F16F16", "F32F16F16F32", "F32BF16BF16F32"])
def test_sm80_m16n8k8(types):
    a = atom(f"SM80_16x8x8_{types}_TN")
    assert a.shape_mnk == (16, 8, 8) and a.thr_id == Layout(32, 1)
    check_table(a.a_layout, 32, 4, 16, ptx_a_m16n8k8)
    check_table(a.b_layout, 32, 2, 8, ptx_b_m16n8k8)
    check_table(a.c_layout, 32, 4, 16, ptx_c_m16n8)


@pytest.mark.parametrize("types", ["F16F16F16F16", "F32F16F16F32", "F32BF16BF16F32"])
def test_sm80_m16n8k16(types):
    a = atom(f"SM80_16x8x16_{types}_TN")
    check_table(a.a_layout, 32, 8, 16, ptx_a_m16n8k16)
    check_table(a.b_layout, 32, 4, 8, ptx_b_m16n8k16)
    check_table(a.c_layout, 32, 4, 16, ptx_c_m16n8)
    assert a.ptx.startswith("mma.sync.aligned.m16n8k16.row.col")


@pytest.mark.parametrize("name", ["SM80_16x8x32_S32S8S8S32_TN", "SM80_16x8x32_S32U8S8S32_TN", "SM89_16x8x32_F32E4M3E4M3F32_TN", "SM89_16x8x32_F32E5M2E4M3F32_TN"])
def test_m16n8k32_8bit(name):
    a = atom(name)
    assert dtype_bits(a.a_dtype) == 8
    check_table(a.a_layout, 32, 16, 16, ptx_a_m16n8k32)
    check_table(a.b_layout, 32, 8, 8, ptx_b_m16n8k32)
    check_table(a.c_layout, 32, 4, 16, ptx_c_m16n8)


# ---- mma.m8n8k4 (PTX ISA "Matrix Fragments for mma.m8n8k4 with .f16 floating point type") ------

def upper(lane):
    return 1 if lane >= 16 else 0


def ptx_a_m8n8k4_row(lane, i):
    return lane % 4 + 4 * upper(lane), i


def ptx_a_m8n8k4_col(lane, i):
    return i + 4 * upper(lane), lane % 4


def ptx_b_m8n8k4_col(lane, i):  # (n, k): B column-major, the lane holds a column of K
    return lane % 4 + 4 * upper(lane), i


def ptx_b_m8n8k4_row(lane, i):
    return i + 4 * upper(lane), lane % 4


def ptx_c_m8n8k4_f16(lane, i):
    return lane % 4 + 4 * upper(lane), i


def ptx_c_m8n8k4_f32(lane, i):
    return (lane & 1) + (i & 2) + 4 * upper(lane), (i & 4) + (lane & 2) + (i & 1)


@pytest.mark.parametrize("suffix,a_f,b_f", [
    ("TN", ptx_a_m8n8k4_row, ptx_b_m8n8k4_col),
    ("NT", ptx_a_m8n8k4_col, ptx_b_m8n8k4_row),
    ("NN", ptx_a_m8n8k4_col, ptx_b_m8n8k4_col),
    ("TT", ptx_a_m8n8k4_row, ptx_b_m8n8k4_row),
])
@pytest.mark.parametrize("acc", ["F16F16F16F16", "F32F16F16F32"])
def test_sm70_quad_pair(suffix, a_f, b_f, acc):
    a = atom(f"SM70_8x8x4_{acc}_{suffix}")
    lanes = [a.thr_id(t) for t in range(8)]
    assert lanes == [0, 1, 2, 3, 16, 17, 18, 19]
    check_table(a.a_layout, 8, 4, 8, a_f, a.thr_id)
    check_table(a.b_layout, 8, 4, 8, b_f, a.thr_id)
    c_f = ptx_c_m8n8k4_f16 if acc.startswith("F16") else ptx_c_m8n8k4_f32
    check_table(a.c_layout, 8, 8, 8, c_f, a.thr_id)


# ---- wgmma (PTX ISA "Register Fragments and Shared Memory Matrix Layouts" for wgmma) ----------

def ptx_wgmma_d(thread, i):
    lane, warp = thread % 32, thread // 32
    return 16 * warp + gid(lane) + 8 * ((i >> 1) & 1), tig(lane) * 2 + (i & 1) + 8 * (i >> 2)


def ptx_wgmma_a_k16(thread, i):
    lane, warp = thread % 32, thread // 32
    r, c = ptx_a_m16n8k16(lane, i)
    return 16 * warp + r, c


def ptx_wgmma_a_k32(thread, i):
    lane, warp = thread % 32, thread // 32
    r, c = ptx_a_m16n8k32(lane, i)
    return 16 * warp + r, c


@pytest.mark.parametrize("n", [8, 16, 24, 64, 136, 256])
@pytest.mark.parametrize("src", ["SS", "RS"])
def test_sm90_bf16(n, src):
    a = atom(f"SM90_64x{n}x16_F32BF16BF16_{src}")
    assert a.shape_mnk == (64, n, 16) and a.num_threads == 128
    check_table(a.c_layout, 128, n // 2, 64, ptx_wgmma_d)
    if src == "RS":
        check_table(a.a_layout, 128, 8, 64, ptx_wgmma_a_k16)
        assert a.a_source == "rmem"
    else:
        assert all(a.a_layout(t, v) == v for t in (0, 77, 127) for v in range(64 * 16))
    # B always from shared memory: every thread sees the whole N x K operand
    assert all(a.b_layout(t, v) == v for t in (0, 127) for v in range(0, n * 16, 7))


@pytest.mark.parametrize("n", [8, 128, 256])
def test_sm90_fp8_rs(n):
    a = atom(f"SM90_64x{n}x32_F32E4M3E4M3_RS_TN")
    check_table(a.a_layout, 128, 16, 64, ptx_wgmma_a_k32)
    check_table(a.c_layout, 128, n // 2, 64, ptx_wgmma_d)


def test_registry_names_and_errors():
    names = atom_names()
    assert len(names) == len(set(names))
    assert "SM90_64x256x16_F32BF16BF16_SS" in names and "SM90_64x8x32_F16E5M2E4M3_RS_TN" in names
    assert sum(1 for n in names if n.startswith("SM90_64x") and n.endswith("F32BF16BF16_SS")) == 32
    assert all(atom(n).name == n for n in names[::37])
    with pytest.raises(LayoutError, match="no atom named"):
        atom("SM80_16x8x16_F32BF16BF16F16_TN")  # bf16 has no fp16 accumulator form
    with pytest.raises(LayoutError):
        atom("SM90_64x12x16_F32BF16BF16_SS")  # N must be a multiple of 8
    with pytest.raises(LayoutError):
        atom("SM90_64x264x16_F32BF16BF16_SS")
    assert atom_names(kind="copy", arch="sm_75") == [n for n in atom_names() if n.startswith("SM75")]


def test_majors():
    ss = atom("SM90_64x64x16_F16F16F16_SS")
    assert ss.with_majors("MN", "MN").a_major == "MN"
    with pytest.raises(LayoutError, match="register A"):
        atom("SM90_64x64x16_F16F16F16_RS").with_majors(a_major="MN")
    with pytest.raises(LayoutError, match="K-major"):
        atom("SM90_64x64x32_F32E4M3E4M3_SS_TN").with_majors(b_major="MN")


def test_repr_shows_three_layouts():
    text = str(atom("SM80_16x8x16_F32BF16BF16F32_TN"))
    assert "((4,8),(2,2,2)):((32,1),(16,8,128))" in text
    assert "((4,8),(2,2)):((16,1),(8,64))" in text
    assert "((4,8),(2,2)):((32,1),(16,8))" in text
    assert repr(atom("SM80_16x8x16_F32BF16BF16F32_TN")) == text  # what a plain REPL shows


# ---- copy atoms ------------------------------------------------------------------------------

@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix(count, trans):
    name = f"SM75_U16x{2 * count}_LDSM_T" if trans else f"SM75_U32x{count}_LDSM_N"
    a = atom(name)
    # smem side: lane 8j + r addresses row r of matrix j (eight contiguous 16-bit values)
    for lane in range(8 * count):
        j, r = divmod(lane, 8)
        assert [a.src_layout(lane, v) for v in range(8)] == [64 * j + 8 * r + c for c in range(8)]
    # register side (PTX ISA ldmatrix fragment): lane t holds row t//4, cols 2*(t%4)+{0,1}; transposed with .trans
    owned = set()
    for lane in range(32):
        for j in range(count):
            for h in range(2):
                r, c = lane // 4, 2 * (lane % 4) + h
                if trans:
                    r, c = c, r
                assert a.dst_layout(lane, h + 2 * j) == 64 * j + 8 * r + c
                owned.add(64 * j + 8 * r + c)
    assert owned == set(range(64 * count))


def test_stmatrix_mirrors_ldmatrix():
    ld, st = atom("SM75_U32x4_LDSM_N"), atom("SM90_U32x4_STSM_N")
    assert (st.src_layout, st.dst_layout) == (ld.dst_layout, ld.src_layout)
    assert st.smem_layout == ld.smem_layout


def test_cp_async_and_tma():
    from cute_kernels.layouts.copy_atoms import tma_atom

    cp = atom("SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>")
    assert cp.smem_vector_bits == 128 and cp.num_threads == 1
    with pytest.raises(LayoutError):
        atom("SM80_CP_ASYNC_CACHEGLOBAL<uint32_t>")
    t = tma_atom((64, 32), "bf16")
    assert t.box == (64, 32) and t.src_layout.size() == 64 * 32
    with pytest.raises(LayoutError, match="16 bytes"):
        tma_atom((4, 8), "bf16")
    with pytest.raises(LayoutError, match="1..256"):
        tma_atom((512, 2), "bf16")


def test_workbench_modules_import_neither_torch_nor_dsl():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import cute_kernels.layouts.atoms, cute_kernels.layouts.smem_atoms, cute_kernels.layouts.tiled\n"
        "import cute_kernels.layouts.analysis, cute_kernels.layouts.render, cute_kernels.cli.workbench\n"
        "from cute_kernels.layouts.atoms import atom_names, atom\n"
        "[atom(n) for n in atom_names()[:50]]\n"
        "bad = [m for m in ('torch', 'cutlass', 'numpy', 'matplotlib') if m in sys.modules]\n"
        "sys.exit(f'imported {bad}' if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
