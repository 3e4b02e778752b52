"""`Linear`: torch.nn.Linear on the cute_kernels GEMM, with an optional fused activation."""

from __future__ import annotations

import torch

from cute_kernels.gemm import activations
from cute_kernels.ops import ACTIVATIONS
from cute_kernels.ops.eager_gemm import linear as linear_entry
from cute_kernels.ops.fallback import check_fallback

__all__ = ["Linear", "FUSE_ACTIVATION"]

# When the activation runs in the GEMM's epilogue: "always", or "inference": only where the
# call records no gradient. Why the second: the fused backward needs the pre-activation, which
# it recomputes (one more GEMM of the layer's size), while torch's activation after the product
# keeps it from the forward; a training step then costs less unfused, inference less fused.
FUSE_ACTIVATION = ("always", "inference")


class Linear(torch.nn.Linear):
    """torch.nn.Linear (same constructor, parameters and state_dict) whose forward is
    `cute_kernels::linear` (in eager mode a warm call skips the op: `ops.eager_gemm`), plus
    keyword options: `activation` (None, "relu", "gelu", "gelu_tanh", "silu") applied to the
    output, `fuse_activation` (`FUSE_ACTIVATION`: "always" in the GEMM's epilogue, or
    "inference": there only when the call records no gradient, else by torch's function after
    the product), `kernel` (GEMM rung or "auto") and `fallback`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 activation=None, kernel: str = "auto", fallback: str = "none", fuse_activation: str = "always"):
        super().__init__(in_features, out_features, bias, device, dtype)
        self._set_options(activation, kernel, fallback, fuse_activation)

    def _set_options(self, activation, kernel: str, fallback: str, fuse_activation: str = "always") -> None:
        if activation not in ACTIVATIONS:
            raise ValueError(f"cute_kernels.nn.Linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
        if not isinstance(kernel, str):
            raise TypeError(f"cute_kernels.nn.Linear: kernel must be a str, got {type(kernel).__name__}")
        if fuse_activation not in FUSE_ACTIVATION:
            raise ValueError(f"cute_kernels.nn.Linear: fuse_activation must be one of {FUSE_ACTIVATION}, got "
                             f"{fuse_activation!r}")
        check_fallback("nn.Linear", fallback)
        self.activation, self.kernel, self.fallback = activation, kernel, fallback
        self.fuse_activation = fuse_activation

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, *, activation=None, kernel: str = "auto",
                    fallback: str = "none", fuse_activation: str = "always") -> "Linear":
        """A `Linear` sharing `module`'s parameters (the same Parameter objects, so optimizers
        and tied weights keep working) and its training flag."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = module.in_features, module.out_features
        new.weight = module.weight
        new.register_parameter("bias", module.bias)
        new.train(module.training)
        new._set_options(activation, kernel, fallback, fuse_activation)
        return new

    def forward(self, input):
        act = self.activation
        if act is not None and self.fuse_activation == "inference" and torch.is_grad_enabled() and (
                input.requires_grad or self.weight.requires_grad
                or (self.bias is not None and self.bias.requires_grad)):
            return activations.apply(linear_entry(input, self.weight, self.bias, None, self.kernel, self.fallback), act)
        return linear_entry(input, self.weight, self.bias, act, self.kernel, self.fallback)

    def extra_repr(self) -> str:
        # The kernel is always shown, so a patched model's repr says which layers are ours.
        extra = f", activation={self.activation!r}" if self.activation else ""
        if self.fuse_activation != "always":
            extra += f", fuse_activation={self.fuse_activation!r}"
        extra += f", kernel={self.kernel!r}"
        if self.fallback != "none":
            extra += f", fallback={self.fallback!r}"
        return super().extra_repr() + extra
