"""The torch-facing side of the sm_90a GEMM rungs (the rung object protocol of contracts.md).

A rung takes 3-D views a: (L, M, K), b: (L, K, N), out: (L, M, N), maps them to the kernels'
(M, K, L) / (N, K, L) / (M, N, L) convention (a permutation, no copy), compiles the kernel once
per (config, dtypes, majors), and launches it on torch's current stream.

Operands TMA cannot address (a leading dimension or base pointer not 16-byte aligned, or no
unit stride) go through a padded, aligned copy: slower, never wrong. beta * C is applied
after the kernel through an fp32 temporary (unfused, correct) until the epilogue fuses it.
Unbatched problems with less than half a wave of tiles split K (`pick_split_k`): the chunks
become the kernel's batch mode and the fp32 partials are summed afterwards.
"""

from __future__ import annotations

import os

import torch

from cute_kernels.gemm.sm90_config import Sm90GemmConfig, pick_config, pick_split_k

_IN_DTYPES = (torch.bfloat16, torch.float16)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_compiled: dict = {}
_max_clusters: dict = {}


def _tma_ok(t: torch.Tensor) -> bool:
    """True when `t` (3-D, kernel order) is addressable by a TMA descriptor."""
    es = t.element_size()
    if t.data_ptr() % 16:
        return False
    unit = [i for i in (0, 1) if t.stride(i) == 1 or t.size(i) == 1]
    if not unit:
        return False
    lead = unit[0]
    return all((t.stride(i) * es) % 16 == 0 for i in range(3) if i != lead and t.size(i) > 1)


def _sane_batch_stride(t: torch.Tensor) -> torch.Tensor:
    """A size-1 batch mode gets a 16-byte-aligned stride (never dereferenced) so TMA accepts it."""
    if t.size(2) != 1:
        return t
    span = max(t.stride(0) * t.size(0), t.stride(1) * t.size(1))
    return t.as_strided(t.shape, (t.stride(0), t.stride(1), _round_up(span, 16)))


def _leading(t: torch.Tensor) -> int:
    return 0 if t.stride(0) == 1 else 1


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _to_cute(t: torch.Tensor, lead: int):
    try:
        from cute_kernels.runtime import from_torch

        return from_torch(t, assumed_align=16, leading_dim=lead)
    except (ImportError, AttributeError):
        from cutlass.cute.runtime import from_dlpack

        return from_dlpack(t, assumed_align=16).mark_layout_dynamic(leading_dim=lead)


def _stream():
    try:
        from cute_kernels.runtime import current_stream

        return current_stream()
    except (ImportError, AttributeError):
        import cuda.bindings.driver as cuda

        return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


def _tvm_ffi_available() -> bool:
    if "tvm" not in _max_clusters:
        import importlib.util
        import os

        _max_clusters["tvm"] = (importlib.util.find_spec("tvm_ffi") is not None
                                and os.environ.get("CUTE_KERNELS_NO_TVM_FFI") != "1")
    return _max_clusters["tvm"]


def max_active_clusters(cluster_size: int) -> int:
    if cluster_size not in _max_clusters:
        import cutlass.utils

        try:
            n = cutlass.utils.HardwareInfo().get_max_active_clusters(cluster_size)
        except Exception:  # older drivers: one CTA per SM
            n = torch.cuda.get_device_properties(0).multi_processor_count // cluster_size
        _max_clusters[cluster_size] = int(n)
    return _max_clusters[cluster_size]


class Sm90Rung:
    """A GEMM ladder rung backed by one of the sm_90a kernel classes."""

    dtypes = _IN_DTYPES

    def __init__(self, name: str, kernel_cls, pick=pick_config, split_k: bool = True, persistent: bool = True):
        self.name = name
        self.persistent = persistent
        self.kernel_cls = kernel_cls
        self.pick = pick
        self.split_k = split_k

    def supports(self, a, b, out) -> str | None:
        if not (a.is_cuda and b.is_cuda and out.is_cuda):
            return "tensors must be on a CUDA device"
        if torch.cuda.get_device_capability(a.device) != (9, 0):
            return "needs an sm_90 (Hopper) GPU"
        if a.dtype not in _IN_DTYPES or b.dtype != a.dtype:
            return f"inputs must both be bf16 or fp16, got {a.dtype} and {b.dtype}"
        if out.dtype not in _OUT_DTYPES:
            return f"output dtype {out.dtype} not supported (bf16, fp16, fp32)"
        if a.dim() != 3 or b.dim() != 3 or out.dim() != 3:
            return "expects 3-D (L, M, K) x (L, K, N) -> (L, M, N) views"
        return None

    def compiled(self, config: Sm90GemmConfig, A, B, C):
        """(compiled function, uses_tvm_ffi) for these kernel-order tensors (compiles on first use).

        With TVM-FFI available the function takes torch tensors directly and launches on the
        current stream (a few microseconds of host time); otherwise DSL tensors and a stream.
        """
        import cutlass

        # a non-persistent launch: a grid of every cluster (the scheduler then hands each CTA one tile)
        ncl = max_active_clusters(config.cluster_m * config.cluster_n) if self.persistent else 65535
        tvm = _tvm_ffi_available()
        key = (self.name, config, str(A.dtype), str(B.dtype), str(C.dtype), _leading(A), _leading(B), _leading(C),
               ncl, tvm)
        fn = _compiled.get(key)
        if fn is None:
            kern = self.kernel_cls(config)
            if tvm:
                from cute_kernels.runtime import compile_kernel, fake_stream, fake_tensor

                args = tuple(fake_tensor(t.dtype, 3, leading_dim=_leading(t)) for t in (A, B, C))
                fn = compile_kernel(kern, *args, cutlass.Float32(1.0), ncl, fake_stream(tvm_ffi_env_stream=True),
                                    key=key, options="--enable-tvm-ffi")
            else:
                import cutlass.cute as cute

                fn = cute.compile(kern, _to_cute(A, _leading(A)), _to_cute(B, _leading(B)), _to_cute(C, _leading(C)),
                                  cutlass.Float32(1.0), ncl, _stream())
            _compiled[key] = fn
        return fn, tvm

    def launcher(self, config, A, B, C, alpha: float = 1.0):
        """A zero-argument callable launching the kernel on prepared kernel-order tensors."""
        fn, tvm = self.compiled(config, A, B, C)
        if tvm:
            return lambda: fn(A, B, C, alpha)
        args = (_to_cute(A, _leading(A)), _to_cute(B, _leading(B)), _to_cute(C, _leading(C)), alpha, _stream())
        return lambda: fn(*args)

    def launch(self, config, A, B, C, alpha: float) -> None:
        fn, tvm = self.compiled(config, A, B, C)
        if tvm:
            fn(A, B, C, alpha)
        else:
            fn(_to_cute(A, _leading(A)), _to_cute(B, _leading(B)), _to_cute(C, _leading(C)), alpha, _stream())

    def __call__(self, a, b, out, *, alpha=1.0, beta=0.0, c=None, config: Sm90GemmConfig | None = None):
        reason = self.supports(a, b, out)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")
        L, M, K = a.shape
        N = b.shape[2]
        if M == 0 or N == 0 or L == 0:
            return out
        if K == 0:
            out.zero_() if c is None or beta == 0 else out.copy_(beta * c)
            return out
        config = (config or self.pick(M, N, K, a.element_size())).validate()
        if (config.schedule == "pingpong" and not getattr(self.kernel_cls, "pingpong_validated", True)
                and os.environ.get("CUTE_KERNELS_EXPERIMENTAL") != "1"):
            raise ValueError(f"{self.name}: the ping-pong schedule is not validated on a GPU yet "
                             "(set CUTE_KERNELS_EXPERIMENTAL=1 to run it anyway)")
        target = out
        if beta != 0 and c is not None:
            target = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        A, B, C = (_sane_batch_stride(t) for t in (a.permute(1, 2, 0), b.permute(2, 1, 0), target.permute(1, 2, 0)))
        splits = pick_split_k(M, N, K, L, config, a.element_size()) if self.split_k else 1
        if splits > 1 and _tma_ok(A) and _tma_ok(B):
            self._launch_split_k(config, A, B, splits, float(alpha), out, beta, c)
            return out
        if _tma_ok(A) and _tma_ok(B) and _tma_ok(C):
            self.launch(config, A, B, C, float(alpha))
        else:
            self._launch_padded(config, a, b, target, float(alpha))
        if target is not out:
            out.copy_(target + beta * c.float())
        return out

    def _launch_split_k(self, config, A, B, splits, alpha, out, beta, c):
        """K split into `splits` chunks that the kernel sees as its batch mode: (M, K/S, S) and
        (N, K/S, S) strided views, fp32 partials (M, N, S), summed here (one extra pass)."""
        M, K, _ = A.shape
        N = B.shape[0]
        ks = K // splits
        As = A.as_strided((M, ks, splits), (A.stride(0), A.stride(1), A.stride(1) * ks))
        Bs = B.as_strided((N, ks, splits), (B.stride(0), B.stride(1), B.stride(1) * ks))
        ws = torch.empty(splits, M, N, dtype=torch.float32, device=out.device)
        self.launch(config, As, Bs, ws.permute(1, 2, 0), alpha)
        res = ws.sum(0)
        if beta != 0 and c is not None:
            res += beta * c[0].float()
        out[0].copy_(res)

    def _launch_padded(self, config, a, b, target, alpha):
        """Zero-pad K (and N for the output) to 16-byte multiples in K-major copies."""
        L, M, K = a.shape
        N = b.shape[2]
        kp = _round_up(K, 16 // a.element_size())
        np_ = _round_up(N, 16 // target.element_size())
        ap = torch.zeros(L, M, kp, dtype=a.dtype, device=a.device)
        ap[:, :, :K] = a
        bp = torch.zeros(L, N, kp, dtype=b.dtype, device=b.device)
        bp[:, :, :K] = b.transpose(1, 2)
        cp = torch.empty(L, M, np_, dtype=target.dtype, device=target.device)
        A, B, C = (_sane_batch_stride(t.permute(1, 2, 0)) for t in (ap, bp, cp))
        self.launch(config, A, B, C, alpha)
        target.copy_(cp[:, :, :N])


def fake_gemm_args(in_dtype: str = "bf16", out_dtype: str = "bf16", a_major: str = "K", b_major: str = "K",
                   c_major: str = "N"):
    """Symbolic-size fake (A, B, C) in kernel order for compile-only builds (no GPU needed)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    dt = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32,
          "e4m3": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2}
    m, n, k, l = (cute.sym_int() for _ in range(4))

    def t(dtype, rows, cols, major_is_cols):
        # (rows, cols, L) with cols contiguous (order (1,0,2)) or rows contiguous (0,1,2)
        return make_fake_compact_tensor(dt[dtype], (rows, cols, l), stride_order=(1, 0, 2) if major_is_cols else (0, 1, 2),
                                        assumed_align=16)

    return (t(in_dtype, m, k, a_major == "K"), t(in_dtype, n, k, b_major == "K"), t(out_dtype, m, n, c_major == "N"))


def register_compile_variants(name: str, kernel_cls, configs: dict[str, dict], requires: set[str]) -> None:
    """Register compile-only builds with cute_kernels.runtime (no-op until the runtime exists).

    Each config dict holds Sm90GemmConfig fields plus optional in_dtype, out_dtype, a_major,
    b_major, c_major for the fake operands.
    """
    try:
        from cute_kernels.runtime.registry import CompileJob, register_variant
    except ImportError:
        return
    operand_keys = ("in_dtype", "out_dtype", "a_major", "b_major", "c_major")

    def build(**cfg):
        import cutlass
        from cutlass.runtime import make_fake_stream

        ops = {k: cfg.pop(k) for k in operand_keys if k in cfg}
        config = Sm90GemmConfig(**cfg).validate()
        kern = kernel_cls(config)
        args = (*fake_gemm_args(**ops), cutlass.Float32(1.0), 132 // (config.cluster_m * config.cluster_n),
                make_fake_stream())
        return CompileJob(kern, args, key=(name, config, tuple(sorted(ops.items()))), options=None)

    register_variant(name, build, configs=configs, requires=requires)
