"""GEMM operators: `cute_kernels::matmul`, `cute_kernels::linear`, `cute_kernels::scaled_mm`.

Each is a `torch.library.custom_op` whose CUDA path is `cute_kernels.gemm.matmul` (the kernel
layer validates and picks the rung); `register_fake` infers shapes and dtypes without touching
data, and `register_autograd` writes the gradients as GEMMs through the same operator
(dA = dC·Bᵀ, dB = Aᵀ·dC), so compiled graphs and CUDA graphs see only our ops.
Every op takes `rung` (a GEMM rung name, or "auto"; passed down as the kernel layer's `kernel=`)
and `fallback` (see `cute_kernels.ops.fallback`). No schema argument may be named `kernel`: Inductor
lowers an op it cannot see into as `FallbackKernel.create(kernel, *args, **kwargs)`, so such a
keyword collides (see `cute_kernels.ops.RESERVED_ARGUMENT_NAMES`).
"""

from typing import Optional

import torch
from torch import Tensor

from cute_kernels.gemm import activations
from cute_kernels.runtime import eager

from .fallback import UNSUPPORTED, check_fallback, device_guard, note_fallback, on_cuda, raise_unsupported

__all__ = ["matmul", "linear", "linear_backward", "scaled_mm", "ACTIVATIONS"]

ACTIVATIONS = (None, *activations.NAMES)


_gemm_matmul = None


def _gemm():
    """cute_kernels.gemm.matmul, imported on first use (registering the ops does not load the
    kernel layer) and kept, so the per-call cost is one global lookup."""
    global _gemm_matmul
    if _gemm_matmul is None:
        from cute_kernels.gemm import matmul as gemm_matmul

        _gemm_matmul = gemm_matmul
    return _gemm_matmul


def _gemm_ready(t: Tensor) -> Tensor:
    """`t` itself when one of its last two strides is 1 (what every rung takes), else a copy.
    Gradients arrive with any strides (an expanded grad of `.sum()` has stride 0 everywhere)."""
    if t.stride(-1) == 1 or t.stride(-2) == 1:
        return t
    return t.contiguous()


# ---- matmul ------------------------------------------------------------------------------------

def _torch_matmul(a: Tensor, b: Tensor, out_dtype) -> Tensor:
    dtype = a.dtype if out_dtype is None else out_dtype
    acc = torch.promote_types(a.dtype, dtype)
    return torch.matmul(a.to(acc), b.to(acc)).to(dtype).contiguous()


@torch.library.custom_op("cute_kernels::matmul", mutates_args=())
def matmul(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None, rung: str = "auto",
           fallback: str = "none") -> Tensor:
    """a @ b with torch.matmul semantics for 2-D and batched 3-D operands (a 2-D operand or a
    batch of 1 broadcasts), on the GEMM ladder; the result has dtype `out_dtype` (default a's)
    and is contiguous."""
    check_fallback("matmul", fallback)
    if fallback == "torch" and not on_cuda(a, b):
        note_fallback("matmul", f"inputs on {a.device}/{b.device}")
        return _torch_matmul(a, b, out_dtype)
    try:
        with device_guard(a):
            return _gemm()(a.detach(), b.detach(), kernel=rung, out_dtype=out_dtype)
    except UNSUPPORTED as err:
        if fallback != "torch":
            raise_unsupported("matmul", err)
        note_fallback("matmul", str(err))
        return _torch_matmul(a, b, out_dtype)


@matmul.register_fake
def _matmul_fake(a, b, out_dtype=None, rung="auto", fallback="none"):
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise ValueError(f"cute_kernels.matmul: operands must be 2-D or 3-D, got {a.dim()}-D and {b.dim()}-D")
    torch._check(a.shape[-1] == b.shape[-2],
                 lambda: f"cute_kernels.matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not compose")
    dtype = a.dtype if out_dtype is None else out_dtype
    m, n = a.shape[-2], b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:
        return a.new_empty((m, n), dtype=dtype)
    la = a.shape[0] if a.dim() == 3 else 1
    lb = b.shape[0] if b.dim() == 3 else 1
    return a.new_empty((lb if la == 1 else la, m, n), dtype=dtype)


def _sum_to(t: Tensor, like: Tensor) -> Tensor:
    """`t` (the gradient of a broadcast operand, batch-expanded) summed back to `like`'s shape."""
    if t.dim() == like.dim() and t.shape[0] == like.shape[0]:
        return t
    return t.sum(0) if like.dim() == 2 else t.sum(0, keepdim=True)


def _matmul_setup(ctx, inputs, output):
    a, b, _, rung, fallback = inputs
    ctx.save_for_backward(a, b)
    ctx.rung, ctx.fallback = rung, fallback


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    kw = dict(rung=ctx.rung, fallback=ctx.fallback)
    g = _gemm_ready(grad.to(a.dtype))
    da = db = None
    if ctx.needs_input_grad[0]:
        da = _sum_to(matmul(g, b.mT, **kw), a)
    if ctx.needs_input_grad[1]:
        if g.dim() == 3 and (b.dim() == 2 or b.shape[0] == 1) and a.dim() == 3 and a.shape[0] > 1:
            # b is shared by the batch: dB = sum_l A_lᵀ dC_l is one GEMM over the flattened batch.
            k, n = a.shape[-1], g.shape[-1]
            db = matmul(_gemm_ready(a.reshape(-1, k)).mT, _gemm_ready(g.reshape(-1, n)), **kw)
            db = db if b.dim() == 2 else db.unsqueeze(0)
        else:
            db = _sum_to(matmul(a.mT, g, **kw), b)
    return da, db, None, None, None


matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


# ---- linear ------------------------------------------------------------------------------------

def _check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"cute_kernels.linear: activation must be one of {ACTIVATIONS}, got {activation!r}")


def _torch_linear(x: Tensor, weight: Tensor, bias, activation) -> Tensor:
    return activations.apply(torch.nn.functional.linear(x, weight, bias), activation).contiguous()


def _check_linear(x: Tensor, weight: Tensor, bias) -> None:
    if weight.dim() != 2:
        raise ValueError(f"cute_kernels.linear: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"cute_kernels.linear: input of shape {tuple(x.shape)} does not match weight "
                         f"{tuple(weight.shape)}: the last input dim must be in_features = {weight.shape[1]}")
    if bias is not None:
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"cute_kernels.linear: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
        if bias.dtype != x.dtype:
            raise TypeError(f"cute_kernels.linear: bias has dtype {bias.dtype} but input has {x.dtype}")
        if bias.device != x.device:
            raise ValueError(f"cute_kernels.linear: bias is on {bias.device} but input is on {x.device}")


def _fused_linear(x2: Tensor, w_t: Tensor, bias, activation, rung: str):
    """x2 @ w_t with bias and activation fused into the GEMM's epilogue, where a rung can take
    it (the GEMM layer decides which); None where none can (then the caller runs the unfused path)."""
    from cute_kernels.gemm import epilogue_api

    kernel = epilogue_api.fusing_kernel(x2, rung)
    if kernel is None:
        return None
    return epilogue_api.matmul_epilogue(x2, w_t, bias=bias, bias_dim="n", activation=activation, kernel=kernel)


def linear_kernel_plan(x2: Tensor, w_t: Tensor, bias, activation, rung: str, callers=None):
    """(kind, launch): the kernel layer's stored plan (`runtime.plan_cache`) of the GEMM that
    `linear`'s body launched for these operands (the 2-D input and transposed weight it hands
    down), or launch None where that call kept none. The eager path (`eager_gemm`) replays it.

    kind "fused": a rung fused bias and activation (`_fused_linear`); launch is the rung's plan
    `launch(a, b, out, alpha, beta, c, bias, scale_a, scale_b)`, writing `out`. kind "direct":
    the same launch as a build taking `callers` = (x, weight, out) (and the bias) as they are,
    `launch(x, weight, out, [bias,] alpha, beta)` (`Sm90Rung.caller_order_launch`), where the
    rung has one. kind "plain": `gemm.matmul`'s plan `plan(a, b, alpha, beta, c) -> (M, N)`."""
    from cute_kernels.gemm import api, epilogue_api

    kernel = epilogue_api.fusing_kernel(x2, rung)
    if kernel is None:
        return "plain", api.plan_for(x2, w_t, kernel=rung)
    plan = epilogue_api.plan_for(x2, w_t, bias=bias, bias_dim="n", activation=activation, kernel=kernel)
    launch = getattr(plan, "launch", None)
    caller_order = getattr(epilogue_api._rung(kernel), "caller_order_launch", None)
    if launch is not None and callers is not None and caller_order is not None:
        direct = caller_order(launch, *callers, bias=bias)
        if direct is not None:
            return "direct", direct
    return "fused", launch


@torch.library.custom_op("cute_kernels::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None,
           rung: str = "auto", fallback: str = "none") -> Tensor:
    """activation(x @ weightᵀ + bias) for x (..., in_features), weight (out_features,
    in_features), bias (out_features,) or None; activation in `ACTIVATIONS`. Contiguous
    result (..., out_features) in x's dtype."""
    return eager.inside("linear", _linear, (x, weight, bias, activation, rung, fallback))


def _linear(x, weight, bias, activation, rung, fallback):
    """`linear`'s checked path (`runtime.eager.inside` replays a recorded call instead)."""
    check_fallback("linear", fallback)
    _check_activation(activation)
    if fallback == "torch" and not on_cuda(x, weight, bias):
        note_fallback("linear", f"inputs on {x.device}/{weight.device}")
        return _torch_linear(x, weight, bias, activation)
    try:
        _check_linear(x, weight, bias)
        x2, w_t = x.detach().reshape(-1, x.shape[-1]), weight.detach().t()
        with device_guard(x):
            fused = _fused_linear(x2, w_t, None if bias is None else bias.detach(), activation, rung)
            if fused is not None:
                return as_output(fused, (*x.shape[:-1], weight.shape[0]))
            y = _gemm()(x2, w_t, kernel=rung)
    except UNSUPPORTED as err:
        if fallback != "torch":
            raise_unsupported("linear", err)
        note_fallback("linear", str(err))
        return _torch_linear(x, weight, bias, activation)
    y = unfused_epilogue(y, None if bias is None else bias.detach(), activation)
    return as_output(y, (*x.shape[:-1], weight.shape[0]))


def unfused_epilogue(y: Tensor, bias, activation) -> Tensor:
    """The UNFUSED EPILOGUE, for rungs without a fused one (below sm_90): bias and activation
    run as separate PyTorch kernels on our GEMM's output, in place, so no extra allocation."""
    if bias is not None:
        y.add_(bias)
    return activations.apply_(y, activation)


def as_output(y: Tensor, shape: tuple) -> Tensor:
    """The (M, N) GEMM result as linear's (..., N) output. Not an autograd view of it (as
    aten.linear's own result is not): autograd forbids in-place ops (an `inplace=True`
    activation, `+=`) on a view that a custom function returns."""
    if len(shape) == 2:
        return y
    return torch.ops.aten._unsafe_view(y, shape)


@linear.register_fake
def _linear_fake(x, weight, bias=None, activation=None, rung="auto", fallback="none"):
    _check_activation(activation)
    if weight.dim() != 2 or x.dim() < 1:
        raise ValueError(f"cute_kernels.linear: weight must be 2-D and input at least 1-D, got {tuple(weight.shape)} "
                         f"and {tuple(x.shape)}")
    torch._check(x.shape[-1] == weight.shape[1],
                 lambda: f"cute_kernels.linear: input {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, activation, rung, fallback = inputs
    # relu's derivative is read off the output; silu's and gelu's need the pre-activation,
    # recomputed in the backward (one more GEMM) rather than kept alive between passes.
    ctx.save_for_backward(x, weight, bias, output if activation == "relu" else None)
    ctx.activation, ctx.rung, ctx.fallback = activation, rung, fallback


def _linear_backward(ctx, grad):
    return linear_grads(ctx, grad, linear_backward)


def linear_grads(ctx, grad, backward):
    """(dx, dw, db, None, None, None) of `linear` from ctx (saved (x, weight, bias, relu's
    output or None); activation; needs_input_grad) and the output gradient.

    Without grad mode (a plain backward, and the backward graph torch.compile traces) the GEMMs
    are one call of `backward`: the `linear_backward` op, or its eager entry (`eager_gemm`), so
    a compiled graph crosses the dispatcher once per layer, not once per GEMM; the bias gradient
    of a layer without activation is a torch sum beside it. A differentiable
    backward (create_graph=True) runs the same formula through `matmul` ops instead, which have
    gradients of their own."""
    x, weight, bias, out = ctx.saved_tensors
    need = ctx.needs_input_grad  # shorter where the call left the bias out
    needs = (need[0], need[1], bias is not None and len(need) > 2 and need[2])
    rung, fallback = ctx.rung, ctx.fallback
    if torch.is_grad_enabled():
        dx, dw, db = grads_of(grad, x, weight, bias, out, ctx.activation, needs,
                              lambda a, b: matmul(a, b, rung=rung, fallback=fallback))
    else:
        # Without an activation db is grad's column sums, left to the caller's graph: a compiled
        # backward fuses it into the kernel that made grad, as for torch's addmm (docs/pytorch.md)
        summed = needs[2] and ctx.activation is None
        dx, dw, db = backward(grad, x, weight, bias, out, ctx.activation, needs[0], needs[1], needs[2] and not summed,
                              rung, fallback)
        # None, not the op's empty placeholders, for gradients not asked
        dx, dw, db = dx if needs[0] else None, dw if needs[1] else None, db if needs[2] else None
        if summed:
            db = grad.reshape(-1, weight.shape[0]).sum(0)
    return dx, dw, db, None, None, None


def grads_of(grad, x, weight, bias, out, activation, needs, mm):
    """(dx, dw, db) of `linear`, each None where `needs` (three flags) says so, with `mm(a, b)`
    computing each GEMM; out is relu's output (its derivative is read off it) or None."""
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    g = _gemm_ready(grad.reshape(-1, n))
    if activation == "relu":
        g = activations.backward(g, out.reshape(-1, n), "relu")
    elif activation is not None:
        z = mm(x2, weight.mT)
        if bias is not None:
            z = z + bias
        g = activations.backward(g, z, activation)
    dx = mm(g, weight).reshape(x.shape) if needs[0] else None
    dw = mm(g.mT, _gemm_ready(x2)) if needs[1] else None
    db = g.sum(0) if bias is not None and needs[2] else None
    return dx, dw, db


@torch.library.custom_op("cute_kernels::linear_backward", mutates_args=())
def linear_backward(grad: Tensor, x: Tensor, weight: Tensor, bias: Optional[Tensor], out: Optional[Tensor],
                    activation: Optional[str], input_grad: bool, weight_grad: bool, bias_grad: bool,
                    rung: str = "auto", fallback: str = "none") -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias) of `linear` for its output gradient `grad`, each an empty tensor where
    its flag is off (bias_grad needs a bias); out is relu's output (None for other activations).
    Not differentiable (`linear`'s create_graph backward uses `matmul` ops instead)."""
    return eager.inside("linear_backward", _linear_backward_checked,
                        (grad, x, weight, bias, out, activation, input_grad, weight_grad, bias_grad, rung, fallback))


def _linear_backward_checked(grad, x, weight, bias, out, activation, input_grad, weight_grad, bias_grad, rung,
                             fallback):
    """`linear_backward`'s checked path (`runtime.eager.inside` replays a recorded call instead)."""
    check_fallback("linear_backward", fallback)
    _check_activation(activation)
    _check_linear(x, weight, bias)
    if activation == "relu" and out is None:
        raise ValueError("cute_kernels.linear_backward: activation 'relu' needs out (the forward's output)")
    if bias_grad and bias is None:
        raise ValueError("cute_kernels.linear_backward: bias_grad=True needs the bias")
    d = [None if t is None else t.detach() for t in (grad, x, weight, bias, out)]
    dx, dw, db = grads_of(*d, activation, (input_grad, weight_grad, bias_grad),
                          lambda a, b: _MATMUL(a, b, None, rung, fallback))
    return tuple(d[1].new_empty((0,)) if t is None else t for t in (dx, dw, db))  # distinct: outputs may not alias


@linear_backward.register_fake
def _linear_backward_fake(grad, x, weight, bias, out, activation, input_grad, weight_grad, bias_grad, rung="auto",
                          fallback="none"):
    _check_activation(activation)
    return (x.new_empty(x.shape if input_grad else (0,)), weight.new_empty(weight.shape if weight_grad else (0,)),
            x.new_empty(bias.shape if bias_grad and bias is not None else (0,)))


linear.register_autograd(_linear_backward, setup_context=_linear_setup)
_MATMUL = eager.op_body(matmul)


# ---- scaled_mm (FP8) ---------------------------------------------------------------------------

_FP8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))


def _check_scaled_mm(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, bias) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"cute_kernels.scaled_mm: a and b must be 2-D, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"cute_kernels.scaled_mm: shapes {tuple(a.shape)} and {tuple(b.shape)} do not compose")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in _FP8:
            raise TypeError(f"cute_kernels.scaled_mm: {name} has dtype {t.dtype}; an FP8 dtype {_FP8} is needed")
    m, n = a.shape[0], b.shape[1]
    for name, s, rowwise in (("scale_a", scale_a, (m, 1)), ("scale_b", scale_b, (1, n))):
        if s.dtype != torch.float32 or not (s.numel() == 1 or tuple(s.shape) == rowwise):
            raise ValueError(f"cute_kernels.scaled_mm: {name} must be float32 with one element (per tensor) or "
                             f"shape {rowwise} (per {'row' if name == 'scale_a' else 'column'}), got "
                             f"{tuple(s.shape)} {s.dtype}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"cute_kernels.scaled_mm: bias must have shape ({n},), got {tuple(bias.shape)}")


def _torch_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype) -> Tensor:
    # Dequantize and multiply in fp32: the definition, not a fast path.
    out = (a.float() * scale_a) @ (b.float() * scale_b)
    if bias is not None:
        out = out + bias.float()
    return out.to(a.dtype if out_dtype is None else out_dtype).contiguous()


@torch.library.custom_op("cute_kernels::scaled_mm", mutates_args=())
def scaled_mm(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, bias: Optional[Tensor] = None,
              out_dtype: Optional[torch.dtype] = None, rung: str = "auto", fallback: str = "none") -> Tensor:
    """(scale_a·a) @ (scale_b·b) + bias for FP8 a (M, K), b (K, N); scales float32, one element
    or per row of a (M, 1) / per column of b (1, N) (row-wise, as torch._scaled_mm). Result
    (M, N) in `out_dtype` (default a's dtype, as torch._scaled_mm). Both kinds of scale run on
    the sm90 FP8 rung (row-wise ones in the epilogue, per element)."""
    check_fallback("scaled_mm", fallback)
    if fallback == "torch" and not on_cuda(a, b):
        note_fallback("scaled_mm", f"inputs on {a.device}/{b.device}")
        return _torch_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype)
    try:
        _check_scaled_mm(a, b, scale_a, scale_b, bias)
        from cute_kernels.gemm import epilogue_api

        kernel = epilogue_api.FUSING_KERNELS[0] if rung == "auto" else rung
        with device_guard(a):
            return epilogue_api.scaled_mm(a.detach(), b.detach(), scale_a.detach(), scale_b.detach(),
                                          bias=None if bias is None else bias.detach(),
                                          out_dtype=a.dtype if out_dtype is None else out_dtype, kernel=kernel)
    except UNSUPPORTED as err:
        if fallback != "torch":
            raise_unsupported("scaled_mm", err)
        note_fallback("scaled_mm", str(err))
        return _torch_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype)


@scaled_mm.register_fake
def _scaled_mm_fake(a, b, scale_a, scale_b, bias=None, out_dtype=None, rung="auto", fallback="none"):
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"cute_kernels.scaled_mm: a and b must be 2-D, got {a.dim()}-D and {b.dim()}-D")
    torch._check(a.shape[1] == b.shape[0], lambda: "cute_kernels.scaled_mm: inner dimensions differ")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=a.dtype if out_dtype is None else out_dtype)
