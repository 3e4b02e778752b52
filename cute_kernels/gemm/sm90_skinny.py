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
        out = _swapped_specs[spec] = EpilogueSpec(spec.beta_c, _SWAP_BIAS[spec.bias], spec.activation, spec.scale_ab)
    return out


def tma_ok(t: torch.Tensor) -> bool:
    """True when `t` (3-D, kernel order) is addressable by a TMA descriptor: 16-byte aligned base,
    a unit-stride mode among the first two, every other stride of a mode longer than 1 a
    multiple of 16 bytes. (As sm90_rung._tma_ok, but a unit stride is preferred over an extent-1
    mode as the leading one, so an (1, K) row of A at M = 1 qualifies.)"""
    if t.data_ptr() % 16:
        return False
    (s0, s1, s2), (e0, e1, e2) = t.stride(), t.shape
    if s0 == 1 or (s1 != 1 and e0 == 1):
        lead_ok = s1 == 1 and e1 > 1  # mode 1 is then another unit stride: 2 bytes, not 16
        other = (s1, e1)
    elif s1 == 1 or e1 == 1:
        lead_ok = False
        other = (s0, e0)
    else:
        return False
    es = t.element_size()
    if lead_ok or (other[1] > 1 and (other[0] * es) % 16):
        return False
    return e2 == 1 or (s2 * es) % 16 == 0


def route(rung, config: Sm90GemmConfig, A, B, out, spec: EpilogueSpec, k_major: bool) -> tuple[str | None, int]:
    """(route, splits) for kernel-order A (M, K, L), B (N, K, L) and out (L, M, N).

    route is "swap" (C^T straight into `out` with the fused epilogue), "swap_split" (swapped,
    K split, partials transposed), "split" (K split, not swapped) or None (the caller's
    ordinary path). A route is taken only where TMA can address every tensor it touches
    (16-byte aligned bases and leading dimensions; odd N or K never qualify) and the kernel
    reads the operands' majors (fp8: K-major only).
    """
    return _route(rung, config, A, B, out, spec, k_major)[:2]


def _route(rung, config, A, B, out, spec, k_major):
    """`route`, plus the (N, M, L) view of `out` the "swap" route writes (else None)."""
    M, K, L = A.shape
    N = B.shape[0]
    if not k_major or not (tma_ok(A) and tma_ok(B)):
        return None, 1, None
    splits = pick_split_k(M, N, K, L, config, A.element_size()) if rung.split_k else 1
    if config.swap_ab:
        if splits > 1:
            # partials (splits, M, N) fp32, viewed (N, M, splits): N * 4 bytes must be 16-aligned
            return ("swap_split", splits, None) if N % 4 == 0 else (None, 1, None)
        C = _r._sane_batch_stride(out.permute(2, 1, 0))
        if tma_ok(C) and (not spec.fused or getattr(rung.kernel_cls, "fuses_epilogue", False)):
            return "swap", 1, C
        return None, 1, None
    return ("split", splits, None) if splits > 1 else (None, 1, None)


def launch(rung, config: Sm90GemmConfig, A, B, out, alpha: float, spec: EpilogueSpec, beta, c, bias, scales,
           k_major: bool):
    """Run the call through swap-AB and/or split-K when `route` picks one: (route, the swapped
    launch's kernel operands (B, A, C, Csrc, bias) or None), or None when it does not (nothing
    was launched; the caller runs its ordinary path with `fallback_config`)."""
    how, splits, C = _route(rung, config, A, B, out, spec, k_major)
    if how is None:
        return None
    if how == "swap":
        return how, launch_swapped(rung, config, A, B, out, alpha, spec, beta, c, bias, scales, C)
    launch_split_k(rung, config, A, B, splits, alpha, out, spec, beta, c, bias, scales, swap=how == "swap_split")
    return how, None


def launch_swapped(rung, config, A, B, out, alpha, spec, beta, c, bias, scales, C=None) -> tuple:
    """C^T = B^T . A^T written straight into `out` (L, M, N) through its (N, M, L) view `C`
    (made here when not given), the epilogue fused with bias rows and columns swapped. Returns
    the kernel operands (B, A, C, Csrc, bias) it launched with."""
    if C is None:
        C = _r._sane_batch_stride(out.permute(2, 1, 0))
    Csrc = _r._unit_stride_mn(c.permute(2, 1, 0)) if spec.beta_c else None
    bias_t = bias if bias is None or bias.stride(0) == 1 else bias.contiguous()
    rung.launch(config, B, A, C, alpha, epi=swapped_spec(spec), beta=float(beta), Csrc=Csrc, bias=bias_t,
                scales=scales)
    return B, A, C, Csrc, bias_t


def launch_split_k(rung, config, A, B, splits, alpha, out, spec, beta, c, bias, scales, swap: bool = False) -> None:
    """K split into `splits` chunks that the kernel sees as its batch mode: (M, K/S, S) and
    (N, K/S, S) strided views, fp32 partials (S, M, N) (written as (M, N, S), or (N, M, S)
    with `swap`), summed here, then the epilogue in torch."""
    M, K, _ = A.shape
    N = B.shape[0]
    ks = K // splits
    As = A.as_strided((M, ks, splits), (A.stride(0), A.stride(1), A.stride(1) * ks))
    Bs = B.as_strided((N, ks, splits), (B.stride(0), B.stride(1), B.stride(1) * ks))
    ws = torch.empty(splits, M, N, dtype=torch.float32, device=out.device)
    if swap:
        rung.launch(config, Bs, As, ws.permute(2, 1, 0), alpha)
    else:
        rung.launch(config, As, Bs, ws.permute(1, 2, 0), alpha)
    if spec.fused:
        out.copy_(_r.torch_epilogue(ws.sum(0).unsqueeze(0), spec, beta, c, bias, scales))
    else:  # one pass: the fp32 sum is rounded once, into out
        torch.sum(ws, 0, keepdim=True, out=out)


def fallback_config(config: Sm90GemmConfig, m: int, n: int, k: int, in_bytes: int) -> Sm90GemmConfig:
    """`config`, or for a swap config that `route` could not run, the unswapped default."""
    if not config.swap_ab:
        return config
    return pick_config(m, n, k, in_bytes, swap_ab=False)
