"""Rung 1, `naive`: one thread per output element, fp32 accumulation straight from global memory.

Thread (block (bn, bm, l), index t) owns out[l, m, n] with (m, n) = (bm*block_m, bn*block_n) +
`thread_layout`(t) read as a coordinate of the (block_m, block_n) block tile. It walks K reading
a[l, m, k] and b[l, k, n] from global memory, so its arithmetic intensity is ~0.25 FLOP/byte
before caches: this is the roofline's floor, the rung every later idea is measured against.

Consecutive threads walk the output's contiguous mode (`threads_along`), so the stores, and the
loads of whichever operand shares that mode, coalesce. Measured on an H200 (fp32, 4096^3):
1.4 TFLOP/s, against 51.2 for cuBLAS SGEMM with TF32 disabled. Any M, N, K >= 1 (threads outside the
problem do nothing), any of the four transposes (strides are runtime values), batches on grid z.
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

__all__ = ["NaiveConfig", "NaiveGemm", "NaiveRung", "RUNG", "thread_layout"]

_MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class NaiveConfig:
    """block_m x block_n: the output tile of one thread block (one thread per element).

    threads_along: "n" when consecutive threads take consecutive n (row-major output), "m" when
    they take consecutive m (column-major output).
    """

    block_m: int = 16
    block_n: int = 16
    threads_along: str = "n"

    def validate(self) -> "NaiveConfig":
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"NaiveConfig.{name} must be a positive int, got {v!r}")
        threads = self.block_m * self.block_n
        if threads % 32 or threads > 1024:
            raise ValueError(
                f"NaiveConfig: block_m * block_n = {threads} threads must be a multiple of 32 and at most 1024"
            )
        if self.threads_along not in ("m", "n"):
            raise ValueError(f"NaiveConfig.threads_along must be 'm' or 'n', got {self.threads_along!r}")
        return self

    @property
    def threads(self) -> int:
        return self.block_m * self.block_n


def thread_layout(config: NaiveConfig) -> Layout:
    """Thread index -> offset of its element in the column-major (block_m, block_n) tile.

    Post-condition: a bijection of [0, block_m*block_n); threads t and t+1 differ by one step of
    `threads_along` (offset +block_m for "n", +1 for "m").
    """
    bm, bn = config.block_m, config.block_n
    if config.threads_along == "n":
        return Layout((bn, bm), (bm, 1))
    return Layout((bm, bn), (1, bm))


class NaiveGemm:
    """out = alpha * a @ b (+ beta * c) for a (L, M, K), b (L, K, N), out and c (L, M, N)."""

    def __init__(self, config: NaiveConfig, has_c: bool):
        self.config = config.validate()
        self.has_c = has_c
        self.thread_layout = thread_layout(config)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream):
        tl = to_cute(self.thread_layout)
        grid = [
            cute.ceil_div(out.shape[2], self.config.block_n),
            cute.ceil_div(out.shape[1], self.config.block_m),
            out.shape[0],
        ]
        self.kernel(a, b, out, c, alpha, beta, tl).launch(grid=grid, block=[self.config.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, c: cute.Tensor,
               alpha: cutlass.Float32, beta: cutlass.Float32, tl: cute.Layout):
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, bl = cute.arch.block_idx()
        # Partition: this thread's (m, n) inside the block tile, from the thread layout.
        tile_coords = cute.composition(cute.make_identity_tensor((self.config.block_m, self.config.block_n)), tl)
        crd = tile_coords[tidx]
        m = bm * self.config.block_m + crd[0]
        n = bn * self.config.block_n + crd[1]
        if cute.elem_less((m, n), (out.shape[1], out.shape[2])):
            # Main loop: the dot product of row m of a and column n of b, in fp32.
            acc = cutlass.Float32(0.0)
            for k in cutlass.range(a.shape[2]):
                acc += a[bl, m, k].to(cutlass.Float32) * b[bl, k, n].to(cutlass.Float32)
            # Epilogue: scale, add beta * c, convert.
            result = alpha * acc
            if cutlass.const_expr(self.has_c):
                result = result + beta * c[bl, m, n].to(cutlass.Float32)
            out[bl, m, n] = result.to(out.element_type)


_DTYPES = ("float32", "float16", "bfloat16")
_BLOCK_M = NaiveConfig().block_m  # the same for both thread orders: what bounds grid y


@functools.cache
def _torch_dtypes():
    import torch

    return tuple(getattr(torch, d) for d in _DTYPES)


@functools.cache
def use_tvm_ffi() -> bool:
    """Launch through TVM-FFI (torch tensors in, torch's current stream) when it is installed,
    unless CUTE_KERNELS_NO_TVM_FFI=1 asks for the DSL-tensor path (see runtime.tvm_ffi_available)."""
    return tvm_ffi_available()


def _leading(t) -> int:
    return 2 if t.stride(2) == 1 else 1


def _layout_class(t) -> tuple:
    """What of `t`'s layout a kernel compiled from `from_torch` tensors specializes on: the
    unit-stride mode, and which strides are 0 (from_dlpack keeps a broadcast operand's zero
    strides static)."""
    return (_leading(t), tuple(s == 0 for s in t.stride()))


def _cuda_reason(a, b, out) -> str | None:
    if a.is_cuda and b.is_cuda and out.is_cuda:
        return None
    where = ", ".join(f"{n} on '{t.device}'" for n, t in (("a", a), ("b", b), ("out", out)) if not t.is_cuda)
    return f"needs CUDA tensors ({where})"


class NaiveRung:
    """The `naive` rung of the GEMM ladder (see `cute_kernels.gemm.registry` for the interface).

    Calls take the operands as they are (matmul and dispatch have checked them with `supports`).
    With TVM-FFI the compiled function takes the torch tensors themselves and re-checks dtype,
    rank, device type, alignment and the unit stride before launching; its compile key is what
    the fake tensors it was built from fix: dtypes, unit-stride modes and whether c is read
    (every size and every other stride, zero included, is a runtime value).
    """

    name = "naive"
    min_capability = None  # plain loads, stores and FMAs: any CUDA GPU

    def __init__(self):
        # (in dtype, out dtype, c dtype, has_c, unit-stride modes) -> TVM-FFI function
        self._compiled = WarmCache("gemm.naive.builds")  # runtime.plan_cache

    @property
    def dtypes(self):
        return _torch_dtypes()

    def supports(self, a, b, out) -> str | None:
        dtypes = _torch_dtypes()
        if a.dtype not in dtypes:
            return f"input dtype {a.dtype} not supported (float32, float16, bfloat16)"
        if b.dtype != a.dtype:
            return f"b has dtype {b.dtype} but a has dtype {a.dtype}"
        if out.dtype not in dtypes:
            return f"output dtype {out.dtype} not supported (float32, float16, bfloat16)"
        batch, m, _ = out.shape
        if batch > _MAX_GRID_YZ:
            return f"batch {batch} exceeds the grid's z limit {_MAX_GRID_YZ}"
        if -(-m // _BLOCK_M) > _MAX_GRID_YZ:
            return f"M = {m} needs more than {_MAX_GRID_YZ} blocks along grid y"
        _, am, ak = a.shape
        if max(am, ak, b.shape[2]) >= 2**31:
            return "a dimension exceeds 2**31 - 1 (32-bit coordinates)"
        return _cuda_reason(a, b, out)  # last, so that every other reason can be checked on CPU

    @staticmethod
    def config_for(out) -> NaiveConfig:
        return NaiveConfig(threads_along="n" if _leading(out) == 2 else "m")

    def __call__(self, a, b, out, *, alpha: float = 1.0, beta: float = 0.0, c=None):
        has_c = c is not None and beta != 0.0
        cc = c if has_c else out
        if use_tvm_ffi():
            key = (a.dtype, out.dtype, cc.dtype, has_c, _leading(a), _leading(b), _leading(out), _leading(cc))
            fn = self._compiled.get(key)
            if fn is None:
                fn = self._compile_tvm_ffi(key)
            fn(a, b, out, cc, float(alpha), float(beta))
            return out
        config = self.config_for(out)
        kernel = NaiveGemm(config, has_c)
        # Scalar accesses only: the element size is all the alignment the kernel assumes.
        tensors = [
            from_torch(t, assumed_align=t.element_size(), leading_dim=_leading(t))
            for t in (a, b, out, cc)
        ]
        key = (
            "gemm.naive", config, has_c,
            str(a.dtype), str(out.dtype), str(cc.dtype),
            *(_layout_class(t) for t in (a, b, out, cc)),
        )
        stream = current_stream()
        alpha32, beta32 = cutlass.Float32(alpha), cutlass.Float32(beta)
        compiled = compile_kernel(kernel, *tensors, alpha32, beta32, stream, key=key)
        compiled(*tensors, alpha32, beta32, stream)
        return out

    def _compile_tvm_ffi(self, key: tuple):
        """Compile (or load) the TVM-FFI function for `key` from fake tensors; cache it here."""
        in_dtype, out_dtype, c_dtype, has_c, *leads = key
        config = NaiveConfig(threads_along="n" if leads[2] == 2 else "m")
        dtypes = (in_dtype, in_dtype, out_dtype, c_dtype)
        args = [
            # Scalar accesses only: the element size is all the alignment the kernel assumes.
            fake_tensor(dtype, 3, leading_dim=lead, assumed_align=dtype.itemsize)
            for dtype, lead in zip(dtypes, leads)
        ]
        fn = compile_kernel(
            NaiveGemm(config, has_c), *args, cutlass.Float32(1.0), cutlass.Float32(0.0),
            fake_stream(tvm_ffi_env_stream=True),
            key=("gemm.naive", "tvm_ffi", config, has_c, *(str(d) for d in dtypes), *leads),
            options=TVM_FFI_OPTION,
        )
        self._compiled[key] = fn
        return fn


RUNG = NaiveRung()


# ---- compile-only variants ------------------------------------------------------------------

_CUTLASS_TYPES = {"float32": cutlass.Float32, "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


def build_variant(dtype: str = "float32", out_dtype: str | None = None, a_major: str = "k", b_major: str = "n",
                  has_c: bool = False):
    """A CompileJob for the naive GEMM with a row-major output.

    a_major: "k" (row-major a) or "m"; b_major: "n" (row-major b) or "k".
    """
    in_t = _CUTLASS_TYPES[dtype]
    out_t = _CUTLASS_TYPES[out_dtype or dtype]
    config = NaiveConfig(threads_along="n")
    kernel = NaiveGemm(config, has_c)
    args = (
        fake_tensor(in_t, 3, leading_dim=2 if a_major == "k" else 1, assumed_align=in_t.width // 8),
        fake_tensor(in_t, 3, leading_dim=2 if b_major == "n" else 1, assumed_align=in_t.width // 8),
        fake_tensor(out_t, 3, leading_dim=2, assumed_align=out_t.width // 8),
        fake_tensor(out_t, 3, leading_dim=2, assumed_align=out_t.width // 8),
        cutlass.Float32(1.0),
        cutlass.Float32(0.0),
        fake_stream(),
    )
    return CompileJob(kernel, args, ("gemm.naive", config, has_c, dtype, out_dtype, a_major, b_major), None)


register_variant(
    "gemm.naive",
    build_variant,
    configs={
        "fp32_nn": {"dtype": "float32"},
        "fp32_tt_c": {"dtype": "float32", "a_major": "m", "b_major": "k", "has_c": True},
        "fp16_fp32out": {"dtype": "float16", "out_dtype": "float32"},
        "bf16": {"dtype": "bfloat16"},
    },
    requires={"FFMA", "LDG", "STG"},
)
