"""The host side of the `sm80_flash` backward (`sm80_flash_bwd`): which problems it takes, the
dense and packed (varlen) launches, and the compile-only variants CI checks the SASS of.

Both launches run the dQ pass, then the dK/dV pass, on torch's current stream, after one fused
torch pre-processing step: D_i = dO_i . O_i (fp32) and lse with -inf (rows that saw no key)
replaced by +inf, so those rows get P = 0 and zero gradients.
"""

from __future__ import annotations

import math

import cutlass

from cute_kernels.runtime.plan_cache import WarmCache, memo

from .features import feature_reason
from .problem_checks import (bottom_right_flag, config_of, launch_scalars, rows_aligned, varlen_window_scalars,
                             window_scalars)
from .sm80_flash_bwd import (_CUTLASS, FlashAttentionSm80BwdDKDV, FlashAttentionSm80BwdDQ, FlashSm80BwdConfig,
                             bwd_config_for)

__all__ = ["supports_backward", "backward", "varlen_backward", "config_for_problem"]


# Score features (`features.FEATURES`) the backward kernels take. Sinks need nothing of them:
# the forward's lse includes the sink, so P = exp(S - lse) and dS = P (dP - D) are unchanged.
BACKWARD_FEATURES = ("sinks", "softcap", "seqused_k")


def supports_backward(problem) -> str | None:
    """None when the backward kernels take `problem` (an `api.AttentionProblem`), else why not.
    Every causal alignment and sliding window is taken."""
    if str(problem.dtype).removeprefix("torch.") not in _CUTLASS:
        return f"the sm80_flash backward takes float16 and bfloat16, not {problem.dtype}"
    d = problem.head_dim
    if d % 16 or not 16 <= d <= 256:
        return f"the sm80_flash backward takes head dims that are multiples of 16 up to 256, not {d}"
    if d > 128 and d % 32:
        return (f"the sm80_flash backward takes head dims above 128 in multiples of 32 (the head-dim split of "
                f"its gradient GEMMs), not {d}")
    if problem.head_dim_v != d:
        return f"the sm80_flash backward needs the value head dim ({problem.head_dim_v}) equal to D ({d})"
    if not (math.isfinite(problem.scale) and problem.scale > 0):
        return f"scale {problem.scale} must be finite and > 0"
    return feature_reason(problem, BACKWARD_FEATURES)


# The warm path's caches (`runtime.plan_cache`): a config per (head dim, dtype, mask flags), a
# kernel object per (pass, config).
_CONFIGS = WarmCache("attention.sm80_flash_bwd.configs")
_KERNELS = WarmCache("attention.sm80_flash_bwd.kernels")


def config_for_problem(problem) -> FlashSm80BwdConfig:
    """`bwd_config_for` the problem's head dim, dtype, mask flags (`mask_flags`) and features
    (soft cap, seqused_k), built once each (`problem_checks.config_of`)."""
    return config_of(_CONFIGS, problem, bwd_config_for, softcap=problem.softcap is not None,
                     seqused_k=problem.seqused_k)


def _softcap_arg(problem):
    """The kernels' softcap argument: the cap as a Float32, or None without one."""
    return None if problem.softcap is None else cutlass.Float32(problem.softcap)


def _kernel(cls, config):
    return memo(_KERNELS, (cls, config), cls, config)


def _prep(dout, out, lse):
    """(D, lse') fp32: D = rowwise dO . O over the last mode, lse' = lse with -inf -> +inf."""
    import torch

    d_rows = (dout.float() * out.float()).sum(-1)
    lse_b = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse).contiguous()
    return d_rows, lse_b


def _check(problem):
    why = supports_backward(problem)
    if why is not None:
        raise ValueError(f"sm80_flash backward: {why}")


def backward(dout, q, k, v, out, lse, problem):
    """(dq, dk, dv) for 4-D q (B, Hq, Sq, D), k, v (B, Hkv, Sk, D), the forward's out and lse
    (natural log, -inf for rows that saw no key) and the output gradient dout, on torch's
    current stream. dq, dk, dv are new tensors of q's dtype, stored (B, S, H, D) as the forward's
    out (`api.new_out`); with GQA dk and dv sum over the query heads sharing a key/value head.
    Raises ValueError for an unsupported problem."""
    from cute_kernels.runtime import compile_kernel, current_stream, from_torch

    from .api import new_out

    _check(problem)
    config = config_for_problem(problem)
    dout = rows_aligned(dout)
    d_rows, lse_b = _prep(dout, out, lse)
    d_rows = d_rows.contiguous()
    # Stored (B, S, H, D) as the forward's out (`api.new_out`); the kernels write any strides.
    dq, dk, dv = (new_out(tuple(t.shape), t.dtype, t.device) for t in (q, k, v))
    t4 = lambda t: from_torch(t, assumed_align=16, leading_dim=3)  # noqa: E731
    t3 = lambda t: from_torch(t, assumed_align=4, leading_dim=2)  # noqa: E731
    scale, offset, group = launch_scalars(problem)
    offset_lo, _ = window_scalars(problem)
    scalars = (cutlass.Float32(scale), cutlass.Int32(offset), cutlass.Int32(offset_lo), cutlass.Int32(group))
    stream = current_stream()
    tail = (None, None, None, None, None, _softcap_arg(problem), None)
    args = (t4(q), t4(k), t4(v), t4(dout), t3(lse_b), t3(d_rows), t4(dq), *scalars)
    fn = compile_kernel(_kernel(FlashAttentionSm80BwdDQ, config), *args, stream, *tail,
                        key=("attention.sm80_flash_bwd_dq", config))
    fn(*args, stream, *tail)
    args = (t4(q), t4(k), t4(v), t4(dout), t3(lse_b), t3(d_rows), t4(dk), t4(dv), *scalars)
    fn = compile_kernel(_kernel(FlashAttentionSm80BwdDKDV, config), *args, stream, *tail,
                        key=("attention.sm80_flash_bwd_dkdv", config))
    fn(*args, stream, *tail)
    return dq, dk, dv


def varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                    problem, seqused_k=None):
    """(dq (Tq, Hq, D), dk, dv (Tk, Hkv, D)) of the packed forward (`Sm80FlashRung.varlen`):
    q, out, dout (Tq, Hq, D), k, v (Tk, Hkv, D), lse (Hq, Tq) fp32 as the varlen forward returns
    it, int32 cu_seqlens (B + 1,) and max lengths already validated by the caller; causal
    alignment and window per sequence (`problem`: batch = number of sequences). dq, dk, dv are
    new contiguous tensors of q's dtype, zero for rows of sequences with no key or no query
    (and for key rows past a sequence's seqused_k)."""
    import torch

    from cute_kernels.runtime import compile_kernel, current_stream, from_torch

    _check(problem)
    config = config_for_problem(problem)
    dout = rows_aligned(dout)
    if max_seqlen_q == 0 or max_seqlen_k == 0 or 0 in (q.shape[0], q.shape[1], k.shape[0], problem.batch):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    # Every row is written: the grids cover the longest sequences, and a block whose rows see
    # no key (or whose keys no row sees) stores zeros.
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    # Key rows past a sequence's seqused_k belong to no CTA's keys: they are zeroed up front.
    alloc = torch.empty if seqused_k is None else torch.zeros
    dk = alloc(k.shape, dtype=k.dtype, device=k.device)
    dv = alloc(v.shape, dtype=v.dtype, device=v.device)
    d_rows, lse_b = _prep(dout, out, lse)
    d_rows = d_rows.t().contiguous()  # (Hq, Tq), as lse
    # (T, H, D) -> (1, H, T, D) and (H, T) -> (1, H, T): the dense kernels' modes, rows offset per CTA.
    view4 = lambda t: from_torch(t.permute(1, 0, 2).unsqueeze(0), assumed_align=16, leading_dim=3)  # noqa: E731
    view3 = lambda t: from_torch(t.unsqueeze(0), assumed_align=4, leading_dim=2)  # noqa: E731
    window_left, window_right = varlen_window_scalars(problem)
    scalars = (cutlass.Float32(problem.scale), cutlass.Int32(window_right), cutlass.Int32(-window_left),
               cutlass.Int32(problem.heads_q // problem.heads_kv))
    cu = [from_torch(t, assumed_align=4, leading_dim=0) for t in (cu_seqlens_q, cu_seqlens_k)]
    flag = cutlass.Int32(bottom_right_flag(problem))
    stream = current_stream()
    used = None if seqused_k is None else from_torch(seqused_k, assumed_align=4, leading_dim=0)
    features = (_softcap_arg(problem), used)
    args = (view4(q), view4(k), view4(v), view4(dout), view3(lse_b), view3(d_rows), view4(dq), *scalars)
    tail = (*cu, cutlass.Int32(problem.batch), cutlass.Int32(max_seqlen_q), flag, *features)
    fn = compile_kernel(_kernel(FlashAttentionSm80BwdDQ, config), *args, stream, *tail,
                        key=("attention.sm80_flash_bwd_dq.varlen", config))
    fn(*args, stream, *tail)
    args = (view4(q), view4(k), view4(v), view4(dout), view3(lse_b), view3(d_rows), view4(dk), view4(dv), *scalars)
    tail = (*cu, cutlass.Int32(problem.batch), cutlass.Int32(max_seqlen_k), flag, *features)
    fn = compile_kernel(_kernel(FlashAttentionSm80BwdDKDV, config), *args, stream, *tail,
                        key=("attention.sm80_flash_bwd_dkdv.varlen", config))
    fn(*args, stream, *tail)
    return dq, dk, dv


# ---- compile-only variants ------------------------------------------------------------------------


def _variant_args(kernel: str, config, varlen: bool):
    from cute_kernels.runtime import fake_stream, fake_tensor

    t = _CUTLASS[config.dtype]
    n_out = 1 if kernel == "dq" else 2
    q, k, v, do, *grads = [fake_tensor(t, 4, leading_dim=3, assumed_align=16) for _ in range(4 + n_out)]
    lse, d = [fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4) for _ in range(2)]
    args = (q, k, v, do, lse, d, *grads, cutlass.Float32(1.0 / math.sqrt(config.head_dim)), cutlass.Int32(0),
            cutlass.Int32(0), cutlass.Int32(1), fake_stream())
    if varlen:
        cu = [fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4) for _ in range(2)]
        args = (*args, *cu, cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1))
    else:
        args = (*args, None, None, None, None, None)
    used = fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4) if config.seqused_k else None
    return (*args, cutlass.Float32(30.0) if config.softcap else None, used)


def _build(kernel: str, varlen: bool):
    cls = FlashAttentionSm80BwdDQ if kernel == "dq" else FlashAttentionSm80BwdDKDV

    def build(head_dim: int = 128, dtype: str = "bfloat16", causal: bool = False, local: bool = False,
              softcap: bool = False, seqused_k: bool = False):
        from cute_kernels.runtime import CompileJob

        config = bwd_config_for(head_dim, dtype, causal, local, softcap, seqused_k)
        name = f"attention.sm80_flash_bwd_{kernel}{'.varlen' if varlen else ''}"
        return CompileJob(cls(config), _variant_args(kernel, config, varlen), (name, config))

    return build


build_dq_variant = _build("dq", False)
build_dkdv_variant = _build("dkdv", False)

BWD_VARIANT_CONFIGS = {
    f"d{d}_{dt}{'_causal' if causal else ''}{'_local' if local else ''}": {
        "head_dim": d, "dtype": dt, "causal": causal, "local": local}
    for d, dt, causal, local in (
        (64, "float16", True, False), (128, "bfloat16", True, False), (128, "bfloat16", True, True),
        (192, "float16", True, False), (256, "bfloat16", True, True),
    )
}
# Soft-capped scores (the tanh's derivative in dS).
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_softcap"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                       "softcap": True}
BWD_VARIANT_CONFIGS["d64_float16_softcap"] = {"head_dim": 64, "dtype": "float16", "softcap": True}
BWD_VARIANT_CONFIGS["d256_bfloat16_causal_softcap"] = {"head_dim": 256, "dtype": "bfloat16", "causal": True,
                                                       "softcap": True}
BWD_VARLEN_CONFIGS = {
    "d128_bfloat16_causal_local": {"head_dim": 128, "dtype": "bfloat16", "causal": True, "local": True},
    "d256_bfloat16_causal": {"head_dim": 256, "dtype": "bfloat16", "causal": True, "local": False},
    "d128_bfloat16_causal_softcap_seqused": {"head_dim": 128, "dtype": "bfloat16", "causal": True, "local": False,
                                             "softcap": True, "seqused_k": True},
}


def _register() -> None:
    from cute_kernels.runtime import register_variant

    need = {"HMMA", "LDSM", "LDGSTS"}
    register_variant("attention.sm80_flash_bwd_dq", build_dq_variant, configs=BWD_VARIANT_CONFIGS, requires=need)
    register_variant("attention.sm80_flash_bwd_dkdv", build_dkdv_variant, configs=BWD_VARIANT_CONFIGS, requires=need)
    register_variant("attention.sm80_flash_bwd_dq_varlen", _build("dq", True), configs=BWD_VARLEN_CONFIGS,
                     requires=need)
    register_variant("attention.sm80_flash_bwd_dkdv_varlen", _build("dkdv", True), configs=BWD_VARLEN_CONFIGS,
                     requires=need)


_register()
