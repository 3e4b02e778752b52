"""PyTorch operators under the `cute_kernels` namespace (`torch.ops.cute_kernels.*`).

Importing this package registers them (it imports torch, not the kernel layer, which loads on
the first call):

- `matmul(a, b, out_dtype=None, rung="auto", fallback="none")`: 2-D and batched GEMM.
- `linear(x, weight, bias=None, activation=None, rung="auto", fallback="none")`:
  activation in {None, "relu", "gelu_tanh", "silu"}.
- `scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=None, rung="auto", fallback="none")`: FP8.
- `sdpa(q, k, v, causal=None, scale=None, enable_gqa=False, window_left=-1, window_right=-1,
  rung="auto", fallback="none")` -> (out, lse), and `sdpa_backward(...)` -> (dq, dk, dv);
  window_left/right: FlashAttention's sliding window, -1 for an unbounded side.
- `sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=None,
  scale=None, window_left=-1, window_right=-1, rung="auto", fallback="none")` -> (out, lse),
  differentiable through `sdpa_varlen_backward(...)` -> (dq, dk, dv); `paged_decode(...)` -> out.

`rung` names a rung of the ladder (`cute_kernels.gemm.KERNELS`, `cute_kernels.attention.KERNELS`)
or "auto"; it is the kernel layer's `kernel=` argument under another name (see
`RESERVED_ARGUMENT_NAMES`). Every op has a fake (shape/dtype inference) and, where it has a
backward, an autograd formula. `fallback="torch"` computes input our kernels do not take with
PyTorch, visibly (see `fallback`).
"""

from __future__ import annotations

from .attention import CAUSAL, paged_decode, sdpa, sdpa_backward, sdpa_varlen, sdpa_varlen_backward
from .fallback import FALLBACK_COUNTS, FALLBACKS, FallbackWarning
from .gemm import ACTIVATIONS, linear, matmul, scaled_mm
from . import eager_attention, eager_gemm  # noqa: E402,F401 (the eager entries; they register the autocast rules)

OPS = ("matmul", "linear", "scaled_mm", "sdpa", "sdpa_backward", "sdpa_varlen", "sdpa_varlen_backward", "paged_decode")

# Names no schema argument of ours may take. Inductor lowers an op it has no lowering for through
# `FallbackKernel.create(kernel, *args, **kwargs)`, passing the schema's defaulted arguments as
# keywords, so an argument named `kernel` fails to compile ("got multiple values for argument
# 'kernel'"). The others are kept free as a precaution: method receivers and the named
# parameters of Inductor's extern-kernel IR constructors.
RESERVED_ARGUMENT_NAMES = frozenset({"kernel", "cls", "self", "name", "layout", "op_overload", "python_kernel_name"})

__all__ = [
    "matmul", "linear", "scaled_mm", "sdpa", "sdpa_backward", "sdpa_varlen", "sdpa_varlen_backward", "paged_decode",
    "ACTIVATIONS", "CAUSAL", "FALLBACKS", "FALLBACK_COUNTS", "FallbackWarning", "OPS", "RESERVED_ARGUMENT_NAMES",
]
