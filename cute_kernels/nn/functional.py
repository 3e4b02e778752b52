"""Functional forms, drop-in for their `torch.nn.functional` namesakes.

Both compute the `cute_kernels::` operators (so they compile, capture and differentiate as those
do; in eager mode a warm call replays its launch without entering the op: `runtime.eager`) and
add two keyword options: `kernel` (a rung name, or "auto"; the operators' `rung` argument) and
`fallback` ("none": input our kernels do not take raises; "torch": PyTorch computes it, with a
`FallbackWarning`).
"""

from __future__ import annotations

import torch

from cute_kernels import ops
from cute_kernels.ops.eager_attention import sdpa as sdpa_entry
from cute_kernels.ops.eager_gemm import linear as linear_entry
from cute_kernels.ops.fallback import check_fallback, note_fallback

__all__ = ["linear", "scaled_dot_product_attention"]


def linear(input, weight, bias=None, *, activation=None, kernel: str = "auto", fallback: str = "none"):
    """activation(input @ weightᵀ + bias), as torch.nn.functional.linear plus `activation`
    (None, "relu", "gelu" (erf), "gelu_tanh" or "silu")."""
    return linear_entry(input, weight, bias, activation, kernel, fallback)


def _causal(attn_mask, is_causal: bool):
    """The causal alignment ("top_left", "bottom_right" or None) the mask arguments ask for, or
    NotImplemented for a mask our kernels do not take (a dense tensor)."""
    if attn_mask is None:
        return "top_left" if is_causal else None
    from torch.nn.attention.bias import CausalBias, CausalVariant

    if isinstance(attn_mask, CausalBias):
        if is_causal:
            raise ValueError("scaled_dot_product_attention: pass either is_causal=True or a causal attn_mask, not both")
        return "bottom_right" if attn_mask.variant == CausalVariant.LOWER_RIGHT else "top_left"
    if isinstance(attn_mask, torch.Tensor):
        return NotImplemented
    raise TypeError(f"scaled_dot_product_attention: attn_mask must be None, a tensor or a CausalBias, got "
                    f"{type(attn_mask).__name__}")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale=None, enable_gqa: bool = False, *, window_size=None, softcap=None, sinks=None,
                                 return_lse: bool = False, kernel: str = "auto", fallback: str = "none"):
    """torch.nn.functional.scaled_dot_product_attention on the cute_kernels attention kernels.

    Masks: is_causal=True (top-left, as PyTorch) or attn_mask=torch.nn.attention.bias.
    causal_lower_right(Sq, Sk) / causal_upper_left(Sq, Sk), and window_size=(left, right):
    FlashAttention's sliding window (-1 for an unbounded side; aligned bottom-right without
    causality; `cute_kernels.attention.mask_rule`). softcap (scores softcap * tanh(scale q.k /
    softcap)) and sinks (Hq,) (one logit per query head in the softmax denominator; gpt-oss):
    `cute_kernels.attention.features`; differentiable in sinks too. return_lse: return (out,
    lse (..., Hq, Sq) fp32, natural log, sinks included). A dense attn_mask tensor and
    dropout_p > 0 are not supported by our kernels: NotImplementedError, or with
    fallback="torch" PyTorch's SDPA (given the window as a boolean mask), or the PyTorch
    definition (`attention_reference.masked_attention`) when a feature or the lse is asked for.
    Differentiable through `cute_kernels::sdpa`'s backward.
    """
    check_fallback("scaled_dot_product_attention", fallback)
    if attn_mask is None and window_size is None and dropout_p == 0.0 and (is_causal is True or is_causal is False) \
            and softcap is None and sinks is None and not return_lse:
        # the common call, with nothing to translate
        return sdpa_entry(query, key, value, "top_left" if is_causal else None, scale, enable_gqa, -1, -1, kernel,
                          fallback)[0]
    causal = _causal(attn_mask, is_causal)
    left, right = _window_ints(window_size, None if causal is NotImplemented else causal)
    if causal is NotImplemented or dropout_p != 0.0:
        what = "a dense attn_mask tensor" if causal is NotImplemented else f"dropout_p={dropout_p}"
        reason = (f"{what} is not supported by the cute_kernels attention kernels (they take is_causal=True or "
                  "a causal_lower_right/causal_upper_left CausalBias, and dropout_p=0)")
        if fallback != "torch":
            raise NotImplementedError(f"scaled_dot_product_attention: {reason}; pass fallback='torch' to use "
                                      "torch.nn.functional.scaled_dot_product_attention for such calls")
        note_fallback("scaled_dot_product_attention", reason)
        if softcap is not None or sinks is not None or return_lse:
            return _by_definition(query, key, value, attn_mask, dropout_p, is_causal, causal, scale, enable_gqa,
                                  window_size, softcap, sinks, return_lse)
        extra = {"enable_gqa": True} if enable_gqa else {}
        if window_size is not None:
            attn_mask, is_causal = _with_window(query, key, attn_mask, is_causal, causal, window_size), False
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **extra)
    if softcap is None and sinks is None:  # the eager entry replays the op's plain form
        out, lse = sdpa_entry(query, key, value, causal, scale, enable_gqa, left, right, kernel, fallback)
        return (out, lse) if return_lse else out
    features = {}
    if softcap is not None:
        features["softcap"] = softcap
    if sinks is not None:
        features["sinks"] = sinks
    out, lse = ops.sdpa(query, key, value, causal, scale, enable_gqa, left, right, rung=kernel, fallback=fallback,
                        **features)
    return (out, lse) if return_lse else out


def _by_definition(query, key, value, attn_mask, dropout_p, is_causal, causal, scale, enable_gqa, window_size,
                   softcap, sinks, return_lse):
    """The fallback for a dense mask or dropout with a feature (or the lse) PyTorch's SDPA lacks."""
    from cute_kernels.attention.features import check_sinks, check_softcap
    from cute_kernels.ops.attention_reference import masked_attention

    who = "scaled_dot_product_attention"
    check_softcap(softcap, who)
    check_sinks(sinks, query.shape[-3], query, who)
    if isinstance(attn_mask, torch.Tensor):
        if is_causal:
            raise ValueError(f"{who}: pass either is_causal=True or attn_mask, not both")
        causal = None
    out, lse = masked_attention(query, key, value, attn_mask if isinstance(attn_mask, torch.Tensor) else None,
                                dropout_p, causal, scale, enable_gqa, window_size, softcap, sinks)
    return (out, lse) if return_lse else out


def _window_ints(window_size, causal):
    """The ops' (window_left, window_right) for `window_size` (None: (-1, -1)), checked."""
    from cute_kernels.attention.mask_rule import canonical_window

    if window_size is None:
        return -1, -1
    canonical_window(window_size, causal, "scaled_dot_product_attention")
    return int(window_size[0]), int(window_size[1])


def _with_window(query, key, attn_mask, is_causal: bool, causal, window_size):
    """The attn_mask PyTorch's SDPA is given for a windowed call our kernels do not take: the
    window (and the causal mask, whichever form it came in) as a boolean mask, combined with
    a dense attn_mask tensor (boolean: and; additive: -inf outside the window)."""
    from cute_kernels.attention.mask_rule import canonical_window, dense_mask

    dense = isinstance(attn_mask, torch.Tensor)
    causal, left, right = canonical_window(window_size, None if dense else causal, "scaled_dot_product_attention")
    if dense and is_causal:
        raise ValueError("scaled_dot_product_attention: pass either is_causal=True or attn_mask, not both")
    keep = dense_mask(query.shape[-2], key.shape[-2], causal=causal is not None, align=causal or "top_left",
                      window_left=left, window_right=right, device=query.device)
    if not dense:
        return keep
    if attn_mask.dtype == torch.bool:
        return attn_mask & keep
    return attn_mask.masked_fill(~keep, float("-inf"))
