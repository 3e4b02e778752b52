"""The problem limits every dense attention rung shares, checked before its own (alignment,
TMA, features) in `supports`, and the scalars every dense kernel launch takes."""

from __future__ import annotations

import math

__all__ = ["MAX_GRID_YZ", "common_reason", "launch_scalars"]

# The launch grid puts heads and batch on y and z.
MAX_GRID_YZ = 65535


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


def launch_scalars(problem) -> tuple[float, int, int]:
    """(softmax scale, causal offset, query heads per KV head) of a dense launch: the offset is
    seqlen_k - seqlen_q for bottom-right causal alignment, else 0 (top-left, or not causal)."""
    offset = problem.seqlen_k - problem.seqlen_q if problem.causal == "bottom_right" else 0
    return problem.scale, offset, problem.heads_q // problem.heads_kv
