"""The "cute_kernels" attention implementation for Hugging Face transformers.

Importing this module registers it (no GPU needed, the DSL is not imported):

    import cute_kernels.integrations.transformers
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="cute_kernels")
    # or, on a model already built: model.set_attn_implementation("cute_kernels"),
    # or cute_kernels.nn.patch(model), which also swaps the linear (and norm) layers.

Two functions are registered under the name, as for transformers' own backends:
- `attention_forward` with `AttentionInterface`: the call every attention layer makes, with
  transformers' signature (q (B, Hq, Sq, D), k, v (B, Hkv, Sk, D) after the KV cache update;
  returns (out (B, Sq, Hq, Dv), None));
- `hf_masks.attention_mask` with `AttentionMaskInterface`: the mask the model builds once per
  forward, which reaches `attention_forward` as `attention_mask` (see `hf_masks`).

What a call takes, and where it goes:
- no mask (no padding): the dense kernels (`cute_kernels.nn.functional.
  scaled_dot_product_attention`), GQA without repeat_kv; a decode step (few queries over a long
  cache) goes there too, where the dense entry routes it to the split-KV decode kernel;
- a key-padding mask, packed sequences (segment ids from `position_ids`), or a causal call
  with fewer queries than keys (a continued prefill): `cute_kernels::sdpa_masked`, which
  unpads to the varlen kernels and pads back inside one operator;
- explicit cumulative lengths (`cu_seq_lens_q/k`, `max_length_q/k`, padding-free batches):
  the varlen operator directly;
- `sliding_window` (Mistral, Qwen2, gpt-oss: a query sees its last `sliding_window` keys, as
  transformers' masks define it), `softcap` (Gemma 2), `s_aux` (gpt-oss's attention sinks),
  `scaling`, `is_causal`.
What it does not take raises before any launch, naming the argument and the way out:
attention dropout in training (`dropout`), a dense mask (an arbitrary pattern, a float bias,
`position_bias`), `output_attentions=True`, `head_mask`. With fallback="torch" (`use(model,
fallback="torch")`, or `register(name, fallback="torch")`) PyTorch computes those calls by the
definition instead, and our operators hand what our kernels do not take (CPU tensors among it)
to PyTorch, visibly (`cute_kernels.ops.fallback`).
"""

from __future__ import annotations

import functools
import math

import torch

from cute_kernels.ops import attention_masked as masked_ops
from cute_kernels.ops import sdpa_varlen
from cute_kernels.ops.fallback import check_fallback, note_fallback

from cute_kernels.nn import ahead

from . import graph_decode, hf_masks

__all__ = ["NAME", "attention_forward", "register", "use"]

NAME = "cute_kernels"
# Per-model options (`use`): set on each module of the model, read by `attention_forward`.
OPTIONS_ATTRIBUTE = "_cute_kernels_attention"
_DEFAULTS = ("auto", "none")  # (kernel, fallback)


def register(name: str = NAME, *, kernel: str = "auto", fallback: str = "none") -> str:
    """Register `attention_forward` and the mask hook under `name`, with these default options
    (per-model options set by `use` take precedence); returns `name`."""
    from transformers import AttentionInterface, AttentionMaskInterface

    check_fallback("integrations.transformers.register", fallback)
    fn = attention_forward if (kernel, fallback) == _DEFAULTS else functools.partial(
        attention_forward, _options=(kernel, fallback))
    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, hf_masks.attention_mask)
    return name


def use(model, *, kernel: str = "auto", fallback: str = "none"):
    """Switch a transformers model (in place) to the "cute_kernels" attention with these
    options (`kernel`: the attention rung or "auto"; `fallback`). Returns the model. Raises
    TypeError when the model cannot switch (its attention does not go through
    transformers' `AttentionInterface`)."""
    check_fallback("integrations.transformers.use", fallback)
    if not isinstance(kernel, str):
        raise TypeError(f"integrations.transformers.use: kernel must be a str, got {type(kernel).__name__}")
    can_set = getattr(type(model), "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        raise TypeError(f"{type(model).__name__} does not route its attention through transformers' "
                        "AttentionInterface, so it cannot use attn_implementation='cute_kernels'")
    for module in model.modules():
        object.__setattr__(module, OPTIONS_ATTRIBUTE, (kernel, fallback))
    model.set_attn_implementation(NAME)
    return model


# ---- the attention call ----------------------------------------------------------------------------

def _refuse(what: str, way_out: str, fallback: str) -> bool:
    """Raise NotImplementedError for `what` unless fallback="torch" (then note it and return
    True: the caller computes with PyTorch)."""
    if fallback != "torch":
        raise NotImplementedError(f"cute_kernels attention: {what} is not supported by the cute_kernels kernels; "
                                  f"{way_out}, or use cute_kernels.integrations.transformers.use(model, "
                                  "fallback='torch') to compute such calls with PyTorch")
    note_fallback("transformers_attention", what)
    return True


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, s_aux=None, *, _options=_DEFAULTS,
                      **kwargs):
    """transformers' attention-function signature on our kernels (module docstring)."""
    kernel, fallback = getattr(module, OPTIONS_ATTRIBUTE, _options)
    if graph_decode.ACTIVE:  # a decode step over a GraphDecodeCache: its fixed buffers, device lengths
        return graph_decode.decode_attention(query, key, value, scaling, fallback), None
    if kwargs.get("output_attentions"):
        raise ValueError("cute_kernels attention: output_attentions=True asks for the attention weights, which "
                         "the fused kernels never form; use attn_implementation='eager' for that")
    if kwargs.get("head_mask") is not None:
        raise NotImplementedError("cute_kernels attention: head_mask is not supported; use "
                                  "attn_implementation='eager' for it")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    sq, sk = query.shape[2], key.shape[2]
    window = _window(sliding_window, causal, sk)
    sinks = s_aux
    refused = _refusal(attention_mask, kwargs.get("position_bias"), dropout, window)
    if refused is not None:
        _refuse(*refused, fallback)
        out = _torch_attention(query, key, value, attention_mask, kwargs.get("position_bias"), dropout, scaling,
                               causal, softcap, sinks, module.training, sliding_window)
        return out, None
    left = -1 if window is None else window
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if attention_mask is None and cu_q is not None and cu_k is not None:
        return _varlen(query, key, value, cu_q, cu_k, kwargs, causal, scaling, left, softcap, sinks, kernel,
                       fallback), None
    if attention_mask is None and (sq == sk or sq == 1 or not causal):
        return _dense(query, key, value, causal and sq > 1, scaling, left, softcap, sinks, kernel, fallback), None
    key_mask = segments = None
    if attention_mask is not None and attention_mask.dtype == torch.int32:
        segments = attention_mask
    elif attention_mask is not None:
        key_mask = attention_mask
    out, _ = masked_ops.sdpa_masked(query, key, value, key_mask, segments, "bottom_right" if causal else None,
                                    scaling, left, -1, softcap, sinks, rung=kernel, fallback=fallback)
    return out, None


def _refusal(attention_mask, position_bias, dropout, window):
    """(what, way out) for a call our kernels do not take, or None."""
    eager = "use attn_implementation='eager' (or 'sdpa') for this model"
    if position_bias is not None:
        return "position_bias (a float bias added to the scores)", eager
    if dropout and dropout > 0:
        return (f"dropout={dropout} (attention dropout in training)",
                "set the config's attention_dropout to 0 (model.config.attention_dropout = 0.0) or call model.eval()")
    if window == "unsupported":
        return "a sliding window on a bidirectional (non-causal) attention", eager
    if attention_mask is not None and not _structured(attention_mask):
        shape = "x".join(str(n) for n in attention_mask.shape)
        return (f"a dense attention_mask ({shape} {attention_mask.dtype}: a pattern or bias other than padding, "
                "packing, causality and sliding windows)", eager)
    return None


def _structured(mask) -> bool:
    """A mask our hook hands on (`hf_masks`): 2-D bool padding or int32 segments."""
    return isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.dtype in (torch.bool, torch.int32)


def _window(sliding_window, causal: bool, seqlen_k: int):
    """The window's left bound for the kernels (None: no window), or "unsupported"."""
    if sliding_window is None:
        return None
    if not causal:
        return "unsupported"
    w = int(sliding_window)
    if w < 1:
        raise ValueError(f"cute_kernels attention: sliding_window must be >= 1, got {sliding_window!r}")
    # transformers' window: kv_idx > q_idx - w, i.e. w - 1 keys to the left of the diagonal.
    # With at most w keys no query can lose one, so no window is needed.
    return None if seqlen_k <= w else w - 1


# ---- compile-ahead: the attention calls a patched model's first step will make ----------------------

def predicted_call(query, key, value, causal: bool, scaling, sliding_window, softcap, sinks, kernel, fallback):
    """What `attention_forward` computes for a call without a mask (a batch without padding): the
    call `_predict` has compile-ahead workers make."""
    window = _window(sliding_window, causal, key.shape[2])
    if window == "unsupported":
        return None
    left = -1 if window is None else window
    return _dense(query, key, value, causal and query.shape[2] > 1, scaling, left, softcap, sinks, kernel, fallback)


def _predict(model, x):
    """`nn.ahead` predictor: for a model on this attention, given its first layer call's input x
    (batch, tokens, hidden), one call per distinct attention configuration of its layers, q, k
    and v laid out as transformers' projections leave them ((B, S, H, D) viewed as (B, H, S, D)):
    (forward calls, backward calls)."""
    from cute_kernels.runtime.compile_ahead import Call, TensorSpec

    if getattr(getattr(model, "config", None), "_attn_implementation", None) != NAME or x.dim() != 3:
        return [], []
    b, s = x.shape[:2]
    grad = torch.is_grad_enabled() and model.training
    device = str(x.device)
    forwards, backwards, seen = [], [], set()
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is None or not all(hasattr(m, a) for a in ("layer_idx", "scaling", "head_dim")):
            continue
        hq = config.num_attention_heads
        hkv = getattr(config, "num_key_value_heads", None) or hq
        d = m.head_dim
        kernel, fallback = getattr(m, OPTIONS_ATTRIBUTE, _DEFAULTS)
        sinks = getattr(m, "sinks", None)
        options = (bool(getattr(m, "is_causal", True)), m.scaling, getattr(m, "sliding_window", None),
                   getattr(m, "attn_logit_softcapping", None))
        signature = (hq, hkv, d, options, None if sinks is None else tuple(sinks.shape), kernel, fallback)
        if signature in seen:
            continue
        seen.add(signature)

        def spec(heads):
            return TensorSpec((b, heads, s, d), (s * heads * d, d, heads * d, 1), x.dtype, device, requires_grad=grad)

        args = (spec(hq), spec(hkv), spec(hkv), *options,
                None if sinks is None else TensorSpec.of(sinks), kernel, fallback)
        call = functools.partial(Call, "cute_kernels.integrations.transformers:predicted_call", args, grad=grad,
                                 imports=("cute_kernels.integrations.transformers",))
        forwards.append(call(backward=False))
        if grad:
            backwards.append(call(backward=True))
    return forwards, backwards


def _features(softcap, sinks) -> dict:
    return masked_ops._features(softcap, sinks)


def _dense(query, key, value, causal: bool, scaling, left: int, softcap, sinks, kernel, fallback):
    from cute_kernels.nn import functional as cf

    out = cf.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling,
                                          enable_gqa=query.shape[1] != key.shape[1],
                                          window_size=None if left == -1 else (left, 0 if causal else -1),
                                          kernel=kernel, fallback=fallback, **_features(softcap, sinks))
    return out.transpose(1, 2)


def _varlen(query, key, value, cu_q, cu_k, kwargs, causal: bool, scaling, left: int, softcap, sinks, kernel,
            fallback):
    """Padding-free batches (transformers' `DataCollatorWithFlattening`): q (1, Hq, T, D) with
    explicit cumulative lengths."""
    if query.shape[0] != 1:
        raise ValueError(f"cute_kernels attention: cu_seq_lens_q/k describe one flattened row, but the query has "
                         f"batch {query.shape[0]}")
    flat = lambda t: t[0].transpose(0, 1)  # noqa: E731 - (1, H, T, D) -> (T, H, D)
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    max_q = int(max_q) if max_q is not None else int((cu_q[1:] - cu_q[:-1]).max())
    max_k = int(max_k) if max_k is not None else int((cu_k[1:] - cu_k[:-1]).max())
    out, _ = sdpa_varlen(flat(query), flat(key), flat(value), cu_q.to(torch.int32), cu_k.to(torch.int32), max_q,
                         max_k, "bottom_right" if causal else None, scaling, left, -1, rung=kernel, fallback=fallback,
                         **_features(softcap, sinks))
    return out.unsqueeze(0)


def _torch_attention(query, key, value, attention_mask, position_bias, dropout, scaling, causal: bool, softcap,
                     sinks, training: bool, sliding_window):
    """Attention by its definition in PyTorch (fallback="torch"): what transformers' eager
    attention computes, masks, bias, soft cap, sinks and dropout included. Returns
    (B, Sq, Hq, Dv)."""
    b, hq, sq, d = query.shape
    sk = key.shape[2]
    k = key.repeat_interleave(hq // key.shape[1], dim=1)
    v = value.repeat_interleave(hq // value.shape[1], dim=1)
    scale = 1.0 / math.sqrt(d) if scaling is None else scaling
    acc = torch.promote_types(query.dtype, torch.float32)
    s = (query.to(acc) @ k.to(acc).transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    keep = None
    if attention_mask is None or attention_mask.dim() == 2:
        i = torch.arange(sq, device=query.device)[:, None] + (sk - sq)
        j = torch.arange(sk, device=query.device)[None, :]
        keep = (j <= i) if causal else torch.ones(sq, sk, dtype=torch.bool, device=query.device)
        if sliding_window is not None:
            w = int(sliding_window)
            keep = keep & ((j > i - w) if causal else ((i - j).abs() <= w))
        if attention_mask is not None and attention_mask.dtype == torch.int32:  # packed segments
            keep = keep & (attention_mask[:, None, :, None] == attention_mask[:, None, None, :])
        elif attention_mask is not None:
            keep = keep & attention_mask[:, None, None, :sk].bool()
    elif attention_mask.dtype == torch.bool:
        keep = attention_mask
    else:
        s = s + attention_mask.to(acc)
    if position_bias is not None:
        s = s + position_bias.to(acc)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.to(acc).reshape(1, -1, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # rows with no visible key (padding queries)
    if sinks is not None:
        p = p[..., :-1]
    p = torch.nn.functional.dropout(p, p=dropout, training=training)
    return (p.to(v.dtype) @ v).transpose(1, 2)


register()
if _predict not in ahead.PREDICTORS:
    ahead.PREDICTORS.append(_predict)
