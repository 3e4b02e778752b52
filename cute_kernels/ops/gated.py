"""`cute_kernels::linear_swiglu`: a gated MLP's first half, silu(x Wg^T) * (x Wu^T), as one op.

    linear_swiglu(x, weight, need_preact=True, rung="auto", fallback="none") -> (h, p)

weight is the (2I, K) interleave of the gate and up projections (`gemm.gated.interleave_gate_up`:
alternating blocks of 8 rows); h (..., I); p (..., 2I) = x @ weight^T, returned (and kept for
the backward) when `need_preact`, else empty. With rung="auto", on an sm_90 GPU with M above the
skinny bound, one GEMM gates its own accumulators (`gemm.gated.gated_product`); otherwise (or
with `rung` naming a GEMM rung) `matmul` computes p on that rung and the elementwise SwiGLU
kernel gates it, reading p's gate and up blocks in place.

    linear_swiglu_backward(dh, x, weight, p, need_dx=True, need_dw=True, rung="auto",
                           fallback="none") -> (dx or empty, dw or empty)

is its backward, one op: the SwiGLU backward kernel reads p's gate and up blocks in place and
writes dp's (no copy between them), then dx = dp W and dW = dp^T x on the GEMM.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cute_kernels.fused import reference
from cute_kernels.gemm.gated import GATE_BLOCK, gate_up_rows, swiglu_of_product

from .fallback import check_fallback, device_guard, note_fallback, on_cuda
from .fused import swiglu
from .gemm import matmul

__all__ = ["linear_swiglu", "linear_swiglu_backward"]


def _check(x: Tensor, weight: Tensor) -> None:
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"cute_kernels.linear_swiglu: input (..., K) and weight (2I, K) do not compose: "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if weight.shape[0] % (2 * GATE_BLOCK):
        raise ValueError(f"cute_kernels.linear_swiglu: weight's rows (2I = {weight.shape[0]}) must be a multiple of "
                         f"{2 * GATE_BLOCK} (gemm.gated.interleave_gate_up)")
    if x.dtype != weight.dtype:
        raise TypeError(f"cute_kernels.linear_swiglu: input is {x.dtype} but weight is {weight.dtype}")
    if x.device != weight.device:
        raise ValueError(f"cute_kernels.linear_swiglu: input is on {x.device} but weight is on {weight.device}")


def _check_backward(dh: Tensor, x: Tensor, weight: Tensor, p: Tensor) -> None:
    _check(x, weight)
    n2, rows = weight.shape[0], x.numel() // max(1, x.shape[-1])
    for name, t, width in (("dh", dh, n2 // 2), ("p", p, n2)):
        if t.dim() < 1 or t.shape[-1] != width or t.numel() != rows * width or t.dtype != x.dtype or \
                t.device != x.device:
            raise ValueError(f"cute_kernels.linear_swiglu_backward: {name} must be (..., {width}) over the input's "
                             f"{rows} rows in {x.dtype} on {x.device}, got {tuple(t.shape)} {t.dtype} on {t.device}")


@torch.library.custom_op("cute_kernels::linear_swiglu", mutates_args=())
def linear_swiglu(x: Tensor, weight: Tensor, need_preact: bool = True, rung: str = "auto",
                  fallback: str = "none") -> tuple[Tensor, Tensor]:
    """(h, p or empty): module docstring."""
    check_fallback("linear_swiglu", fallback)
    _check(x, weight)
    x, weight = x.detach(), weight.detach()
    lead, n2 = x.shape[:-1], weight.shape[0]
    if fallback == "torch" and not on_cuda(x, weight):
        note_fallback("linear_swiglu", f"inputs on {x.device}")
        p = torch.matmul(x, weight.t())
        return swiglu_of_product(p), p if need_preact else x.new_empty((0,))
    from cute_kernels.gemm import gated

    with device_guard(x):
        x2 = x.reshape(-1, x.shape[-1])
        gated_ok = rung == "auto" and gated.gated_kernel_reason(x2, weight) is None
        done = gated.gated_product(x2, weight, need_preact) if gated_ok else None
        if done is not None:
            h, p = done
            return h.reshape(*lead, n2 // 2), p.reshape(*lead, n2) if need_preact else x.new_empty((0,))
        p = matmul(x2, weight.t(), rung=rung, fallback=fallback)
        h = swiglu(*gate_up_rows(p), fallback=fallback)
    return h.reshape(*lead, n2 // 2), p.reshape(*lead, n2) if need_preact else x.new_empty((0,))


@linear_swiglu.register_fake
def _linear_swiglu_fake(x, weight, need_preact=True, rung="auto", fallback="none"):
    _check(x, weight)
    h = x.new_empty((*x.shape[:-1], weight.shape[0] // 2))
    return h, x.new_empty((*x.shape[:-1], weight.shape[0])) if need_preact else x.new_empty((0,))


def _setup(ctx, inputs, output):
    x, weight, need_preact, rung, fallback = inputs
    h, p = output
    ctx.mark_non_differentiable(p)
    ctx.set_materialize_grads(False)  # None, not a zeros fill, for p's gradient
    ctx.save_for_backward(x, weight, p)
    ctx.rung, ctx.fallback = rung, fallback


def _grad(ctx, dh, _dp):
    if dh is None:
        return None, None, None, None, None
    x, weight, p = ctx.saved_tensors
    if p.numel() == 0 and x.numel() and weight.numel():
        raise RuntimeError("cute_kernels.linear_swiglu: the forward ran with need_preact=False; call it with "
                           "gradients enabled (nn.functional.linear_swiglu does) to differentiate it")
    needs = ctx.needs_input_grad
    dx, dw = linear_swiglu_backward(dh, x, weight, p, needs[0], needs[1], ctx.rung, ctx.fallback)
    return dx if needs[0] else None, dw if needs[1] else None, None, None, None


def _dp(dh, p, kernel_backward):
    """dp (rows, 2I) from dh (in p's dtype) and the product p: the SwiGLU backward of p's gate and
    up blocks, written into dp's own blocks (`kernel_backward(dh8, g, u, out)`)."""
    dp = torch.empty(p.shape, dtype=p.dtype, device=p.device).reshape(-1, p.shape[-1])
    kernel_backward(dh.reshape(-1, GATE_BLOCK), *gate_up_rows(p), gate_up_rows(dp))
    return dp


def _reference_dp(dh8, g, u, out):
    """The SwiGLU backward's torch definition (`fused.reference`), written into out = (dg, du)."""
    for dst, src in zip(out, reference.swiglu_backward(dh8, g, u)):
        dst.copy_(src)


@torch.library.custom_op("cute_kernels::linear_swiglu_backward", mutates_args=())
def linear_swiglu_backward(dh: Tensor, x: Tensor, weight: Tensor, p: Tensor, need_dx: bool = True,
                           need_dw: bool = True, rung: str = "auto", fallback: str = "none") -> tuple[Tensor, Tensor]:
    """(dx or empty, dweight or empty) of `linear_swiglu` (module docstring)."""
    check_fallback("linear_swiglu_backward", fallback)
    dh = dh if dh.dtype == p.dtype else dh.to(p.dtype)
    _check_backward(dh, x, weight, p)
    dh, x, weight, p = dh.detach(), x.detach(), weight.detach(), p.detach()
    n2, k = weight.shape
    x2 = x.reshape(-1, k)
    if fallback == "torch" and not on_cuda(dh, x, weight, p):
        note_fallback("linear_swiglu_backward", f"inputs on {x.device}")
        dp = _dp(dh, p, _reference_dp)
        dx = (dp @ weight).reshape(x.shape) if need_dx else x.new_empty((0,))
        return dx, dp.t() @ x2 if need_dw else weight.new_empty((0,))
    from cute_kernels.fused import swiglu_backward as kernel_swiglu_backward

    with device_guard(x):
        dp = _dp(dh, p, lambda d, g, u, out: kernel_swiglu_backward(d, g, u, out=out))
        dx = matmul(dp, weight, rung=rung, fallback=fallback).reshape(x.shape) if need_dx else x.new_empty((0,))
        dw = matmul(dp.t(), x2, rung=rung, fallback=fallback) if need_dw else weight.new_empty((0,))
    return dx, dw


@linear_swiglu_backward.register_fake
def _linear_swiglu_backward_fake(dh, x, weight, p, need_dx=True, need_dw=True, rung="auto", fallback="none"):
    _check(x, weight)
    return (x.new_empty(x.shape) if need_dx else x.new_empty((0,)),
            weight.new_empty(weight.shape) if need_dw else weight.new_empty((0,)))


linear_swiglu.register_autograd(_grad, setup_context=_setup)
