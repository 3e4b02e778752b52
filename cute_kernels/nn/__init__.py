"""Drop-in PyTorch modules and functions on the cute_kernels kernels.

- `Linear`: torch.nn.Linear (same constructor and state_dict) plus `activation=`, `kernel=`,
  `fallback=`; `Linear.from_linear(m)` wraps an existing layer's parameters.
- `functional.linear`, `functional.scaled_dot_product_attention`: the torch.nn.functional forms.
- `patch(model)` / `route()`: send an existing model's nn.Linear and SDPA calls through them.
- `parallel`: tensor parallelism on our `linear` (`ColumnParallelLinear`, `RowParallelLinear`,
  `TensorParallelMLP`).
"""

from __future__ import annotations

from cute_kernels.runtime.eager import transparent_mode

from . import functional, parallel
from .linear import Linear
from .parallel import ColumnParallelLinear, RowParallelLinear, TensorParallelMLP
from .routing import patch, route

# route() reroutes F.linear and SDPA and passes every other function through, so a warm call
# made under it (a patched model's Linear layers) keeps the direct path (runtime.eager).
transparent_mode(route)

__all__ = ["ColumnParallelLinear", "Linear", "RowParallelLinear", "TensorParallelMLP", "functional", "parallel",
           "patch", "route"]
