"""Fused-epilogue GEMMs on the Hopper rungs: what `cute_kernels.ops.linear` / `scaled_mm` call.

    matmul_epilogue(a, b, *, bias=None, bias_dim="n", activation=None, alpha=1.0, beta=0.0,
                    c=None, out_dtype=None, kernel="auto", config=None)
        = activation(alpha * (a @ b) + beta * c + bias)

    scaled_mm(a, b, scale_a, scale_b, *, bias=None, activation=None, out_dtype=torch.bfloat16, ...)
        = activation(scale_a * scale_b * (a @ b) + bias), a and b fp8 (e4m3 / e5m2)

Shapes follow torch.matmul for 2-D and batched 3-D operands (a 2-D operand or a batch of 1
broadcasts). bias is 1-D: one value per output column (`bias_dim="n"`, nn.Linear's
(out_features,)) or per row (`"m"`). On an sm_90 GPU the sm90_persistent / sm90_warp_specialized
kernels (or, with kernel="auto" and a side of at most 16, the memory-bound gemv rung) apply
every term in registers before the single store (`hopper.epilogue`); every argument is checked,
with an error naming it, before anything launches.
"""

from __future__ import annotations

import numbers

import torch

from cute_kernels.hopper.epilogue import ACTIVATIONS
from cute_kernels.runtime.plan_cache import PlanCache, WarmCache, plain_tensors, tensor_signature

__all__ = ["matmul_epilogue", "scaled_mm", "fusing_kernel", "plan_for", "ACTIVATIONS", "FUSING_KERNELS"]

FUSING_KERNELS = ("sm90_persistent", "sm90_warp_specialized", "sm90_tma_wgmma", "gemv")
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


_rungs = WarmCache("gemm.epilogue_api.rungs")  # runtime.plan_cache


def _rung(kernel: str, a3=None, b3=None, out3=None):
    """The rung object for `kernel`; for "auto", the specialist that serves this problem's
    shape (the gemv rung when a side is at most 16) if it takes it, else the top fusing rung."""
    if kernel == "auto":
        special = _rung("gemv")
        if a3 is not None and special.supports(a3, b3, out3) is None:
            return special
        kernel = FUSING_KERNELS[0]
    rung = _rungs.get(kernel)
    if rung is None:
        if kernel not in FUSING_KERNELS:
            raise ValueError(f"kernel must be 'auto' or one of {FUSING_KERNELS}, got {kernel!r}")
        from .registry import KERNELS

        rung = _rungs[kernel] = KERNELS[kernel]
    return rung


_EPILOGUE_DTYPES = (torch.bfloat16, torch.float16)  # fp8 takes scales: `scaled_mm`
_HOPPER = WarmCache("gemm.epilogue_api.hopper")  # device index -> sm_90 or newer (asked once per device)


def fusing_kernel(a: torch.Tensor, kernel: str = "auto") -> str | None:
    """The rung that fuses an epilogue for 16-bit inputs like `a` on `a`'s device: `kernel` itself
    when it is a fusing rung that can run there, "auto" for "auto" (`matmul_epilogue` then picks
    per problem: the gemv rung for a side of at most 16, else the top fusing rung), else None
    (the caller then applies bias and activation after a plain GEMM)."""
    if kernel != "auto" and kernel not in FUSING_KERNELS:
        return None
    if a.device.type != "cuda" or a.dtype not in _EPILOGUE_DTYPES:
        return None
    index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    hopper = _HOPPER.get(index)
    if hopper is None:
        hopper = _HOPPER[index] = torch.cuda.get_device_capability(index) >= (9, 0)
    if not hopper:
        return None
    return kernel


def _device_reason(a, b) -> str | None:
    """Why a and b cannot feed one GPU kernel, or None (tests replace this to run on CPU)."""
    if not (a.is_cuda and b.is_cuda) or a.device != b.device:
        return f"a and b must be on one CUDA device, got {a.device} and {b.device}"
    return None


def _k_major_or_copy(t: torch.Tensor, fp8: bool) -> torch.Tensor:
    """`t` (L, R, C) with one of its last two strides 1 (fp8: a; b is handled by the caller)."""
    if t.stride(2) == 1 or (not fp8 and t.stride(1) == 1):
        return t
    return t.contiguous()


def _normalize(name, a, b):
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"{name}: a and b must be torch.Tensors")
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise ValueError(f"{name}: a and b must be 2-D or 3-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not compose (K {a.shape[-1]} "
                         f"vs {b.shape[-2]})")
    why = _device_reason(a, b)
    if why is not None:
        raise ValueError(f"{name}: {why}")
    la = a.shape[0] if a.dim() == 3 else 1
    lb = b.shape[0] if b.dim() == 3 else 1
    if la != lb and 1 not in (la, lb):
        raise ValueError(f"{name}: batch sizes {la} and {lb} differ and neither is 1")
    L = max(la, lb)
    a3 = (a if a.dim() == 3 else a.unsqueeze(0)).expand(L, a.shape[-2], a.shape[-1])
    b3 = (b if b.dim() == 3 else b.unsqueeze(0)).expand(L, b.shape[-2], b.shape[-1])
    batched = a.dim() == 3 or b.dim() == 3
    return a3, b3, L, batched


def _run(name, a, b, *, bias, bias_dim, activation, alpha, beta, c, out_dtype, kernel, config, scales):
    sig = _plan_signature(name, a, b, bias, bias_dim, activation, alpha, beta, c, out_dtype, kernel, config, scales)
    if sig is not None:
        try:
            plan = _PLANS.get(sig)
        except TypeError:  # an unhashable option: the checks below report it
            plan = sig = None
        if plan is not None:
            return plan(a, b, alpha, beta, c, bias, scales)
    for nm, v in (("alpha", alpha), ("beta", beta)):
        if type(v) not in (float, int) and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            raise TypeError(f"{name}: {nm} must be a real number, got {v!r}")
    a3, b3, L, batched = _normalize(name, a, b)
    fp8 = a.dtype in _FP8
    M, N = a3.shape[1], b3.shape[2]
    if out_dtype is None:
        out_dtype = torch.bfloat16 if fp8 else a.dtype
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"{name}: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    a3 = _k_major_or_copy(a3, fp8)
    # b is (L, K, N): "K-major" means unit stride along K (mode 1), i.e. b = w.t() of a (N, K) w
    if not (b3.stride(1) == 1 or (not fp8 and b3.stride(2) == 1)):
        b3 = b3.transpose(1, 2).contiguous().transpose(1, 2)
    c3 = None
    if beta != 0:
        if c is None:
            raise ValueError(f"{name}: beta={beta} needs c")
        if not isinstance(c, torch.Tensor):
            raise TypeError(f"{name}: c must be a torch.Tensor")
        try:
            c3 = c.expand((L, M, N) if batched else (M, N))
        except RuntimeError:
            raise ValueError(f"{name}: c of shape {tuple(c.shape)} does not broadcast to {(L, M, N)}") from None
        c3 = c3 if batched else c3.unsqueeze(0)
    out3 = torch.empty((L, M, N), dtype=out_dtype, device=a.device)
    if M and N and L:
        # a config given is the Hopper rungs' (Sm90GemmConfig): "auto" then means their top rung
        rung = _rung(FUSING_KERNELS[0] if config is not None and kernel == "auto" else kernel, a3, b3, out3)
        why = rung.supports(a3, b3, out3)
        if why is not None:
            raise ValueError(f"{name}: kernel {kernel!r} cannot run this problem: {why}")
        sa, sb = scales if scales else (None, None)
        rung(a3, b3, out3, alpha=float(alpha), beta=float(beta), c=c3, config=config, bias=bias, bias_dim=bias_dim,
             activation=activation, scale_a=sa, scale_b=sb)
        if sig is not None:
            launch = rung.plan_for(a3, b3, out3, alpha=float(alpha), beta=float(beta), c=c3, config=config, bias=bias,
                                   bias_dim=bias_dim, activation=activation, scale_a=sa, scale_b=sb)
            _keep_plan(sig, launch, (a, b, c if beta != 0 else None), (a3, b3, c3), out3, batched)
    return out3 if batched else out3[0]


# ---- launch plans (runtime.plan_cache): a warm call of a signature checked before ------------

_PLANS = PlanCache("gemm.epilogue_api")
_PLAN_SCALARS = (float, int)


def _plan_signature(name, a, b, bias, bias_dim, activation, alpha, beta, c, out_dtype, kernel, config, scales):
    """Every argument that decides `_run`'s path, or None when the call cannot have a plan."""
    if alpha.__class__ not in _PLAN_SCALARS or beta.__class__ not in _PLAN_SCALARS:
        return None
    use_c = beta != 0
    try:
        return (name, tensor_signature(a), tensor_signature(b), None if bias is None else tensor_signature(bias),
                bias_dim, activation, alpha.__class__, beta.__class__, use_c, tensor_signature(c) if use_c else None,
                out_dtype, kernel, config,
                None if scales is None else (tensor_signature(scales[0]), tensor_signature(scales[1])))
    except (TypeError, RuntimeError):  # not plain tensors (FakeTensor, other subclasses, non-tensors)
        return None


def plan_for(a, b, *, bias=None, bias_dim: str = "n", activation=None, alpha=1.0, beta=0.0, c=None, out_dtype=None,
             kernel: str = "sm90_persistent", config=None, scales=None, name: str = "matmul_epilogue"):
    """The stored plan of a `matmul_epilogue` (name "scaled_mm": `scaled_mm`, scales given)
    call with these arguments, or None: `plan(a, b, alpha, beta, c, bias, scales) -> out`,
    which takes any tensors whose storage holds the recorded operands where a and b held them
    (it forms the kernel's views with `as_strided`). `plan.launch(a, b, out, alpha, beta, c,
    bias, scale_a, scale_b)` is the rung's plan it calls (`Sm90Rung.plan_for`), writing `out`."""
    sig = _plan_signature(name, a, b, bias, bias_dim, activation, alpha, beta, c, out_dtype, kernel, config, scales)
    try:
        return None if sig is None else _PLANS.get(sig)
    except TypeError:
        return None


def _keep_plan(sig, launch, given: tuple, views: tuple, out3, batched: bool) -> None:
    """Store the replay of the direct launch the rung kept a plan of (`Sm90Rung.plan_for`), when
    the 3-D operands it saw are views of the caller's tensors (no copy was made)."""
    a, b, c = given
    a3, b3, c3 = views
    if launch is None or not plain_tensors(a, b, c):
        return
    pairs = ((a3, a), (b3, b)) + (((c3, c),) if c is not None else ())
    if any(view.data_ptr() != t.data_ptr() for view, t in pairs):
        return
    shape = tuple(out3.shape) if batched else tuple(out3.shape[1:])
    dtype, device, empty = out3.dtype, out3.device, torch.empty
    # the rung's plan detaches by the requires_grad of the views it saw (made here, maybe under
    # no_grad); the caller's tensors are detached by their own
    da, db, dc = a.requires_grad, b.requires_grad, c is not None and c.requires_grad

    def plan(a, b, alpha, beta, c, bias, scales):
        out = empty(shape, dtype=dtype, device=device)
        sa, sb = scales if scales else (None, None)
        launch(a.detach() if da else a, b.detach() if db else b, out, alpha, beta, c.detach() if dc else c, bias,
               sa, sb)
        return out

    # the rung's plan itself, for callers that allocate the result in another shape of the same
    # storage order (`ops.eager_gemm`: linear's (..., N) output)
    plan.launch = launch
    _PLANS.put(sig, plan)


def matmul_epilogue(a, b, *, bias=None, bias_dim: str = "n", activation: str | None = None, alpha: float = 1.0,
                    beta: float = 0.0, c=None, out_dtype=None, kernel: str = "auto", config=None):
    """activation(alpha * (a @ b) + beta * c + bias), fused into the GEMM's epilogue.

    a (M, K) or (L, M, K); b (K, N) or (L, K, N); both bf16 or both fp16, on one sm_90 GPU.
    bias: None or 1-D fp32/bf16/fp16 of length N (`bias_dim="n"`) or M (`"m"`). activation:
    None, "relu", "gelu", "gelu_tanh" or "silu". c: read only when beta != 0, broadcastable to the
    result. Returns a new contiguous (M, N) or (L, M, N) tensor of `out_dtype` (default a's).
    For nn.Linear: matmul_epilogue(x, weight.t(), bias=bias, activation=...).
    """
    if a.dtype in _FP8:
        raise TypeError("matmul_epilogue: fp8 inputs need their scales: use scaled_mm")
    return _run("matmul_epilogue", a, b, bias=bias, bias_dim=bias_dim, activation=activation, alpha=alpha,
                beta=beta, c=c, out_dtype=out_dtype, kernel=kernel, config=config, scales=None)


def scaled_mm(a, b, scale_a, scale_b, *, bias=None, bias_dim: str = "n", activation: str | None = None,
              out_dtype=torch.bfloat16, kernel: str = "auto", config=None):
    """activation(scale_a * scale_b * (a @ b) + bias) for fp8 a, b (as torch._scaled_mm). a
    (M, K) row-major and b (K, N) column-major (b = w.t() of an (N, K) row-major w) read
    directly; other layouts are copied to those first. scale_a, scale_b: float32 tensors on
    the device (never read on the host: no synchronization), one element each (per tensor) or
    row-wise: scale_a one per row of a ((M, 1) or (M,)), scale_b one per column of b ((1, N)
    or (N,)), applied per output element in the epilogue.
    """
    if a.dtype not in _FP8 or b.dtype not in _FP8:
        raise TypeError(f"scaled_mm: a and b must be float8_e4m3fn or float8_e5m2, got {a.dtype} and {b.dtype}")
    return _run("scaled_mm", a, b, bias=bias, bias_dim=bias_dim, activation=activation, alpha=1.0, beta=0.0,
                c=None, out_dtype=out_dtype, kernel=kernel, config=config, scales=(scale_a, scale_b))
