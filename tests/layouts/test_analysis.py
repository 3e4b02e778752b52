"""Bank conflicts, coalescing and vector width: the headline cases, and hypothesis properties
against a brute-force simulation of the 32-bank model written independently here."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cute_kernels.layouts.analysis import bank_conflicts, coalescing, parse_access, vector_width
from cute_kernels.layouts.atoms import atom
from cute_kernels.layouts.composed import ComposedLayout
from cute_kernels.layouts.errors import LayoutError
from cute_kernels.layouts.layout import Layout
from cute_kernels.layouts.smem_atoms import gmma_smem_atom
from cute_kernels.layouts.swizzle import Swizzle

SW128 = ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1)))
ROW_MAJOR = Layout((8, 64), (64, 1))


# ---- headline figures -------------------------------------------------------------------------

def test_ldmatrix_sw128_is_conflict_free():
    r = bank_conflicts(SW128, "ldmatrix_x4", "bf16")
    assert (r.instructions, r.wavefronts, r.ideal_wavefronts, r.way) == (2, 4, 4, 1)
    assert r.conflict_degree == 1.0 and r.conflict_free


def test_ldmatrix_row_major_is_8_way():
    # eight 128-byte rows: every 16-byte row address of a phase starts at bank 0
    r = bank_conflicts(ROW_MAJOR, "ldmatrix_x4", "bf16")
    assert (r.wavefronts, r.ideal_wavefronts, r.way) == (32, 4, 8)
    assert r.conflict_degree == 8.0


def test_smem_atom_record_and_copy_atom_access():
    a = gmma_smem_atom("K_SW128", "bf16")
    assert bank_conflicts(a, atom("SM75_U32x4_LDSM_N"), "bf16").conflict_free
    assert bank_conflicts(a, "stmatrix_x4", "bf16").conflict_free


def test_padding_fixes_row_major():
    padded = Layout((8, 64), (72, 1))  # +16 bytes per row
    assert bank_conflicts(padded, "ldmatrix_x4", "bf16").conflict_free


def test_element_unit_swizzle_is_not_the_128B_swizzle():
    # Read as a pure function on bf16 offsets, Sw<3,4,3> permutes 32-byte chunks: 2-way conflicts
    r = bank_conflicts(SW128, "ldmatrix_x4", "bf16", swizzle_unit="elements")
    assert r.way == 2 and r.wavefronts == 8
    # ... while Sw<3,3,3> on elements is the 128-byte swizzle again
    assert bank_conflicts(ComposedLayout(Swizzle(3, 3, 3), 0, ROW_MAJOR), "ldmatrix_x4", "bf16", swizzle_unit="elements").conflict_free


def test_column_reads_of_fp32_tile():
    # 32 threads each read one float down a column of a 32x32 row-major tile: 32-way conflict
    col = Layout((32, 32), (1, 32))  # contiguous mode 0: "rows" of the picture are columns here
    r = bank_conflicts(Layout((32, 32), (32, 1)), Layout((32, 1), (1, 0)), "f32")
    assert r.way == 32 and r.wavefronts == 32
    assert bank_conflicts(col, "scalar", "f32").conflict_free


def test_illegal_vector_is_rejected():
    with pytest.raises(LayoutError, match="not contiguous"):
        bank_conflicts(ComposedLayout(Swizzle(3, 2, 3), 0, ROW_MAJOR), "ldmatrix_x4", "bf16")
    with pytest.raises(LayoutError, match="unknown access"):
        parse_access("ldmatrix_x3")


def test_coalescing_headlines():
    r = coalescing(Layout((64, 64), (64, 1)), "bf16", "vec128")
    assert (r.sectors, r.lines, r.ideal_sectors, r.efficiency) == (16, 4, 16, 1.0)
    # 32 threads reading one bf16 each down a column: 32 sectors for 64 useful bytes
    r = coalescing(Layout((64, 64), (64, 1)), "bf16", Layout((32, 1), (1, 0)))
    assert (r.sectors, r.lines, r.bytes_per_request) == (32, 32, 64)
    assert r.efficiency == 64 / (32 * 32)
    # misaligned base by 16 bytes: each 512-byte request straddles one more sector and line
    r = coalescing(Layout((64, 64), (64, 1)), "bf16", "vec128", base=16)
    assert (r.sectors, r.lines) == (17, 5)


def test_vector_width_headlines():
    assert vector_width(Layout((64, 64), (64, 1)), "bf16").bits == 128
    assert vector_width(Layout((64, 64), (64, 1)), "bf16", along="index").elements == 1
    assert vector_width(SW128, "bf16").elements == 8
    assert vector_width(Layout((8, 3), (3, 1)), "f32").elements == 4  # packed rows: memory is one run
    assert vector_width(Layout((8, 3), (4, 1)), "f32").elements == 1  # 3 of every 4 floats: no pairs
    assert vector_width(Layout((8, 6), (8, 1)), "bf16").elements == 2  # 6 of every 8: pairs only
    assert vector_width(Layout((4, 2), (2, 1)), "f64").bits == 128


# ---- brute-force model, written independently ----------------------------------------------

def simulate_wavefronts(lane_bytes, phase):
    """Serve each phase cycle by cycle: every bank delivers one pending word per cycle (all lanes
    waiting for that word are satisfied together)."""
    total = 0
    for p in range(0, 32, phase):
        pending = {a // 4 for lane in lane_bytes[p : p + phase] for a in lane}
        while pending:
            served = {}
            for w in sorted(pending):
                served.setdefault(w % 32, w)
            pending -= set(served.values())
            total += 1
    return total


def brute_smem_instructions(rows, cols, row_stride, sw_bits, bits, kind, count_or_vbits):
    """Per instruction, per lane, the byte addresses: a row-major tile (cols contiguous), an
    optional 128/64/32-byte swizzle on byte addresses."""
    nbytes = bits // 8

    def byte(r, c):
        b = (r * row_stride + c) * nbytes
        return b ^ (((b >> 7) & ((1 << sw_bits) - 1)) << 4)

    if kind == "ldmatrix":
        n, active = 8, 8 * count_or_vbits  # 16 bytes per lane
        n = 128 // bits
        vecs = [(q % rows, q // rows) for q in range(rows * cols // n)]
    else:
        n, active = count_or_vbits // bits, 32
        vecs = [(q // (cols // n), q % (cols // n)) for q in range(rows * cols // n)]
    out = []
    for s in range(0, len(vecs), active):
        lanes = []
        for t in range(32):
            if t < active and s + t < len(vecs):
                r, vc = vecs[s + t]
                lanes.append([byte(r, vc * n + j) + k for j in range(n) for k in range(0, nbytes, 4)])
            else:
                lanes.append([])
        out.append(lanes)
    return out


@settings(max_examples=60, deadline=None)
@given(
    rows=st.sampled_from([8, 16, 32]),
    cols=st.sampled_from([8, 16, 32, 64]),
    pad=st.sampled_from([0, 2, 4, 8]),
    sw_bits=st.integers(0, 3),
    access=st.sampled_from([("ldmatrix", 1), ("ldmatrix", 2), ("ldmatrix", 4), ("vec", 32), ("vec", 64), ("vec", 128)]),
)
def test_bank_conflicts_match_simulation(rows, cols, pad, sw_bits, access):
    bits = 16
    stride = cols + pad * 8 // 2 if pad else cols
    if sw_bits and (pad or cols * 2 < (16 << sw_bits)):
        sw_bits = 0  # swizzles apply to unpadded tiles whose rows span the swizzle width
    base = Layout((rows, cols), (stride, 1))
    smem = ComposedLayout(Swizzle(sw_bits, 4, 3), 0, base) if sw_bits else base
    kind, arg = access
    name = f"ldmatrix_x{arg}" if kind == "ldmatrix" else f"vec{arg}"
    if (rows * cols * bits // 128) % (8 * arg if kind == "ldmatrix" else 1):
        return
    r = bank_conflicts(smem, name, "bf16")
    phase = 8 if kind == "ldmatrix" or arg == 128 else 16 if arg == 64 else 32
    sims = [simulate_wavefronts(lanes, phase) for lanes in brute_smem_instructions(rows, cols, stride, sw_bits, bits, kind, arg)]
    assert list(r.per_instruction) == sims
    assert r.wavefronts >= r.ideal_wavefronts


@settings(max_examples=60, deadline=None)
@given(
    rows=st.sampled_from([4, 8, 32]),
    cols=st.sampled_from([8, 16, 64, 128]),
    extra=st.sampled_from([0, 8, 24, 64]),
    dtype=st.sampled_from([("bf16", 2), ("f32", 4), ("e4m3", 1)]),
    vbits=st.sampled_from([32, 64, 128]),
    base=st.sampled_from([0, 32, 64]),
)
def test_coalescing_matches_brute_force(rows, cols, extra, dtype, vbits, base):
    name, nbytes = dtype
    n = vbits // (8 * nbytes)
    if n < 1 or cols % n:
        return
    stride = cols + extra
    if (stride * nbytes) % (vbits // 8):
        with pytest.raises(LayoutError, match="not contiguous and aligned"):
            coalescing(Layout((rows, cols), (stride, 1)), name, f"vec{vbits}", base=base)
        return
    r = coalescing(Layout((rows, cols), (stride, 1)), name, f"vec{vbits}", base=base)
    vecs = [(q // (cols // n), q % (cols // n)) for q in range(rows * cols // n)]
    worst = None
    for s in range(0, len(vecs), 32):
        addrs = {base + ((vr * stride + vc * n + j) * nbytes) + k for vr, vc in vecs[s : s + 32] for j in range(n) for k in range(nbytes)}
        key = (len({a // 32 for a in addrs}), len({a // 128 for a in addrs}))
        worst = key if worst is None or key > worst else worst
    assert (r.sectors, r.lines) == worst
    assert r.lines <= r.sectors <= 4 * r.lines + 4
    assert r.sectors >= math.ceil(r.bytes_per_request / 32)


@settings(max_examples=80, deadline=None)
@given(
    shape=st.lists(st.sampled_from([1, 2, 3, 4, 8]), min_size=1, max_size=3),
    perm=st.permutations([0, 1, 2]),
    gap=st.sampled_from([1, 2, 3]),
    dtype=st.sampled_from(["e4m3", "bf16", "f32"]),
)
def test_vector_width_is_maximal_and_legal(shape, perm, gap, dtype):
    # compact strides in a random order, with an optional gap after the first mode
    order = [p for p in perm if p < len(shape)]
    stride, acc = [0] * len(shape), 1
    for k, i in enumerate(order):
        stride[i] = acc
        acc *= shape[i] * (gap if k == 0 else 1)
    lay = Layout(tuple(shape), tuple(stride))
    vw = vector_width(lay, dtype, along="index")
    bits = {"e4m3": 8, "bf16": 16, "f32": 32}[dtype]
    offs = [lay(i) for i in range(lay.size())]

    def legal(n):
        return lay.size() % n == 0 and all(
            offs[k] % n == 0 and offs[k : k + n] == list(range(offs[k], offs[k] + n)) for k in range(0, len(offs), n)
        )

    assert vw.bits == vw.elements * bits and legal(vw.elements)
    assert vw.bits * 2 > 128 or not legal(2 * vw.elements)


def test_tiled_copy_as_access():
    from cute_kernels.layouts.tiled import make_tiled_copy

    # 128 threads, 8 bf16 each along rows of a 32x32 tile: each warp reads 8 whole 64-byte rows,
    # 512 contiguous bytes = 16 sectors in 4 lines
    tc = make_tiled_copy("SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>", Layout((32, 4), (4, 1)), Layout((1, 8)))
    row_major = Layout((32, 32), (32, 1))
    r = coalescing(row_major, "bf16", tc)
    assert (r.requests, r.sectors, r.lines, r.efficiency) == (4, 16, 4, 1.0)
    # the same copy on a column-major tile: 8-element vectors run down columns, which are not contiguous
    with pytest.raises(LayoutError, match="not contiguous"):
        coalescing(Layout((32, 32), (1, 32)), "bf16", tc)
    # each quarter-warp phase reads two consecutive 64-byte rows: 128 contiguous bytes
    assert bank_conflicts(row_major, tc, "bf16").conflict_free
    # threads down the columns instead: a phase's eight vectors start 64 bytes apart, so rows
    # 0, 2, 4, 6 share banks 0-3 and rows 1, 3, 5, 7 banks 16-19: 4-way
    down = make_tiled_copy("SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>", Layout((32, 4), (1, 32)), Layout((1, 8)))
    r = bank_conflicts(row_major, down, "bf16")
    assert (r.way, r.wavefronts, r.ideal_wavefronts) == (4, 16, 4)


def test_reports_read_at_the_prompt_and_in_jupyter():
    from cute_kernels.layouts import bank_conflicts, coalescing, vector_width

    r = bank_conflicts("(8,64):(64,1)", "ldmatrix_x4", "bf16")  # the CLI's strings work here too
    assert repr(r) == str(r) and repr(r).splitlines()[2] == "  conflict degree 8x: 8-way bank conflict"
    html = r._repr_html_()
    assert "<table>" in html and "<td>8x</td>" in html and "<svg" in html
    assert r.banks[0][:5] == (8, 8, 8, 8, 0) and len(r.banks) == 4 and all(len(p) == 32 for p in r.banks)
    c = coalescing("(64,64):(64,1)", "bf16", "vec128")
    assert repr(c).endswith("efficiency 100.0%") and "<td>100.0%</td>" in c._repr_html_()
    v = vector_width("(8,64):(64,1)", "bf16")
    assert repr(v) == "128-bit vectors (8 elements)" and "<td>8</td>" in v._repr_html_()


def test_access_given_as_text():
    from cute_kernels.layouts import atom, bank_conflicts
    from cute_kernels.layouts.analysis import parse_access

    smem = "Sw<3,4,3> o 0 o (8,64):(64,1)"
    by_name = bank_conflicts(smem, "SM75_U32x4_LDSM_N", "bf16")
    assert by_name == bank_conflicts(smem, atom("SM75_U32x4_LDSM_N"), "bf16") == bank_conflicts(smem, "ldmatrix_x4", "bf16")
    tv = "((8,4),(8)):((1,64),(8))"  # lane t: row t % 8, a 16-byte vector in column block t // 8
    assert parse_access(tv, "bf16").vector_bits == 128
    assert bank_conflicts("(8,64):(64,1)", tv, "bf16").way == 8
    with pytest.raises(LayoutError, match="is an MMA atom"):
        parse_access("SM80_16x8x16_F32BF16BF16F32_TN", "bf16")
    with pytest.raises(LayoutError, match=r"unknown access 'ldmatrix'; use .*copy atom's name.*TV layout"):
        parse_access("ldmatrix", "bf16")
    with pytest.raises(LayoutError, match="looks like a TV layout"):
        parse_access("((8,4):(1,64)", "bf16")
