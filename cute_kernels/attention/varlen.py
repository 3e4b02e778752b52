"""`attention_varlen_forward`: attention over a batch of sequences packed end to end.

Sequence b holds rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q (Tq, Hq, D) and rows
[cu_seqlens_k[b], cu_seqlens_k[b+1]) of k (Tk, Hkv, D), v (Tk, Hkv, Dv) (FlashAttention's
`flash_attn_varlen_func` layout). Each sequence is attended on its own, exactly as
`attention_forward` would on that sequence alone; the kernel (`sm80_flash`, varlen launch) runs
one CTA per (q tile of max_seqlen_q, query head, sequence) and reads its sequence's offsets
from cu_seqlens on the device (`seqlen_info.varlen_seqlens`).

Causal alignment is per sequence and named, as in `attention_forward`: "top_left" (row i sees
keys j <= i) or "bottom_right" (j <= i + Sk_b - Sq_b, FlashAttention's varlen convention, where
Sk_b, Sq_b are that sequence's lengths). Rows that see no key give out 0 and lse -inf.

The offsets are validated on the host before the launch (one small device-to-host copy): a
max_seqlen_q below a real length would leave rows unwritten, so it is refused, never trusted.
"""

from __future__ import annotations

import math

from .api import _CAUSAL, AttentionProblem

__all__ = ["attention_varlen_forward", "check_varlen_inputs"]

_WHO = "attention_varlen_forward"


def _check_cu(cu, name: str, total: int, max_seqlen: int, max_name: str) -> list[int]:
    import torch

    from .seqlen_info import check_cu_seqlens

    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{_WHO}: {name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32 or cu.dim() != 1:
        raise ValueError(f"{_WHO}: {name} must be a 1-D int32 tensor, got {cu.dim()}-D {cu.dtype}")
    if not cu.is_contiguous():
        raise ValueError(f"{_WHO}: {name} must be contiguous")
    values = check_cu_seqlens(cu.cpu(), total, what=f"{_WHO}: {name}")
    longest = max(b - a for a, b in zip(values, values[1:]))
    if longest > max_seqlen:
        raise ValueError(f"{_WHO}: {max_name} = {max_seqlen} but {name} holds a sequence of length {longest}")
    return values


def check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, scale
                        ) -> AttentionProblem:
    """Validate the packed inputs; return the problem (batch = number of sequences, seqlen_q/k
    = max_seqlen_q/k). Raises TypeError/ValueError naming the offending argument."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_WHO}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{_WHO}: {name} must be 3-D (total_tokens, heads, head_dim), got shape {tuple(t.shape)}")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{_WHO}: {name} must have a contiguous head dim (stride 1), got strides {t.stride()}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise TypeError(f"{_WHO}: q, k, v must share a floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    (tq, hq, d), (tk, hk, dk), (tv, hv, dv) = q.shape, k.shape, v.shape
    if dk != d:
        raise ValueError(f"{_WHO}: q head dim {d} differs from k head dim {dk}")
    if (tv, hv) != (tk, hk):
        raise ValueError(f"{_WHO}: k {tuple(k.shape)} and v {tuple(v.shape)} differ in tokens or heads")
    if hk == 0 or hq % hk:
        raise ValueError(f"{_WHO}: query heads ({hq}) must be a multiple of key/value heads ({hk})")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{_WHO}: {name} must be a non-negative int, got {n!r}")
    if causal not in _CAUSAL:
        raise ValueError(f"{_WHO}: causal must be one of {_CAUSAL}, got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    elif not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError(f"{_WHO}: scale must be a real number or None, got {type(scale).__name__}")
    devices = {t.device for t in (q, k, v, cu_seqlens_q, cu_seqlens_k) if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"{_WHO}: inputs are on different devices {sorted(map(str, devices))}")
    cu_q = _check_cu(cu_seqlens_q, "cu_seqlens_q", tq, max_seqlen_q, "max_seqlen_q")
    cu_k = _check_cu(cu_seqlens_k, "cu_seqlens_k", tk, max_seqlen_k, "max_seqlen_k")
    if len(cu_q) != len(cu_k):
        raise ValueError(f"{_WHO}: cu_seqlens_q has {len(cu_q) - 1} sequences but cu_seqlens_k has {len(cu_k) - 1}")
    if q.device.type != "cuda":
        raise ValueError(f"{_WHO}: tensors are on '{q.device}'; the cute_kernels attention kernels run on CUDA "
                         "devices only")
    return AttentionProblem(len(cu_q) - 1, hq, hk, max_seqlen_q, max_seqlen_k, d, dv, q.dtype, causal, float(scale))


def attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                             causal: str | None = None, scale=None, kernel: str = "auto", out=None, lse=None):
    """(out (Tq, Hq, Dv) in q's dtype, lse (Hq, Tq) fp32 natural log): per sequence b,
    attention_forward of its rows (module docstring), GQA when Hq > Hkv (query head h reads
    key/value head h // (Hq / Hkv)). kernel: "auto" or "sm80_flash". Forward only.
    out, lse: optional preallocated contiguous results, overwritten entirely."""
    import torch

    from .api import _result
    from .dispatch import resolve
    from .registry import KERNELS

    problem = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  causal=causal, scale=scale)
    out = _result(out, "out", (q.shape[0], q.shape[1], v.shape[2]), q.dtype, q.device, False)
    lse = _result(lse, "lse", (q.shape[1], q.shape[0]), torch.float32, q.device, False)
    if lse.numel() == 0:
        return out, lse
    if max_seqlen_k == 0:
        out.zero_()
        lse.fill_(-math.inf)
        return out, lse
    # The rung checks strides and sizes on the (1, H, T, D) views the kernel runs on; "auto"
    # picks among the rungs that have a varlen launch.
    views = [t.permute(1, 0, 2).unsqueeze(0) for t in (q, k, v)]
    with_varlen = {name: KERNELS[name] for name in KERNELS if hasattr(KERNELS[name], "varlen")}
    if kernel != "auto" and kernel in KERNELS and kernel not in with_varlen:
        raise ValueError(f"attention kernel {kernel!r} has no varlen launch; varlen kernels: {list(with_varlen)}")
    rung = resolve(kernel, *views, problem, registry=with_varlen)
    return rung.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, out, lse, problem)
