"""Epilogue through shared memory: accumulators -> (fuse, convert) -> smem -> TMA store.

The CTA tile is stored in `epi_tile` sub-tiles through a ring of `stages` smem buffers: the
consumer threads write a sub-tile with stmatrix (16-bit outputs) or plain stores, fence the
async proxy, sync on a named barrier, and one warp issues the TMA store; a buffer is reused
only after the store that read it has drained (PipelineTmaStore acquire).

Fusion (`EpilogueSpec`, static per build) rewrites the fp32 accumulators in place before the
conversion, element by element:

    D[m, n] = act(alpha * acc[m, n] + beta * C[m, n] + bias[m or n])

C is read from global memory at the coordinates of each accumulator element (`fuse`, one
epilogue sub-tile at a time), masked to the problem's M x N, so any strides and any tile edge
are handled; each element is read by exactly the thread that owns it, before that tile's TMA
store is issued, so C may alias D.

The bias and row-wise scales can be read the same way, but a kernel that walks tiles stages
them instead (`StagedVector`, `staged_vectors`): each tile's slice of the bias vector (and of
the two fp8 scale vectors, one per row and one per column) is loaded from global memory once,
at the start of the tile, into registers spread over the epilogue threads (the loads' latency
hides under the main loop), written to shared memory after the main loop, and every
accumulator element reads its values there. Why: read per element, a thread issues one
predicated global load per accumulator value of every sub-tile and vector (16 per 64x32
sub-tile, half of them duplicates), and each sub-tile waits a global round trip between the
main loop and the store; measured on ViT-B's layers (H200, M = 12608, K = 768) the bias alone
made the GEMM 26-29% slower than without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warp

from cute_kernels.layouts import Layout, composition
from cute_kernels.layouts.atoms_sm90 import GATE_BLOCK, GATE_UP_OFFSET, gate_selector

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")  # torch definitions: gemm.activations
BIAS_DIMS = ("m", "n")
GATES = ("swiglu",)
# A gated product's columns alternate blocks of GATE_BLOCK gate and GATE_BLOCK up columns. A
# wgmma accumulator fragment holds, per thread, two adjacent columns of every 8-column block,
# so with 8-column blocks a thread holds each gate value beside its up value, and the gated
# values form exactly the fragment of the half-width tile (`gate_view`, from the workbench's
# `layouts.atoms_sm90.gate_selector`): stmatrix and the TMA store run as for any output.
_SQRT_2_OVER_PI = 0.7978845608028654
_SQRT_1_2 = 0.7071067811865476
_LOG2_E = 1.4426950408889634


@dataclass(frozen=True)
class EpilogueSpec:
    """What the epilogue fuses: beta * C (`beta_c`), a bias broadcast along rows (`bias="m"`:
    one value per output row) or columns (`bias="n"`: one per column, nn.Linear's), and an
    activation applied last (`ACTIVATIONS`, or None). `scale_ab`: the product is multiplied by
    two scales read from device memory (fp8 inputs' dequantization scales): per tensor (one
    value each, folded into alpha), or with `scale_rows` one per row of A and one per column
    of B (torch._scaled_mm's row-wise scales: alpha * scale_a[m] * scale_b[n] * (A.B)[m, n]).

    `gate="swiglu"`: the product P = alpha * A.B has 2I columns in alternating blocks of
    `GATE_BLOCK` gate and up columns, and the output is its (M, I) gated half,
    D[m, 8j + i] = silu(P[m, 16j + i]) * P[m, 16j + 8 + i]; with `gate_preact` the kernel also
    stores P itself (what the backward needs) into the tensor passed as C's source. A gate
    takes none of the other terms."""

    beta_c: bool = False
    bias: str | None = None
    activation: str | None = None
    scale_ab: bool = False
    scale_rows: bool = False
    gate: str | None = None
    gate_preact: bool = False

    def validate(self) -> "EpilogueSpec":
        if self.gate not in (None, *GATES):
            raise ValueError(f"gate must be None or one of {GATES}, got {self.gate!r}")
        if self.gate_preact and self.gate is None:
            raise ValueError("gate_preact (store the product beside its gated half) needs a gate")
        if self.gate is not None and (self.beta_c or self.bias or self.activation or self.scale_ab):
            raise ValueError(f"a gated epilogue ({self.gate}) takes no beta * C, bias, activation or scales")
        if self.scale_rows and not self.scale_ab:
            raise ValueError("scale_rows (row-wise scales) needs scale_ab")
        if self.bias not in (None, *BIAS_DIMS):
            raise ValueError(f"bias must be None, 'm' (per row) or 'n' (per column), got {self.bias!r}")
        if self.activation not in (None, *ACTIVATIONS):
            raise ValueError(f"activation must be None or one of {ACTIVATIONS}, got {self.activation!r}")
        return self

    @property
    def fused(self) -> bool:
        return self.beta_c or self.bias is not None or self.activation is not None or self.scale_ab \
            or self.gate is not None

    @property
    def tag(self) -> str:
        parts = (["c"] if self.beta_c else []) + ([f"bias_{self.bias}"] if self.bias else []) + \
            ([self.activation] if self.activation else []) + \
            ((["scale_rows"] if self.scale_rows else ["scale_ab"]) if self.scale_ab else []) + \
            ([self.gate] if self.gate else []) + (["preact"] if self.gate_preact else [])
        return "+".join(parts) or "none"


def activate(x, name: str | None):
    """`name`(x) for one fp32 value (trace time). NaN in, NaN out for every activation:
    ReLU selects 0 only where x < 0 (a comparison NaN fails), so it is not max(x, 0)."""
    if name is None:
        return x
    if name == "relu":
        return cutlass.Float32(cutlass.select_(x < cutlass.Float32(0.0), cutlass.Float32(0.0), x))
    if name == "gelu":  # exact (erf) GELU, torch.nn.GELU()'s
        return cutlass.Float32(0.5) * x * (cutlass.Float32(1.0) + cute.math.erf(x * cutlass.Float32(_SQRT_1_2)))
    if name == "gelu_tanh":
        inner = cutlass.Float32(_SQRT_2_OVER_PI) * (x + cutlass.Float32(0.044715) * x * x * x)
        return cutlass.Float32(0.5) * x * (cutlass.Float32(1.0) + cute.math.tanh(inner))
    if name == "silu":
        return x / (cutlass.Float32(1.0) + cute.math.exp(-x))
    raise ValueError(f"unknown activation {name!r}")


@cute.jit
def fuse(spec: cutlass.Constexpr, x, coord, extent_mn, alpha, beta, c_src, bias, scale_a, scale_b, staged=None):
    """act(alpha * [scale_a[m] * scale_b[n] *] x + beta * C[coord] + bias[coord's m or n]) for
    one fp32 accumulator value (the row-wise scales with `spec.scale_rows`; per-tensor scales
    are already in alpha).

    `coord` is its (m, n, l) (from the identity tensor partitioned like the accumulator); C,
    bias and row-wise scales are read only inside `extent_mn` = (M, N) (outside, the TMA store
    clips the value). Called per epilogue sub-tile, so only one sub-tile's loads are in flight.
    With `staged` = (bias slice, scale_a slice, scale_b slice, m0, n0) (the tile's slices in
    shared memory, `StagedVector`, None where not staged; the tile's first row and column) the
    staged vectors are read there at coord's m - m0 or n - n0, unmasked: the slices hold zeros
    past the problem's edge.
    """
    s_bias, s_scale_a, s_scale_b, m0, n0 = staged if cutlass.const_expr(staged is not None) else (None,) * 5
    bias_staged = s_bias is not None
    rows_staged = s_scale_a is not None
    x = x * alpha
    mi, ni, li = coord
    if cutlass.const_expr(spec.scale_rows and rows_staged):
        x = x * s_scale_a[mi - m0] * s_scale_b[ni - n0]
    if cutlass.const_expr(spec.beta_c or (spec.bias is not None and not bias_staged) or
                          (spec.scale_rows and not rows_staged)):
        inside = cute.elem_less((mi, ni), extent_mn)
        if cutlass.const_expr(spec.scale_rows and not rows_staged):
            sv = cutlass.Float32(0.0)
            if inside:
                sv = scale_a[mi].to(cutlass.Float32) * scale_b[ni].to(cutlass.Float32)
            x = x * sv
        if cutlass.const_expr(spec.beta_c):
            cv = cutlass.Float32(0.0)
            if inside:
                cv = c_src[mi, ni, li].to(cutlass.Float32)
            x = x + beta * cv
        if cutlass.const_expr(spec.bias is not None and not bias_staged):
            bv = cutlass.Float32(0.0)
            if inside:
                if cutlass.const_expr(spec.bias == "m"):
                    bv = bias[mi].to(cutlass.Float32)
                else:
                    bv = bias[ni].to(cutlass.Float32)
            x = x + bv
    if cutlass.const_expr(spec.bias == "m" and bias_staged):
        x = x + s_bias[mi - m0]
    if cutlass.const_expr(spec.bias == "n" and bias_staged):
        x = x + s_bias[ni - n0]
    return activate(x, spec.activation)


def gate_view(acc: cute.Tensor) -> cute.Tensor:
    """The gate half of a wgmma accumulator fragment ((2, 2, N/8), MMA_M, MMA_N) as a fragment
    of the half-width tile ((2, 2, N/16), MMA_M, MMA_N), in place, where `gate_in_place` leaves
    the gated values (trace time; a view, no registers): the fragment's value mode composed with
    `layouts.atoms_sm90.gate_selector`, the even 8-column blocks."""
    (c2, r2, blocks), mm, mn = acc.shape
    values, sm, sn = acc.layout.stride
    view = composition(Layout((c2, r2, blocks), tuple(values)), gate_selector(GATE_BLOCK * blocks))
    return cute.make_tensor(acc.iterator, cute.make_layout((view.shape, mm, mn), stride=(view.stride, sm, sn)))


@cute.jit
def gate_in_place(acc: cute.Tensor, alpha):
    """Every gate value of `acc` (accumulator fragment, module GATE_BLOCK layout) becomes
    silu(alpha * g) * (alpha * u) with its up value, `GATE_UP_OFFSET` values further in the same
    thread: the values `layouts.atoms_sm90.gate_selector` picks, which `gate_view` then reads.
    NaN and Inf propagate as torch's silu(g) * u."""
    (c2, r2, blocks), mm, mn = acc.shape
    select = gate_selector(GATE_BLOCK * blocks)
    for n in cutlass.range_constexpr(mn):
        for m in cutlass.range_constexpr(mm):
            for v in cutlass.range_constexpr(select.size()):
                i = select(v)  # the gate value's index in the fragment's (2, 2, N/8) value mode
                g = acc[i, m, n] * alpha
                u = acc[i + GATE_UP_OFFSET, m, n] * alpha
                # sigmoid by the approximate reciprocal: an IEEE division would call its
                # slow-path subroutine once per value (64 CALLs in a 128x256 tile)
                sig = cute.arch.rcp_approx(cutlass.Float32(1.0) + cute.math.exp2(
                    g * cutlass.Float32(-_LOG2_E), fastmath=True))
                acc[i, m, n] = g * sig * u


STAGED = ("bias", "scale_a", "scale_b")  # the vectors a tile may stage, in `fuse`'s `staged` order


def staged_vectors(spec: EpilogueSpec, tile_mn: tuple, threads: int) -> dict:
    """{name: StagedVector} for the vectors `spec` reads (among `STAGED`): the bias along its
    dim, and with row-wise scales scale_a per row ("m") and scale_b per column ("n")."""
    out = {}
    if spec.bias is not None:
        out["bias"] = StagedVector(spec.bias, tile_mn, threads)
    if spec.scale_rows:
        out["scale_a"] = StagedVector("m", tile_mn, threads)
        out["scale_b"] = StagedVector("n", tile_mn, threads)
    return out


class StagedVector:
    """A tile's slice of a per-row ("m") or per-column ("n") vector in shared memory, loaded
    once per tile (module docstring): the tile's `tile_m` rows or `tile_n` columns; `threads`
    epilogue threads (thread index `tid`) share the loads, each holding `per_thread` values in
    registers between `prefetch` and `stage`.

        vec = StagedVector("n", (tile_m, tile_n), threads)     # trace time
        smem_elems = vec.smem_elems(buffers)                   # fp32 elements to allocate
        regs = vec.fragment()                                  # per consumer thread
        vec.prefetch(bias, regs, origin, limit, tid)           # tile start: global -> registers
        ... main loop ...
        vec.stage(regs, s_slice, tid); barrier                 # registers -> smem, then sync
        fuse(..., staged=(s_slice, None, None, m0, n0))        # per accumulator element

    The caller's barrier after `stage` orders the smem writes before every read; the next
    tile's `stage` comes after the barrier that ends this tile's epilogue, so no read sees it.
    """

    def __init__(self, dim: str, tile_mn: tuple, threads: int):
        self.dim = dim
        self.length = tile_mn[0] if dim == "m" else tile_mn[1]
        self.threads = threads
        self.per_thread = -(-self.length // threads)

    def smem_elems(self, buffers: int) -> int:
        return self.length * buffers

    def fragment(self):
        return cute.make_rmem_tensor((self.per_thread,), cutlass.Float32)

    @cute.jit
    def prefetch(self, vec: cute.Tensor, regs: cute.Tensor, origin, limit, tid):
        """regs[j] = vec[origin + tid + j * threads] as fp32 where that index is inside the
        slice and below `limit` (the problem's M or N), else 0."""
        for j in cutlass.range_constexpr(self.per_thread):
            idx = tid + j * self.threads
            v = cutlass.Float32(0.0)
            if idx < self.length:
                if origin + idx < limit:
                    v = vec[origin + idx].to(cutlass.Float32)
            regs[j] = v

    @cute.jit
    def stage(self, regs: cute.Tensor, s_slice: cute.Tensor, tid):
        """s_slice[tid + j * threads] = regs[j] for the indices inside the slice."""
        for j in cutlass.range_constexpr(self.per_thread):
            idx = tid + j * self.threads
            if idx < self.length:
                s_slice[idx] = regs[j]


def make_r2s_copy(c_layout_enum, c_dtype, acc_dtype, tiled_mma):
    """The tiled register->smem copy for C fragments of `tiled_mma` (stmatrix when 16-bit)."""
    store_atom = sm90_utils.get_smem_store_op(c_layout_enum, elem_ty_d=c_dtype, elem_ty_acc=acc_dtype)
    # The thread/value partition always comes from the 16-bit stmatrix atom, whatever the output
    # width: the epilogue walks the retiled accumulator in epi-tile-sized contiguous chunks, which
    # holds for that partition (a 1-element universal atom would order values differently).
    shape_atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(c_layout_enum.is_m_major_c(), 4), cutlass.Float16)
    return cute.make_tiled_copy_S(store_atom, cute.make_tiled_copy_C_atom(shape_atom, tiled_mma))
