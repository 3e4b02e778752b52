"""PyTorch operators under the `cute_kernels` namespace (`torch.ops.cute_kernels.*`).

Importing this package registers them (it imports torch, not the kernel layer, which loads on
the first call):

- `matmul(a, b, out_dtype=None, kernel="auto", fallback="none")`: 2-D and batched GEMM.
- `linear(x, weight, bias=None, activation=None, kernel="auto", fallback="none")`:
  activation in {None, "relu", "gelu_tanh", "silu"}.
- `scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=None, kernel="auto", fallback="none")`: FP8.
- `sdpa(q, k, v, causal=None, scale=None, enable_gqa=False, kernel="auto", fallback="none")`
  -> (out, lse), and `sdpa_backward(...)` -> (dq, dk, dv).
- `sdpa_varlen(...)` -> (out, lse), `paged_decode(...)` -> out.

Every op has a fake (shape/dtype inference) and, where it has a backward, an autograd formula.
`fallback="torch"` computes input our kernels do not take with PyTorch, visibly (see `fallback`).
"""

from __future__ import annotations

from .attention import CAUSAL, paged_decode, sdpa, sdpa_backward, sdpa_varlen
from .fallback import FALLBACK_COUNTS, FALLBACKS, FallbackWarning
from .gemm import ACTIVATIONS, linear, matmul, scaled_mm

OPS = ("matmul", "linear", "scaled_mm", "sdpa", "sdpa_backward", "sdpa_varlen", "paged_decode")

__all__ = [
    "matmul", "linear", "scaled_mm", "sdpa", "sdpa_backward", "sdpa_varlen", "paged_decode",
    "ACTIVATIONS", "CAUSAL", "FALLBACKS", "FALLBACK_COUNTS", "FallbackWarning", "OPS",
]
