"""Host glue of the sm_90a GEMM rungs for small M: swap-AB and split-K.

Definitions (kernel order, as `sm90_rung`: A (M, K, L), B (N, K, L), C (M, N, L)):

swap-AB: C^T = B^T . A^T. The kernel is launched on (B, A, C^T) where C^T is `out` viewed as
    (N, M, L) with unit stride along N (an M-major output for the kernel; its TMA-store epilogue
    handles either major). The operands only trade roles, so their majors go with them: fp8's
    K-major requirement holds after the swap exactly when it held before. Epilogue terms follow
    the transpose: a bias per column of C (bias_dim "n") is a bias per row of C^T ("m") and the
    other way round; C is read through the same transposed view; alpha, beta and the fp8 scales
    are unchanged. A config with `swap_ab` (sm90_config.pick_skinny_config) asks for it.
split-K: K cut into `splits` equal chunks that the kernel sees as its batch mode, fp32
    partials (splits, M, N) summed afterwards and the epilogue applied in torch (one extra
    pass over M x N, small when M is). With swap-AB the partials are written transposed.

`launch` routes one call: swap (with or without split-K), plain split-K, or nothing (the
caller's ordinary path, with `fallback_config` in place of a swap config it cannot run).
Post-condition of every route: `out` holds act(alpha * a @ b + beta * c + bias) as the
ordinary path computes it (fp32 accumulation; split-K sums fp32 partials in fp32).
"""

from __future__ import annotations

import torch

from cute_kernels.gemm import sm90_rung as _r
from cute_kernels.gemm.sm90_config import Sm90GemmConfig, pick_config, pick_split_k
from cute_kernels.hopper.epilogue import EpilogueSpec
from cute_kernels.runtime.plan_cache import WarmCache

_SWAP_BIAS = {None: None, "m": "n", "n": "m"}


_swapped_specs = WarmCache("gemm.sm90_skinny.swapped_specs")


def swapped_spec(spec: EpilogueSpec) -> EpilogueSpec:
    """The epilogue of C^T for the epilogue `spec` of C: bias rows and columns trade places."""
    out = _swapped_specs.get(spec)
    if out is None:
        out = _swapped_specs[spec] = EpilogueSpec(spec.beta_c, _SWAP_BIAS[spec.bias], spec.activation, spec.scale_ab,
                                                  spec.scale_rows)
    return out


def route(rung, config: Sm90GemmConfig, A, B, out, spec: EpilogueSpec) -> tuple[str | None, int]:
    """(route, splits) for kernel-order TMA views A (M, K, L), B (N, K, L) (`sm90_rung.
    tma_operand`) and out (L, M, N).

    route is "swap" (C^T straight into `out` with the fused epilogue), "swap_split" (swapped,
    K split, partials transposed), "split" (K split, not swapped) or None (the caller's
    ordinary path). "swap" needs `out`'s transpose (and c's, when read) to be TMA-addressable
    and the rung to fuse any epilogue; the split routes write fp32 partials whose rows are
    padded to 16 bytes, so any N qualifies.
    """
    return _route(rung, config, A, B, out, spec)[:2]


def _route(rung, config, A, B, out, spec):
    """`route`, plus the (N, M, L) view of `out` the "swap" route writes (else None)."""
    M, K, L = A.shape
    N = B.shape[0]
    splits = pick_split_k(M, N, K, L, config, A.element_size()) if rung.split_k else 1
    if config.swap_ab:
        if splits > 1:
            return "swap_split", splits, None
        C = _r.tma_operand(out.permute(2, 1, 0))
        if C is not None and (not spec.fused or getattr(rung.kernel_cls, "fuses_epilogue", False)):
            return "swap", 1, C
        return None, 1, None
    return ("split", splits, None) if splits > 1 else (None, 1, None)


def launch(rung, config: Sm90GemmConfig, A, B, out, alpha: float, spec: EpilogueSpec, beta, c, bias, scales):
    """Run the call through swap-AB and/or split-K when `route` picks one: (route, detail), or
    None when it does not (nothing was launched; the caller runs its ordinary path with
    `fallback_config`). detail: for "swap", the swapped launch's kernel operands (B, A, C,
    Csrc, bias); for the split routes, the `split_k_plan` that ran (None when the call cannot
    be replayed)."""
    how, splits, C = _route(rung, config, A, B, out, spec)
    if how is None:
        return None
    if how == "swap":
        Csrc = _r.tma_operand(_r._unit_stride_mn(c.permute(2, 1, 0))) if spec.beta_c else None
        if spec.beta_c and Csrc is None:
            return None
        return how, launch_swapped(rung, config, A, B, out, alpha, spec, beta, Csrc, bias, scales, C)
    plan, run = split_k_plan(rung, config, A, B, splits, out, spec, swap=how == "swap_split")
    run(A, B, out, alpha, beta, c, bias, *(scales or (None, None)))
    return how, plan


def launch_swapped(rung, config, A, B, out, alpha, spec, beta, Csrc, bias, scales, C) -> tuple:
    """C^T = B^T . A^T written straight into `out` (L, M, N) through its (N, M, L) TMA view
    `C`, the epilogue fused with bias rows and columns swapped; `Csrc` is c's (N, M, L) TMA
    view when beta != 0. Returns the kernel operands (B, A, C, Csrc, bias) it launched with."""
    bias_t = bias if bias is None or bias.stride(0) == 1 else bias.contiguous()
    if spec.scale_rows:  # C^T's rows are C's columns: scale_b per kernel row, scale_a per column
        scales = (scales[1], scales[0])
    rung.launch(config, B, A, C, alpha, epi=swapped_spec(spec), beta=float(beta), Csrc=Csrc, bias=bias_t,
                scales=scales)
    return B, A, C, Csrc, bias_t


def split_k_plan(rung, config, A, B, splits, out, spec, swap: bool = False) -> tuple:
    """(plan, run) for K split into `splits` chunks that the kernel sees as its batch mode:
    (M, K/S, S) and (N, K/S, S) strided views of the TMA views A and B, fp32 partials (S, M, N)
    (written through (M, N, S), or (N, M, S) with `swap`) whose rows are padded to 16 bytes so
    TMA addresses them for any M and N, summed in fp32, then the epilogue in torch.

    `run(a, b, out, alpha, beta, c, bias, scale_a, scale_b)` does all that on tensors whose
    kernel-order views are A and B at the recorded sizes and strides (formed by `as_strided`
    from their own storage: the caller's 3-D views, or the 2-D tensors `matmul` was given) and
    an `out` of the recorded layout; `plan` is `run` when it can be replayed so (a TVM-FFI
    build), else None.
    """
    M, K, _ = A.shape
    N = B.shape[0]
    ks = K // splits
    As = A.as_strided((M, ks, splits), (A.stride(0), A.stride(1), A.stride(1) * ks))
    Bs = B.as_strided((N, ks, splits), (B.stride(0), B.stride(1), B.stride(1) * ks))
    ws_shape, device = (splits, M, _r._round_up(N, 4)), out.device
    ws0 = torch.empty(ws_shape, dtype=torch.float32, device=device)[:, :, :N]
    perm = (2, 1, 0) if swap else (1, 2, 0)
    W0 = _r.tma_operand(ws0.permute(perm))
    first, second = (Bs, As) if swap else (As, Bs)
    fn, _ = rung._bound(config, first, second, W0, 1.0, EpilogueSpec(), 0.0, None, None, None)
    sA, tA, sB, tB = tuple(As.shape), As.stride(), tuple(Bs.shape), Bs.stride()
    sO, tO = tuple(out.shape), out.stride()
    tvm = _r.tvm_ffi_available()
    empty, f32, epilogue = torch.empty, torch.float32, _r.torch_epilogue
    # a build that fuses epilogues takes its operands whatever the spec (`Sm90Rung._bound`)
    one = _r._dummy_bias(device) if getattr(rung.kernel_cls, "fuses_epilogue", False) else None

    def run(a, b, out, alpha, beta, c, bias, scale_a, scale_b):
        if tvm:
            ws = empty(ws_shape, dtype=f32, device=device)[:, :, :N]
            a = a.detach() if a.requires_grad else a
            b = b.detach() if b.requires_grad else b
            As, Bs = a.as_strided(sA, tA), b.as_strided(sB, tB)
            X, Y, W = (Bs, As, ws.permute(perm)) if swap else (As, Bs, ws.permute(perm))
            if one is None:
                fn(X, Y, W, float(alpha))
            else:
                fn(X, Y, W, W, one, one, one, float(alpha), 0.0)
        else:  # the DSL-tensor path (no plan): this call's views, bound when it was built
            ws = ws0
            rung.launch(config, first, second, W0, float(alpha))
        total = ws.sum(0, keepdim=True)  # in fp32: `sum(..., out=out)` would round each partial first
        o = out.as_strided(sO, tO)
        if spec.fused:
            sc = (scale_a.reshape(-1), scale_b.reshape(-1)) if spec.scale_ab else None
            o.copy_(epilogue(total, spec, beta, c, bias, sc))
        else:
            o.copy_(total)

    return (run if tvm else None), run


def fallback_config(config: Sm90GemmConfig, m: int, n: int, k: int, in_bytes: int) -> Sm90GemmConfig:
    """`config`, or for a swap config that `route` could not run, the unswapped default."""
    if not config.swap_ab:
        return config
    return pick_config(m, n, k, in_bytes, swap_ab=False)
