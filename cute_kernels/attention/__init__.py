"""Attention on the CuTe DSL: PyTorch's SDPA interface over a ladder of kernels.

- `scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
  scale=None, enable_gqa=False, *, kernel="auto")`: PyTorch's signature, (B, H, S, D).
- `attention_forward(q, k, v, *, causal=None, scale=None, enable_gqa=False, kernel="auto")`
  -> (out, lse): the internal entry, with the log-sum-exp for a backward;
  `attention_backward(dout, q, k, v, out, lse, ...)` -> (dq, dk, dv).
- `KERNELS`: the ladder (`sm80_flash`; `sm90_flash` and the decode kernel to come).

The kernel composes small modules, as flash-attention's CuTe kernels do: `mask` (causal
alignments, sequence ends), `softmax` (online softmax in base 2), `block_info` (which K/V blocks
a Q block visits), `seqlen_info` (varlen offsets), `fragments` (register views).
Names are imported lazily: importing the package loads neither torch nor the DSL.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "scaled_dot_product_attention": "api",
    "attention_forward": "api",
    "attention_backward": "api",
    "AttentionProblem": "api",
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
