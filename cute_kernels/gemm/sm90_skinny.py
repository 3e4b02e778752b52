"""Host glue of the sm_90a GEMM rungs for small M: swap-AB and split-K.

Definitions (kernel order, as `sm90_rung`: A (M, K, L), B (N, K, L), C (M, N, L)):

swap-AB: C^T = B^T . A^T. The kernel is launched on (B, A, C^T) where C^T is `out` viewed as
    (N, M, L) with unit stride along N (an M-major output for the kernel; its TMA-store epilogue
    handles either major). The operands only trade roles, so their majors go with them: fp8's
    K-major requirement holds after the swap exactly when it held before. Epilogue terms follow
    the transpose: a bias per column of C (bias_dim "n") is a bias per row of C^T ("m") and the
    other way round; C is read through the same transposed view; alpha, beta and the fp8 scales
    are unchanged. A config with `swap_ab` (sm90_config.pick_skinny_config) asks for it.
split-K: K cut into `splits` chunks. With a kernel that has a split-K build
    (`reduces_split_k`) and TVM-FFI, the chunks are whole k-tiles summed in the kernel and the
    fused epilogue writes `out` directly (`SplitKLaunch`: one launch, fp32 partials through an
    L2-resident workspace, a deterministic order); otherwise (or with `REDUCE_IN_KERNEL`
    False) they are equal chunks the kernel sees as its batch mode, fp32 partials (splits, M,
    N) summed afterwards and the epilogue applied in torch (one extra pass over M x N, small
    when M is). With swap-AB the partials are written transposed.

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
# Split-K summed in the kernel (`sm90_persistent.SplitKLaunch`). Measured on an H200 against the
# torch-summed partials (`gemm_shapes`, 2026-12-05; ratio to cuBLAS): 768x768x12608 weight
# gradient 0.54x -> 0.92x, 1024x1024x12608 0.67x -> 1.01x, 512x2048x8192 0.54x -> 0.91x,
# 256x4096x16384 0.85x -> 1.01x, 32x2048x8192 0.76x -> 0.98x. False restores the torch sum
# (for comparison: scripts/gemm_config_sweep.py --reduce both).
REDUCE_IN_KERNEL = True


_swapped_specs = WarmCache("gemm.sm90_skinny.swapped_specs")


def swapped_spec(spec: EpilogueSpec) -> EpilogueSpec:
    """The epilogue of C^T for the epilogue `spec` of C: bias rows and columns trade places."""
    out = _swapped_specs.get(spec)
    if out is None:
        out = _swapped_specs[spec] = EpilogueSpec(spec.beta_c, _SWAP_BIAS[spec.bias], spec.activation, spec.scale_ab,
                                                  spec.scale_rows)
    return out


def route(rung, config: Sm90GemmConfig, A, B, out, spec: EpilogueSpec, c=None) -> tuple[str | None, int]:
    """(route, splits) for kernel-order TMA views A (M, K, L), B (N, K, L) (`sm90_rung.
    tma_operand`) and out (L, M, N) (and c, read when beta != 0).

    route is "swap" (C^T straight into `out` with the fused epilogue), "swap_split" (swapped,
    K split), "split" (K split, not swapped) or None (the caller's ordinary path). "swap" needs
    `out`'s transpose (and c's, when read) to be TMA-addressable and the rung to fuse any
    epilogue. A split is summed in the kernel where `reduced_views` allows (its chunks whole
    k-tiles, `pick_split_k(in_kernel=True)`), else as fp32 partials whose rows are padded to
    16 bytes, so any N qualifies.
    """
    return _route(rung, config, A, B, out, spec, c)[:2]


def _route(rung, config, A, B, out, spec, c=None):
    """`route`, plus what its launch needs: the (N, M, L) view of `out` the "swap" route writes,
    or for a split reduced in the kernel `reduced_views`' (C, Csrc); else None."""
    M, K, L = A.shape
    N = B.shape[0]
    splits = 1
    if rung.split_k:
        if L == 1 and _reduces(rung, spec, c):
            splits = pick_split_k(M, N, K, L, config, A.element_size(), in_kernel=True)
            reduced = reduced_views(rung, config, out, spec, c, config.swap_ab) if splits > 1 else None
            if reduced is not None:
                return ("swap_split" if config.swap_ab else "split"), splits, reduced
        splits = pick_split_k(M, N, K, L, config, A.element_size())
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
    how, splits, views = _route(rung, config, A, B, out, spec, c)
    if how is None:
        return None
    if how == "swap":
        Csrc = _r.tma_operand(_r._unit_stride_mn(c.permute(2, 1, 0))) if spec.beta_c else None
        if spec.beta_c and Csrc is None:
            return None
        return how, launch_swapped(rung, config, A, B, out, alpha, spec, beta, Csrc, bias, scales, views)
    plan, run = split_k_plan(rung, config, A, B, splits, out, spec, swap=how == "swap_split", c=c, reduced=views)
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


def split_k_plan(rung, config, A, B, splits, out, spec, swap: bool = False, c=None, reduced=None) -> tuple:
    """(plan, run) for K split into `splits` chunks. With `reduced` (`reduced_views`' (C, Csrc))
    one `SplitKLaunch` sums chunks of whole k-tiles in the kernel (`_reduced_plan`). Otherwise
    the chunks are equal and the kernel sees them as its batch mode, (M, K/S, S) and (N, K/S,
    S) strided views of the TMA views A and B, writing fp32 partials (S, M, N) (through
    (M, N, S), or (N, M, S) with `swap`) whose rows are padded to 16 bytes so TMA addresses
    them for any M and N, summed in fp32, then the epilogue in torch.

    `run(a, b, out, alpha, beta, c, bias, scale_a, scale_b)` does all that on tensors whose
    kernel-order views are A and B at the recorded sizes and strides (formed by `as_strided`
    from their own storage: the caller's 3-D views, or the 2-D tensors `matmul` was given) and
    an `out` (and `c`, read when beta != 0) of the recorded layout; `plan` is `run` when it can
    be replayed so (a TVM-FFI build), else None.
    """
    if reduced is not None:
        return _reduced_plan(rung, config, A, B, splits, out, spec, c, swap, *reduced)
    M, K, _ = A.shape
    N = B.shape[0]
    As, Bs = _chunks(A, splits), _chunks(B, splits)
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


def _chunks(X, splits: int):
    """The kernel-order TMA view X (rows, K, 1) as (rows, K / splits, splits): K's chunks in the batch mode."""
    rows, k, _ = X.shape
    ks = k // splits
    return X.as_strided((rows, ks, splits), (X.stride(0), X.stride(1), X.stride(1) * ks))


def _reduces(rung, spec: EpilogueSpec, c) -> bool:
    """Whether a split of this call may be summed in the kernel: `REDUCE_IN_KERNEL`, a kernel
    with a split-K build, no gated epilogue, c given where it is read, and TVM-FFI (the
    split-K build is compiled for it only)."""
    return REDUCE_IN_KERNEL and spec.gate is None \
        and getattr(rung.kernel_cls, "reduces_split_k", False) and not (spec.beta_c and c is None) \
        and _r.tvm_ffi_available()


def reduced_views(rung, config, out, spec: EpilogueSpec, c, swap: bool) -> tuple | None:
    """(C, Csrc): the kernel-order TMA views of `out` (L = 1) and, when beta * C is fused, of `c`,
    through which an in-kernel split-K reduction (`_reduces` said it may) writes its result;
    None when the split must be summed in torch: an output TMA cannot store, or more tiles
    than `sm90_rung.SPLIT_COUNTERS`."""
    perm = (2, 1, 0) if swap else (1, 2, 0)
    C = _r.tma_operand(out.permute(perm))
    if C is None:
        return None
    Csrc = _r.tma_operand(_r._unit_stride_mn(c.permute(perm))) if spec.beta_c else None
    if spec.beta_c and Csrc is None:
        return None
    tiles = -(-C.shape[0] // config.tile_m) * -(-C.shape[1] // config.tile_n)
    return (C, Csrc) if tiles <= _r.SPLIT_COUNTERS else None


def _reduced_plan(rung, config, A, B, splits, out, spec, c, swap, C, Csrc) -> tuple:
    """`split_k_plan`'s (plan, run) for a reduction in the kernel: one `SplitKLaunch` (a TVM-FFI
    build, so `run` is always a replayable plan) on the TMA views A, B (swapped with `swap`),
    K's k-tiles in `splits` chunks, writing act(alpha * sum + beta * c + bias) into `out`
    through its kernel-order view C, with a per-call fp32 workspace and the stream's counters."""
    kspec = swapped_spec(spec) if swap else spec
    tiles = -(-C.shape[0] // config.tile_m) * -(-C.shape[1] // config.tile_n)
    ws_numel, device = tiles * splits * config.tile_m * config.tile_n, out.device
    perm = (2, 1, 0) if swap else (1, 2, 0)
    layout = lambda t: (tuple(t.shape), t.stride())  # noqa: E731
    (sA, tA), (sB, tB), (sC, tC), (sO, tO) = layout(A), layout(B), layout(C), layout(out)
    # C's source replays as a view of c when it is one, else is made per call (`_unit_stride_mn`'s copy)
    c_view = layout(Csrc) if spec.beta_c and Csrc.data_ptr() == c.data_ptr() else None
    c_layout = layout(c) if spec.beta_c else None
    empty, f32, split_counters, one = torch.empty, torch.float32, _r.split_counters, _r._dummy_bias(device)
    built = []  # the build, found on the first call (its key holds the bias dtype); TVM-FFI (`_reduces`)

    def run(a, b, out, alpha, beta, c, bias, scale_a, scale_b):
        a = a.detach() if a.requires_grad else a
        b = b.detach() if b.requires_grad else b
        X, Y = a.as_strided(sA, tA), b.as_strided(sB, tB)
        if swap:
            X, Y = Y, X
        out = out.detach() if out.requires_grad else out
        Cv = out.as_strided(sC, tC)
        Cs = Cv
        if spec.beta_c:
            c = c.detach() if c.requires_grad else c
            Cs = c.as_strided(*c_view) if c_view is not None else \
                _r.tma_operand(_r._unit_stride_mn(c.as_strided(*c_layout).permute(perm)))
        sa = sb = one
        if spec.scale_ab:
            sa, sb = (_plain(t) for t in _r._check_scales("", out.as_strided(sO, tO), scale_a, scale_b)[:2])
            if spec.scale_rows and swap:  # C^T's rows are C's columns
                sa, sb = sb, sa
        bias_t = one if bias is None else _plain(bias if bias.stride(0) == 1 else bias.contiguous())
        split_ws = (empty(ws_numel, dtype=f32, device=device), split_counters(device), splits)
        if not built:
            built.append(rung._bound(config, X, Y, Cv, float(alpha), kspec, float(beta), Cs, bias_t, (sa, sb),
                                     split_ws)[0])
        built[0](X, Y, Cv, Cs, bias_t, sa, sb, *split_ws, float(alpha), float(beta))

    return run, run


def _plain(t):
    """`t` as DLPack takes it: detached only when it requires grad (nn.Linear's bias)."""
    return t.detach() if t.requires_grad else t


def fallback_config(config: Sm90GemmConfig, m: int, n: int, k: int, in_bytes: int) -> Sm90GemmConfig:
    """`config`, or for a swap config that `route` could not run, the unswapped default."""
    if not config.swap_ab:
        return config
    return pick_config(m, n, k, in_bytes, swap_ab=False)
