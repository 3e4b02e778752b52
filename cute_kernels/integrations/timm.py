"""timm models on cute_kernels attention and fused MLP activations.

timm's attention modules (`timm.layers.Attention` and the per-model variants) call
`F.scaled_dot_product_attention` when their `fused_attn` flag is set (timm's default where
torch has SDPA; TIMM_FUSED_ATTN=0 turns it off) and compute the softmax by hand otherwise.
`patch_attention` rebinds those modules' forwards on the instance (`cute_kernels.nn.rebind`),
so their SDPA calls reach `cute_kernels.nn.functional.scaled_dot_product_attention`; nothing
global changes. Modules left on timm's manual path (fused_attn off) are reported, not changed:
that flag is the user's or timm's choice.

Attention dropout in training (`attn_drop` > 0) is refused by our SDPA (NotImplementedError
naming dropout_p), or computed by PyTorch with fallback="torch".

`fold_mlp_activations` moves the activation of each `timm.layers.Mlp` (fc1 -> act -> drop1 ->
norm -> fc2 -> drop2) into its fc1's GEMM epilogue: fc1 becomes a `cute_kernels.nn.Linear`
with that activation and `fuse_activation="inference"`, act an Identity. The module computes
what it computed (the activation still follows fc1 directly); inference saves the activation's
own pass over the hidden tensor (ViT-B/16: 12 GELU kernels over 12608 x 3072 per image batch),
a training step keeps torch's activation node (`nn.linear.FUSE_ACTIVATION` says why).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

__all__ = ["TimmAttentionPatch", "is_timm_model", "patch_attention", "fold_mlp_activations"]

# the attributes timm's Mlp.forward reads first, in order: fc1, then act on its output
_MLP_HEAD = ("fc1", "act")


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


def _foldable_mlp(module: torch.nn.Module) -> str | None:
    """The activation name of a timm `Mlp` whose act can move into fc1's epilogue, else None:
    the class is timm's own `Mlp` (a subclass or another MLP may order its calls otherwise),
    its forward reads fc1 then act before anything else, fc1 is an nn.Linear (ours or torch's)
    without an activation, and act an activation `gemm.activations.of_module` names."""
    from cute_kernels.gemm import activations
    from cute_kernels.nn.linear import Linear

    kind = type(module)
    if kind.__name__ != "Mlp" or not kind.__module__.startswith("timm."):
        return None
    if kind.forward.__code__.co_names[:len(_MLP_HEAD)] != _MLP_HEAD:
        return None
    fc1, act = getattr(module, "fc1", None), getattr(module, "act", None)
    if not isinstance(fc1, torch.nn.Linear) or (isinstance(fc1, Linear) and fc1.activation is not None):
        return None
    return None if act is None else activations.of_module(act)


def fold_mlp_activations(model: torch.nn.Module, *, kernel: str = "auto", fallback: str = "none") -> list[str]:
    """Fold the activation of each timm `Mlp` in `model` into its fc1 (module docstring), in
    place; returns the folded modules' names."""
    from cute_kernels.nn.linear import Linear

    folded = []
    for name, module in model.named_modules():
        activation = _foldable_mlp(module)
        if activation is None:
            continue
        module.fc1 = Linear.from_linear(module.fc1, activation=activation, kernel=kernel, fallback=fallback,
                                        fuse_activation="inference")
        module.act = torch.nn.Identity()
        folded.append(name)
    return folded


# ---- compile-ahead: the attention calls a patched model's first step will make ----------------------

def _predict(model, x):
    """`nn.ahead` predictor: for each distinct rebound timm attention module whose forward splits
    one qkv projection (`qkv`, `num_heads`, `head_dim`; ViT's `Attention`), given the first layer
    call's input x (batch, tokens, width): its SDPA call on q, k and v as that split leaves them
    (views of the (B, N, 3, H, D) projection). (forward calls, backward calls)."""
    from cute_kernels.nn.rebind import is_rebound
    from cute_kernels.runtime.compile_ahead import Call, TensorSpec

    if not is_timm_model(model) or x.dim() != 3:
        return [], []
    b, n = x.shape[:2]
    grad = torch.is_grad_enabled() and model.training
    forwards, backwards, seen = [], [], set()
    for m in model.modules():
        options = is_rebound(m)
        h, d = getattr(m, "num_heads", None), getattr(m, "head_dim", None)
        if options is None or not isinstance(getattr(m, "qkv", None), torch.nn.Linear) or not (h and d) \
                or not getattr(m, "fused_attn", False) or (m.training and getattr(m.attn_drop, "p", 0.0)):
            continue
        if (h, d, options) in seen:
            continue
        seen.add((h, d, options))
        spec = TensorSpec((b, h, n, d), (n * 3 * h * d, d, 3 * h * d, 1), x.dtype, str(x.device), requires_grad=grad)
        kernel, fallback = options
        call = functools.partial(Call, "cute_kernels.nn.functional:scaled_dot_product_attention", (spec, spec, spec),
                                 {"kernel": kernel, "fallback": fallback}, grad=grad, imports=("cute_kernels.nn",))
        forwards.append(call(backward=False))
        if grad:
            backwards.append(call(backward=True))
    return forwards, backwards


def _register_predictor() -> None:
    from cute_kernels.nn import ahead

    if _predict not in ahead.PREDICTORS:
        ahead.PREDICTORS.append(_predict)


_register_predictor()
