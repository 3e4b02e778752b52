"""Loss modules on the fused kernels.

- `CrossEntropyLoss`: torch.nn.CrossEntropyLoss (same constructor, no state) for class-index
  targets, plus `z_loss`; class weights fall back to torch only with fallback="torch".
- `LinearCrossEntropyLoss`: an output projection and its cross-entropy in one module that never
  holds the logits. Its parameters are an nn.Linear's (`weight` (V, H), optional `bias`), so
  `from_module(lm_head)` shares a model's head and the state_dict keys are the head's;
  `forward(hidden, labels)` returns the loss (`cute_kernels.fused.linear_cross_entropy`).
"""

from __future__ import annotations

import torch

from . import fused_functional as ff
from cute_kernels.ops.fallback import check_fallback

__all__ = ["CrossEntropyLoss", "LinearCrossEntropyLoss"]


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss on the fused kernel, plus `z_loss` and `fallback`."""

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0, *, z_loss: float = 0.0,
                 fallback: str = "none"):
        super().__init__(weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        check_fallback("nn.CrossEntropyLoss", fallback)
        self.z_loss, self.fallback = float(z_loss), fallback

    def forward(self, input, target):
        return ff.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing,
                                z_loss=self.z_loss, fallback=self.fallback)


class LinearCrossEntropyLoss(torch.nn.Module):
    """cross_entropy(hidden @ weight.T + bias, labels) without the (tokens, vocab) logits.

    Constructed like nn.Linear(in_features, out_features, bias) plus the loss options
    (ignore_index, reduction, label_smoothing, z_loss), `chunk` (tokens per logits chunk; None:
    the default rule), `gemm` ("torch" or "cute_kernels") and `fallback`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, device=None, dtype=None, *,
                 ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 z_loss: float = 0.0, chunk: int | None = None, gemm: str = "torch", fallback: str = "none"):
        super().__init__()
        head = torch.nn.Linear(in_features, out_features, bias, device, dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight = head.weight
        self.register_parameter("bias", head.bias)
        self._set_options(ignore_index, reduction, label_smoothing, z_loss, chunk, gemm, fallback)

    def _set_options(self, ignore_index, reduction, label_smoothing, z_loss, chunk, gemm, fallback) -> None:
        if reduction not in ff.REDUCTIONS:
            raise ValueError(f"cute_kernels.nn.LinearCrossEntropyLoss: reduction must be one of {ff.REDUCTIONS}, "
                             f"got {reduction!r}")
        check_fallback("nn.LinearCrossEntropyLoss", fallback)
        self.ignore_index, self.reduction = int(ignore_index), reduction
        self.label_smoothing, self.z_loss = float(label_smoothing), float(z_loss)
        self.chunk, self.gemm, self.fallback = chunk, gemm, fallback

    @classmethod
    def from_module(cls, module: torch.nn.Linear, **options) -> "LinearCrossEntropyLoss":
        """A loss sharing `module`'s weight and bias (the same Parameters: tied embeddings stay tied)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = module.in_features, module.out_features
        new.weight = module.weight
        new.register_parameter("bias", module.bias)
        new.train(module.training)
        defaults = dict(ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0, chunk=None,
                        gemm="torch", fallback="none")
        unknown = set(options) - set(defaults)
        if unknown:
            raise TypeError(f"cute_kernels.nn.LinearCrossEntropyLoss.from_module: unknown options {sorted(unknown)}")
        new._set_options(**{**defaults, **options})
        return new

    def forward(self, hidden, labels):
        return ff.linear_cross_entropy(hidden, self.weight, labels, self.bias, ignore_index=self.ignore_index,
                                       reduction=self.reduction, label_smoothing=self.label_smoothing,
                                       z_loss=self.z_loss, chunk=self.chunk, gemm=self.gemm, fallback=self.fallback)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"reduction={self.reduction!r}, kernel='cute_kernels'")
