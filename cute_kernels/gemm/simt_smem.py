"""Rung 2, `simt_smem`: shared-memory tiling, 16-byte coalesced loads and register blocking (fp32).

One thread block computes a block_m x block_n tile of out, walking K in block_k slices:

1. Load: each thread fetches 16-byte vectors of the next A and B slices from global memory
   into registers (`load_a_layout`, `load_b_layout`: thread-value layouts over the (rows, k)
   slice whose values run along the operand's contiguous mode, so a warp reads contiguous
   512-byte runs). The loads of slice k+1 are issued before the math on slice k (prefetch).
2. Store to shared memory, both operands as (rows, k) with rows contiguous (`smem_a_layout`,
   `smem_b_layout`, two stages). The row pitch is padded by 4 floats: a k-contiguous operand is
   stored transposed, one float at a time, and the padding spreads the two k-halves a warp
   writes onto different banks; the pitch stays a multiple of 16 bytes for the vector reads.
3. Math: each thread owns a thread_m x thread_n micro-tile (8x8) of accumulators. Per k it
   reads thread_m values of A and thread_n of B from shared memory as 16-byte vectors
   (`a_frag_layout`, `b_frag_layout`: 4 consecutive rows, then the next 4 a quarter-tile away,
   so 8 neighbouring threads read 128 contiguous bytes: conflict-free) and does
   thread_m * thread_n FMAs. Double-buffered shared memory needs one barrier per K slice.
4. Epilogue: out = alpha * acc (+ beta * c), converted, stored under an (m < M, n < N) guard
   (`tv_c_layout` maps (thread, value) to the element of the tile).

Measured on an H200 (fp32, 4096^3, row-major A and B): 45.0 TFLOP/s, 0.88x cuBLAS SGEMM with
TF32 disabled (51.2 TFLOP/s); 44.2 TFLOP/s with column-major A. The naive rung does 1.4.

Requirements (`supports`): fp32 inputs; A and B 16-byte aligned, their non-unit strides and
their contiguous extents multiples of 4 elements (so each 16-byte vector is wholly inside or
wholly outside the problem). Out and c may have any layout.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from cute_kernels.runtime import (
    TVM_FFI_OPTION,
    CompileJob,
    compile_kernel,
    current_stream,
    fake_stream,
    fake_tensor,
    from_torch,
    register_variant,
    to_cute,
    tvm_ffi_available,
)
from cute_kernels.layouts import Layout
from cute_kernels.runtime.plan_cache import WarmCache

__all__ = [
    "SimtSmemConfig", "SimtSmemGemm", "SimtSmemRung", "RUNG",
    "smem_layout", "load_tv_layout", "frag_layout", "tv_c_layout",
]

_VEC = 4  # fp32 elements per 16-byte vector
_PAD = 4  # floats of padding per shared-memory row (see module docstring)
_STAGES = 2
_MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class SimtSmemConfig:
    """Static shape of one build.

    block_m x block_n x block_k: the block tile. thread_m x thread_n: each thread's accumulator
    micro-tile (multiples of 4). a_major: "k" (row-major A) or "m"; b_major: "n" (row-major B)
    or "k": the contiguous mode of each operand, along which global loads vectorize.
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 8
    thread_m: int = 8
    thread_n: int = 8
    a_major: str = "k"
    b_major: str = "n"

    @property
    def threads_m(self) -> int:
        return self.block_m // self.thread_m

    @property
    def threads_n(self) -> int:
        return self.block_n // self.thread_n

    @property
    def threads(self) -> int:
        return self.threads_m * self.threads_n

    def validate(self) -> "SimtSmemConfig":
        for name in ("block_m", "block_n", "block_k", "thread_m", "thread_n"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < _VEC or v % _VEC:
                raise ValueError(f"SimtSmemConfig.{name} must be a positive multiple of {_VEC}, got {v!r}")
        if self.block_m % self.thread_m or self.block_n % self.thread_n:
            raise ValueError("SimtSmemConfig: block_m/block_n must be multiples of thread_m/thread_n")
        if self.threads % 32 or self.threads > 1024:
            raise ValueError(f"SimtSmemConfig: {self.threads} threads; need a multiple of 32, at most 1024")
        if self.a_major not in ("k", "m"):
            raise ValueError(f"SimtSmemConfig.a_major must be 'k' or 'm', got {self.a_major!r}")
        if self.b_major not in ("k", "n"):
            raise ValueError(f"SimtSmemConfig.b_major must be 'k' or 'n', got {self.b_major!r}")
        for rows, major in ((self.block_m, self.a_major), (self.block_n, self.b_major)):
            load_tv_layout(rows, self.block_k, self.threads, k_contiguous=major == "k")  # raises if it does not tile
        smem = 4 * _STAGES * self.block_k * (self.block_m + self.block_n + 2 * _PAD)
        if smem > 48 * 1024:
            raise ValueError(f"SimtSmemConfig: {smem} bytes of static shared memory exceed 48 KiB")
        return self


def smem_layout(rows: int, block_k: int) -> Layout:
    """(row, k, stage) -> shared-memory offset: rows contiguous, row pitch rows + 4 floats."""
    pitch = rows + _PAD
    return Layout((rows, block_k, _STAGES), (1, pitch, pitch * block_k))


def load_tv_layout(rows: int, block_k: int, threads: int, *, k_contiguous: bool) -> Layout:
    """(thread, (v, r)) -> offset m + rows*k in the column-major (rows, block_k) slice.

    Value v (0..3) runs along the operand's contiguous mode (k when `k_contiguous`, else rows),
    so each (thread, r) is one 16-byte vector; consecutive threads take consecutive vectors.
    Post-condition: a bijection onto [0, rows*block_k). Raises ValueError when the threads do
    not tile the slice evenly.
    """
    run, other = (block_k, rows) if k_contiguous else (rows, block_k)
    vectors_per_run = run // _VEC
    if threads % vectors_per_run or (rows * block_k) % (threads * _VEC):
        raise ValueError(f"{threads} threads do not tile a ({rows}, {block_k}) slice with 16-byte vectors")
    others_per_pass = threads // vectors_per_run
    passes = other // others_per_pass
    if passes < 1 or other % others_per_pass:
        raise ValueError(f"{threads} threads do not tile a ({rows}, {block_k}) slice with 16-byte vectors")
    if k_contiguous:  # thread -> (k vector, row); value -> k within the vector
        return Layout(((vectors_per_run, others_per_pass), (_VEC, passes)),
                      ((_VEC * rows, 1), (rows, others_per_pass)))
    # thread -> (row vector, k); value -> row within the vector
    return Layout(((vectors_per_run, others_per_pass), (_VEC, passes)),
                  ((_VEC, rows), (1, rows * others_per_pass)))


def frag_layout(threads_along: int, per_thread: int) -> Layout:
    """(thread, (i, g)) -> row: thread t's rows are 4t + i + 4*threads_along*g.

    Each group g is one 16-byte shared-memory vector; 8 neighbouring threads' vectors are
    128 contiguous bytes, which is what makes the 128-bit reads conflict-free.
    """
    groups = per_thread // _VEC
    return Layout((threads_along, (_VEC, groups)), (_VEC, (1, _VEC * threads_along)))


def tv_c_layout(config: SimtSmemConfig) -> Layout:
    """((tn, tm), (mi, ni)) -> offset m + block_m*n in the (block_m, block_n) tile.

    Thread t = tn + threads_n*tm; value (mi, ni) indexes its thread_m x thread_n accumulators,
    with m and n given by `frag_layout` for A and for B.
    """
    fa = frag_layout(config.threads_m, config.thread_m)
    fb = frag_layout(config.threads_n, config.thread_n)
    bm = config.block_m
    scale = lambda s: tuple(scale(x) for x in s) if isinstance(s, tuple) else s * bm  # noqa: E731
    return Layout(
        ((config.threads_n, config.threads_m), (fa.shape[1], fb.shape[1])),
        ((fb.stride[0] * bm, fa.stride[0]), (fa.stride[1], scale(fb.stride[1]))),
    )


def _vector_strides(t: cute.Tensor, unit_mode: int) -> cute.Tensor:
    """`t` with its dynamic non-unit strides declared multiples of 4 (checked by `supports`), so
    the compiler can prove 16-byte alignment of every vector."""
    strides = []
    for i, s in enumerate(t.stride):
        strides.append(s if (i == unit_mode or isinstance(s, int)) else cute.assume(s, divby=_VEC))
    return cute.make_tensor(t.iterator, cute.make_layout(t.shape, stride=tuple(strides)))


class SimtSmemGemm:
    """out = alpha * a @ b (+ beta * c); a (L, M, K), b (L, K, N), out and c (L, M, N), fp32 in."""

    def __init__(self, config: SimtSmemConfig, has_c: bool):
        self.config = config.validate()
        self.has_c = has_c
        cfg = config
        self.smem_a_layout = smem_layout(cfg.block_m, cfg.block_k)
        self.smem_b_layout = smem_layout(cfg.block_n, cfg.block_k)
        self.load_a_layout = load_tv_layout(cfg.block_m, cfg.block_k, cfg.threads, k_contiguous=cfg.a_major == "k")
        self.load_b_layout = load_tv_layout(cfg.block_n, cfg.block_k, cfg.threads, k_contiguous=cfg.b_major == "k")
        self.a_frag_layout = frag_layout(cfg.threads_m, cfg.thread_m)
        self.b_frag_layout = frag_layout(cfg.threads_n, cfg.thread_n)
        self.tv_c_layout = tv_c_layout(cfg)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream):
        cfg = self.config
        a = _vector_strides(a, 2 if cfg.a_major == "k" else 1)
        b = _vector_strides(b, 1 if cfg.b_major == "k" else 2)
        grid = [cute.ceil_div(out.shape[2], cfg.block_n), cute.ceil_div(out.shape[1], cfg.block_m), out.shape[0]]
        self.kernel(
            a, b, out, c, alpha, beta,
            to_cute(self.smem_a_layout), to_cute(self.smem_b_layout),
            to_cute(self.load_a_layout), to_cute(self.load_b_layout),
            to_cute(self.a_frag_layout), to_cute(self.b_frag_layout), to_cute(self.tv_c_layout),
        ).launch(
            grid=grid,
            block=[cfg.threads, 1, 1],
            stream=stream,
            # Two resident blocks per SM: caps registers at 128 per thread (the 8x8 micro-tile
            # needs ~130 unconstrained, which would leave one block and little latency hiding).
            min_blocks_per_mp=2,
            preferred_smem_carveout=50,
        )

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, c: cute.Tensor,
               alpha: cutlass.Float32, beta: cutlass.Float32,
               smem_a: cute.Layout, smem_b: cute.Layout, load_a: cute.Layout, load_b: cute.Layout,
               frag_a: cute.Layout, frag_b: cute.Layout, tv_c: cute.Layout):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, bl = cute.arch.block_idx()
        tn = tidx % cfg.threads_n
        tm = tidx // cfg.threads_n

        # ---- partition: this block's operands as (rows, k, k_slice) ----
        m_a = a[bl, None, None]                                                   # (M, K)
        b_kn = b[bl, None, None]                                                  # (K, N)
        m_b = cute.make_tensor(b_kn.iterator, cute.select(b_kn.layout, mode=[1, 0]))  # (N, K)
        tile_a = (cfg.block_m, cfg.block_k)
        tile_b = (cfg.block_n, cfg.block_k)
        g_a = cute.local_tile(m_a, tile_a, (bm, None))
        g_b = cute.local_tile(m_b, tile_b, (bn, None))
        crd_a = cute.local_tile(cute.make_identity_tensor(m_a.shape), tile_a, (bm, None))
        crd_b = cute.local_tile(cute.make_identity_tensor(m_b.shape), tile_b, (bn, None))
        depth = a.shape[2]
        k_slices = cute.ceil_div(a.shape[2], cfg.block_k)

        allocator = cutlass.memory.SmemAllocator()
        s_a = allocator.allocate_tensor(cutlass.Float32, smem_a, 16)
        s_b = allocator.allocate_tensor(cutlass.Float32, smem_b, 16)

        regs_a = cute.make_rmem_tensor(cute.make_layout(cute.flatten(load_a.shape[1])), cutlass.Float32)
        regs_b = cute.make_rmem_tensor(cute.make_layout(cute.flatten(load_b.shape[1])), cutlass.Float32)
        acc = cute.make_rmem_tensor(cute.make_layout((cfg.thread_m, cfg.thread_n)), cutlass.Float32)
        acc.fill(0.0)

        # ---- prologue: slice 0 into stage 0 ----
        row_ok_a = self.row_predicates(crd_a, load_a, m_a.shape[0], tidx)
        row_ok_b = self.row_predicates(crd_b, load_b, m_b.shape[0], tidx)
        self.load_slice(g_a, crd_a, load_a, row_ok_a, depth, 0, regs_a, tidx)
        self.load_slice(g_b, crd_b, load_b, row_ok_b, depth, 0, regs_b, tidx)
        self.store_slice(s_a, load_a, 0, regs_a, tidx)
        self.store_slice(s_b, load_b, 0, regs_b, tidx)
        cute.arch.sync_threads()

        # ---- main loop: prefetch slice k+1 into registers while computing slice k ----
        for k in cutlass.range(k_slices):
            stage = k % 2
            if k + 1 < k_slices:
                self.load_slice(g_a, crd_a, load_a, row_ok_a, depth, k + 1, regs_a, tidx)
                self.load_slice(g_b, crd_b, load_b, row_ok_b, depth, k + 1, regs_b, tidx)
            self.multiply_slice(s_a, s_b, frag_a, frag_b, stage, tm, tn, acc)
            if k + 1 < k_slices:
                self.store_slice(s_a, load_a, 1 - stage, regs_a, tidx)
                self.store_slice(s_b, load_b, 1 - stage, regs_b, tidx)
            cute.arch.sync_threads()

        # ---- epilogue ----
        self.epilogue(out, c, acc, alpha, beta, tv_c, bl, bm, bn, tidx)

    @cute.jit
    def row_predicates(self, crd: cute.Tensor, tv: cute.Layout, rows, tidx) -> cute.Tensor:
        """Whether each of this thread's load vectors lies on a row < rows (the same for every K
        slice, so it is computed once, outside the main loop)."""
        thr_crd = cute.flatten(cute.composition(crd[(None, None, 0)], tv)[(tidx, None)])
        passes = cute.size(thr_crd, mode=[1])
        pred = cute.make_rmem_tensor(cute.make_layout(passes), cutlass.Boolean)
        for r in cutlass.range_constexpr(passes):
            pred[r] = thr_crd[(0, r)][0] < rows
        return pred

    @cute.jit
    def load_slice(self, g: cute.Tensor, crd: cute.Tensor, tv: cute.Layout, row_ok: cute.Tensor, depth, k,
                   regs: cute.Tensor, tidx):
        """Global -> registers, one 16-byte vector per (thread, r); vectors outside the problem
        read as zeros (so a ragged last K slice adds nothing)."""
        thr_g = cute.flatten(cute.composition(g[(None, None, k)], tv)[(tidx, None)])      # (4, passes)
        thr_crd = cute.flatten(cute.composition(crd[(None, None, k)], tv)[(tidx, None)])
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128)
        for r in cutlass.range_constexpr(cute.size(thr_g, mode=[1])):
            if row_ok[r] & (thr_crd[(0, r)][1] < depth):
                cute.copy(atom, thr_g[(None, r)], regs[(None, r)])
            else:
                for v in cutlass.range_constexpr(_VEC):
                    regs[(v, r)] = cutlass.Float32(0.0)

    @cute.jit
    def store_slice(self, s: cute.Tensor, tv: cute.Layout, stage, regs: cute.Tensor, tidx):
        """Registers -> shared memory stage `stage` (16-byte stores when rows are contiguous in the
        vector, else 4 scalar stores that the padding keeps conflict-free)."""
        thr_s = cute.flatten(cute.composition(s[(None, None, stage)], tv)[(tidx, None)])
        cute.autovec_copy(regs, thr_s)

    @cute.jit
    def multiply_slice(self, s_a: cute.Tensor, s_b: cute.Tensor, frag_a: cute.Layout, frag_b: cute.Layout,
                       stage, tm, tn, acc: cute.Tensor):
        cfg = self.config
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128)
        reg_a = cute.make_rmem_tensor(cute.make_layout(cute.flatten(frag_a.shape[1])), cutlass.Float32)
        reg_b = cute.make_rmem_tensor(cute.make_layout(cute.flatten(frag_b.shape[1])), cutlass.Float32)
        for kk in cutlass.range_constexpr(cfg.block_k):
            thr_a = cute.flatten(cute.composition(s_a[(None, kk, stage)], frag_a)[(tm, None)])  # (4, groups)
            thr_b = cute.flatten(cute.composition(s_b[(None, kk, stage)], frag_b)[(tn, None)])
            for g in cutlass.range_constexpr(cfg.thread_m // _VEC):
                cute.copy(atom, thr_a[(None, g)], reg_a[(None, g)])
            for g in cutlass.range_constexpr(cfg.thread_n // _VEC):
                cute.copy(atom, thr_b[(None, g)], reg_b[(None, g)])
            for i in cutlass.range_constexpr(cfg.thread_m):
                for j in cutlass.range_constexpr(cfg.thread_n):
                    acc[i, j] = acc[i, j] + reg_a[i] * reg_b[j]

    @cute.jit
    def epilogue(self, out: cute.Tensor, c: cute.Tensor, acc: cute.Tensor, alpha, beta, tv_c: cute.Layout,
                 bl, bm, bn, tidx):
        cfg = self.config
        thr_crd = cute.composition(cute.make_identity_tensor((cfg.block_m, cfg.block_n)), tv_c)[(tidx, None)]
        for v in cutlass.range_constexpr(cfg.thread_m * cfg.thread_n):
            crd = thr_crd[v]
            m = bm * cfg.block_m + crd[0]
            n = bn * cfg.block_n + crd[1]
            if cute.elem_less((m, n), (out.shape[1], out.shape[2])):
                result = alpha * acc[v]
                if cutlass.const_expr(self.has_c):
                    result = result + beta * c[bl, m, n].to(cutlass.Float32)
                out[bl, m, n] = result.to(out.element_type)


# ---- the rung -----------------------------------------------------------------------------------

def _leading(t) -> int:
    return 2 if t.stride(2) == 1 else 1


def _layout_class(t) -> tuple:
    return (_leading(t), tuple(s == 0 for s in t.stride()))


@functools.cache
def use_tvm_ffi() -> bool:
    """Launch through TVM-FFI (torch tensors in, torch's current stream) when it is installed,
    unless CUTE_KERNELS_NO_TVM_FFI=1 asks for the DSL-tensor path (see runtime.tvm_ffi_available)."""
    return tvm_ffi_available()


_BLOCK_M = SimtSmemConfig().block_m


def _cuda_reason(a, b, out) -> str | None:
    if a.is_cuda and b.is_cuda and out.is_cuda:
        return None
    where = ", ".join(f"{n} on '{t.device}'" for n, t in (("a", a), ("b", b), ("out", out)) if not t.is_cuda)
    return f"needs CUDA tensors ({where})"


_torch_types = None  # (float32, (float32, float16, bfloat16)), set on first use


def _types():
    global _torch_types
    if _torch_types is None:
        import torch

        _torch_types = (torch.float32, (torch.float32, torch.float16, torch.bfloat16))
    return _torch_types


class SimtSmemRung:
    """The `simt_smem` rung of the GEMM ladder (interface: `cute_kernels.gemm.registry`).

    Calls take the operands as they are (matmul and dispatch have checked them with `supports`).
    With TVM-FFI the compiled function takes the torch tensors themselves and re-checks dtype,
    rank, device type, alignment and the unit strides before launching; its compile key is what
    the fake tensors it was built from fix: output and c dtypes, unit-stride modes and whether c
    is read (every size and every other stride, zero included, is a runtime value).
    """

    name = "simt_smem"
    min_capability = (8, 0)  # tuned for (and only tested on) Ampere and later

    def __init__(self):
        # (out dtype, c dtype, has_c, unit-stride modes) -> TVM-FFI function
        self._compiled = WarmCache("gemm.simt_smem.builds")  # runtime.plan_cache

    @property
    def dtypes(self):
        return (_types()[0],)

    def supports(self, a, b, out) -> str | None:
        f32, out_dtypes = _torch_types or _types()
        if a.dtype != f32 or b.dtype != f32:
            return f"takes float32 inputs only, got {a.dtype}"
        if out.dtype not in out_dtypes:
            return f"output dtype {out.dtype} not supported"
        for name, t in (("a", a), ("b", b)):
            if t.data_ptr() % 16:
                return f"{name}'s data pointer is not 16-byte aligned"
            stride = t.stride()
            lead = 2 if stride[2] == 1 else 1
            if t.shape[lead] % _VEC:
                return f"{name}'s contiguous extent {t.shape[lead]} is not a multiple of {_VEC}"
            for i, s in enumerate(stride):
                if i != lead and s % _VEC:
                    return f"{name}'s stride {s} (mode {i}) is not a multiple of {_VEC} elements"
        batch, m, _ = out.shape
        if batch > _MAX_GRID_YZ:
            return f"batch {batch} exceeds the grid's z limit {_MAX_GRID_YZ}"
        if -(-m // _BLOCK_M) > _MAX_GRID_YZ:
            return f"M = {m} needs too many blocks along grid y"
        return _cuda_reason(a, b, out)  # last, so that every other reason can be checked on CPU

    @staticmethod
    def config_for(a, b) -> SimtSmemConfig:
        return SimtSmemConfig(a_major="k" if _leading(a) == 2 else "m", b_major="n" if _leading(b) == 2 else "k")

    def __call__(self, a, b, out, *, alpha: float = 1.0, beta: float = 0.0, c=None):
        has_c = c is not None and beta != 0.0
        cc = c if has_c else out
        if use_tvm_ffi():
            key = (out.dtype, cc.dtype, has_c, _leading(a), _leading(b), _leading(out), _leading(cc))
            fn = self._compiled.get(key)
            if fn is None:
                fn = self._compile_tvm_ffi(key)
            fn(a, b, out, cc, float(alpha), float(beta))
            return out
        config = self.config_for(a, b)
        kernel = SimtSmemGemm(config, has_c)
        tensors = [
            from_torch(a, assumed_align=16, leading_dim=_leading(a)),
            from_torch(b, assumed_align=16, leading_dim=_leading(b)),
            from_torch(out, assumed_align=out.element_size(), leading_dim=_leading(out)),
            from_torch(cc, assumed_align=cc.element_size(), leading_dim=_leading(cc)),
        ]
        key = ("gemm.simt_smem", config, has_c, str(out.dtype), str(cc.dtype),
               *(_layout_class(t) for t in (a, b, out, cc)))
        stream = current_stream()
        alpha32, beta32 = cutlass.Float32(alpha), cutlass.Float32(beta)
        compiled = compile_kernel(kernel, *tensors, alpha32, beta32, stream, key=key)
        compiled(*tensors, alpha32, beta32, stream)
        return out

    def _compile_tvm_ffi(self, key: tuple):
        """Compile (or load) the TVM-FFI function for `key` from fake tensors; cache it here."""
        out_dtype, c_dtype, has_c, lead_a, lead_b, lead_out, lead_c = key
        config = SimtSmemConfig(a_major="k" if lead_a == 2 else "m", b_major="n" if lead_b == 2 else "k")
        f32 = cutlass.Float32
        args = (
            fake_tensor(f32, 3, leading_dim=lead_a, assumed_align=16),
            fake_tensor(f32, 3, leading_dim=lead_b, assumed_align=16),
            fake_tensor(out_dtype, 3, leading_dim=lead_out, assumed_align=out_dtype.itemsize),
            fake_tensor(c_dtype, 3, leading_dim=lead_c, assumed_align=c_dtype.itemsize),
        )
        fn = compile_kernel(
            SimtSmemGemm(config, has_c), *args, cutlass.Float32(1.0), cutlass.Float32(0.0),
            fake_stream(tvm_ffi_env_stream=True),
            key=("gemm.simt_smem", "tvm_ffi", config, has_c, str(out_dtype), str(c_dtype), lead_out, lead_c),
            options=TVM_FFI_OPTION,
        )
        self._compiled[key] = fn
        return fn


RUNG = SimtSmemRung()


# ---- compile-only variants ------------------------------------------------------------------------

def build_variant(a_major: str = "k", b_major: str = "n", has_c: bool = False):
    config = SimtSmemConfig(a_major=a_major, b_major=b_major)
    kernel = SimtSmemGemm(config, has_c)
    f32 = cutlass.Float32
    args = (
        fake_tensor(f32, 3, leading_dim=2 if a_major == "k" else 1, assumed_align=16),
        fake_tensor(f32, 3, leading_dim=1 if b_major == "k" else 2, assumed_align=16),
        fake_tensor(f32, 3, leading_dim=2, assumed_align=4),
        fake_tensor(f32, 3, leading_dim=2, assumed_align=4),
        cutlass.Float32(1.0),
        cutlass.Float32(0.0),
        fake_stream(),
    )
    return CompileJob(kernel, args, ("gemm.simt_smem", config, has_c), None)


register_variant(
    "gemm.simt_smem",
    build_variant,
    configs={
        "nt": {"a_major": "m", "b_major": "k"},
        "nn_c": {"a_major": "m", "b_major": "n", "has_c": True},
        "tt": {"a_major": "k", "b_major": "k"},
    },
    requires={"LDG.E.128", "LDS.128", "FFMA", "BAR.SYNC"},
)

# With A k-major (row-major A, the common case) ptxas keeps one 8-byte value (the block's column
# offset, needed again by the epilogue) in local memory across the main loop: one STL before it,
# one LDL after it, none inside. The variant is registered apart so that this, and only this,
# is allowed.
register_variant(
    "gemm.simt_smem.a_k_major",
    build_variant,
    configs={"tn": {"a_major": "k", "b_major": "n"}},
    requires={"LDG.E.128", "LDS.128", "FFMA", "BAR.SYNC", "STS"},
    forbids=set(),
)
