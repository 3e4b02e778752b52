"""`GatedMLP`: a Llama-style SwiGLU MLP, down(silu(gate(x)) * up(x)), on one gated GEMM.

The gate and up projections live in one (2I, H) parameter, `gate_up`, interleaved in blocks of
8 rows (`cute_kernels.gemm.gated.interleave_gate_up`), so the first GEMM writes silu(g) * u
directly (`nn.fused_functional.linear_swiglu`); `down` is a `cute_kernels.nn.Linear`.
`GatedMLP.from_projections(gate_proj, up_proj, down_proj)` builds one from a model's three
nn.Linear layers (copying gate and up into the interleaved parameter: the result no longer
shares them), and `projections()` gives the (gate, up) weights back.
"""

from __future__ import annotations

import torch

from cute_kernels.gemm.gated import interleave_gate_up, split_gate_up

from .fused_functional import linear_swiglu
from .linear import Linear

__all__ = ["GatedMLP"]


class GatedMLP(torch.nn.Module):
    """down(silu(x Wg^T) * (x Wu^T)) for x (..., hidden); bias-free, as Llama's, Mistral's and
    Qwen's MLPs. `intermediate` must be a multiple of 8."""

    def __init__(self, hidden: int, intermediate: int, *, device=None, dtype=None, fallback: str = "none"):
        super().__init__()
        if intermediate % 8:
            raise ValueError(f"cute_kernels.nn.GatedMLP: intermediate must be a multiple of 8, got {intermediate}")
        self.hidden, self.intermediate, self.fallback = hidden, intermediate, fallback
        self.gate_up = torch.nn.Parameter(torch.empty(2 * intermediate, hidden, device=device, dtype=dtype))
        self.down = Linear(intermediate, hidden, bias=False, device=device, dtype=dtype, fallback=fallback)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's initialization for each projection (the interleave mixes rows only)
        bound = 1.0 / self.hidden ** 0.5
        torch.nn.init.uniform_(self.gate_up, -bound, bound)
        self.down.reset_parameters()

    @classmethod
    def from_projections(cls, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear, down_proj: torch.nn.Linear, *,
                         fallback: str = "none") -> "GatedMLP":
        for name, m in (("gate_proj", gate_proj), ("up_proj", up_proj), ("down_proj", down_proj)):
            if m.bias is not None:
                raise ValueError(f"cute_kernels.nn.GatedMLP.from_projections: {name} has a bias; GatedMLP is bias-free")
        w = gate_proj.weight
        mlp = cls(w.shape[1], w.shape[0], device=w.device, dtype=w.dtype, fallback=fallback)
        with torch.no_grad():
            mlp.gate_up.copy_(interleave_gate_up(gate_proj.weight, up_proj.weight))
            mlp.down.weight.copy_(down_proj.weight)
        return mlp

    def projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate weight, up weight), each (intermediate, hidden) (copies)."""
        return split_gate_up(self.gate_up.detach())

    def forward(self, x):
        return self.down(linear_swiglu(x, self.gate_up, fallback=self.fallback))

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, intermediate={self.intermediate}, gate_up interleaved in blocks of 8 rows"
