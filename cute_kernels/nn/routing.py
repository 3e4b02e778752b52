"""Route an existing model's linear layers, norms and attention through cute_kernels.

- `patch(model)`: in place, with each library's own mechanism, so that no other torch call pays
  anything:
  - every `torch.nn.Linear` submodule (exactly that class; subclasses keep their own forward)
    becomes a `cute_kernels.nn.Linear` sharing its parameters (state_dict unchanged), and the
    activation of each timm `Mlp` moves into its fc1's epilogue for inference
    (`integrations.timm.fold_mlp_activations`);
  - norms (norms=True): each RMSNorm/LayerNorm module `cute_kernels.nn.norms.replacement_for`
    has a fused replacement for (where that module exists in this build);
  - attention (sdpa=True): a Hugging Face transformers model switches to the "cute_kernels"
    attention implementation (`integrations.transformers.use`); any other model (timm's
    included, `integrations.timm`) has the forwards of its modules that call
    F.scaled_dot_product_attention rebound on the instance (`nn.rebind`).
  The model's `cute_kernels_patch` attribute says what was done (`PatchReport`). Where
  `runtime.compile_ahead` is on, the model is armed for it (`nn.ahead`).
- `route()`: the explicit generic fallback, a context manager (a TorchFunctionMode) under which
  every `torch.nn.functional.linear` and `scaled_dot_product_attention` call, however the
  caller reached it, goes to `cute_kernels.nn.functional`. In eager mode every torch call in
  the block pays a Python hop; under torch.compile the mode is traced away.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

from . import functional as cf
from .linear import Linear

__all__ = ["PatchReport", "patch", "route"]


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


@dataclass
class PatchReport:
    """What `patch` did to a model. `attention`: "transformers" (the attention implementation
    switched), "rebound" (module forwards rebound; `rebound` names them) or "none";
    `norms`: how many norm modules were replaced, None where this build has no fused norms;
    `folded`: the MLP modules whose activation moved into their first linear layer."""

    linears: int = 0
    folded: list[str] = field(default_factory=list)
    attention: str = "none"
    rebound: list[str] = field(default_factory=list)
    norms: int | None = None
    notes: list[str] = field(default_factory=list)


def patch(model: torch.nn.Module, *, linear: bool = True, sdpa: bool = True, norms: bool = True,
          kernel: str = "auto", attention_kernel: str = "auto", fallback: str = "none",
          decode_graph: bool = True) -> torch.nn.Module:
    """Route `model`'s linear layers (linear=True, GEMM rung `kernel`), norms (norms=True) and
    attention (sdpa=True, attention rung `attention_kernel`) through cute_kernels, in place
    (module docstring); returns `model`. A transformers model's `generate` replays its decode
    steps from a CUDA graph where it can (`integrations.graph_decode`; decode_graph=False keeps
    transformers' own). Idempotent; a later call with other options applies them."""
    cf.check_fallback("nn.patch", fallback)
    if type(model) is torch.nn.Linear:
        raise TypeError("cute_kernels.nn.patch: model is itself an nn.Linear; use cute_kernels.nn.Linear."
                        "from_linear(model) instead")
    report = PatchReport()
    if linear:
        from cute_kernels.integrations.timm import fold_mlp_activations

        report.linears = _swap_linears(model, kernel, fallback)
        report.folded = fold_mlp_activations(model, kernel=kernel, fallback=fallback)
    if norms:
        report.norms = _swap_norms(model, fallback)
    if sdpa:
        _patch_attention(model, attention_kernel, fallback, decode_graph, report)
    object.__setattr__(model, "cute_kernels_patch", report)
    from .ahead import arm

    arm(model)  # compile-ahead at the first call, where on
    return model


def _swap_linears(model: torch.nn.Module, kernel: str, fallback: str) -> int:
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, Linear.from_linear(child, kernel=kernel, fallback=fallback))
                count += 1
            elif isinstance(child, Linear):
                child._set_options(child.activation, kernel, fallback, child.fuse_activation)
                count += 1
    return count


def _swap_norms(model: torch.nn.Module, fallback: str) -> int | None:
    """Replace norm modules by `cute_kernels.nn.norms.replacement_for` (None when absent)."""
    try:
        from . import norms as norms_module
    except ImportError:
        return None
    replacement_for = getattr(norms_module, "replacement_for", None)
    if replacement_for is None:
        return None
    extra = {"fallback": fallback} if "fallback" in inspect.signature(replacement_for).parameters else {}
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            new = replacement_for(child, **extra)
            if new is not None and new is not child:
                setattr(parent, name, new)
                count += 1
    return count


def _is_transformers_model(model) -> bool:
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def _patch_attention(model, attention_kernel: str, fallback: str, decode_graph: bool, report: PatchReport) -> None:
    from cute_kernels.nn.rebind import rebind_sdpa

    if _is_transformers_model(model):
        from cute_kernels.integrations import transformers as hf

        try:
            hf.use(model, kernel=attention_kernel, fallback=fallback)
            report.attention = "transformers"
            from cute_kernels.integrations import graph_decode

            graph_decode.arm(model, on=decode_graph)  # generate's decode steps from a CUDA graph, where admitted
            return
        except TypeError as err:  # a model whose attention bypasses the interface: rebind below
            report.notes.append(str(err))
    from cute_kernels.integrations.timm import is_timm_model, patch_attention

    if is_timm_model(model):
        timm_report = patch_attention(model, kernel=attention_kernel, fallback=fallback)
        report.rebound = timm_report.rebound
        if timm_report.manual:
            report.notes.append(f"{len(timm_report.manual)} timm attention module(s) have fused_attn off and keep "
                                f"timm's manual softmax (e.g. {timm_report.manual[0]!r})")
    else:
        report.rebound = rebind_sdpa(model, kernel=attention_kernel, fallback=fallback)
    report.attention = "rebound" if report.rebound else "none"
