"""`scaled_dot_product_attention`: PyTorch's SDPA on the attention ladder.

The public function takes PyTorch's signature and (B, H, S, D) convention (also unbatched
(H, S, D)); `attention_forward` is the internal entry that also returns the log-sum-exp the
backward needs. Both check every argument and raise a clear error before anything launches,
then hand the views (never copies) to the rung `dispatch` picks.

Masks: `is_causal=True` is the causal mask aligned top-left, as in PyTorch; the bottom-right
alignment comes as PyTorch spells it, `attn_mask=torch.nn.attention.bias.causal_lower_right(
Sq, Sk)` (also accepted: `causal_upper_left`). An arbitrary dense `attn_mask` and `dropout_p > 0`
are not implemented and say so.

Sliding windows: `window_size=(left, right)` (FlashAttention's convention: ints, -1 for an
unbounded side, None for no window) limits row i to keys i + base - left <= j <= i + base +
right, where base aligns the diagonal (bottom-right for a window without causality; see
`mask_rule`). It is checked and made canonical (`mask_rule.canonical_window`) with the other
arguments; a rung that does not implement it says so in its `supports` reason.

Score features (`features`): `softcap` (Gemma 2's s = softcap * tanh(scale * q.k / softcap),
before the mask) and `sinks` (Hq,) (gpt-oss: one logit per query head joining the softmax
denominator; the returned lse includes it, and `attention_backward` returns its gradient too).
Both are keyword-only on every entry; a rung that does not implement one declines it in
`supports` (`features.feature_reason`), so "auto" picks one that does.

Gradients: when grad mode is on and q, k, v (or sinks) requires grad, `scaled_dot_product_attention` runs
through an autograd function whose backward is `attention_backward` (the rung's `backward`:
dQ, dK, dV recomputing P from the saved lse). Whether the rung can differentiate the problem is
checked in the forward, before any launch.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from cute_kernels.runtime.plan_cache import PlanCache, plain_tensors, tensor_signature

from .features import check_sinks, check_softcap, sinks_gradient
from .mask_rule import canonical_window

__all__ = ["AttentionProblem", "scaled_dot_product_attention", "attention_forward", "attention_backward",
           "check_inputs", "plan_for", "backward_plan_for", "new_out"]

_CAUSAL = (None, "top_left", "bottom_right")


@dataclass(frozen=True)
class AttentionProblem:
    """The sizes and options of one attention forward, as rungs see it."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    head_dim_v: int
    dtype: object
    causal: str | None
    scale: float
    # A sliding window's bounds (None = unbounded; see `mask` for the rule and its alignment).
    window_left: int | None = None
    window_right: int | None = None
    # Score features (`features`): the soft cap (None: none), whether sinks are given, and
    # (varlen) whether per-sequence key lengths (seqused_k) are.
    softcap: float | None = None
    sinks: bool = False
    seqused_k: bool = False

    @property
    def windowed(self) -> bool:
        return self.window_left is not None or self.window_right is not None

    def describe(self) -> str:
        causal = f", causal {self.causal}" if self.causal else ""
        if self.windowed:
            w = lambda x: -1 if x is None else x  # noqa: E731
            causal += f", window ({w(self.window_left)}, {w(self.window_right)})"
        if self.softcap is not None:
            causal += f", softcap {self.softcap:g}"
        if self.sinks:
            causal += ", sinks"
        if self.seqused_k:
            causal += ", seqused_k"
        return (f"B={self.batch} Hq={self.heads_q} Hkv={self.heads_kv} Sq={self.seqlen_q} Sk={self.seqlen_k} "
                f"D={self.head_dim} Dv={self.head_dim_v} {self.dtype}{causal}, scale {self.scale:g}")


def _causal_from_mask(attn_mask, is_causal: bool) -> str | None:
    """The causal alignment the (attn_mask, is_causal) pair asks for; errors for the rest."""
    import torch

    if attn_mask is None:
        return "top_left" if is_causal else None
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:  # pragma: no cover - older torch
        CausalBias = None
    if CausalBias is not None and isinstance(attn_mask, CausalBias):
        if is_causal:
            raise ValueError("scaled_dot_product_attention: pass either is_causal=True or a causal attn_mask, not both")
        return "bottom_right" if attn_mask.variant == CausalVariant.LOWER_RIGHT else "top_left"
    if isinstance(attn_mask, torch.Tensor):
        raise NotImplementedError(
            "scaled_dot_product_attention: an arbitrary dense attn_mask is not supported by the cute_kernels "
            "attention kernels; use is_causal=True (top-left) or attn_mask=torch.nn.attention.bias."
            "causal_lower_right(Sq, Sk) (bottom-right), or torch.nn.functional.scaled_dot_product_attention"
        )
    raise TypeError(f"scaled_dot_product_attention: attn_mask must be None, a tensor or a CausalBias, "
                    f"got {type(attn_mask).__name__}")


def _check_tensor(t, name: str) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"scaled_dot_product_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() not in (3, 4):
        raise ValueError(
            f"scaled_dot_product_attention: {name} must be 4-D (batch, heads, seq, head_dim) or 3-D "
            f"(heads, seq, head_dim), got {t.dim()}-D shape {tuple(t.shape)}"
        )
    if not t.dtype.is_floating_point:
        raise TypeError(f"scaled_dot_product_attention: {name} has dtype {t.dtype}; a floating dtype is needed")


def check_inputs(q, k, v, *, causal: str | None, scale, enable_gqa: bool, window_size=None, softcap=None,
                 sinks=None) -> AttentionProblem:
    """Validate q, k, v (4-D, or all 3-D) and options; return the problem. Raises TypeError or
    ValueError naming the offending argument. Device placement is checked last, so every shape
    and dtype error is reported the same on CPU tensors. The window is stored in canonical form
    (`mask_rule.canonical_window`: None for an unbounded side; causality bounds the right).
    softcap and sinks: `features.check_softcap` / `check_sinks`."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        _check_tensor(t, name)
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(f"scaled_dot_product_attention: query, key and value must have the same rank, got "
                         f"{q.dim()}-D, {k.dim()}-D and {v.dim()}-D")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"scaled_dot_product_attention: query, key and value must share a dtype, got "
                        f"{q.dtype}, {k.dtype} and {v.dtype}")
    q4, k4, v4 = (t if t.dim() == 4 else t.unsqueeze(0) for t in (q, k, v))
    b, hq, sq, d = q4.shape
    bk, hk, sk, dk = k4.shape
    bv, hv, sv, dv = v4.shape
    if not (b == bk == bv):
        raise ValueError(f"scaled_dot_product_attention: batch sizes differ: query {b}, key {bk}, value {bv}")
    if hk != hv:
        raise ValueError(f"scaled_dot_product_attention: key has {hk} heads but value has {hv}")
    if sk != sv:
        raise ValueError(f"scaled_dot_product_attention: key has sequence length {sk} but value has {sv}")
    if dk != d:
        raise ValueError(f"scaled_dot_product_attention: query head dim {d} differs from key head dim {dk}")
    if hq != hk:
        if not enable_gqa:
            raise ValueError(
                f"scaled_dot_product_attention: query has {hq} heads but key/value have {hk}; pass "
                "enable_gqa=True for grouped-query attention"
            )
        if hk == 0 or hq % hk:
            raise ValueError(
                f"scaled_dot_product_attention: grouped-query attention needs the query heads ({hq}) to be a "
                f"multiple of the key/value heads ({hk})"
            )
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(
                f"scaled_dot_product_attention: {name} has head-dim stride {t.stride(-1)}; it must be 1 (the "
                f"head dim contiguous; a (B, S, H, D) tensor transposed to (B, H, S, D) is fine). Call .contiguous()"
            )
    if causal not in _CAUSAL:
        raise ValueError(f"causal must be one of {_CAUSAL}, got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    elif not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"scaled_dot_product_attention: scale must be a real number or None, got {type(scale).__name__}")
    causal, left, right = canonical_window(window_size, causal, "scaled_dot_product_attention")
    softcap = check_softcap(softcap, "scaled_dot_product_attention")
    check_sinks(sinks, hq, q, "scaled_dot_product_attention")
    why = _device_reason(q, k, v)
    if why is not None:
        raise ValueError(f"scaled_dot_product_attention: {why}")
    return AttentionProblem(b, hq, hk, sq, sk, d, dv, q.dtype, causal, float(scale), left, right, softcap,
                            sinks is not None)


def _device_reason(q, k, v) -> str | None:
    """Why q, k, v cannot run here (not on one CUDA device), or None. Tests replace it to run
    the whole call path on CPU tensors."""
    device = q.device
    if k.device != device or v.device != device:
        return f"query, key and value are on different devices {sorted({str(t.device) for t in (q, k, v)})}"
    if device.type != "cuda":
        return (f"tensors are on '{device}'; the cute_kernels attention kernels run on CUDA devices only "
                "(move them with .cuda())")
    return None


def new_out(shape: tuple, dtype, device):
    """A fresh attention output of `shape` (B, H, S, D), stored (B, S, H, D): the result is the
    (B, H, S, D) view of it, as torch's flash and cuDNN attention return theirs (an unbatched
    (H, S, D) shape: stored (S, H, D)).

    Why: models reshape the output to (B, S, H * D) right after (`out.transpose(1, 2).reshape`);
    stored so, that is a view, not a copy kernel per layer, and the output gradient that comes
    back has the same storage order, which the backward reads in place. The kernels take any
    strides that are multiples of 8 elements outside the head dim."""
    import torch

    *b, h, s, d = shape
    return torch.empty((*b, s, h, d), dtype=dtype, device=device).transpose(-3, -2)


def _out_strides(shape) -> tuple:
    """The strides `new_out` gives a tensor of `shape` (B..., H, S, D): those of a contiguous
    (B..., S, H, D) tensor, read in (B..., H, S, D) order (size-1 modes included)."""
    *b, h, s, d = shape
    strides, step = [], h * s * d
    for n in reversed(b):
        strides.insert(0, step)
        step *= n
    return (*strides, d, h * d, 1)


def stored_like_out(t):
    """`t` itself when it is stored as `new_out` stores (the (B, H, S, D) view of a contiguous
    (B, S, H, D) tensor), else a copy so stored. The backward's dq, dk, dv leave every path
    stored so: the models' `q.transpose(1, 2).reshape(B, S, H * D)` of their gradient is then a
    view, and an op's real result and its fake agree on strides (size-1 modes included)."""
    if t.stride() == _out_strides(t.shape):
        return t
    return new_out(tuple(t.shape), t.dtype, t.device).copy_(t)


def _result(t, name: str, shape: tuple, dtype, device, unbatched: bool, fresh=None):
    """A preallocated result checked (and viewed 4-D / 3-D), or a fresh one (`fresh(shape,
    dtype, device)`, default torch.empty)."""
    import torch

    if t is None:
        return (fresh or torch.empty)(shape, dtype=dtype, device=device)
    want = shape[1:] if unbatched else shape
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(want) or t.dtype != dtype or t.device != device:
        got = f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"attention_forward: {name} must be a {tuple(want)} {dtype} tensor on {device}, got {got}")
    if not t.is_contiguous():
        raise ValueError(f"attention_forward: {name} must be contiguous")
    return t.unsqueeze(0) if unbatched else t


def attention_forward(q, k, v, *, causal: str | None = None, scale=None, enable_gqa: bool = False,
                      window_size=None, kernel: str = "auto", out=None, lse=None, softcap=None, sinks=None):
    """(out, lse): out = softmax(q k^T * scale + mask) v per head, lse = logsumexp over keys of
    the masked, scaled scores (fp32, natural log, shape q.shape[:-1]).
    softcap: scores softcap * tanh(scale q.k / softcap) before the mask; sinks (Hq,): a logit
    per query head in the softmax denominator, included in lse (`features`).

    causal: None, "top_left" (row i sees keys j <= i) or "bottom_right" (j <= i + Sk - Sq;
    rows that see no key give out 0 and lse -inf). window_size: None or (left, right), -1 for an
    unbounded side (`mask_rule`: FlashAttention's sliding window, aligned bottom-right without
    causality). Query head h reads key/value head h // (Hq / Hkv). The shape conventions and
    errors are those of `scaled_dot_product_attention`.
    out, lse: optional preallocated results (contiguous, shapes and dtypes as returned), which
    every launch overwrites entirely (tests pass NaN-poisoned ones to prove it). A fresh out is
    stored (B, Sq, Hq, Dv) and returned as its (B, Hq, Sq, Dv) view (`new_out`).
    A call without out and lse whose signature was checked before replays its launch
    (`runtime.plan_cache`).
    """
    sig = None
    if out is None and lse is None:
        sig = _plan_signature(q, k, v, causal, scale, enable_gqa, kernel, window_size, softcap, sinks)
        if sig is not None:
            try:
                plan = _PLANS.get(sig)
            except TypeError:  # an unhashable option: the checks report it
                plan = sig = None
            if plan is not None:
                return plan(q, k, v, sinks)
    out, lse, launched = _forward(q, k, v, causal, scale, enable_gqa, kernel, out, lse, window_size, softcap, sinks)
    if sig is not None and launched is not None:
        _keep_plan(sig, q, k, v, *launched, sinks=sinks)
    return out, lse


def _forward(q, k, v, causal, scale, enable_gqa, kernel, out, lse, window_size=None, softcap=None, sinks=None):
    """`attention_forward`'s checked path: (out, lse, (rung, problem) when a rung launched)."""
    import torch

    from .dispatch import resolve

    launched = None
    problem = check_inputs(q, k, v, causal=causal, scale=scale, enable_gqa=enable_gqa, window_size=window_size,
                           softcap=softcap, sinks=sinks)
    unbatched = q.dim() == 3
    q4, k4, v4 = (t.unsqueeze(0) if unbatched else t for t in (q, k, v))
    p = problem
    out_shape = (p.batch, p.heads_q, p.seqlen_q, p.head_dim_v)
    out = _result(out, "out", out_shape, q.dtype, q.device, unbatched, fresh=new_out)
    lse = _result(lse, "lse", out_shape[:3], torch.float32, q.device, unbatched)
    if lse.numel() and p.seqlen_k == 0:
        # Softmax over no keys: an empty sum, so out is 0 and lse is log(0) (with sinks, the
        # sink alone: lse = sink).
        out.zero_()
        if sinks is None:
            lse.fill_(-math.inf)
        else:
            lse.copy_(sinks.to(torch.float32)[None, :, None].expand(lse.shape))
    elif lse.numel():
        rung = resolve(kernel, q4, k4, v4, problem)
        if sinks is None:
            rung(q4, k4, v4, out, lse, problem)
        else:
            rung(q4, k4, v4, out, lse, problem, sinks=sinks)
        launched = (rung, problem)
    if unbatched:
        out, lse = out[0], lse[0]
    return out, lse, launched


# ---- launch plans (runtime.plan_cache) -----------------------------------------------------

_PLANS = PlanCache("attention.forward")
_SCALE_TYPES = (float, int, type(None))


def _plan_signature(q, k, v, causal, scale, enable_gqa, kernel, window_size=None, softcap=None, sinks=None):
    """The plan key of an `attention_forward` call (no out/lse given), or None when it cannot
    have a plan (a non-tensor, a scale or softcap that is not a Python float/int/None). Not
    hashed here (an unhashable window_size, a list, fails the lookup and so takes the checked
    path)."""
    if scale.__class__ not in _SCALE_TYPES or softcap.__class__ not in _SCALE_TYPES:
        return None
    try:
        return (tensor_signature(q), tensor_signature(k), tensor_signature(v), causal, scale.__class__, scale,
                enable_gqa, kernel, window_size, softcap.__class__, softcap,
                None if sinks is None else tensor_signature(sinks))
    except (TypeError, RuntimeError):  # not plain tensors (FakeTensor, other subclasses, non-tensors)
        return None


def plan_for(q, k, v, *, causal=None, scale=None, enable_gqa: bool = False, kernel: str = "auto", window_size=None):
    """The stored plan of an `attention_forward` call with these arguments (no out/lse, no
    softcap or sinks), or None: `plan(q, k, v) -> (out, lse)` for tensors with the recorded
    call's signature (the eager path, `ops.eager_attention`, replays it)."""
    sig = _plan_signature(q, k, v, causal, scale, enable_gqa, kernel, window_size)
    try:
        return None if sig is None else _PLANS.get(sig)
    except TypeError:
        return None


def _keep_plan(sig, q, k, v, rung, problem, sinks=None) -> None:
    """Store under `sig` the replay of the checked forward just made: allocate out and lse as it
    did and call the rung's `launch_plan(problem)` (when it has one: TVM-FFI builds) on the
    caller's tensors (detached when they require grad, as the rung does; sinks as fp32)."""
    launch_plan = getattr(rung, "launch_plan", None)
    if launch_plan is None or not plain_tensors(q, k, v, sinks):
        return
    launch = launch_plan(problem)
    if launch is None:
        return
    import torch

    empty, fp32 = torch.empty, torch.float32
    p = problem
    out_shape = (p.batch, p.heads_q, p.seqlen_q, p.head_dim_v)
    lse_shape = out_shape[:3]
    dtype, device = q.dtype, q.device
    unbatched = q.dim() == 3
    detach = q.requires_grad or k.requires_grad or v.requires_grad
    # The signature fixes the sinks' dtype and strides: convert only when the kernel cannot read them.
    convert = sinks is not None and (sinks.dtype != fp32 or not sinks.is_contiguous())

    def plan(q, k, v, sinks=None):
        out = new_out(out_shape, dtype, device)
        lse = empty(lse_shape, dtype=fp32, device=device)
        if detach:
            q, k, v = q.detach(), k.detach(), v.detach()
        extra = ()
        if sinks is not None:
            extra = (sinks.detach().to(fp32).contiguous() if convert else sinks.detach(),)
        if unbatched:
            launch(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), out, lse, *extra)
            return out[0], lse[0]
        launch(q, k, v, out, lse, *extra)
        return out, lse

    # A launch that reads the key count and the cache's strides per call serves every key count
    # the rung takes (`ops.eager_attention`'s decode family).
    plan.any_seqlen_k = getattr(rung, "launch_reads_seqlen_k", False)
    _PLANS.put(sig, plan)


def _has_backward(rung, problem) -> str | None:
    return rung.supports_backward(problem) if hasattr(rung, "backward") else f"rung {rung.name!r} has no backward"


def _backward_rung(kernel: str, q4, k4, v4, problem):
    """The rung whose backward runs: the forward's rung, or for "auto" when that rung has no
    backward for this problem (sm90_flash at D = 96, 192, 256), the highest one below it that
    has (every rung writes the same natural-log LSE, so the passes mix)."""
    from .dispatch import NOT_AUTO, resolve
    from .registry import KERNELS

    rung = resolve(kernel, q4, k4, v4, problem)
    why = _has_backward(rung, problem)
    if why is not None and kernel == "auto":
        reasons = [f"{rung.name}: {why}"]
        for name in reversed(list(KERNELS)):
            other = KERNELS[name]
            if name in NOT_AUTO or other is rung:
                continue
            other_why = _has_backward(other, problem) or other.supports(q4, k4, v4, problem)
            if other_why is None:
                return other
            reasons.append(f"{name}: {other_why}")
        why = "; ".join(reasons)
    if why is not None:
        raise NotImplementedError(f"attention backward: {why}")
    return rung


def attention_backward(dout, q, k, v, out, lse, *, causal: str | None = None, scale=None, enable_gqa: bool = False,
                       window_size=None, kernel: str = "auto", deterministic: bool | None = None, softcap=None,
                       sinks=None):
    """(dq, dk, dv): gradients of `attention_forward`'s out for the output gradient `dout`,
    given the forward's `out` and `lse` (same causal/scale/enable_gqa/window_size/kernel/
    softcap/sinks arguments). A rung whose backward does not take the problem (a window, a head
    dim, a feature) raises NotImplementedError with its reason, before any launch. With
    GQA, dk and dv sum over the query heads sharing each key/value head.
    With sinks: (dq, dk, dv, dsinks), dsinks shaped and typed as sinks (`features.sinks_gradient`;
    the q, k, v gradients need nothing of the sinks but the lse that includes them).

    deterministic: True asks for bitwise-reproducible gradients (dQ through its own pass, not
    fp32 atomics: `sm90_flash` then hands the pass to `sm80_flash`'s kernels); None follows
    `torch.are_deterministic_algorithms_enabled()`.
    A call whose signature (`runtime.plan_cache`: the six tensors', every option, the resolved
    `deterministic`) was checked before skips the checks and the rung choice: it calls the
    chosen rung's `backward` with the recorded problem."""
    import torch

    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    # plans for the plain problem only: softcap and sinks take the checked path every time
    sig = None if softcap is not None or sinks is not None else \
        _backward_signature(dout, q, k, v, out, lse, causal, scale, enable_gqa, kernel, window_size, deterministic)
    if sig is not None:
        try:
            replay = _BACKWARD_PLANS.get(sig)
        except TypeError:  # an unhashable option: the checks report it
            replay = sig = None
        if replay is not None:
            return replay(dout, q, k, v, out, lse)
    problem = check_inputs(q, k, v, causal=causal, scale=scale, enable_gqa=enable_gqa, window_size=window_size,
                           softcap=softcap, sinks=sinks)
    unbatched = q.dim() == 3
    q4, k4, v4, out4, do4 = (t.unsqueeze(0) if unbatched else t for t in (q, k, v, out, dout))
    lse4 = lse.unsqueeze(0) if unbatched else lse
    if tuple(do4.shape) != tuple(out4.shape) or do4.dtype != out4.dtype:
        raise ValueError(f"attention_backward: dout {tuple(dout.shape)} {dout.dtype} must match out "
                         f"{tuple(out.shape)} {out.dtype}")
    p = problem
    if p.batch * p.heads_q * p.seqlen_q == 0 or p.seqlen_k == 0:
        # No query row or no key: out does not depend on q, k, v.
        grads = (torch.zeros_like(q4), torch.zeros_like(k4), torch.zeros_like(v4))
    else:
        rung = _backward_rung(kernel, q4, k4, v4, problem)
        # Rungs without the option are deterministic already (sm80_flash: a separate dQ pass).
        options = {"deterministic": True} if deterministic and _takes_deterministic(rung) else {}
        grads = rung.backward(do4, q4, k4, v4, out4, lse4, problem, **options)
        if sig is not None and plain_tensors(dout, q, k, v, out, lse):
            _BACKWARD_PLANS.put(sig, _backward_replay(rung, problem, options, unbatched,
                                                      (do4, q4, k4, v4, out4, lse4)))
    grads = tuple(g[0] for g in grads) if unbatched else tuple(grads)
    if sinks is not None:
        grads = (*grads, sinks_gradient(do4, out4, lse4, sinks))
    return grads


_BACKWARD_PLANS = PlanCache("attention.backward")


def _backward_signature(dout, q, k, v, out, lse, causal, scale, enable_gqa, kernel, window_size, deterministic):
    """The plan key of an `attention_backward` call, or None (as `_plan_signature`)."""
    if scale.__class__ not in _SCALE_TYPES:
        return None
    try:
        return (tensor_signature(dout), tensor_signature(q), tensor_signature(k), tensor_signature(v),
                tensor_signature(out), tensor_signature(lse), causal, scale.__class__, scale, enable_gqa, kernel,
                window_size, bool(deterministic))
    except (TypeError, RuntimeError):
        return None


def backward_plan_for(dout, q, k, v, out, lse, *, causal=None, scale=None, enable_gqa: bool = False,
                      window_size=None, kernel: str = "auto", deterministic: bool | None = None):
    """The stored plan of an `attention_backward` call with these arguments, or None:
    `replay(dout, q, k, v, out, lse) -> (dq, dk, dv)` for tensors with the recorded call's
    signature (`deterministic` None: as `torch.are_deterministic_algorithms_enabled()` is now)."""
    if deterministic is None:
        import torch

        deterministic = torch.are_deterministic_algorithms_enabled()
    sig = _backward_signature(dout, q, k, v, out, lse, causal, scale, enable_gqa, kernel, window_size, deterministic)
    try:
        return None if sig is None else _BACKWARD_PLANS.get(sig)
    except TypeError:
        return None


def _backward_replay(rung, problem, options: dict, unbatched: bool, tensors: tuple):
    """What a warm `attention_backward` call runs: the rung's own replay of the backward it
    just ran on the 4-D `tensors` (`backward_plan`, where the rung keeps one: its decisions
    made once), else the chosen rung's backward on the recorded problem. The signature the
    replay is stored under fixes every layout and which tensors require grad."""
    plan_for = getattr(rung, "backward_plan", None)
    fast = plan_for(*(t.detach() for t in tensors), problem, **options) if plan_for is not None else None
    if fast is None:
        backward = rung.backward

        def run(dout, q, k, v, out, lse):
            return tuple(backward(dout, q, k, v, out, lse, problem, **options))
    elif any(t.requires_grad for t in tensors):
        def run(dout, q, k, v, out, lse):  # the kernels' DLPack export refuses tensors that require grad
            return fast(dout.detach(), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach())
    else:
        run = fast
    if unbatched:
        def replay(dout, q, k, v, out, lse):
            grads = run(dout.unsqueeze(0), q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), out.unsqueeze(0),
                        lse.unsqueeze(0))
            return tuple(g[0] for g in grads)
        return replay
    return run


def _takes_deterministic(rung) -> bool:
    import inspect

    return "deterministic" in inspect.signature(rung.backward).parameters


def _attention_function():
    """The torch.autograd.Function behind differentiable calls (built on first use)."""
    global _ATTENTION_FN
    if _ATTENTION_FN is None:
        import torch

        class AttentionFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, sinks, causal, scale, enable_gqa, kernel, window_size, softcap):
                out, lse = attention_forward(q, k, v, causal=causal, scale=scale, enable_gqa=enable_gqa,
                                             window_size=window_size, kernel=kernel, softcap=softcap,
                                             sinks=None if sinks is None else sinks.detach())
                ctx.mark_non_differentiable(lse)
                ctx.set_materialize_grads(False)  # None, not a zeros fill, for lse's gradient
                ctx.save_for_backward(q, k, v, out, lse, sinks)
                ctx.options = dict(causal=causal, scale=scale, enable_gqa=enable_gqa, window_size=window_size,
                                   kernel=kernel, softcap=softcap)
                return out, lse

            @staticmethod
            def backward(ctx, dout, _dlse):
                if dout is None:
                    return (None,) * 10
                q, k, v, out, lse, sinks = ctx.saved_tensors
                grads = attention_backward(dout, q, k, v, out, lse, sinks=sinks, **ctx.options)
                dsinks = grads[3] if sinks is not None and ctx.needs_input_grad[3] else None
                return grads[0], grads[1], grads[2], dsinks, None, None, None, None, None, None

        _ATTENTION_FN = AttentionFunction
    return _ATTENTION_FN


_ATTENTION_FN = None


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale=None, enable_gqa: bool = False, *, window_size=None, softcap=None, sinks=None,
                                 return_lse: bool = False, kernel: str = "auto"):
    """torch.nn.functional.scaled_dot_product_attention on the cute_kernels ladder.

    q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv) (or all without B), fp16/bf16 on
    one CUDA device, head dim contiguous (other strides free: (B, S, H, D) tensors transposed
    to (B, H, S, D) are used in place). Returns out (B, Hq, Sq, Dv). `kernel`: "auto" or a rung
    name from `cute_kernels.attention.KERNELS`. window_size: None or (left, right), a sliding
    window in FlashAttention's convention (-1 for an unbounded side; with a causal mask right
    must be -1 or 0; see the module docstring). softcap: scores softcap * tanh(scale q.k /
    softcap); sinks (Hq,): one logit per query head joining the softmax denominator
    (`features`). return_lse: return (out, lse (B, Hq, Sq) fp32, natural log, including the
    sinks; not differentiable). Raises NotImplementedError for dropout and an arbitrary dense
    attn_mask, and ValueError/TypeError for bad inputs, before any launch.
    Differentiable in q, k, v and sinks (see the module docstring).
    """
    if attn_mask is None and dropout_p.__class__ is float and dropout_p == 0.0 and is_causal.__class__ is bool:
        # the warm path: a plan of `attention_forward` for this signature, if none requires grad
        sig = _plan_signature(q, k, v, "top_left" if is_causal else None, scale, enable_gqa, kernel, window_size,
                              softcap, sinks)
        if sig is not None and not (sig[0][-1] or sig[1][-1] or sig[2][-1] or (sig[-1] is not None and sig[-1][-1])):
            try:
                plan = _PLANS.get(sig)
            except TypeError:  # an unhashable option: the checks report it
                plan = None
            if plan is not None:
                out, lse = plan(q, k, v, sinks)
                return (out, lse) if return_lse else out
    if not isinstance(dropout_p, numbers.Real) or isinstance(dropout_p, bool):
        raise TypeError(f"scaled_dot_product_attention: dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"scaled_dot_product_attention: dropout_p={dropout_p} is not supported by the cute_kernels attention "
            "kernels (inference forward only); pass dropout_p=0.0"
        )
    if not isinstance(is_causal, bool):
        raise TypeError(f"scaled_dot_product_attention: is_causal must be a bool, got {type(is_causal).__name__}")
    import torch

    causal = _causal_from_mask(attn_mask, is_causal)
    if attn_mask is not None and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor):
        want = (q.shape[-2], k.shape[-2]) if q.dim() >= 2 and k.dim() >= 2 else None
        have = (attn_mask.seq_len_q, attn_mask.seq_len_kv)
        if want is not None and have != want:
            raise ValueError(f"scaled_dot_product_attention: the causal attn_mask is built for (Sq, Sk) = {have} but "
                             f"query and key have {want}")
    tensors = [t for t in (q, k, v, sinks) if isinstance(t, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        problem = check_inputs(q, k, v, causal=causal, scale=scale, enable_gqa=enable_gqa, window_size=window_size,
                               softcap=softcap, sinks=sinks)
        q4, k4, v4 = (t.unsqueeze(0) if t.dim() == 3 else t for t in (q, k, v))
        if problem.seqlen_k and problem.batch * problem.heads_q * problem.seqlen_q:
            _backward_rung(kernel, q4, k4, v4, problem)  # refuse before launching what cannot be differentiated
        out, lse = _attention_function().apply(q, k, v, sinks, causal, scale, enable_gqa, kernel, window_size,
                                               softcap)
    else:
        out, lse = attention_forward(q, k, v, causal=causal, scale=scale, enable_gqa=enable_gqa,
                                     window_size=window_size, kernel=kernel, softcap=softcap, sinks=sinks)
    return (out, lse) if return_lse else out
