"""The epilogue activations as torch computes them: the definition every torch-side path uses
(the fallbacks, the unfused epilogue of rungs without a fused one, the references of tests and
fuzzes) and the derivative the linear backward applies. The fused epilogues compute the same
functions in registers (`hopper.epilogue.activate`), under the same names.

    NAMES                    "relu", "gelu" (erf), "gelu_tanh", "silu"
    apply(y, name)           name(y), a new tensor (None: y itself)
    apply_(y, name)          name(y), in place where torch has an in-place form (the result)
    backward(g, z, name)     dL/dz for dL/d name(z) = g, z the pre-activation
    of_module(module)        the name of an activation module (torch.nn.ReLU, GELU, SiLU), or None
"""

from __future__ import annotations

import torch

__all__ = ["NAMES", "apply", "apply_", "backward", "of_module"]

NAMES = ("relu", "gelu", "gelu_tanh", "silu")
_GELU_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}


def _check(name) -> None:
    if name is not None and name not in NAMES:
        raise ValueError(f"activation must be None or one of {NAMES}, got {name!r}")


def apply(y: torch.Tensor, name: str | None) -> torch.Tensor:
    _check(name)
    if name is None:
        return y
    if name == "relu":
        return torch.relu(y)
    if name == "silu":
        return torch.nn.functional.silu(y)
    return torch.nn.functional.gelu(y, approximate=_GELU_APPROXIMATE[name])


def apply_(y: torch.Tensor, name: str | None) -> torch.Tensor:
    _check(name)
    if name == "relu":
        return y.relu_()
    if name == "silu":
        return torch.nn.functional.silu(y, inplace=True)
    return apply(y, name)  # GELU has no in-place form


def backward(g: torch.Tensor, z: torch.Tensor, name: str) -> torch.Tensor:
    _check(name)
    if name == "relu":
        return torch.ops.aten.threshold_backward(g, z, 0)
    if name == "silu":
        return torch.ops.aten.silu_backward(g, z)
    return torch.ops.aten.gelu_backward(g, z, approximate=_GELU_APPROXIMATE[name])


def of_module(module: torch.nn.Module) -> str | None:
    """"relu", "gelu", "gelu_tanh" or "silu" for a torch.nn.ReLU, GELU (either approximation) or
    SiLU module (exactly those classes: a subclass may compute something else), else None."""
    kind = type(module)
    if kind is torch.nn.ReLU:
        return "relu"
    if kind is torch.nn.SiLU:
        return "silu"
    if kind is torch.nn.GELU:
        return "gelu" if module.approximate == "none" else "gelu_tanh"
    return None
