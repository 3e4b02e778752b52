"""The problem limits every dense attention rung shares, checked before its own (alignment,
TMA, features) in `supports`, the scalars every dense kernel launch takes, and how a rung's
config follows from a problem (`config_of`, cached)."""

from __future__ import annotations

import math

__all__ = ["MAX_GRID_YZ", "rows_aligned", "common_reason", "launch_scalars", "mask_flags", "window_scalars",
           "varlen_window_scalars", "bottom_right_flag", "softcap_scalars", "config_of"]

# The launch grid puts heads and batch on y and z.
MAX_GRID_YZ = 65535


def rows_aligned(t):
    """`t` itself when each of its head-dim rows is whole 16-byte vectors on 16-byte boundaries
    (pointer 16-byte aligned, unit last stride, every other stride of a mode longer than 1 a
    multiple of 8 elements: what TMA and 128-bit loads read), else a contiguous copy. The
    (B, S, H, D) storage of attention outputs and their gradients passes as it is."""
    if t.is_contiguous() and not t.data_ptr() & 15 and t.shape[-1] % 8 == 0:
        return t  # the common case, decided without walking the strides
    if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 8 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
        return t.contiguous()
    return t


def common_reason(problem, dtypes) -> str | None:
    """None when `problem` (an `api.AttentionProblem`) is within the limits all rungs share
    (dtype in `dtypes`, D = Dv a multiple of 16 up to 256, a positive finite scale, heads and
    batch within the grid, 32-bit row indices), else the first limit it breaks."""
    if problem.dtype not in dtypes:
        return f"dtype {problem.dtype} not supported (float16, bfloat16)"
    d = problem.head_dim
    if d % 16 or not 16 <= d <= 256:
        return f"head dim {d} not supported (a multiple of 16 from 16 to 256)"
    if problem.head_dim_v != d:
        return f"value head dim {problem.head_dim_v} differs from the query/key head dim {d}"
    if not (math.isfinite(problem.scale) and problem.scale > 0):
        return f"scale {problem.scale} must be finite and > 0 (the running max is taken before scaling)"
    if problem.heads_q > MAX_GRID_YZ or problem.batch > MAX_GRID_YZ:
        return f"batch {problem.batch} and heads {problem.heads_q} must each be at most {MAX_GRID_YZ} (grid y/z)"
    if max(problem.seqlen_q, problem.seqlen_k) >= 2**31 - 256:
        return "sequence lengths must be below 2**31 (32-bit row indices)"
    return None


def _base_offset(problem) -> int:
    """The diagonal's alignment offset: seqlen_k - seqlen_q for bottom-right causality and for
    windows without causality (FlashAttention's convention), else 0."""
    bottom_right = problem.causal == "bottom_right" or (problem.causal is None and _windowed(problem))
    return problem.seqlen_k - problem.seqlen_q if bottom_right else 0


def _windowed(problem) -> bool:
    return getattr(problem, "window_left", None) is not None or getattr(problem, "window_right", None) is not None


def launch_scalars(problem) -> tuple[float, int, int]:
    """(softmax scale, upper offset, query heads per KV head) of a dense launch: row i may see
    keys j <= i + offset, where offset = base + window_right (`mask`: base is seqlen_k - seqlen_q
    for bottom-right alignment, else 0; window_right is 0 when causal or unset)."""
    offset = _base_offset(problem) + (getattr(problem, "window_right", None) or 0)
    return problem.scale, offset, problem.heads_q // problem.heads_kv


def mask_flags(problem) -> tuple[bool, bool]:
    """(upper, local): whether kernels test the upper diagonal (causal, or a right window bound)
    and the lower one (a left window bound). A kernel config's `causal` flag is `upper`."""
    upper = problem.causal is not None or getattr(problem, "window_right", None) is not None
    return upper, getattr(problem, "window_left", None) is not None


def window_scalars(problem) -> tuple[int, bool]:
    """(offset_lo, local): row i may see keys j >= i + offset_lo when local (a left window
    bound: offset_lo = base - window_left); (0, False) without one."""
    left = getattr(problem, "window_left", None)
    if left is None:
        return 0, False
    return _base_offset(problem) - left, True


def varlen_window_scalars(problem) -> tuple[int, int]:
    """(window_left, window_right) as varlen kernels take them (0 where unbounded; the flags of
    `mask_flags` say which bound is tested): they add them to each sequence's own base offset."""
    return getattr(problem, "window_left", None) or 0, getattr(problem, "window_right", None) or 0


def bottom_right_flag(problem) -> int:
    """1 when the diagonal is aligned bottom-right (varlen kernels then take each sequence's
    seqlen_k - seqlen_q as its base offset), else 0."""
    return 1 if problem.causal == "bottom_right" or (problem.causal is None and _windowed(problem)) else 0


def softcap_scalars(problem) -> tuple[float, float]:
    """(exponent scale, score scale) of a launch: the kernels' online softmax runs on raw scores
    x with 2^(x * exponent scale * log2 e); with a soft cap c it runs on t = tanh(x * score
    scale) instead, so (c, scale / c) (`softmax`); without one (scale, 1.0), the score scale
    unused."""
    softcap = getattr(problem, "softcap", None)
    if softcap is None:
        return problem.scale, 1.0
    return softcap, problem.scale / softcap


def config_of(cache, problem, config_for, **features):
    """`config_for(head_dim, dtype name, upper, local, **features)` for the problem's head dim,
    dtype and mask flags (`mask_flags`: the upper diagonal for causality or a right window
    bound, the lower one for a left bound) and the score features the rung's configs depend on
    (soft cap, sinks, seqused_k, varlen: booleans), made once per combination in `cache` (a
    `runtime.plan_cache` cache): how every flash rung picks its forward and backward configs."""
    from cute_kernels.runtime.plan_cache import memo

    upper, local = mask_flags(problem)
    key = (problem.head_dim, problem.dtype, upper, local, *features.items())
    return memo(cache, key, _call_config_for, config_for, problem.head_dim, str(problem.dtype).removeprefix("torch."),
                upper, local, features)


def _call_config_for(config_for, head_dim, dtype, upper, local, features):
    return config_for(head_dim, dtype, upper, local, **features)
