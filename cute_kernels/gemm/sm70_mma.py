"""Rung 3, `sm70_mma`: the first tensor-core rung, Volta's `mma.sync.m8n8k4`.

The idea this rung adds to `simt_smem`: the inner product of the shared-memory tiles is done by
tensor cores, one 8x8x4 fp16 product per *quad pair* (lanes 0-3 with 16-19, 4-7 with 20-23...;
atom `SM70_8x8x4_F32F16F16F32_TN` in `cute_kernels.layouts`, whose TV layouts say which lane
holds which element). A warp's four quad pairs are placed 2 x 2 (`quad_pair_layout`), so one
instruction per lane makes a 16x16x4 warp product; a warp repeats it over its warp tile.

The DSL has no atom for m8n8k4, so the instruction is issued as inline PTX
(`mma_m8n8k4`), with the fragments gathered from shared memory element by element following
the atom's A/B/C layouts. Everything else is deliberately plain, as on Volta: synchronous
element-wise global loads (coalesced along the contiguous mode, predicated, so any M, N, K and
any alignment work), one shared-memory stage padded against bank conflicts
(`smem_a_layout`, `smem_b_layout`), and a direct predicated epilogue. fp16 inputs only
(m8n8k4 has no bf16 form); fp32 accumulation; fp16/fp32 output.

On sm_80 and later the instruction is not native. Compiled for sm_90a, ptxas replaces every
m8n8k4 by a CALL to an internal routine, `__cuda_sm_8x_mma_row_col_f32_f16_f16_f32`, that
gathers the quad pair's operands with 12 SHFLs and computes the 8x8x4 product with 32 FFMAs: no
tensor core is used (docs/gemm_ladder.md shows the SASS). The rung is correct on Hopper and
teaches the fragment idea; its speed there is a SIMT kernel's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator
from cutlass._mlir.dialects import llvm

from cute_kernels.runtime import (
    CompileJob,
    compile_kernel,
    current_stream,
    fake_stream,
    fake_tensor,
    from_torch,
    register_variant,
    to_cute,
)
from cute_kernels.layouts import Layout

__all__ = ["Sm70MmaConfig", "Sm70MmaGemm", "Sm70MmaRung", "RUNG", "mma_atom_name", "quad_pair_layout",
           "build_variant"]

_MAX_GRID_Z = 65535
_DSL_TYPES = {"float16": cutlass.Float16, "float32": cutlass.Float32}
_PAD = 4  # elements of padding per smem row: 8-byte fragment reads of 16 rows hit 32 distinct banks


def mma_atom_name() -> str:
    """The `cute_kernels.layouts.atom` name of the MMA this rung issues."""
    return "SM70_8x8x4_F32F16F16F32_TN"


def quad_pair_layout() -> Layout:
    """Quad pair index (0..3) -> (m, n) block of 8x8 in the warp's 16x16 step: 2 x 2, m first."""
    return Layout((2, 2), (1, 2))


@dataclass(frozen=True)
class Sm70MmaConfig:
    """tile_m x tile_n x tile_k block tile; warps_m x warps_n warps, each a multiple of 16x16;
    a_major "k"|"m", b_major "n"|"k" (contiguous mode of a (L,M,K), b (L,K,N)); out_dtype
    "float16"|"float32"; has_c: the epilogue reads c (beta != 0)."""

    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 32
    warps_m: int = 2
    warps_n: int = 2
    a_major: str = "k"
    b_major: str = "n"
    out_dtype: str = "float16"
    has_c: bool = False

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    def validate(self) -> "Sm70MmaConfig":
        for f in ("tile_m", "tile_n", "tile_k", "warps_m", "warps_n"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Sm70MmaConfig.{f} must be a positive int, got {v!r}")
        if self.tile_m % (16 * self.warps_m) or self.tile_n % (16 * self.warps_n):
            raise ValueError(f"Sm70MmaConfig: the warp tile ({self.tile_m}/{self.warps_m} x "
                             f"{self.tile_n}/{self.warps_n}) must be a multiple of 16 x 16")
        if self.tile_k % 4:
            raise ValueError(f"Sm70MmaConfig.tile_k must be a multiple of 4, got {self.tile_k}")
        if self.threads > 1024:
            raise ValueError(f"Sm70MmaConfig: {self.threads} threads per block exceed 1024")
        if (self.tile_m * self.tile_k) % self.threads or (self.tile_n * self.tile_k) % self.threads:
            raise ValueError("Sm70MmaConfig: the A and B tiles must split evenly over the threads")
        if self.a_major not in ("k", "m"):
            raise ValueError(f"Sm70MmaConfig.a_major must be 'k' or 'm', got {self.a_major!r}")
        if self.b_major not in ("n", "k"):
            raise ValueError(f"Sm70MmaConfig.b_major must be 'n' or 'k', got {self.b_major!r}")
        if self.out_dtype not in _DSL_TYPES:
            raise ValueError(f"Sm70MmaConfig.out_dtype must be 'float16' or 'float32', got {self.out_dtype!r}")
        if not isinstance(self.has_c, bool):
            raise ValueError(f"Sm70MmaConfig.has_c must be a bool, got {self.has_c!r}")
        return self


def _load_order(rows: int, cols: int, contiguous_cols: bool) -> Layout:
    """Element e of a thread sweep -> column-major index of the (rows, cols) tile, consecutive e
    along the global contiguous mode (coalesced loads)."""
    if contiguous_cols:
        return Layout((cols, rows), (rows, 1))
    return Layout((rows, cols), (1, rows))


@cute.jit
def mma_m8n8k4(a, b, acc):
    """acc (8 fp32, the atom's C values in register order) += A-fragment a (4 fp16, k = 0..3 of
    this lane's row) x B-fragment b (4 fp16, k = 0..3 of this lane's column), via inline PTX."""
    i16 = cutlass.Int16.mlir_type
    f32 = cutlass.Float32.mlir_type
    halves = [llvm.bitcast(i16, x.ir_value()) for x in (*a, *b)]
    accs = [x.ir_value() for x in acc]
    res = llvm.inline_asm(
        llvm.StructType.get_literal([f32] * 8),
        halves + accs,
        "{\n.reg .b32 a0, a1, b0, b1;\n"
        "mov.b32 a0, {$8, $9};\nmov.b32 a1, {$10, $11};\n"
        "mov.b32 b0, {$12, $13};\nmov.b32 b1, {$14, $15};\n"
        "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {$0, $1, $2, $3, $4, $5, $6, $7}, "
        "{a0, a1}, {b0, b1}, {$16, $17, $18, $19, $20, $21, $22, $23};\n}",
        ",".join(["=f"] * 8 + ["h"] * 8 + ["f"] * 8),
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return [cutlass.Float32(llvm.extractvalue(f32, res, [i])) for i in range(8)]


class Sm70MmaGemm:
    """out = alpha * a @ b (+ beta * c), a (L, M, K) fp16, b (L, K, N) fp16, out/c (L, M, N)."""

    def __init__(self, config: Sm70MmaConfig):
        from cute_kernels.layouts.atoms import atom

        self.config = cfg = config.validate()
        self.atom = atom(mma_atom_name())
        # K-major shared tiles for both operands (the atom's .row.col form), rows padded.
        self.smem_a_layout = Layout((cfg.tile_m, cfg.tile_k), (cfg.tile_k + _PAD, 1))
        self.smem_b_layout = Layout((cfg.tile_n, cfg.tile_k), (cfg.tile_k + _PAD, 1))
        self.load_a_layout = _load_order(cfg.tile_m, cfg.tile_k, cfg.a_major == "k")
        self.load_b_layout = _load_order(cfg.tile_n, cfg.tile_k, cfg.b_major == "k")
        self.quad_pair_layout = quad_pair_layout()
        self.c_type = _DSL_TYPES[cfg.out_dtype]

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream):
        cfg = self.config
        grid = [cute.ceil_div(out.shape[2], cfg.tile_n), cute.ceil_div(out.shape[1], cfg.tile_m), out.shape[0]]
        smem_elems = (cfg.tile_m + cfg.tile_n) * (cfg.tile_k + _PAD)
        self.kernel(a, b, out, c, alpha, beta, to_cute(self.smem_a_layout), to_cute(self.smem_b_layout),
                    to_cute(self.load_a_layout), to_cute(self.load_b_layout)).launch(
            grid=grid, block=[cfg.threads, 1, 1], smem=smem_elems * 2 + 256, stream=stream)

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, c: cute.Tensor,
               alpha: cutlass.Float32, beta: cutlass.Float32, sA_layout: cute.Layout, sB_layout: cute.Layout,
               la: cute.Layout, lb: cute.Layout):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, bl = cute.arch.block_idx()
        M, N, K = out.shape[1], out.shape[2], a.shape[2]
        m0 = bm * cfg.tile_m
        n0 = bn * cfg.tile_n

        smem = SmemAllocator()
        sA = smem.allocate_tensor(cutlass.Float16, sA_layout, 16)
        sB = smem.allocate_tensor(cutlass.Float16, sB_layout, 16)
        a_coords = cute.composition(cute.make_identity_tensor((cfg.tile_m, cfg.tile_k)), la)
        b_coords = cute.composition(cute.make_identity_tensor((cfg.tile_n, cfg.tile_k)), lb)

        # This lane's place in the warp tile: warp (wm, wn); quad pair qp at 8x8 block (qm, qn);
        # logical atom thread t = lane % 4 + 4 * (lane // 16) (the atom's thr_id (4,2):(1,16)).
        warp_id = tidx // 32
        lane = tidx % 32
        wm = warp_id % cfg.warps_m
        wn = warp_id // cfg.warps_m
        qp = (lane % 16) // 4
        t = lane % 4 + 4 * (lane // 16)
        warp_m = cfg.tile_m // cfg.warps_m
        warp_n = cfg.tile_n // cfg.warps_n
        rep_m = warp_m // 16
        rep_n = warp_n // 16
        row_a = wm * warp_m + (qp % 2) * 8 + t  # + 16 * i
        row_b = wn * warp_n + (qp // 2) * 8 + t  # + 16 * j

        acc = cute.make_rmem_tensor(cute.make_layout((8, rep_m, rep_n)), cutlass.Float32)
        acc.fill(0.0)
        per_a = cfg.tile_m * cfg.tile_k // cfg.threads
        per_b = cfg.tile_n * cfg.tile_k // cfg.threads

        for k0 in range(0, K, cfg.tile_k):
            cute.arch.sync_threads()
            # Global -> shared, one element per step, consecutive threads along the contiguous mode.
            for r in cutlass.range_constexpr(per_a):
                crd = a_coords[tidx + r * cfg.threads]
                v = cutlass.Float16(0.0)
                if cute.elem_less((m0 + crd[0], k0 + crd[1]), (M, K)):
                    v = a[bl, m0 + crd[0], k0 + crd[1]]
                sA[crd] = v
            for r in cutlass.range_constexpr(per_b):
                crd = b_coords[tidx + r * cfg.threads]
                v = cutlass.Float16(0.0)
                if cute.elem_less((n0 + crd[0], k0 + crd[1]), (N, K)):
                    v = b[bl, k0 + crd[1], n0 + crd[0]]
                sB[crd] = v
            cute.arch.sync_threads()
            for kk in cutlass.range_constexpr(0, cfg.tile_k, 4):
                a_frags = [[sA[row_a + 16 * i, kk + v] for v in range(4)] for i in range(rep_m)]
                b_frags = [[sB[row_b + 16 * j, kk + v] for v in range(4)] for j in range(rep_n)]
                for i in cutlass.range_constexpr(rep_m):
                    for j in cutlass.range_constexpr(rep_n):
                        res = mma_m8n8k4(a_frags[i], b_frags[j], [acc[v, i, j] for v in range(8)])
                        for v in cutlass.range_constexpr(8):
                            acc[v, i, j] = res[v]

        # Epilogue: the atom's C layout gives each value's (m, n) in the 8x8 block:
        # m = t0 + 4 t2 + 2 v1, n = 2 t1 + v0 + 4 v2 (t = t0 + 2 t1 + 4 t2, v = v0 + 2 v1 + 4 v2).
        t0, t1, t2 = t % 2, (t // 2) % 2, t // 4
        for i in cutlass.range_constexpr(rep_m):
            for j in cutlass.range_constexpr(rep_n):
                for v in cutlass.range_constexpr(8):
                    m = m0 + wm * warp_m + 16 * i + (qp % 2) * 8 + t0 + 4 * t2 + 2 * ((v // 2) % 2)
                    n = n0 + wn * warp_n + 16 * j + (qp // 2) * 8 + 2 * t1 + (v % 2) + 4 * (v // 4)
                    if cute.elem_less((m, n), (M, N)):
                        x = alpha * acc[v, i, j]
                        if cutlass.const_expr(cfg.has_c):
                            x = x + beta * c[bl, m, n].to(cutlass.Float32)
                        out[bl, m, n] = x.to(out.element_type)


# ---- compile-only builds ----------------------------------------------------------------------

def build_variant(**overrides) -> CompileJob:
    """A CompileJob for `Sm70MmaGemm(Sm70MmaConfig(**overrides))` on fake tensors."""
    config = Sm70MmaConfig(**overrides).validate()
    out_t = _DSL_TYPES[config.out_dtype]
    args = (
        fake_tensor(cutlass.Float16, 3, leading_dim=2 if config.a_major == "k" else 1, assumed_align=2),
        fake_tensor(cutlass.Float16, 3, leading_dim=2 if config.b_major == "n" else 1, assumed_align=2),
        fake_tensor(out_t, 3, leading_dim=2, assumed_align=out_t.width // 8),
        fake_tensor(out_t, 3, leading_dim=2, assumed_align=out_t.width // 8),
        cutlass.Float32(1.0),
        cutlass.Float32(0.0),
        fake_stream(),
    )
    return CompileJob(Sm70MmaGemm(config), args, ("gemm.sm70_mma", config), None)


register_variant(
    "gemm.sm70_mma",
    build_variant,
    configs={
        "default": {},
        "tn_fp32out": {"a_major": "k", "b_major": "k", "out_dtype": "float32"},
        "nt_c": {"a_major": "m", "b_major": "n", "has_c": True},
        "mk": {"a_major": "m", "b_major": "k"},
    },
    # On sm_90a ptxas replaces m8n8k4 by a call to an internal emulation routine
    # (__cuda_sm_8x_mma_row_col_f32_f16_f16_f32: lane shuffles and FFMAs), so no HMMA appears.
    requires={"CALL", "SHFL", "FFMA", "LDS", "STS"},
)


# ---- the rung ----------------------------------------------------------------------------------

def _unit_mode(t) -> int:
    return 2 if t.stride(2) == 1 else 1


class Sm70MmaRung:
    """The `sm70_mma` rung of the GEMM ladder (interface: `cute_kernels.gemm.registry`)."""

    name = "sm70_mma"
    min_capability = (7, 0)

    def __init__(self, base_config: Sm70MmaConfig = Sm70MmaConfig()):
        self.base_config = base_config.validate()

    @property
    def dtypes(self):
        import torch

        return (torch.float16,)

    def supports(self, a, b, out) -> str | None:
        import torch

        if a.dtype != torch.float16 or b.dtype != torch.float16:
            return f"input dtype {a.dtype}: mma.m8n8k4 takes float16 only"
        if out.dtype not in (torch.float16, torch.float32):
            return f"output dtype {out.dtype} not supported (float16, float32)"
        if out.shape[0] > _MAX_GRID_Z:
            return f"batch {out.shape[0]} exceeds the grid's z limit {_MAX_GRID_Z}"
        if -(-out.shape[1] // self.base_config.tile_m) > _MAX_GRID_Z:
            return f"M = {out.shape[1]} needs more than {_MAX_GRID_Z} blocks along grid y"
        if max(a.shape[1], a.shape[2], b.shape[2]) >= 2**31:
            return "a dimension exceeds 2**31 - 1 (32-bit coordinates)"
        for what, t in (("a", a), ("b", b), ("out", out)):
            if t.stride(1) != 1 and t.stride(2) != 1:
                return f"{what} has strides {tuple(t.stride())}: neither of its last two modes has stride 1"
        return None

    def __call__(self, a, b, out, *, alpha: float = 1.0, beta: float = 0.0, c=None):
        why = self.supports(a, b, out)
        if why is not None:
            raise ValueError(f"sm70_mma cannot run this problem: {why}")
        has_c = c is not None and beta != 0.0
        config = replace(self.base_config,
                         a_major="k" if _unit_mode(a) == 2 else "m",
                         b_major="n" if _unit_mode(b) == 2 else "k",
                         out_dtype=str(out.dtype).replace("torch.", ""),
                         has_c=has_c)
        kernel = Sm70MmaGemm(config)
        cin = c if has_c else out
        ts = (a, b, out, cin)
        # Element-wise accesses only: the element size is all the alignment assumed.
        tensors = [from_torch(t, assumed_align=t.element_size(), leading_dim=_unit_mode(t)) for t in ts]
        key = ("gemm.sm70_mma", config, str(cin.dtype),
               *((_unit_mode(t), tuple(s == 0 for s in t.stride())) for t in ts))
        stream = current_stream()
        alpha32, beta32 = cutlass.Float32(alpha), cutlass.Float32(beta)
        compiled = compile_kernel(kernel, *tensors, alpha32, beta32, stream, key=key)
        compiled(*tensors, alpha32, beta32, stream)
        return out


RUNG = Sm70MmaRung()
