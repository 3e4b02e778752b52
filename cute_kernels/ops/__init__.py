"""PyTorch operators under the `cute_kernels` namespace (`torch.ops.cute_kernels.*`).

Importing this package registers them (it imports torch, not the kernel layer, which loads on
the first call):

- `matmul(a, b, out_dtype=None, rung="auto", fallback="none")`: 2-D and batched GEMM.
- `linear(x, weight, bias=None, activation=None, rung="auto", fallback="none")`:
  activation in {None, "relu", "gelu", "gelu_tanh", "silu"} (`gemm.activations`), differentiable
  through `linear_backward(grad, x, weight, bias, out, activation, input_grad, weight_grad,
  bias_grad, ...)` -> (dx, dw, db) (the eager backward's and a compiled backward graph's).
- `linear_swiglu(x, weight, need_preact=True, rung="auto", fallback="none")` -> (h, p): silu(gate) * up of x
  times an interleaved gate-up weight, gated in the GEMM's epilogue on sm_90 (`gated`),
  differentiable through `linear_swiglu_backward`.
- `scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=None, rung="auto", fallback="none")`: FP8.
- `sdpa(q, k, v, causal=None, scale=None, enable_gqa=False, window_left=-1, window_right=-1,
  rung="auto", fallback="none")` -> (out, lse), and `sdpa_backward(...)` -> (dq, dk, dv);
  window_left/right: FlashAttention's sliding window, -1 for an unbounded side.
- `sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=None,
  scale=None, window_left=-1, window_right=-1, rung="auto", fallback="none")` -> (out, lse),
  differentiable through `sdpa_varlen_backward(...)` -> (dq, dk, dv); `paged_decode(...)` -> out.
  The dense and varlen ops end with `softcap=None, sinks=None` (varlen also `seqused_k=None`):
  logit soft-capping and per-head sinks (`cute_kernels.attention.features`), differentiable in
  sinks.
- the fused memory-bound ops (`FUSED_OPS`, module `fused`; they take no `rung`): `norm`, `softmax`,
  `cross_entropy`, `rotary` / `rotary_`, `swiglu`, `linear_cross_entropy` and their backwards.

`rung` names a rung of the ladder (`cute_kernels.gemm.KERNELS`, `cute_kernels.attention.KERNELS`)
or "auto"; it is the kernel layer's `kernel=` argument under another name (see
`RESERVED_ARGUMENT_NAMES`). Every op has a fake (shape/dtype inference) and, where it has a
backward, an autograd formula. `fallback="torch"` computes input our kernels do not take with
PyTorch, visibly (see `fallback`).

`sdpa_masked(q, k, v, key_mask, segments, ...)` -> (out (B, Sq, Hq, Dv), lse) takes a padded or
packed (B, H, S, D) batch in one opaque op (unpad, varlen, pad back inside), with its backward
(`attention_masked`; what the transformers integration runs for masked calls). It and the
varlen ops read device values on the host (a mask's plan, the offsets' check), so they carry
torch's `cudagraph_unsafe` tag (`HOST_READ_TAGS`): torch.compile's CUDA graphs leave them out.
"""

from __future__ import annotations

from .attention import CAUSAL, paged_decode, sdpa, sdpa_backward, sdpa_varlen, sdpa_varlen_backward
from .attention_masked import sdpa_masked, sdpa_masked_backward
from .fallback import FALLBACK_COUNTS, FALLBACKS, FallbackWarning
from .gemm import ACTIVATIONS, linear, linear_backward, matmul, scaled_mm
from .gated import linear_swiglu, linear_swiglu_backward
from . import fused
from .fused import (cross_entropy, cross_entropy_backward, linear_cross_entropy, linear_cross_entropy_backward, norm,
                    norm_backward, rotary, rotary_, softmax, softmax_backward, swiglu, swiglu_backward)
from . import eager_attention, eager_fused, eager_gemm  # noqa: E402,F401 (the eager entries; they register the autocast rules)

FUSED_OPS = ("norm", "norm_backward", "softmax", "softmax_backward", "cross_entropy", "cross_entropy_backward", "rotary",
             "rotary_", "swiglu", "swiglu_backward", "linear_cross_entropy", "linear_cross_entropy_backward")
OPS = ("matmul", "linear", "linear_backward", "linear_swiglu", "linear_swiglu_backward", "scaled_mm", "sdpa", "sdpa_backward", "sdpa_varlen", "sdpa_varlen_backward", "paged_decode",
       "sdpa_masked", "sdpa_masked_backward")


def install_lean_dispatch() -> None:
    """`runtime.lean_dispatch` for every op above (it leaves out `rotary_`, which mutates q and k);
    idempotent; done at import."""
    from cute_kernels.runtime import lean_dispatch

    for name in OPS + FUSED_OPS:
        lean_dispatch.install(globals()[name])


install_lean_dispatch()

# Names no schema argument of ours may take. Inductor lowers an op it has no lowering for through
# `FallbackKernel.create(kernel, *args, **kwargs)`, passing the schema's defaulted arguments as
# keywords, so an argument named `kernel` fails to compile ("got multiple values for argument
# 'kernel'"). The others are kept free as a precaution: method receivers and the named
# parameters of Inductor's extern-kernel IR constructors.
RESERVED_ARGUMENT_NAMES = frozenset({"kernel", "cls", "self", "name", "layout", "op_overload", "python_kernel_name"})

__all__ = [
    "matmul", "linear", "linear_backward", "linear_swiglu", "linear_swiglu_backward", "scaled_mm", "sdpa", "sdpa_backward", "sdpa_varlen", "sdpa_varlen_backward", "paged_decode",
    "sdpa_masked", "sdpa_masked_backward",
    "fused", "FUSED_OPS", *FUSED_OPS,
    "ACTIVATIONS", "CAUSAL", "FALLBACKS", "FALLBACK_COUNTS", "FallbackWarning", "OPS", "RESERVED_ARGUMENT_NAMES",
]
