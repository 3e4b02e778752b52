"""The torch-facing side of the sm_90a GEMM rungs (the rung object protocol of contracts.md).

A rung takes 3-D views a: (L, M, K), b: (L, K, N), out: (L, M, N), maps them to the kernels'
(M, K, L) / (N, K, L) / (M, N, L) convention (a permutation, no copy), compiles the kernel once
per (config, dtypes, majors), and launches it on torch's current stream.

Only the operands TMA cannot address (a leading dimension or base pointer not 16-byte aligned,
or no unit stride) are copied, in their own major with aligned rows (`_aligned_copy`).

Epilogue: kernels with `fuses_epilogue` (sm90_warp_specialized, sm90_persistent) compute
act(alpha * A.B + beta * C + bias) in registers (`hopper.epilogue.EpilogueSpec`, one build per
spec). Where the kernel cannot fuse (sm90_tma_wgmma, the padded path, split-K) the product
goes through an fp32 temporary and `torch_epilogue` applies the same terms afterwards.
Small M (decode-like, M <= 128) runs swap-AB (`sm90_skinny`): C^T = B^T A^T, so N fills the
wgmma M side and M the narrow N side, with many pipeline stages; problems with too few tiles
for the SMs also split K (`pick_split_k`: the chunks become the kernel's batch mode and the fp32
partials are summed afterwards, or, by default, they are whole k-tiles summed in the kernel,
`sm90_persistent.SplitKLaunch`). A warm call of a signature seen before replays its launch
without the checks (`runtime.plan_cache`); for a plain product (no epilogue beyond alpha)
`matmul`'s warm call goes through `CallerOrderLaunch`, a build taking the caller's 2-D or 3-D
tensors as they are, so no torch view is made per call.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch

from cute_kernels.gemm import autotune as _autotune
from cute_kernels.gemm.sm90_config import Sm90GemmConfig, pick_config
from cute_kernels.gemm import activations
from cute_kernels.hopper.epilogue import ACTIVATIONS, EpilogueSpec
from cute_kernels.runtime import compile_kernel, tvm_ffi_available
from cute_kernels.runtime.lasting import lasting
from cute_kernels.runtime.plan_cache import PlanCache, WarmCache, plain_tensors, tensor_signature
from cute_kernels.runtime.tensors import tma_view

_IN_DTYPES = (torch.bfloat16, torch.float16)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The warm path's caches (`runtime.plan_cache`): the compiled function per build key, the
# occupancy per cluster size, per device why it cannot run sm_90a code (or None: the capability
# query is not per call), and per signature the replay of a checked direct launch (_keep_plan).
_compiled = WarmCache("gemm.sm90.builds")
_max_clusters = WarmCache("gemm.sm90.max_active_clusters")
_device_reasons = WarmCache("gemm.sm90.device_reasons")
_PLANS = PlanCache("gemm.sm90")
_PLAN_SCALARS = (float, int)


def tma_operand(t: torch.Tensor) -> torch.Tensor | None:
    """`t` (3-D, kernel order: (rows, cols, batch)) as a view TMA can address with its
    leading mode among the first two, or None (`runtime.tma_view`, the one check every
    operand of every route passes before a launch)."""
    return tma_view(t, (0, 1))


def _zero_strides(*ts: torch.Tensor) -> tuple:
    """Which modes of each tensor have stride 0 (part of a DSL-tensor build's key)."""
    return tuple(tuple(s == 0 for s in t.stride()) for t in ts)


def _leading(t: torch.Tensor) -> int:
    return 0 if t.stride(0) == 1 else 1


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _to_cute(t: torch.Tensor, lead: int, align: int = 16):
    try:
        from cute_kernels.runtime import from_torch

        return from_torch(t, assumed_align=align, leading_dim=lead)
    except (ImportError, AttributeError):
        from cutlass.cute.runtime import from_dlpack

        return from_dlpack(t, assumed_align=align).mark_layout_dynamic(leading_dim=lead)


_dummies = WarmCache("gemm.sm90.dummy_operands")


def _csrc_align(epi: EpilogueSpec, csrc: torch.Tensor) -> int:
    """The alignment a build assumes of C's source: 16 bytes where the gated epilogue TMA-stores
    the product into it (a descriptor's base must be), else one element (it is read per element)."""
    return 16 if epi.gate_preact else csrc.element_size()


def _dummy_bias(device) -> torch.Tensor:
    """A 1-element fp32 stand-in for the bias / scale arguments of builds that do not read them.

    One per device for the life of the process: made on a call that needs it first, never again,
    so a warm call allocates and initializes nothing for absent operands; made outside any CUDA
    graph pool (`runtime.lasting`), which may not hold a tensor its graph did not return.
    """
    t = _dummies.get(device)
    if t is None:
        t = _dummies[device] = lasting(device, torch.zeros, 1, dtype=torch.float32, device=device)
    return t


_split_counters = WarmCache("gemm.sm90.split_k_counters")
# Output tiles an in-kernel split-K launch may have (one counter each). `pick_split_k` splits
# only problems of less than half a wave of tiles, so this is never the limit in practice.
SPLIT_COUNTERS = 4096


def split_counters(device) -> torch.Tensor:
    """The int32 tile counters of in-kernel split-K launches (`sm90_persistent.SplitKLaunch`)
    on torch's current stream of `device`: zeroed once, left zero by every completed launch.
    One buffer per stream, so launches that may run concurrently never share counters; kept
    for the life of the process, made outside any CUDA graph pool (`runtime.lasting`). While a
    CUDA graph is being captured, a fresh zeroed buffer per launch instead: the capture records
    its zeroing, so each replay starts from zero and no two graphs (replayed on any streams)
    share counters."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(SPLIT_COUNTERS, dtype=torch.int32, device=device)
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    t = _split_counters.get(key)
    if t is None:
        t = _split_counters[key] = lasting(device, torch.zeros, SPLIT_COUNTERS, dtype=torch.int32, device=device)
    return t


def _cuda_reason(a, b, out) -> str | None:
    """Why these tensors cannot reach an sm_90 kernel (not all on CUDA, or the device is not
    Hopper), or None. The device's capability is asked once per device and remembered."""
    if not (a.is_cuda and b.is_cuda and out.is_cuda):
        return "tensors must be on a CUDA device"
    device = a.device
    try:
        return _device_reasons[device]
    except KeyError:
        major, minor = torch.cuda.get_device_capability(device)
        why = None if (major, minor) == (9, 0) else f"needs an sm_90 (Hopper) GPU, device has {major}.{minor}"
        _device_reasons[device] = why
        return why


def _unit_stride_mn(t: torch.Tensor) -> torch.Tensor:
    """`t` (M, N, L) with unit stride in M or N (a stride of an extent-1 mode may be set to 1),
    else a contiguous copy in that order."""
    if t.stride(0) == 1 or t.stride(1) == 1:
        return t
    for mode in (1, 0):
        if t.size(mode) == 1:
            st = list(t.stride())
            st[mode] = 1
            return t.as_strided(t.shape, st)
    return t.permute(2, 0, 1).contiguous().permute(1, 2, 0)


def _aligned_copy(t: torch.Tensor, k_major: bool) -> torch.Tensor:
    """A copy of kernel-order `t` (rows, K, L) TMA can address, as a TMA view of the same
    extents: K-major when `k_major` (fp8 wgmma reads no other) or `t` has no unit-stride mode,
    else in `t`'s own major (so the copy reads and writes coalesced: no transpose), the other
    mode's stride rounded up to 16 bytes. The padding past the extents is never read (TMA
    fills out-of-bounds boxes with zeros), so it is left as allocated."""
    rows, k, L = t.shape
    q = 16 // t.element_size()
    if not k_major and t.stride(0) == 1 and rows > 1:
        view = torch.empty(L, k, _round_up(rows, q), dtype=t.dtype, device=t.device)[:, :, :rows].permute(2, 1, 0)
    else:
        view = torch.empty(L, rows, _round_up(k, q), dtype=t.dtype, device=t.device)[:, :, :k].permute(1, 2, 0)
    view.copy_(t)
    return tma_operand(view)


def _check_epilogue(name, out, beta, c, bias, bias_dim, activation) -> EpilogueSpec:
    """The EpilogueSpec for these arguments; raises ValueError/TypeError naming a bad one."""
    L, M, N = out.shape
    if activation not in (None, *ACTIVATIONS):
        raise ValueError(f"{name}: activation must be None or one of {ACTIVATIONS}, got {activation!r}")
    if bias_dim not in ("m", "n"):
        raise ValueError(f"{name}: bias_dim must be 'm' (one value per row) or 'n' (per column), got {bias_dim!r}")
    use_c = beta != 0
    if use_c:
        if c is None:
            raise ValueError(f"{name}: beta={beta} needs c")
        if tuple(c.shape) != (L, M, N):
            raise ValueError(f"{name}: c has shape {tuple(c.shape)}, expected {(L, M, N)}")
        if c.device != out.device or not c.dtype.is_floating_point:
            raise TypeError(f"{name}: c must be a floating tensor on {out.device}, got {c.dtype} on {c.device}")
    if bias is not None:
        want = N if bias_dim == "n" else M
        if bias.dim() != 1 or bias.shape[0] != want:
            raise ValueError(f"{name}: bias for bias_dim={bias_dim!r} must have shape ({want},), got {tuple(bias.shape)}")
        if bias.device != out.device or bias.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"{name}: bias must be fp32/bf16/fp16 on {out.device}, got {bias.dtype} on {bias.device}")
    return EpilogueSpec(beta_c=use_c, bias=bias_dim if bias is not None else None, activation=activation).validate()


def _check_scales(name, out, scale_a, scale_b):
    """(scale_a, scale_b, row_wise) as 1-D fp32 views ((1,) each per tensor; (M,) and (N,)
    row-wise: one per row of the result and one per column), or None when neither is given."""
    if scale_a is None and scale_b is None:
        return None
    if scale_a is None or scale_b is None:
        raise ValueError(f"{name}: pass both scale_a and scale_b or neither")
    _, M, N = out.shape
    for nm, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device != out.device:
            raise ValueError(f"{name}: {nm} must be a float32 tensor on {out.device}")
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return (scale_a.reshape(1), scale_b.reshape(1), False)
    # one row-wise and one per-tensor: the per-tensor one repeated along its side
    if scale_a.numel() == 1 and scale_b.numel() == N:
        scale_a = scale_a.reshape(1).expand(M)
    elif scale_b.numel() == 1 and scale_a.numel() == M:
        scale_b = scale_b.reshape(1).expand(N)
    if scale_a.numel() != M or scale_b.numel() != N or scale_a.dim() > 2 or scale_b.dim() > 2:
        raise ValueError(f"{name}: scales must be per tensor (one element each) or row-wise: scale_a with M = {M} "
                         f"and scale_b with N = {N} elements ((M, 1) and (1, N)); got {tuple(scale_a.shape)} and "
                         f"{tuple(scale_b.shape)}")
    return (scale_a.reshape(-1).contiguous(), scale_b.reshape(-1).contiguous(), True)


def torch_epilogue(acc: torch.Tensor, spec: EpilogueSpec, beta, c, bias, scales=None) -> torch.Tensor:
    """act(scale_a * scale_b * acc + beta * c + bias) in fp32 with torch: the unfused path, the
    same terms as the kernel's (acc already holds alpha * A.B)."""
    res = acc.float()
    if spec.scale_rows:
        res = res * (scales[0].view(1, -1, 1) * scales[1].view(1, 1, -1))
    elif spec.scale_ab:
        res = res * (scales[0] * scales[1])
    if spec.beta_c:
        res = res + beta * c.float()
    if spec.bias == "n":
        res = res + bias.float().view(1, 1, -1)
    elif spec.bias == "m":
        res = res + bias.float().view(1, -1, 1)
    return activations.apply(res, spec.activation)


def _stream():
    """torch's current stream for the DSL-tensor fallback (the TVM-FFI build reads it itself)."""
    from cute_kernels.runtime import current_stream

    return current_stream()


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
    """A GEMM ladder rung backed by one of the sm_90a kernel classes.

    The warm call path (a config, dtypes and majors seen before) allocates only what the problem
    needs through torch's caching allocator (the output, a split-K workspace, padded copies),
    never creates a tensor from host data, never synchronizes, and with TVM-FFI hands the torch
    tensors straight to the compiled function (tests/gemm/test_sm90_call_path.py holds it to that).
    """

    dtypes = _IN_DTYPES
    min_capability = (9, 0)  # dispatch checks this once per device; `supports` remembers it too

    def __init__(self, name: str, kernel_cls, pick=pick_config, split_k: bool = True, persistent: bool = True):
        self.name = name
        self.persistent = persistent
        self.kernel_cls = kernel_cls
        self.pick = pick
        self.split_k = split_k

    def supports(self, a, b, out) -> str | None:
        fp8_ok = getattr(self.kernel_cls, "fuses_epilogue", False)
        allowed = _IN_DTYPES + (_FP8_DTYPES if fp8_ok else ())
        if a.dtype not in allowed or b.dtype not in allowed or (a.element_size() != b.element_size()) \
                or (a.element_size() == 2 and a.dtype != b.dtype):
            kinds = "bf16, fp16 or fp8 (e4m3/e5m2, both 8-bit)" if fp8_ok else "bf16 or fp16"
            return f"inputs must both be {kinds}, got {a.dtype} and {b.dtype}"
        if out.dtype not in _OUT_DTYPES:
            return f"output dtype {out.dtype} not supported (bf16, fp16, fp32)"
        if a.dim() != 3 or b.dim() != 3 or out.dim() != 3:
            return "expects 3-D (L, M, K) x (L, K, N) -> (L, M, N) views"
        return _cuda_reason(a, b, out)  # last, so that every other reason can be checked on CPU

    def compiled(self, config: Sm90GemmConfig, A, B, C, epi: EpilogueSpec = EpilogueSpec(), Csrc=None, bias=None,
                 scales=None, split: bool = False):
        """(compiled function, uses_tvm_ffi) for these kernel-order tensors (compiles on first use).

        With TVM-FFI available the function takes torch tensors directly and launches on the
        current stream (a few microseconds of host time); otherwise DSL tensors and a stream.
        Kernels that fuse the epilogue also take (Csrc, bias, scale_a, scale_b) after C and beta
        after alpha; `split` builds (`sm90_persistent.SplitKLaunch`: K's k-tiles cut into chunks
        reduced in the kernel) also take (workspace, counters, splits) after the scales.
        """
        # a non-persistent launch: a grid of every cluster (the scheduler then hands each CTA one tile)
        ncl = max_active_clusters(config.cluster_m * config.cluster_n) if self.persistent else 65535
        tvm = tvm_ffi_available()
        fuses = getattr(self.kernel_cls, "fuses_epilogue", False)
        extra = (str(Csrc.dtype), _leading(Csrc), str(bias.dtype), str(scales[0].dtype)) if fuses else ()
        key = (self.name, config, epi, str(A.dtype), str(B.dtype), str(C.dtype), _leading(A), _leading(B),
               _leading(C), *extra, ncl, tvm)
        if split:
            key += ("split_k",)
        if not tvm:  # DSL tensors bake a zero (broadcast) stride into the build
            key += (_zero_strides(A, B, C, Csrc) if fuses else _zero_strides(A, B, C),)
        fn = _compiled.get(key)
        if fn is None:
            fn = _compiled[key] = self._compile(key, config, epi, A, B, C, Csrc, bias, scales, ncl, tvm, fuses, split)
        return fn, tvm

    def _compile(self, key, config, epi, A, B, C, Csrc, bias, scales, ncl, tvm, fuses, split=False):
        import cutlass

        if split:
            kern = _split_launch_cls()(self.kernel_cls(config, epilogue_spec=epi, split_k=True))
        else:
            kern = self.kernel_cls(config, epilogue_spec=epi) if fuses else self.kernel_cls(config)
        scalars = (cutlass.Float32(1.0), cutlass.Float32(0.0)) if fuses else (cutlass.Float32(1.0),)
        if tvm:
            from cute_kernels.runtime import TVM_FFI_OPTION, fake_stream, fake_tensor

            args = tuple(fake_tensor(t.dtype, 3, leading_dim=_leading(t)) for t in (A, B, C))
            if fuses:
                args += (fake_tensor(Csrc.dtype, 3, leading_dim=_leading(Csrc), assumed_align=_csrc_align(epi, Csrc)),
                         fake_tensor(bias.dtype, 1, leading_dim=0, assumed_align=bias.element_size()),
                         *(fake_tensor(t.dtype, 1, leading_dim=0, assumed_align=4) for t in scales))
            if split:
                args += (fake_tensor(torch.float32, 1, leading_dim=0, assumed_align=16),
                         fake_tensor(torch.int32, 1, leading_dim=0, assumed_align=4), cutlass.Int32(2))
            return compile_kernel(kern, *args, *scalars, ncl, fake_stream(tvm_ffi_env_stream=True), key=key,
                                  options=TVM_FFI_OPTION)
        return compile_kernel(kern, *self._dsl_tensors(A, B, C, Csrc, bias, scales, fuses, epi), *scalars, ncl,
                              _stream(), key=key)

    @staticmethod
    def _dsl_tensors(A, B, C, Csrc, bias, scales, fuses, epi):
        ts = tuple(_to_cute(t, _leading(t)) for t in (A, B, C))
        if fuses:
            ts += (_to_cute(Csrc, _leading(Csrc), align=_csrc_align(epi, Csrc)),
                   _to_cute(bias, 0, align=bias.element_size()), *(_to_cute(t, 0, align=4) for t in scales))
        return ts

    def _epi_operands(self, C, Csrc, bias, scales):
        """(Csrc, bias, scales) to pass: the real ones, or stand-ins the kernel never reads."""
        one = _dummy_bias(C.device)
        return (C if Csrc is None else Csrc), (one if bias is None else bias), (scales or (one, one))

    def _bound(self, config, A, B, C, alpha, epi, beta, Csrc, bias, scales, split_ws=None):
        """(compiled function, its arguments) for prepared kernel-order tensors; `split_ws` =
        (workspace, counters, splits) for a split-K build (`compiled(split=True)`; TVM-FFI only)."""
        fuses = getattr(self.kernel_cls, "fuses_epilogue", False)
        for what, t in (("A", A), ("B", B), ("C", C), ("c", Csrc)):
            # every route hands over `tma_operand` views: anything else would build a bad
            # descriptor and compute garbage, so it is a bug here, never a launch
            if t is not None and (not isinstance(t, torch.Tensor) or tma_operand(t) is not t):
                raise RuntimeError(f"{self.name}: internal error: operand {what} (shape {tuple(t.shape)}, strides "
                                   f"{tuple(t.stride())}) is not a TMA view; please report this")
        Csrc, bias, scales = self._epi_operands(C, Csrc, bias, scales)
        if split_ws is not None and not tvm_ffi_available():
            raise RuntimeError(f"{self.name}: internal error: a split-K build runs on TVM-FFI only; please report this")
        fn, tvm = self.compiled(config, A, B, C, epi, Csrc, bias, scales, split=split_ws is not None)
        scalars = (alpha, beta) if fuses else (alpha,)
        if tvm:
            args = (A, B, C, Csrc, bias, *scales, *(split_ws or ()), *scalars) if fuses else (A, B, C, *scalars)
            # DLPack export refuses tensors that require grad (nn.Linear's weight and bias);
            # a detached alias shares the storage
            for t in args:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    args = tuple(t.detach() if isinstance(t, torch.Tensor) and t.requires_grad else t for t in args)
                    break
            return fn, args
        return fn, (*self._dsl_tensors(A, B, C, Csrc, bias, scales, fuses, epi), *scalars, _stream())

    def launcher(self, config, A, B, C, alpha: float = 1.0, *, epi: EpilogueSpec = EpilogueSpec(), beta: float = 0.0,
                 Csrc=None, bias=None, scales=None):
        """A zero-argument callable launching the kernel on prepared kernel-order tensors (on the
        stream current when the launcher was made, for the DSL-tensor fallback)."""
        fn, args = self._bound(config, A, B, C, float(alpha), epi, float(beta), Csrc, bias, scales)
        return lambda: fn(*args)

    def launch(self, config, A, B, C, alpha: float, *, epi: EpilogueSpec = EpilogueSpec(), beta: float = 0.0,
               Csrc=None, bias=None, scales=None) -> None:
        fn, args = self._bound(config, A, B, C, float(alpha), epi, float(beta), Csrc, bias, scales)
        fn(*args)

    def __call__(self, a, b, out, *, alpha=1.0, beta=0.0, c=None, config: Sm90GemmConfig | None = None,
                 bias=None, bias_dim: str = "n", activation: str | None = None, scale_a=None, scale_b=None):
        """out = act(alpha * a @ b + beta * c + bias) on (L, M, K) x (L, K, N) -> (L, M, N) views.

        c (L, M, N) is read only when beta != 0; bias is (N,) for bias_dim "n" (one value per
        output column, as nn.Linear) or (M,) for "m"; activation one of `ACTIVATIONS` or None.
        scale_a, scale_b: one-element fp32 device tensors multiplying the product (fp8
        dequantization, as torch._scaled_mm's per-tensor scales); both or neither.

        A signature seen before whose checked call launched directly (`plan_for`) replays that
        launch with no checks (runtime.plan_cache).
        """
        sig = self._plan_signature(a, b, out, alpha, beta, c, config, bias, bias_dim, activation, scale_a, scale_b)
        try:
            plan = _PLANS.get(sig) if sig is not None else None
        except TypeError:  # an unhashable option: the checks below report it
            plan = sig = None
        if plan is not None:
            plan(a, b, out, alpha, beta, c, bias, scale_a, scale_b)
            return out
        reason = self.supports(a, b, out)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")
        L, M, K = a.shape
        N = b.shape[2]
        spec = _check_epilogue(self.name, out, beta, c, bias, bias_dim, activation)
        scales = _check_scales(self.name, out, scale_a, scale_b)
        if scales:
            scales, rows = scales[:2], scales[2]
            spec = EpilogueSpec(spec.beta_c, spec.bias, spec.activation, scale_ab=True, scale_rows=rows)
        fp8 = a.element_size() == 1
        if M == 0 or N == 0 or L == 0:
            return out
        if K == 0:
            out.copy_(torch_epilogue(torch.zeros(out.shape, device=out.device), spec, beta, c, bias, scales))
            return out
        if config is None:
            # a stored autotuned winner (tuning first under CUTE_KERNELS_AUTOTUNE=1), else the heuristic
            config = _autotune.config_for(self, a, b, out, spec, M, N, K, (beta, c, bias, bias_dim, scale_a, scale_b)) \
                or self.pick(M, N, K, a.element_size())
        config = config.validate()
        # kernel-order views TMA can address as they are, else None (then copied below)
        A, B = tma_operand(a.permute(1, 2, 0)), tma_operand(b.permute(2, 1, 0))
        if fp8:  # fp8 wgmma reads K-major operands only
            A = A if A is not None and A.stride(1) == 1 else None
            B = B if B is not None and B.stride(1) == 1 else None
        # small M: swap-AB and/or split-K (sm90_skinny); else the ordinary path below
        routed = _skinny.launch(self, config, A, B, out, float(alpha), spec, beta, c, bias, scales) \
            if A is not None and B is not None else None
        if routed is not None:
            how, detail = routed
            if how == "swap" and sig is not None:  # the swapped launch replays like a direct one
                sab = (scale_b, scale_a) if spec.scale_rows else (scale_a, scale_b)  # C^T's rows are C's columns
                self._keep_plan(sig, config, _skinny.swapped_spec(spec), (b, a, out, c, bias, *sab),
                                (*detail, scales and (scales[::-1] if spec.scale_rows else scales)), swap=True)
            elif detail is not None and sig is not None:  # a split-K plan
                self._keep_run(sig, detail, a, b, out, c, bias, scale_a, scale_b)
            return out
        config = _skinny.fallback_config(config, M, N, K, a.element_size())
        fuses = getattr(self.kernel_cls, "fuses_epilogue", False)
        if A is not None and B is not None:
            C = tma_operand(out.permute(1, 2, 0))
            Csrc = tma_operand(_unit_stride_mn(c.permute(1, 2, 0))) if spec.beta_c else None
            if C is not None and (not spec.fused or (fuses and (Csrc is not None or not spec.beta_c))):
                bias_t = bias if bias is None or bias.stride(0) == 1 else bias.contiguous()
                self.launch(config, A, B, C, float(alpha), epi=spec, beta=float(beta), Csrc=Csrc, bias=bias_t,
                            scales=scales)
                if sig is not None:
                    self._keep_plan(sig, config, spec, (a, b, out, c, bias, scale_a, scale_b),
                                    (A, B, C, Csrc, bias_t, scales))
                return out
        run = self._staged(config, spec, a, b, out, c, copy_a=A is None, copy_b=B is None)
        run(a, b, out, alpha, beta, c, bias, scale_a, scale_b)
        if sig is not None:
            self._keep_run(sig, run, a, b, out, c, bias, scale_a, scale_b)
        return out

    def _staged(self, config, spec: EpilogueSpec, a, b, out, c, copy_a: bool, copy_b: bool):
        """`run(a, b, out, alpha, beta, c, bias, scale_a, scale_b)` for a call that is not one
        launch on the caller's tensors: only the operands TMA cannot address are copied
        (`_aligned_copy`: their own major with 16-byte aligned rows, K-major for fp8); the result goes
        to `out` directly when TMA can store it and the kernel can apply the epilogue, else
        to a temporary (fp32 when an epilogue follows in torch, N padded when its rows are
        not 16-byte aligned). The decisions are made here, once; `run` takes any tensors of
        the recorded layouts (formed with `as_strided` from their own storage, so `matmul`
        may pass the 2-D tensors it was given)."""
        L, M, K = a.shape
        N = b.shape[2]
        fp8 = a.element_size() == 1
        layouts = [(tuple(t.shape), t.stride()) if t is not None else None for t in (a, b, out, c)]
        fuses = getattr(self.kernel_cls, "fuses_epilogue", False)
        C = tma_operand(out.permute(1, 2, 0))
        Csrc = tma_operand(_unit_stride_mn(c.permute(1, 2, 0))) if spec.beta_c else None
        direct = C is not None and (not spec.fused or (fuses and (Csrc is not None or not spec.beta_c)))
        target_dtype = torch.float32 if spec.fused else out.dtype
        # a result temporary's rows: as `out`'s when TMA can store those, else padded to 16 bytes
        pad_n = 0 if direct or (not spec.fused and C is not None) or (spec.fused and N % 4 == 0) else \
            _round_up(N, 16 // torch.empty((), dtype=target_dtype).element_size())
        empty = torch.empty

        def run(a, b, out, alpha, beta, c, bias, scale_a, scale_b):
            (sa, ta), (sb, tb), (so, to) = layouts[:3]
            a3, b3, o3 = a.as_strided(sa, ta), b.as_strided(sb, tb), out.as_strided(so, to)
            c3 = c.as_strided(*layouts[3]) if spec.beta_c else None
            Av, Bv = a3.permute(1, 2, 0), b3.permute(2, 1, 0)
            A = _aligned_copy(Av, fp8) if copy_a else tma_operand(Av)
            B = _aligned_copy(Bv, fp8) if copy_b else tma_operand(Bv)
            scales = _check_scales("", o3, scale_a, scale_b)[:2] if spec.scale_ab else None
            if direct:
                Cs = tma_operand(_unit_stride_mn(c3.permute(1, 2, 0))) if spec.beta_c else None
                bias_t = bias if bias is None or bias.stride(0) == 1 else bias.contiguous()
                self.launch(config, A, B, tma_operand(o3.permute(1, 2, 0)), float(alpha), epi=spec, beta=float(beta),
                            Csrc=Cs, bias=bias_t, scales=scales)
                return
            target = empty(o3.shape, dtype=target_dtype, device=o3.device) if spec.fused else o3
            if pad_n:  # rows of the result not 16-byte aligned: write a padded temporary
                tmp = empty(L, M, pad_n, dtype=target_dtype, device=o3.device)
                self.launch(config, A, B, tma_operand(tmp.permute(1, 2, 0)), float(alpha))
                target.copy_(tmp[:, :, :N])
            else:
                self.launch(config, A, B, tma_operand(target.permute(1, 2, 0)), float(alpha))
            if spec.fused:
                o3.copy_(torch_epilogue(target, spec, beta, c3, bias, scales))

        return run

    def _keep_run(self, sig, run, a, b, out, c, bias, scale_a, scale_b) -> None:
        """Store `run` (a staged or split-K call: `_staged`, `sm90_skinny.split_k_plan`) as the
        plan of `sig`, for plain tensors with a TVM-FFI build (the DSL-tensor path binds its
        arguments per call)."""
        if tvm_ffi_available() and plain_tensors(a, b, out, c, bias, scale_a, scale_b):
            _PLANS.put(sig, run)

    # ---- launch plans (runtime.plan_cache): the warm call of a signature seen before ----------

    def _plan_signature(self, a, b, out, alpha, beta, c, config, bias, bias_dim, activation, scale_a, scale_b):
        """The plan key of a call: every argument that decides its path (tensors by
        `tensor_signature`; c only when beta != 0), or None when the call cannot have a plan
        (alpha or beta not a Python float/int, a non-tensor where a tensor goes). Not hashed
        here: a lookup may still raise TypeError for an unhashable option."""
        if alpha.__class__ not in _PLAN_SCALARS or beta.__class__ not in _PLAN_SCALARS:
            return None
        use_c = beta != 0
        try:
            return (self, tensor_signature(a), tensor_signature(b), tensor_signature(out), alpha.__class__,
                    beta.__class__, use_c, tensor_signature(c) if use_c else None,
                    None if bias is None else tensor_signature(bias), bias_dim, activation,
                    None if scale_a is None else tensor_signature(scale_a),
                    None if scale_b is None else tensor_signature(scale_b), config)
        except (TypeError, RuntimeError):  # not plain tensors (FakeTensor, other subclasses, non-tensors)
            return None

    def plan_for(self, a, b, out, *, alpha=1.0, beta=0.0, c=None, config=None, bias=None, bias_dim: str = "n",
                 activation=None, scale_a=None, scale_b=None):
        """The stored plan of a call with these arguments (the same as `__call__`'s), or None.

        A plan is `plan(a, b, out, alpha, beta, c, bias, scale_a, scale_b) -> None`: the
        launch the checked call made, on any tensors whose kernel-order views are those
        tensors' storage at the recorded sizes and strides (as_strided from the tensor's own
        storage offset), so `matmul` may pass the caller's 2-D tensors where the rung saw 3-D
        views of them. Only a direct TVM-FFI launch (unpadded, unsplit; swap-AB or not) has one.
        """
        sig = self._plan_signature(a, b, out, alpha, beta, c, config, bias, bias_dim, activation, scale_a, scale_b)
        try:
            return None if sig is None else _PLANS.get(sig)
        except TypeError:
            return None

    def _keep_plan(self, sig, config, spec: EpilogueSpec, given: tuple, views: tuple, swap: bool = False) -> None:
        """Store under `sig` the replay of the direct launch just made from the caller's tensors
        `given` (a, b, out, c, bias, scale_a, scale_b) through `views` (A, B, C, Csrc, bias_t,
        scales), when it can be replayed: a TVM-FFI build, plain tensors on a plan device, and
        every kernel operand the caller's own tensor or a view of it (nothing copied).

        swap: the launch was swap-AB (sm90_skinny): `given` starts (b, a, ...) and the stored
        plan, called as always with (a, b, ...), hands them over in that order."""
        a, b, out, c, bias, scale_a, scale_b = given
        A, B, C, Csrc, bias_t, scales = views
        if not spec.beta_c:
            c = None
        if not tvm_ffi_available() or not plain_tensors(a, b, out, c, bias, scale_a, scale_b):
            return
        pairs = ((A, a), (B, b), (C, out)) + (((Csrc, c),) if c is not None else ())
        if bias_t is not bias or any(view.data_ptr() != t.data_ptr() for view, t in pairs):
            return
        if spec.scale_rows and (scale_a.numel(), scale_b.numel()) != tuple(C.shape[:2]):
            return  # one scale per tensor, one row-wise: `_check_scales` repeats it on every call
        fuses = getattr(self.kernel_cls, "fuses_epilogue", False)
        Csrc_arg, bias_arg, scale_args = self._epi_operands(C, Csrc, bias_t, scales)
        fn, tvm = self.compiled(config, A, B, C, spec, Csrc_arg, bias_arg, scale_args)
        if not tvm:
            return
        plan = _direct_plan(fn, fuses, A, B, C, Csrc if c is not None else None, given, _dummy_bias(C.device))
        if swap:
            direct = plan

            if spec.scale_rows:
                def plan(a, b, out, alpha, beta, c, bias, scale_a, scale_b):
                    direct(b, a, out, alpha, beta, c, bias, scale_b, scale_a)
            else:
                def plan(a, b, out, alpha, beta, c, bias, scale_a, scale_b):
                    direct(b, a, out, alpha, beta, c, bias, scale_a, scale_b)

        # what caller_order_launch needs to launch the same kernel on the caller's own tensors
        operands = tuple((tuple(t.shape), t.stride(), t.data_ptr()) for t in (A, B, C))
        plan.kernel_operands = (config, spec, swap, operands)
        _PLANS.put(sig, plan)

    def caller_order_launch(self, plan, a, b, out, bias=None):
        """A compiled function `fn(a, b, out, alpha, beta)` (with a bias: `fn(a, b, out, bias,
        alpha, beta)`) that launches what `plan` (from `plan_for`) launches, taking the caller's
        own tensors: (M, K) or (L, M, K) `a`, (K, N) or (L, K, N) `b` and the result `out`
        ((M, N) or (L, M, N)); a 3-D tensor whose first two modes flatten into M, as nn.Linear's
        (batch, tokens, features) input and output, also serves a 2-D problem. The kernel-order
        views are formed inside the compiled host function (no torch views per call). None when
        `plan`'s epilogue reads more than a bias (beta * C, scales) or `bias` is absent where
        it reads one, or when some kernel operand is not exactly a mode permutation of the
        caller's tensor (`_caller_modes`): such calls keep `plan`.

        Post-condition: for tensors with the signature of the recorded call, `fn` launches the
        kernel on operands with the recorded extents and strides (`CallerOrderLaunch.views`),
        except the batch stride of an extent-1 batch, which nothing dereferences.
        """
        info = getattr(plan, "kernel_operands", None)
        if info is None or not tvm_ffi_available():
            return None
        config, spec, swap, operands = info
        fuses = getattr(self.kernel_cls, "fuses_epilogue", False)
        if spec.beta_c or spec.scale_ab or (spec.bias is None) != (bias is None) or (spec.fused and not fuses):
            return None
        callers = (a, b, out)
        modes = []
        for src, (shape, stride, ptr) in zip((1, 0, 2) if swap else (0, 1, 2), operands):
            t = callers[src]
            found = _caller_modes(shape, stride, t) if t.data_ptr() == ptr else None
            if found is None:
                return None
            modes.append((src, *found))
        modes = tuple(modes)
        leads = [None, None, None]
        for (src, rows, cols, _), (_, stride, _) in zip(modes, operands):
            leads[src] = _inner(rows) if stride[0] == 1 else _inner(cols)  # the view's leading mode (`_leading`)
        ncl = max_active_clusters(config.cluster_m * config.cluster_n) if self.persistent else 65535
        key = (self.name, "caller_order", config, spec, tuple(str(t.dtype) for t in callers),
               tuple(t.dim() for t in callers), modes, tuple(leads), ncl)
        if bias is not None:
            key += (("bias", str(bias.dtype)),)
        fn = _compiled.get(key)
        if fn is None:
            from cute_kernels.runtime import TVM_FFI_OPTION, fake_stream, fake_tensor

            kern = self.kernel_cls(config, epilogue_spec=spec) if fuses else self.kernel_cls(config)
            args = tuple(fake_tensor(t.dtype, t.dim(), leading_dim=lead) for t, lead in zip(callers, leads))
            entry = CallerOrderLaunch(kern, modes, fuses)
            if bias is not None:
                entry = CallerOrderBiasLaunch(kern, modes, fuses)
                args += (fake_tensor(bias.dtype, 1, leading_dim=0, assumed_align=bias.element_size()),)
            fn = _compiled[key] = compile_kernel(entry, *args, cutlass.Float32(1.0), cutlass.Float32(0.0), ncl,
                                                 fake_stream(tvm_ffi_env_stream=True), key=key,
                                                 options=TVM_FFI_OPTION)
        return fn


def _direct_plan(fn, fuses: bool, A, B, C, Csrc, given: tuple, dummy):
    """The replay of a direct launch: `plan(a, b, out, alpha, beta, c, bias, scale_a, scale_b)`
    forms A, B, C (and Csrc when c is read) with `as_strided` at the recorded sizes and strides
    and calls `fn` with what `Sm90Rung._bound` passed: absent bias and scales replaced by the
    per-device stand-in, tensors that require grad detached (DLPack refuses them)."""
    a, b, out, c, bias, scale_a, scale_b = given
    sA, tA, sB, tB, sC, tC = tuple(A.shape), A.stride(), tuple(B.shape), B.stride(), tuple(C.shape), C.stride()
    da, db, dout = a.requires_grad, b.requires_grad, out.requires_grad
    if not fuses:
        def plan(a, b, out, alpha, beta, c, bias, scale_a, scale_b):
            if da:
                a = a.detach()
            if db:
                b = b.detach()
            if dout:
                out = out.detach()
            fn(a.as_strided(sA, tA), b.as_strided(sB, tB), out.as_strided(sC, tC), float(alpha))

        return plan
    use_c = Csrc is not None
    sCs, tCs = (tuple(Csrc.shape), Csrc.stride()) if use_c else (None, None)
    dc = use_c and c.requires_grad
    has_bias = bias is not None
    dbias = has_bias and bias.requires_grad
    has_scales = scale_a is not None
    # _check_scales passes 1-D views; a 1-D contiguous scale is passed as it is (the same view)
    ra, rb = has_scales and scale_a.dim() != 1, has_scales and scale_b.dim() != 1
    dsa, dsb = has_scales and scale_a.requires_grad, has_scales and scale_b.requires_grad

    def plan(a, b, out, alpha, beta, c, bias, scale_a, scale_b):
        if da:
            a = a.detach()
        if db:
            b = b.detach()
        if dout:
            out = out.detach()
        C = out.as_strided(sC, tC)
        if use_c:
            Cs = (c.detach() if dc else c).as_strided(sCs, tCs)
        else:
            Cs = C
        if has_bias:
            if dbias:
                bias = bias.detach()
        else:
            bias = dummy
        if has_scales:
            if ra:
                scale_a = scale_a.reshape(-1)
            if rb:
                scale_b = scale_b.reshape(-1)
            if dsa:
                scale_a = scale_a.detach()
            if dsb:
                scale_b = scale_b.detach()
        else:
            scale_a = scale_b = dummy
        fn(a.as_strided(sA, tA), b.as_strided(sB, tB), C, Cs, bias, scale_a, scale_b, float(alpha), float(beta))

    return plan


def _caller_modes(shape, stride, t):
    """(rows, cols, batch): the modes of `t` (2-D or 3-D) with the extents and strides of a
    kernel-order view of `shape` and `stride`, batch None where the view's batch extent is 1
    and `t` has no mode left for it (its stride is then free). A mode is an index, or an
    (outer, inner) pair of `t`'s modes that flatten into one (stride(outer) = extent(inner) *
    stride(inner)), as (batch, tokens) flatten into M. None when `t` has no such modes."""
    ts, tt = t.shape, t.stride()
    rank = len(ts)
    if rank == 2 and shape[2] != 1:
        return None

    def candidates(extent, step):
        found = [m for m in range(rank) if ts[m] == extent and tt[m] == step]
        if rank == 3 and shape[2] == 1:
            found += [(i, j) for i in range(3) for j in range(3)
                      if i != j and ts[i] * ts[j] == extent and tt[j] == step and tt[i] == ts[j] * tt[j]]
        return found

    for rows in candidates(shape[0], stride[0]):
        for cols in candidates(shape[1], stride[1]):
            used = set(rows if isinstance(rows, tuple) else (rows,)) | set(cols if isinstance(cols, tuple) else (cols,))
            if len(used) != len(_flat(rows)) + len(_flat(cols)):
                continue
            if len(used) == rank:
                return rows, cols, None
            if rank == 2:
                continue
            (batch,) = set(range(3)) - used
            if ts[batch] == shape[2] and tt[batch] == stride[2]:
                return rows, cols, batch
    return None


def _flat(mode) -> tuple:
    return mode if isinstance(mode, tuple) else (mode,)


def _inner(mode) -> int:
    """The innermost caller mode of a kernel mode (a flattened pair's inner one)."""
    return mode[1] if isinstance(mode, tuple) else mode


def _mode(shape, stride, mode):
    """(extent, stride) of one kernel mode of a tensor with `shape`, `stride` (traced or not)."""
    if isinstance(mode, tuple):
        outer, inner = mode
        return shape[outer] * shape[inner], stride[inner]
    return shape[mode], stride[mode]


def _kernel_views(tensors, modes):
    """Kernel-order DSL views (rows, cols, batch) of the caller's DSL tensors (traced code)."""
    views = []
    for src, rows, cols, batch in modes:
        t = tensors[src]
        (r, sr), (c, sc) = _mode(t.shape, t.stride, rows), _mode(t.shape, t.stride, cols)
        shape = (r, c, 1 if batch is None else t.shape[batch])
        stride = (sr, sc, 0 if batch is None else t.stride[batch])
        views.append(cute.make_tensor(t.iterator, cute.make_layout(shape, stride=stride)))
    return views


class CallerOrderLaunch:
    """A GEMM launch compiled to take the caller's tensors (a, b, out) in their own order.

    modes: for the kernel's A, B, C in turn, (source, rows, cols, batch): which caller tensor
    (0: a, 1: b, 2: out) and which of its modes become the kernel-order (rows, cols, batch)
    view; batch None for a 2-D tensor, whose view gets a static batch of extent 1. The host
    function forms the views and, for kernels that fuse the epilogue, passes C as c_src and a
    one-element fp32 view of C's storage as bias and scales (a plain epilogue reads none of
    them), then runs `kern`'s own host code. So the kernel is the same kernel, with one launch
    argument per caller tensor and no torch views made per call.
    """

    def __init__(self, kern, modes: tuple, fuses: bool):
        self.kern, self.modes, self.fuses = kern, modes, fuses

    def views(self, a, b, out):
        """The kernel-order torch views (A, B, C) the compiled function forms from these
        tensors (an extent-1 batch of a 2-D tensor gets stride 0): what tests compare with
        the checked launch."""
        callers, views = (a, b, out), []
        for src, rows, cols, batch in self.modes:
            t = callers[src]
            (r, sr), (c, sc) = _mode(t.shape, t.stride(), rows), _mode(t.shape, t.stride(), cols)
            shape = (r, c, 1 if batch is None else t.shape[batch])
            stride = (sr, sc, 0 if batch is None else t.stride(batch))
            views.append(t.as_strided(shape, stride))
        return tuple(views)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
                 max_active_clusters: cutlass.Constexpr, stream):
        A, B, C = _kernel_views((a, b, c), self.modes)
        if cutlass.const_expr(self.fuses):
            one = cute.make_tensor(cute.recast_ptr(C.iterator, dtype=cutlass.Float32), cute.make_layout(1))
            self.kern(A, B, C, C, one, one, one, alpha, beta, max_active_clusters, stream)
        else:
            self.kern(A, B, C, alpha, max_active_clusters, stream)


class CallerOrderBiasLaunch(CallerOrderLaunch):
    """`CallerOrderLaunch` for an epilogue that reads a bias (and may apply an activation): the
    host function takes the caller's 1-D bias after the result and passes it as the kernel's
    bias (C stands in for c_src and a one-element fp32 view of it for the scales, none of them
    read), so nn.Linear's warm call hands over (x, weight, out, bias) as they are."""

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, bias: cute.Tensor, alpha: cutlass.Float32,
                 beta: cutlass.Float32, max_active_clusters: cutlass.Constexpr, stream):
        A, B, C = _kernel_views((a, b, c), self.modes)
        one = cute.make_tensor(cute.recast_ptr(C.iterator, dtype=cutlass.Float32), cute.make_layout(1))
        self.kern(A, B, C, C, bias, one, one, alpha, beta, max_active_clusters, stream)


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
    b_major, c_major for the fake operands, beta_c, bias, activation, scale_ab, scale_rows,
    gate, gate_preact for the epilogue, and split_k for a split-K build (`SplitKLaunch`).
    """
    try:
        from cute_kernels.runtime.registry import CompileJob, register_variant
    except ImportError:
        return
    operand_keys = ("in_dtype", "out_dtype", "a_major", "b_major", "c_major")
    epi_keys = ("beta_c", "bias", "activation", "scale_ab", "scale_rows", "gate", "gate_preact")

    def build(**cfg):
        ops = {k: cfg.pop(k) for k in operand_keys if k in cfg}
        epi = EpilogueSpec(**{k: cfg.pop(k) for k in epi_keys if k in cfg}).validate()
        split = cfg.pop("split_k", False)
        config = Sm90GemmConfig(**cfg).validate()
        kern, args = compile_job_args(kernel_cls, config, epi, split_k=split, **ops)
        return CompileJob(kern, args, key=(name, config, epi, split, tuple(sorted(ops.items()))), options=None)

    register_variant(name, build, configs=configs, requires=requires)


def compile_job_args(kernel_cls, config: Sm90GemmConfig, epi: EpilogueSpec = EpilogueSpec(), split_k: bool = False,
                     **operands):
    """(kernel, fake arguments) for a compile-only build of `kernel_cls` (no GPU needed); with
    `split_k`, the `SplitKLaunch` of its split-K build and that launch's arguments."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor
    from cutlass.runtime import make_fake_stream

    A, B, C = fake_gemm_args(**operands)
    ncl = 132 // (config.cluster_m * config.cluster_n)
    scalars = (cutlass.Float32(1.0), cutlass.Float32(0.0), ncl, make_fake_stream())
    if getattr(kernel_cls, "fuses_epilogue", False):
        csrc = fake_gemm_args(**operands)[2]
        bias, sa, sb = (make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=4) for _ in range(3))
        if split_k:
            ws, counters = split_k_fakes()
            kern = _split_launch_cls()(kernel_cls(config, epilogue_spec=epi, split_k=True))
            return kern, (A, B, C, csrc, bias, sa, sb, ws, counters, cutlass.Int32(2), *scalars)
        return kernel_cls(config, epilogue_spec=epi), (A, B, C, csrc, bias, sa, sb, *scalars)
    if split_k:
        raise ValueError(f"{kernel_cls.__name__} has no split-K build")
    return kernel_cls(config), (A, B, C, cutlass.Float32(1.0), ncl, make_fake_stream())


def split_k_fakes():
    """Fake (workspace, counters) of a split-K build: fp32 and 16-byte aligned, int32."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    return (make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16),
            make_fake_compact_tensor(cutlass.Int32, (cute.sym_int(),), assumed_align=4))


def _split_launch_cls():
    from cute_kernels.gemm.sm90_persistent import SplitKLaunch

    return SplitKLaunch


from cute_kernels.gemm import sm90_skinny as _skinny  # noqa: E402 (imports this module's helpers)
