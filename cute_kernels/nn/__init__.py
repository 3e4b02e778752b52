"""Drop-in PyTorch modules and functions on the cute_kernels kernels.

- `Linear`: torch.nn.Linear (same constructor and state_dict) plus `activation=`, `kernel=`,
  `fallback=`; `Linear.from_linear(m)` wraps an existing layer's parameters.
- `functional.linear`, `functional.scaled_dot_product_attention`: the torch.nn.functional forms.
- `RMSNorm`, `LayerNorm` (norms.py), `CrossEntropyLoss`, `LinearCrossEntropyLoss` (losses.py): the
  fused kernels as drop-in modules; `replacement_for(module)` recognizes torch's, timm's and
  Hugging Face's norm modules; `fused_functional`: their functional forms.
- `patch(model)`: an existing model's nn.Linear layers, norms and attention on cute_kernels, by
  each library's own mechanism (transformers' attention interface; instance-level rebinding of
  F.scaled_dot_product_attention for timm and other models: `rebind`); `route()`: the generic
  TorchFunctionMode fallback.
- `GatedMLP` (mlp.py): a SwiGLU MLP whose gate/up GEMM gates in its epilogue (one interleaved
  gate-up weight); `from_projections(gate_proj, up_proj, down_proj)`; `fuse_gated_mlps(model)`
  puts one in place of every SwiGLU MLP of a model (Hugging Face's Llama, Mistral, Qwen2),
  keeping its state-dict keys.
- `parallel`: tensor parallelism on our `linear` (`ColumnParallelLinear`, `RowParallelLinear`,
  `TensorParallelMLP`).
"""

from __future__ import annotations

from cute_kernels.runtime.eager import transparent_mode

from . import functional, fused_functional, parallel
from .linear import Linear
from .losses import CrossEntropyLoss, LinearCrossEntropyLoss
from .mlp import GatedMLP, fuse_gated_mlps
from .norms import LayerNorm, RMSNorm, replacement_for
from .parallel import ColumnParallelLinear, RowParallelLinear, TensorParallelMLP
from .routing import PatchReport, patch, route

# route() reroutes F.linear and SDPA and passes every other function through, so a warm call
# made under it (a patched model's Linear layers) keeps the direct path (runtime.eager).
transparent_mode(route)

__all__ = ["ColumnParallelLinear", "CrossEntropyLoss", "GatedMLP", "LayerNorm", "Linear", "LinearCrossEntropyLoss", "PatchReport",
           "RMSNorm", "RowParallelLinear", "TensorParallelMLP", "functional", "fuse_gated_mlps", "fused_functional",
           "parallel", "patch",
           "replacement_for", "route"]
