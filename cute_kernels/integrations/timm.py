"""timm models on cute_kernels attention.

timm's attention modules (`timm.layers.Attention` and the per-model variants) call
`F.scaled_dot_product_attention` when their `fused_attn` flag is set (timm's default where
torch has SDPA; TIMM_FUSED_ATTN=0 turns it off) and compute the softmax by hand otherwise.
`patch_attention` rebinds those modules' forwards on the instance (`cute_kernels.nn.rebind`),
so their SDPA calls reach `cute_kernels.nn.functional.scaled_dot_product_attention`; nothing
global changes. Modules left on timm's manual path (fused_attn off) are reported, not changed:
that flag is the user's or timm's choice.

Attention dropout in training (`attn_drop` > 0) is refused by our SDPA (NotImplementedError
naming dropout_p), or computed by PyTorch with fallback="torch".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["TimmAttentionPatch", "is_timm_model", "patch_attention"]


@dataclass
class TimmAttentionPatch:
    """What `patch_attention` did: the modules rebound, and those whose fused_attn is off."""

    rebound: list[str] = field(default_factory=list)
    manual: list[str] = field(default_factory=list)


def is_timm_model(model: torch.nn.Module) -> bool:
    """Whether `model` is (or holds, at its top) a module defined by timm."""
    return type(model).__module__.split(".")[0] == "timm"


def patch_attention(model: torch.nn.Module, *, kernel: str = "auto", fallback: str = "none") -> TimmAttentionPatch:
    """Route `model`'s timm attention modules to our SDPA, in place (module docstring)."""
    from cute_kernels.nn.rebind import rebind_sdpa

    report = TimmAttentionPatch(rebound=rebind_sdpa(model, kernel=kernel, fallback=fallback))
    report.manual = [name for name, m in model.named_modules() if getattr(m, "fused_attn", True) is False]
    return report
