"""Torch entry points of the norm kernels: `norm_forward` and `norm_backward` (RMSNorm and
LayerNorm, residual add fused), checked, then launched through TVM-FFI on torch's current stream.

Inputs of any leading shape (..., N) are taken as (rows, N) views (a copy only when the leading
dimensions do not merge or the last stride is not 1). Each call is checked once per signature
(shapes, strides, dtypes, device, pointer alignment: `runtime.plan_cache`); a repeated signature
replays a stored plan that only allocates the outputs and calls the compiled function.
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.plan_cache import PlanCache, plain_tensors, tensor_signature

from cute_kernels.runtime.arch import sm_count

from .host import check_same_device, check_tensor, compile_tvm_ffi, dtype_name, nograd, rows_view, tensor_vec

__all__ = ["norm_forward", "norm_backward", "forward_plan_for"]

KINDS = ("rms", "layer")
_FWD_PLANS = PlanCache("fused.norm_forward")
# The forward compiled for more CTAs an SM (`NormConfig.dense`; docs/fusion.md has the measurement).
# The GPU tests set it False (and invalidate the plans) to compare.
DENSE_FORWARD = True
_BWD_PLANS = PlanCache("fused.norm_backward")


def _check_forward(op, x, weight, bias, residual, kind, offset, out_dtype):
    if kind not in KINDS:
        raise ValueError(f"{op}: kind must be one of {KINDS}, got {kind!r}")
    check_tensor(op, "x", x)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"{op}: x must have a last dimension of at least 1 element, got shape {tuple(x.shape)}")
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        check_tensor(op, name, t)
        if tuple(t.shape) != (n,):
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} but x's last dimension is {n}")
    if bias is not None:
        if kind != "layer":
            raise ValueError(f"{op}: a bias is LayerNorm's (kind='layer'), not RMSNorm's")
        if weight is None or bias.dtype != weight.dtype:
            raise TypeError(f"{op}: bias needs a weight of the same dtype (weight "
                            f"{None if weight is None else weight.dtype}, bias {bias.dtype})")
    if offset != 0.0 and weight is None:
        raise ValueError(f"{op}: offset={offset} needs a weight")
    if residual is not None:
        check_tensor(op, "residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"{op}: residual has shape {tuple(residual.shape)} but x has {tuple(x.shape)}")
    if out_dtype is not None and out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"{op}: out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    check_same_device(op, {"x": x, "weight": weight, "bias": bias, "residual": residual})


def norm_forward(x, weight=None, bias=None, residual=None, *, kind: str = "rms", eps: float = 1e-6,
                 offset: float = 0.0, save_stats: bool = True, out_dtype=None):
    """(y, s, rstd, mean) of RMSNorm (kind="rms") or LayerNorm (kind="layer") over x's last dim.

    s = x + residual when a residual is given (in the residual's dtype; else None) and the norm
    is taken of s; y = norm(s) * (weight + offset) (+ bias), in `out_dtype` (default x's). rstd
    and mean (LayerNorm only) are fp32 of shape x.shape[:-1] when `save_stats`, else None. The
    math is fp32 (module docstring of `cute_kernels.fused.norms`).
    """
    sig = _forward_signature(x, weight, bias, residual, kind, offset, save_stats, out_dtype)
    if sig is not None:
        plan = _FWD_PLANS.get(sig)
        if plan is not None:
            return plan(x, weight, bias, residual, eps)
    op = f"cute_kernels.fused.{'rms' if kind == 'rms' else 'layer'}_norm"
    _check_forward(op, x, weight, bias, residual, kind, offset, out_dtype)
    plan = _forward_plan(x, weight, bias, residual, kind, float(offset), bool(save_stats), out_dtype)
    if sig is not None:
        _FWD_PLANS.put(sig, plan)
    return plan(x, weight, bias, residual, eps)


def _forward_signature(x, weight, bias, residual, kind, offset, save_stats, out_dtype):
    """The key of a forward call's plan, or None for a call that gets no plan (not plain tensors)."""
    if not plain_tensors(x, weight, bias, residual):
        return None
    try:
        return (kind, float(offset), bool(save_stats), out_dtype, tensor_signature(x),
                None if weight is None else tensor_signature(weight),
                None if bias is None else tensor_signature(bias),
                None if residual is None else tensor_signature(residual))
    except TypeError:
        return None


def forward_plan_for(x, weight=None, bias=None, residual=None, *, kind: str = "rms", offset: float = 0.0,
                     save_stats: bool = True, out_dtype=None):
    """The plan `norm_forward` stored for a call with these arguments (a checked call made
    first), `plan(x, weight, bias, residual, eps) -> (y, s, rstd, mean)`, or None: what the
    eager direct path (`ops.eager_fused`) replays."""
    sig = _forward_signature(x, weight, bias, residual, kind, offset, save_stats, out_dtype)
    return None if sig is None else _FWD_PLANS.get(sig)


def _flat(t):
    """A 1-D parameter with unit stride, without autograd history (a copy only when strided)."""
    return None if t is None else nograd(t if t.stride(0) == 1 else t.contiguous())


def _forward_plan(x, weight, bias, residual, kind, offset, save_stats, out_dtype):
    """The launch for this signature: compiles (or finds) the kernel and returns
    plan(x, weight, bias, residual, eps) -> (y, s, rstd, mean)."""
    from .dispatch import norm_tiling
    from .norms import NormConfig, NormForward, forward_args

    n = x.shape[-1]
    y_dtype = out_dtype or x.dtype
    x2 = rows_view(x, n)
    r2 = None if residual is None else rows_view(residual, n)
    probe_y = torch.empty((0,), dtype=y_dtype, device=x.device)  # 16-byte aligned, like every output
    vec = tensor_vec(n, [x2, r2, _flat(weight), _flat(bias), probe_y])
    wdt = None if weight is None else dtype_name(weight.dtype)
    tiling = norm_tiling(n, dtype_name(x.dtype), wdt, bias=bias is not None, residual=residual is not None, vec=vec)
    config = NormConfig(kind, tiling, dtype_name(x.dtype), weight_dtype=wdt,
                        residual_dtype=None if residual is None else dtype_name(residual.dtype),
                        has_bias=bias is not None, offset=offset, save_stats=save_stats,
                        out_dtype=dtype_name(y_dtype), dense=DENSE_FORWARD)
    fn = compile_tvm_ffi(NormForward(config), forward_args(config), ("fused.norm_fwd", config))
    layer = kind == "layer"
    shape, device = x.shape, x.device
    stats_shape = tuple(shape[:-1])
    s_dtype = None if residual is None else residual.dtype

    def plan(x, weight, bias, residual, eps):
        y = torch.empty(shape, dtype=y_dtype, device=device)
        s = None if s_dtype is None else torch.empty(shape, dtype=s_dtype, device=device)
        rstd = torch.empty(stats_shape, dtype=torch.float32, device=device) if save_stats else None
        mean = torch.empty(stats_shape, dtype=torch.float32, device=device) if save_stats and layer else None
        if y.numel():
            fn(rows_view(x, n), None if residual is None else rows_view(residual, n), _flat(weight), _flat(bias),
               y.view(-1, n),
               None if s is None else s.view(-1, n), None if rstd is None else rstd.view(-1),
               None if mean is None else mean.view(-1), float(eps))
        return y, s, rstd, mean

    return plan


def norm_backward(dy, s, weight, rstd, mean=None, *, kind: str = "rms", offset: float = 0.0, dsum=None,
                  has_bias: bool = False, weight_grad: bool = True):
    """(ds, dweight, dbias) of `norm_forward`: dy the gradient of y, s the normalized input (x, or
    x + residual), rstd (and mean for LayerNorm) its saved statistics, dsum the gradient reaching s
    directly (the residual stream's; added to ds). ds is the gradient of x and of the residual,
    in s's dtype; dweight, dbias (fp32 sums over rows, cast to the weight's dtype) are None
    without a weight / bias or when `weight_grad` is False."""
    sig = None
    if plain_tensors(dy, s, weight, rstd, mean, dsum):
        try:
            sig = (kind, float(offset), bool(has_bias), bool(weight_grad), tensor_signature(dy), tensor_signature(s),
                   None if weight is None else tensor_signature(weight), tensor_signature(rstd),
                   None if mean is None else tensor_signature(mean), None if dsum is None else tensor_signature(dsum))
            plan = _BWD_PLANS.get(sig)
        except TypeError:
            plan = sig = None
        if plan is not None:
            return plan(dy, s, weight, rstd, mean, dsum)
    op = f"cute_kernels.fused.{'rms' if kind == 'rms' else 'layer'}_norm_backward"
    _check_backward(op, dy, s, weight, rstd, mean, dsum, kind, has_bias)
    plan = _backward_plan(dy, s, weight, rstd, mean, dsum, kind, float(offset), has_bias, weight_grad)
    if sig is not None:
        _BWD_PLANS.put(sig, plan)
    return plan(dy, s, weight, rstd, mean, dsum)


def _composed_backward_plan(kind, offset, has_bias, weight_grad):
    """Rows wider than the backward kernel holds in registers (the forward holds twice as wide:
    a model whose forward ran must also train) are differentiated by the composed torch formula
    in fp32, the same arithmetic as the kernel's."""
    from . import reference

    def plan(dy, s, weight, rstd, mean, dsum):
        return reference.norm_backward(dy, s, weight, rstd, mean, kind=kind, offset=offset, dsum=dsum,
                                       has_bias=has_bias, weight_grad=weight_grad)

    return plan


def _check_backward(op, dy, s, weight, rstd, mean, dsum, kind, has_bias):
    if kind not in KINDS:
        raise ValueError(f"{op}: kind must be one of {KINDS}, got {kind!r}")
    check_tensor(op, "s", s)
    check_tensor(op, "dy", dy)
    if dy.shape != s.shape:
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)} but the input has {tuple(s.shape)}")
    n = s.shape[-1]
    if weight is not None:
        check_tensor(op, "weight", weight)
        if tuple(weight.shape) != (n,):
            raise ValueError(f"{op}: weight has shape {tuple(weight.shape)} but the last dimension is {n}")
    if has_bias and (kind != "layer" or weight is None):
        raise ValueError(f"{op}: has_bias needs kind='layer' and a weight")
    for name, t, need in (("rstd", rstd, True), ("mean", mean, kind == "layer")):
        if t is None:
            if need:
                raise ValueError(f"{op}: {name} (saved by the forward) is required")
            continue
        check_tensor(op, name, t, dtypes=(torch.float32,))
        if tuple(t.shape) != tuple(s.shape[:-1]):
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected {tuple(s.shape[:-1])}")
    if dsum is not None:
        check_tensor(op, "dsum", dsum)
        if dsum.shape != s.shape:
            raise ValueError(f"{op}: dsum has shape {tuple(dsum.shape)} but the input has {tuple(s.shape)}")
    check_same_device(op, {"dy": dy, "s": s, "weight": weight, "rstd": rstd, "mean": mean, "dsum": dsum})


def _backward_plan(dy, s, weight, rstd, mean, dsum, kind, offset, has_bias, weight_grad):
    from .dispatch import norm_backward_prefetch, norm_tiling
    from .norms import NormBackward, NormConfig, backward_args
    from .tiling import min_blocks_per_sm

    n = s.shape[-1]
    dy2, s2 = rows_view(dy, n), rows_view(s, n)
    ds2 = None if dsum is None else rows_view(dsum, n)
    probe = torch.empty((0,), dtype=torch.float32, device=s.device)
    vec = tensor_vec(n, [dy2, s2, ds2, _flat(weight), probe])
    dt = dtype_name(s.dtype)
    wdt = None if weight is None else dtype_name(weight.dtype)
    fuse_dsum = dsum is not None
    try:
        tiling = norm_tiling(n, dt, wdt, bias=has_bias, residual=fuse_dsum, backward=True, vec=vec)
    except NotImplementedError:
        try:
            # Too wide to add dsum in the kernel: the kernel without it, then one torch add.
            if not fuse_dsum:
                raise
            fuse_dsum = False
            tiling = norm_tiling(n, dt, wdt, bias=has_bias, residual=False, backward=True, vec=vec)
        except NotImplementedError:
            return _composed_backward_plan(kind, offset, has_bias, weight_grad)
    want_w = weight is not None and weight_grad
    want_b = has_bias and weight_grad
    prefetch = norm_backward_prefetch(tiling, dt, wdt, bias=has_bias, residual=fuse_dsum)
    config = NormConfig(kind, tiling, dt, weight_dtype=wdt,
                        residual_dtype=dtype_name(dsum.dtype) if fuse_dsum else None,
                        has_bias=has_bias, offset=offset, has_dsum=fuse_dsum,
                        weight_grad=want_w, bias_grad=want_b, prefetch=prefetch)
    fn = compile_tvm_ffi(NormBackward(config), backward_args(config), ("fused.norm_bwd", config))
    rows = s2.shape[0]
    blocks = -(-rows // tiling.rows_per_cta)
    grid = max(1, min(blocks, sm_count(s.device) * min_blocks_per_sm(tiling.threads)))
    parts = grid * tiling.rows_per_cta
    shape, device, dx_dtype = s.shape, s.device, s.dtype
    layer = kind == "layer"

    partials = int(want_w) + int(want_b)

    def plan(dy, s, weight, rstd, mean, dsum):
        dx = torch.empty(shape, dtype=dx_dtype, device=device)
        # the weight's and the bias's per-CTA partial rows in one buffer summed by one reduction
        # (each torch op is several µs of host time on a warm call); each gradient then gets its
        # own storage (a copy even in fp32): the op's returns must not alias one another
        parts_wb = torch.empty((partials, parts, n), dtype=torch.float32, device=device) if partials else None
        pw = parts_wb[0] if want_w else None
        pb = parts_wb[-1] if want_b else None
        if rows:
            fn(rows_view(s, n), _flat(weight), rows_view(dy, n), nograd(rstd).reshape(-1),
               nograd(mean).reshape(-1) if layer else None, rows_view(dsum, n) if fuse_dsum else None,
               dx.view(-1, n), pw, pb, grid)
        if dsum is not None and not fuse_dsum:
            dx.add_(dsum)
        if not partials:
            return dx, None, None
        sums = parts_wb.sum(1) if rows else parts_wb.new_zeros((partials, n))
        dw = sums[0].to(weight.dtype, copy=True) if want_w else None
        db = sums[-1].to(weight.dtype, copy=True) if want_b else None
        return dx, dw, db

    return plan
