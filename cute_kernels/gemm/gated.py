"""SwiGLU from one GEMM: silu(x @ Wg^T) * (x @ Wu^T) with the gate applied in the epilogue.

    w = interleave_gate_up(w_gate, w_up)       (2I, K): the two (I, K) weights' rows in
                                               alternating blocks of GATE_BLOCK = 8
    h, p = matmul_swiglu(x, w, preact=True)    h (M, I) = silu(g) * u; p (M, 2I) = x @ w^T,
                                               the product the backward differentiates
    w_gate, w_up = split_gate_up(w)            the inverse (copies)
    swiglu_of_product(p)                       h from p, in torch (the reference and fallback)

Why one GEMM: the gate/up product (M x 2I) is the largest activation of a gated MLP. Computed
apart, it is written by the GEMM, read back by the activation, and h written again; here the
epilogue gates the fp32 accumulators in registers and writes h (and p only when training keeps
it for the backward), saving a read of p and a launch. Why blocks of 8 rows: a wgmma
accumulator fragment holds two adjacent columns of every 8-column block per thread, so with
8-row blocks each thread holds every gate value beside its up value and the gated values form
the half-width tile's own fragment (`hopper.epilogue.gate_view`); row-by-row interleaving would
scatter them. The same layout is two strided views of 8-element rows (`gate_up_rows`), which
the elementwise SwiGLU kernels take as they lie.

On an sm_90 GPU `matmul_swiglu` runs the `sm90_persistent` kernel with a gated epilogue
(`EpilogueSpec.gate`) when TMA can address the operands and M is not skinny; otherwise (and
with kernel="torch") it computes p with `cute_kernels.gemm.matmul` and gates it in torch, and
says why in `last_route()`.
"""

from __future__ import annotations

import dataclasses

import torch

from cute_kernels.layouts.atoms_sm90 import GATE_BLOCK  # pure Python: importing this loads no DSL

from .sm90_config import SKINNY_M

__all__ = ["GATE_BLOCK", "interleave_gate_up", "split_gate_up", "gate_up_rows", "swiglu_of_product",
           "matmul_swiglu", "gated_kernel_reason", "gated_product", "last_route", "SKINNY_M"]

_ROUTE = ["none"]
_GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # `matmul`'s; others run on torch.matmul


def _check_pair(w_gate, w_up):
    if not isinstance(w_gate, torch.Tensor) or not isinstance(w_up, torch.Tensor):
        raise TypeError("interleave_gate_up: w_gate and w_up must be torch.Tensors")
    if w_gate.dim() != 2 or w_gate.shape != w_up.shape:
        raise ValueError(f"interleave_gate_up: w_gate and w_up must be 2-D of one shape (I, K), got "
                         f"{tuple(w_gate.shape)} and {tuple(w_up.shape)}")
    if w_gate.shape[0] % GATE_BLOCK:
        raise ValueError(f"interleave_gate_up: I = {w_gate.shape[0]} must be a multiple of {GATE_BLOCK}")
    if w_gate.dtype != w_up.dtype or w_gate.device != w_up.device:
        raise ValueError(f"interleave_gate_up: w_gate and w_up differ in dtype or device ({w_gate.dtype} on "
                         f"{w_gate.device}, {w_up.dtype} on {w_up.device})")


def interleave_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """(2I, K) weight whose rows alternate blocks of GATE_BLOCK rows of w_gate and of w_up (each
    (I, K), nn.Linear's (out_features, in_features)): what `matmul_swiglu` multiplies by."""
    _check_pair(w_gate, w_up)
    i, k = w_gate.shape
    blocks = (w_gate.reshape(i // GATE_BLOCK, 1, GATE_BLOCK, k), w_up.reshape(i // GATE_BLOCK, 1, GATE_BLOCK, k))
    return torch.cat(blocks, dim=1).reshape(2 * i, k)


def split_gate_up(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_gate, w_up), each (I, K), of an interleaved (2I, K) weight (the inverse of
    `interleave_gate_up`; copies)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[0] % (2 * GATE_BLOCK):
        raise ValueError(f"split_gate_up: w must be a 2-D (2I, K) tensor with 2I a multiple of {2 * GATE_BLOCK}, "
                         f"got {tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    blocks = w.reshape(-1, 2, GATE_BLOCK, w.shape[1])
    return blocks[:, 0].reshape(-1, w.shape[1]), blocks[:, 1].reshape(-1, w.shape[1])


def gate_up_rows(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) of a contiguous (..., 2I) product as two (rows, GATE_BLOCK) views (row stride
    2 * GATE_BLOCK): the layout the elementwise SwiGLU kernels read in place."""
    rows = p.reshape(-1, 2 * GATE_BLOCK)
    return rows[:, :GATE_BLOCK], rows[:, GATE_BLOCK:]


def swiglu_of_product(p: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of an interleaved (..., 2I) product, in torch (at least fp32 math; p's dtype)."""
    blocks = p.unflatten(-1, (-1, 2, GATE_BLOCK)).to(torch.promote_types(p.dtype, torch.float32))
    h = torch.nn.functional.silu(blocks[..., 0, :]) * blocks[..., 1, :]
    return h.flatten(-2).to(p.dtype)


def last_route() -> str:
    """How the last `matmul_swiglu` call ran: "sm90_persistent (gated epilogue)" or the reason
    it computed the product and gated it apart."""
    return _ROUTE[0]


def _check(x, w, kernel):
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise TypeError("matmul_swiglu: x and w must be torch.Tensors")
    if x.dim() < 1 or w.dim() != 2:
        raise ValueError(f"matmul_swiglu: x must be (..., K) and w (2I, K), got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"matmul_swiglu: x {tuple(x.shape)} and w {tuple(w.shape)} do not compose (K {x.shape[-1]} "
                         f"vs {w.shape[1]})")
    if w.shape[0] % (2 * GATE_BLOCK):
        raise ValueError(f"matmul_swiglu: w's rows (2I = {w.shape[0]}) must be a multiple of {2 * GATE_BLOCK}: "
                         "whole blocks of gate and up rows (interleave_gate_up)")
    if x.dtype != w.dtype or not x.dtype.is_floating_point:
        raise TypeError(f"matmul_swiglu: x and w must share a floating-point dtype, got {x.dtype} and {w.dtype}")
    if x.device != w.device:
        raise ValueError(f"matmul_swiglu: x and w are on different devices ({x.device}, {w.device})")
    if kernel not in ("auto", "torch", "sm90_persistent"):
        raise ValueError(f"matmul_swiglu: kernel must be 'auto', 'sm90_persistent' or 'torch', got {kernel!r}")


def _device_reason(x2) -> str | None:
    """Why x2's device cannot run the sm90 kernel, or None (tests replace this to run on CPU)."""
    if not x2.is_cuda:
        return f"inputs on {x2.device}"
    if torch.cuda.get_device_capability(x2.device) < (9, 0):
        return "not an sm_90 GPU"
    return None


def gated_kernel_reason(x2, w) -> str | None:
    """Why the gated sm90 kernel cannot take x2 (M, K) and w, or None (device, dtype, GPU
    generation, M; TMA's alignment is `gated_product`'s to find)."""
    if x2.dtype not in (torch.bfloat16, torch.float16):
        return f"{x2.dtype} inputs (the gated epilogue takes bf16 and fp16)"
    why = _device_reason(x2)
    if why is not None:
        return why
    if x2.shape[0] <= SKINNY_M:  # matmul's skinny path (swap-AB, split-K) serves it; its epilogue does not gate
        return f"M = {x2.shape[0]} <= {SKINNY_M} (the skinny path)"
    return None


def matmul_swiglu(x: torch.Tensor, w: torch.Tensor, *, preact: bool = False, alpha: float = 1.0,
                  kernel: str = "auto") -> tuple[torch.Tensor, torch.Tensor | None]:
    """(h, p): h (..., I) = silu(g) * u of the product p = alpha * x @ w^T (..., 2I) of x (..., K)
    and an interleaved weight w (2I, K) (`interleave_gate_up`); p is returned when `preact`
    (else None). Every argument is checked before anything launches."""
    _check(x, w, kernel)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m, n2 = x2.shape[0], w.shape[0]
    why = "kernel='torch'" if kernel == "torch" else gated_kernel_reason(x2, w)
    if why is None:
        done = gated_product(x2, w, preact, float(alpha))
        if done is not None:
            _ROUTE[0] = "sm90_persistent (gated epilogue)"
            h, p = done
            return h.reshape(*lead, n2 // 2), None if p is None else p.reshape(*lead, n2)
        why = "an operand TMA cannot address (a row stride not a multiple of 16 bytes)"
    if kernel == "sm90_persistent":
        raise ValueError(f"matmul_swiglu: kernel='sm90_persistent' cannot run this problem: {why}")
    _ROUTE[0] = f"product, then gated apart: {why}"
    if x2.is_cuda and kernel != "torch" and x2.dtype in _GEMM_DTYPES:
        from .api import matmul

        p = matmul(x2, w.t())
    else:
        p = torch.matmul(x2, w.t())
    if alpha != 1.0:
        p = p * alpha
    h = swiglu_of_product(p)
    return h.reshape(*lead, n2 // 2), p.reshape(*lead, n2) if preact else None


def gated_product(x2, w, preact: bool, alpha: float = 1.0, config=None):
    """(h, p or None) for a 2-D x2 (M, K) from the gated sm90_persistent kernel, or None when TMA
    cannot address an operand as it lies (the caller then runs the unfused route). The caller
    has checked the operands (`matmul_swiglu`'s checks) and `gated_kernel_reason`. `config`: an
    `Sm90GemmConfig` (default: the heuristic's for the M x 2I x K product)."""
    from cute_kernels.hopper.epilogue import EpilogueSpec

    from .sm90_persistent import rung
    from .sm90_rung import tma_operand

    m, k = x2.shape
    n2 = w.shape[0]
    A = tma_operand(x2.unsqueeze(2))  # (M, K, 1)
    B = tma_operand(w.unsqueeze(2))  # (2I, K, 1): nn.Linear's weight is B K-major as it lies
    if A is None or B is None:
        return None
    h = torch.empty((m, n2 // 2), dtype=x2.dtype, device=x2.device)
    p = torch.empty((m, n2), dtype=x2.dtype, device=x2.device) if preact else None
    C = tma_operand(h.unsqueeze(2))
    P = tma_operand(p.unsqueeze(2)) if preact else None
    if C is None or (preact and P is None):
        return None
    config = (config or rung.pick(m, n2, k, x2.element_size())).validate()
    if config.tile_n % 64:  # whole gate/up block pairs in every half-width epilogue sub-tile
        config = dataclasses.replace(config, tile_n=128)
    rung.launch(config, A, B, C, alpha, epi=EpilogueSpec(gate="swiglu", gate_preact=preact), Csrc=P)
    return h, p
