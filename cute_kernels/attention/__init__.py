"""Attention on the CuTe DSL: PyTorch's SDPA interface over a ladder of kernels.

- `scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
  scale=None, enable_gqa=False, *, window_size=None, softcap=None, sinks=None, return_lse=False,
  kernel="auto")`: PyTorch's signature,
  (B, H, S, D), plus FlashAttention's sliding window `window_size=(left, right)` (-1 unbounded).
- `attention_forward(q, k, v, *, causal=None, scale=None, enable_gqa=False, window_size=None,
  kernel="auto")` -> (out, lse): the internal entry, with the log-sum-exp for a backward;
  `attention_backward(dout, q, k, v, out, lse, ...)` -> (dq, dk, dv).
- `attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
  causal, scale, window_size, kernel, page_table)` -> (out (Tq, Hq, Dv), lse (Hq, Tq)): packed
  variable-length batches, the keys packed too or in a paged cache (`page_table`,
  `paged_prefill`); `attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q,
  cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, ...)` -> (dq, dk, dv).
- `paged_decode(q, k_cache, v_cache, block_table, seqlens_k, *, scale, kernel)` -> out (B, Hq, Dv):
  one query token per sequence over a paged KV cache (split-KV, the `decode` rung); its indices
  are checked on the device, errors surface from `raise_paged_decode_errors()`.
- `KERNELS`: the ladder (`sm80_flash`, `sm90_flash`, `decode`).

Every dense and varlen entry also takes the keyword-only score features of `features`:
`softcap` (Gemma 2's capped logits) and `sinks` (Hq,) (gpt-oss's per-head sink logits; the
backward entries then also return dsinks), and the varlen entries `seqused_k` (key lengths per
sequence); `scaled_dot_product_attention` takes `return_lse`. A rung that lacks a feature
declines it in `supports`.

The kernel composes small modules, as flash-attention's CuTe kernels do: `mask` (causal
alignments, sliding windows, sequence ends; the rule itself is in the DSL-free `mask_rule`),
`softmax` (online softmax in base 2), `block_info` (which K/V blocks a Q block visits),
`seqlen_info` (varlen offsets), `fragments` (register views).
Names are imported lazily: importing the package loads neither torch nor the DSL.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "scaled_dot_product_attention": "api",
    "attention_forward": "api",
    "attention_backward": "api",
    "AttentionProblem": "api",
    "attention_varlen_forward": "varlen",
    "attention_varlen_backward": "varlen",
    "paged_decode": "paged",
    "raise_paged_decode_errors": "paged",
    "paged_decode_errors": "paged",
    "PagedDecodeIndexError": "paged",
    "sinks_gradient": "features",
    "PagedProblem": "paged",
    "KERNELS": "registry",
    "LADDER": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cute_kernels.attention' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
