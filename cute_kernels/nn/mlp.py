"""`GatedMLP`: a Llama-style SwiGLU MLP, down(silu(gate(x)) * up(x)), on one gated GEMM.

The gate and up projections live in one (2I, H) parameter, `gate_up`, interleaved in blocks of
8 rows (`cute_kernels.gemm.gated.interleave_gate_up`), so the first GEMM writes silu(g) * u
directly (`nn.fused_functional.linear_swiglu`); `down` is a `cute_kernels.nn.Linear`.
`GatedMLP.from_projections(gate_proj, up_proj, down_proj)` builds one from a model's three
nn.Linear layers (copying gate and up into the interleaved parameter: the result no longer
shares them), and `projections()` gives the (gate, up) weights back.

`fuse_gated_mlps(model)` does that to every SwiGLU MLP of a model (Hugging Face's Llama,
Mistral, Qwen2 MLPs: `gate_proj`, `up_proj`, `down_proj`, confirmed on a probe input), keeping
the model's state-dict keys (`mlp.gate_proj.weight`, ...: checkpoints load and save as before).
The parameters are new tensors: fuse before building the optimizer.
"""

from __future__ import annotations

import torch

from cute_kernels.gemm.gated import interleave_gate_up, split_gate_up

from .fused_functional import linear_swiglu
from .linear import Linear
from .norms import _probe

__all__ = ["GatedMLP", "fuse_gated_mlps"]

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # Hugging Face's names of a gated MLP's layers


class GatedMLP(torch.nn.Module):
    """down(silu(x Wg^T) * (x Wu^T)) for x (..., hidden); bias-free, as Llama's, Mistral's and
    Qwen's MLPs. `intermediate` must be a multiple of 8."""

    def __init__(self, hidden: int, intermediate: int, *, device=None, dtype=None, fallback: str = "none",
                 state_dict_names: tuple[str, str, str] | None = None):
        """`state_dict_names`: (gate, up, down) layer names the state dict uses instead of
        `gate_up` and `down` (e.g. `PROJECTIONS`: a Hugging Face checkpoint's keys)."""
        super().__init__()
        if intermediate % 8:
            raise ValueError(f"cute_kernels.nn.GatedMLP: intermediate must be a multiple of 8, got {intermediate}")
        self.hidden, self.intermediate, self.fallback = hidden, intermediate, fallback
        self.gate_up = torch.nn.Parameter(torch.empty(2 * intermediate, hidden, device=device, dtype=dtype))
        self.down = Linear(intermediate, hidden, bias=False, device=device, dtype=dtype, fallback=fallback)
        self.reset_parameters()
        self.state_dict_names = state_dict_names
        if state_dict_names is not None:
            self._register_state_dict_hook(_save_as_projections)
            self._register_load_state_dict_pre_hook(_load_projections, with_module=True)

    def reset_parameters(self) -> None:
        # nn.Linear's initialization for each projection (the interleave mixes rows only)
        bound = 1.0 / self.hidden ** 0.5
        torch.nn.init.uniform_(self.gate_up, -bound, bound)
        self.down.reset_parameters()

    @classmethod
    def from_projections(cls, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear, down_proj: torch.nn.Linear, *,
                         fallback: str = "none", state_dict_names: tuple[str, str, str] | None = None) -> "GatedMLP":
        for name, m in (("gate_proj", gate_proj), ("up_proj", up_proj), ("down_proj", down_proj)):
            if m.bias is not None:
                raise ValueError(f"cute_kernels.nn.GatedMLP.from_projections: {name} has a bias; GatedMLP is bias-free")
        w = gate_proj.weight
        mlp = cls(w.shape[1], w.shape[0], device=w.device, dtype=w.dtype, fallback=fallback,
                  state_dict_names=state_dict_names)
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


def _save_as_projections(module: GatedMLP, state_dict, prefix, local_metadata):
    gate, up, down = module.state_dict_names
    gate_up = state_dict.pop(prefix + "gate_up")
    state_dict[prefix + f"{gate}.weight"], state_dict[prefix + f"{up}.weight"] = split_gate_up(gate_up)
    state_dict[prefix + f"{down}.weight"] = state_dict.pop(prefix + "down.weight")
    return state_dict


def _load_projections(module: GatedMLP, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                      error_msgs):
    gate, up, down = (prefix + f"{name}.weight" for name in module.state_dict_names)
    if gate in state_dict and up in state_dict:
        state_dict[prefix + "gate_up"] = interleave_gate_up(state_dict.pop(gate), state_dict.pop(up))
    if down in state_dict:
        state_dict[prefix + "down.weight"] = state_dict.pop(down)


def _gated_layers(module: torch.nn.Module):
    """(gate_proj, up_proj, down_proj) of a module that holds them as bias-free nn.Linear
    layers of matching shapes (I a multiple of 8), else None."""
    layers = tuple(getattr(module, name, None) for name in PROJECTIONS)
    if not all(type(m) is torch.nn.Linear or isinstance(m, Linear) for m in layers):
        return None
    g, u, d = layers
    if any(m.bias is not None for m in layers) or g.weight.shape != u.weight.shape or \
            d.weight.shape != g.weight.shape[::-1] or g.weight.shape[0] % 8:
        return None
    return layers


@torch.no_grad()
def _computes_swiglu(module: torch.nn.Module, layers) -> bool:
    """Whether `module`'s forward is down(silu(gate(x)) * up(x)), on a probe of two tokens."""
    g, u, d = layers
    w = g.weight
    x = torch.randn(2, w.shape[1], generator=torch.Generator().manual_seed(0)).to(device=w.device, dtype=w.dtype)
    got = _probe(module, x)  # None: it cannot run a bare (tokens, hidden) input, or answers in another shape
    if got is None:
        return False
    xf = x.float()
    want = (torch.nn.functional.silu(xf @ g.weight.float().t()) * (xf @ u.weight.float().t())) @ d.weight.float().t()
    scale = want.abs().max().clamp_min(1e-6)
    return bool(((got.float() - want).abs().max() / scale) < (1e-2 if w.dtype in (torch.bfloat16, torch.float16) else
                                                               1e-4))


def fuse_gated_mlps(model: torch.nn.Module, *, fallback: str = "none") -> list[str]:
    """Replace every SwiGLU MLP in `model` by a `GatedMLP` (module docstring); the names of the
    replaced modules. Each candidate (bias-free `gate_proj`, `up_proj`, `down_proj`) is run once
    on a probe input and replaced only if it computes down(silu(gate(x)) * up(x)): a GELU-gated
    MLP (Gemma's) or anything else is left as it is. Keeps each module's training flag."""
    from . import ahead

    was_armed = ahead.armed(model)
    ahead.disarm(model)
    replaced = []
    for name, module in list(model.named_modules()):
        if isinstance(module, GatedMLP) or not name:
            continue
        layers = _gated_layers(module)
        if layers is None or not _computes_swiglu(module, layers):
            continue
        fused = GatedMLP.from_projections(*layers, fallback=fallback, state_dict_names=PROJECTIONS)
        fused.train(module.training)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, fused)
        replaced.append(name)
    if was_armed:  # by `patch`, before these layers came in (and the probe calls must not fire it)
        ahead.arm(model)
    return replaced
