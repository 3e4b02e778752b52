"""Route an existing model's nn.Linear and SDPA calls through cute_kernels.

- `patch(model)`: replaces every `torch.nn.Linear` submodule (exactly that class; subclasses
  keep their own forward) by a `cute_kernels.nn.Linear` sharing its parameters, (norms=True) every
  norm module `cute_kernels.nn.replacement_for` recognizes by ours, and (sdpa=True) runs
  `model.forward` under `route(linear=False)` so its SDPA calls are routed too. In place; returns
  the model. The state_dict is unchanged.
- `route()`: a context manager (a TorchFunctionMode) under which every
  `torch.nn.functional.linear` and `torch.nn.functional.scaled_dot_product_attention` call,
  however the caller imported it, goes to `cute_kernels.nn.functional`. In eager mode every
  torch call in the block pays a Python hop; under torch.compile the mode is traced away.
"""

from __future__ import annotations

import functools

import torch
from torch.overrides import TorchFunctionMode

from . import functional as cf
from .linear import Linear
from .norms import replacement_for

__all__ = ["patch", "route"]


class route(TorchFunctionMode):
    """Within the block, F.linear -> cute_kernels.nn.functional.linear and
    F.scaled_dot_product_attention -> cute_kernels.nn.functional.scaled_dot_product_attention,
    with the options given here: `kernel` names the GEMM rung for linear, `attention_kernel`
    the attention rung (e.g. "sm90_flash", which "auto" does not pick yet)."""

    def __init__(self, *, linear: bool = True, sdpa: bool = True, kernel: str = "auto",
                 attention_kernel: str = "auto", fallback: str = "none"):
        super().__init__()
        cf.check_fallback("nn.route", fallback)
        self.linear, self.sdpa, self.fallback = linear, sdpa, fallback
        self.kernel, self.attention_kernel = kernel, attention_kernel

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.linear and func is torch.nn.functional.linear:
            return cf.linear(*args, **kwargs, kernel=self.kernel, fallback=self.fallback)
        if self.sdpa and func is torch.nn.functional.scaled_dot_product_attention:
            return cf.scaled_dot_product_attention(*args, **kwargs, kernel=self.attention_kernel,
                                                   fallback=self.fallback)
        return func(*args, **kwargs)


def _routed_forward(forward, fallback: str, attention_kernel: str, *args, **kwargs):
    with route(linear=False, sdpa=True, attention_kernel=attention_kernel, fallback=fallback):
        return forward(*args, **kwargs)


def patch(model: torch.nn.Module, *, linear: bool = True, sdpa: bool = True, norms: bool = True,
          kernel: str = "auto", attention_kernel: str = "auto", fallback: str = "none") -> torch.nn.Module:
    """Route `model`'s nn.Linear layers (linear=True, GEMM rung `kernel`), norm modules
    (norms=True: those `replacement_for` recognizes) and SDPA calls (sdpa=True, attention rung
    `attention_kernel`) through cute_kernels, in place; returns `model`. Idempotent."""
    cf.check_fallback("nn.patch", fallback)
    if norms:
        for parent in model.modules():
            for name, child in list(parent.named_children()):
                new = replacement_for(child, fallback=fallback)
                if new is not None:
                    setattr(parent, name, new)
    if linear:
        for parent in model.modules():
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, Linear.from_linear(child, kernel=kernel, fallback=fallback))
        if type(model) is torch.nn.Linear:
            raise TypeError("cute_kernels.nn.patch: model is itself an nn.Linear; use cute_kernels.nn.Linear."
                            "from_linear(model) instead")
    if sdpa and not getattr(model.__dict__.get("forward"), "_cute_kernels_routed", False):
        routed = functools.partial(_routed_forward, model.forward, fallback, attention_kernel)
        routed._cute_kernels_routed = True
        model.forward = routed
    return model
