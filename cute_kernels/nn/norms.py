"""`RMSNorm` and `LayerNorm`: torch.nn.RMSNorm / torch.nn.LayerNorm on the fused kernels (same
constructors, parameters and state_dict), and `replacement_for(module)`, which recognizes the norm
modules models are built with and returns ours sharing their parameters.

Both modules take an optional `residual` in `forward`: `norm(x, residual)` returns
(norm(x + residual), x + residual) from one pass (the residual add of a pre-norm block fused in).

`replacement_for` knows:
- torch.nn.RMSNorm and torch.nn.LayerNorm (exactly those classes: a subclass may change forward);
- timm's `LayerNorm` (a torch.nn.LayerNorm subclass with the same forward; found by class name and
  module, not by importing timm);
- Hugging Face transformers' RMSNorm classes (LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm,
  GemmaRMSNorm and their kin), by duck typing: a class named `*RMSNorm` holding exactly a 1-D
  `weight` and an `eps` or `variance_epsilon`. Gemma's classes scale by (1 + weight) and return the
  input's dtype; the Llama family scales by weight and returns weight's dtype promoted with the
  input's. Which one a module computes is read off the module itself, run once on a small probe
  (`_hf_rms_convention`); a module that matches neither formula is left alone.
A replacement of torch's own fused modules (the first two) runs torch's native op on inputs under
`NATIVE_BELOW` elements, where its one C++ op costs less host time than the kernel saves on the GPU.
"""

from __future__ import annotations

import torch

from . import fused_functional as ff
from cute_kernels.ops.fallback import check_fallback

# Norms that stand in for torch's own fused modules (torch.nn.LayerNorm, timm's LayerNorm,
# torch.nn.RMSNorm) call torch's native op below this many input elements, and the kernel at and
# above it (`native_below`). Why: torch's is one C++ op with a C++ autograd node, ours a kernel
# behind a Python autograd function. Measured on the H200 (bench overhead, host time per warm
# call): LayerNorm over ViT-B/16's 12608 x 768 tokens costs 75 µs forward and 590 µs forward +
# backward against torch's 22 and 171, while the kernels save only 16 and 29 µs of GPU time
# there; patched ViT-B/16 trained 3.6 ms slower per step (23.96 -> 27.56 ms) with its LayerNorms
# alone routed. The GPU saving grows with the tensor and the host cost does not: past 2^25
# elements (8192 tokens of 4096) the kernel's saving exceeds it. Hugging Face's RMSNorm modules
# are several torch ops each (no native fused op stands behind them), so theirs always run ours.
NATIVE_BELOW = 1 << 25

__all__ = ["RMSNorm", "LayerNorm", "replacement_for", "DTYPE_POLICIES"]

# How the output dtype is chosen: "input" (torch, Gemma: the input's) or "promote" (the Llama
# family: weight's dtype promoted with the input's).
DTYPE_POLICIES = ("input", "promote")


def _out_dtype(policy: str, x, weight):
    if policy == "promote" and weight is not None and weight.dtype != x.dtype:
        return torch.promote_types(weight.dtype, x.dtype)
    return None


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm on the fused kernel, plus keyword options: `offset` (added to the weight;
    1.0 for Gemma's (1 + weight)), `dtype_policy` ("input" or "promote", see DTYPE_POLICIES) and
    `fallback`. `forward(x, residual=None)`: with a residual, returns (y, x + residual)."""

    native_below = 0  # input elements under which torch's native op runs (NATIVE_BELOW); 0: never

    def __init__(self, normalized_shape, eps=None, elementwise_affine: bool = True, device=None, dtype=None, *,
                 offset: float = 0.0, dtype_policy: str = "input", fallback: str = "none"):
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        self._set_options(offset, dtype_policy, fallback)

    def _set_options(self, offset: float, dtype_policy: str, fallback: str) -> None:
        if dtype_policy not in DTYPE_POLICIES:
            raise ValueError(f"cute_kernels.nn.RMSNorm: dtype_policy must be one of {DTYPE_POLICIES}, got "
                             f"{dtype_policy!r}")
        check_fallback("nn.RMSNorm", fallback)
        if offset and self.weight is None:
            raise ValueError("cute_kernels.nn.RMSNorm: offset needs elementwise_affine=True (a weight)")
        self.offset, self.dtype_policy, self.fallback = float(offset), dtype_policy, fallback

    @classmethod
    def from_module(cls, module, *, offset: float = 0.0, dtype_policy: str = "input", eps=None,
                    fallback: str = "none") -> "RMSNorm":
        """An RMSNorm sharing `module`'s weight (the same Parameter) and training flag. `module` is
        a torch.nn.RMSNorm or anything with a 1-D `weight` (eps taken from its `eps` or
        `variance_epsilon` unless given)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        weight = getattr(module, "weight", None)
        shape = getattr(module, "normalized_shape", None) or (tuple(weight.shape) if weight is not None else None)
        if shape is None:
            raise ValueError(f"cute_kernels.nn.RMSNorm.from_module: {type(module).__name__} has no weight or "
                             "normalized_shape")
        new.normalized_shape = tuple(shape)
        new.eps = eps if eps is not None else getattr(module, "eps", getattr(module, "variance_epsilon", None))
        new.elementwise_affine = weight is not None
        new.register_parameter("weight", weight)
        new.train(module.training)
        new._set_options(offset, dtype_policy, fallback)
        return new

    @property
    def variance_epsilon(self):
        """The Hugging Face name of eps (code that reads it from the module it replaced)."""
        return self.eps

    def forward(self, input, residual=None):
        if residual is None and input.numel() < self.native_below and not self.offset and self.dtype_policy == "input":
            return torch.nn.functional.rms_norm(input, self.normalized_shape, self.weight, self.eps)
        out_dtype = _out_dtype(self.dtype_policy, input, self.weight)
        if residual is None:
            return ff.rms_norm(input, self.normalized_shape, self.weight, self.eps, offset=self.offset,
                               out_dtype=out_dtype, fallback=self.fallback)
        return ff.fused_add_rms_norm(input, residual, self.normalized_shape, self.weight, self.eps, offset=self.offset,
                                     out_dtype=out_dtype, fallback=self.fallback)

    def extra_repr(self) -> str:
        extra = super().extra_repr()
        if self.offset:
            extra += f", offset={self.offset}"
        if self.dtype_policy != "input":
            extra += f", dtype_policy={self.dtype_policy!r}"
        if self.fallback != "none":
            extra += f", fallback={self.fallback!r}"
        return extra + ", kernel='cute_kernels'"


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm on the fused kernel, plus `fallback`. `forward(x, residual=None)`: with a
    residual, returns (y, x + residual)."""

    native_below = 0  # input elements under which torch's native op runs (NATIVE_BELOW); 0: never

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None, *, fallback: str = "none"):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        check_fallback("nn.LayerNorm", fallback)
        self.fallback = fallback

    @classmethod
    def from_module(cls, module: torch.nn.LayerNorm, *, fallback: str = "none") -> "LayerNorm":
        """A LayerNorm sharing `module`'s weight and bias (the same Parameters) and training flag."""
        check_fallback("nn.LayerNorm", fallback)
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.normalized_shape = tuple(module.normalized_shape)
        new.eps = module.eps
        new.elementwise_affine = module.elementwise_affine
        new.register_parameter("weight", module.weight)
        new.register_parameter("bias", module.bias)
        new.train(module.training)
        new.fallback = fallback
        return new

    def forward(self, input, residual=None):
        if self.weight is None and self.bias is not None:
            raise ValueError("cute_kernels.nn.LayerNorm: a bias without a weight is not supported")
        if residual is None and input.numel() < self.native_below:
            return torch.nn.functional.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
        if residual is None:
            return ff.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps, fallback=self.fallback)
        return ff.fused_add_layer_norm(input, residual, self.normalized_shape, self.weight, self.bias, self.eps,
                                       fallback=self.fallback)

    def extra_repr(self) -> str:
        extra = super().extra_repr()
        if self.fallback != "none":
            extra += f", fallback={self.fallback!r}"
        return extra + ", kernel='cute_kernels'"


# ---- recognizing the modules a model is built with -------------------------------------------------

_KNOWN_ATTRS = {"weight", "eps", "variance_epsilon", "hidden_size", "dim", "normalized_shape"}


def _looks_like_hf_rms_norm(module) -> bool:
    """A class named `*RMSNorm` holding exactly a 1-D `weight` and a numeric eps / variance_epsilon,
    and no options this rule does not know (with_scale, ...)."""
    if not type(module).__name__.endswith("RMSNorm"):
        return False
    weight = module._parameters.get("weight")
    if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1:
        return False
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if isinstance(eps, bool) or not isinstance(eps, (float, int)):
        return False
    if module._buffers or module._modules or set(module._parameters) != {"weight"}:
        return False
    extra = {k for k in vars(module) if not k.startswith("_") and k != "training"} - _KNOWN_ATTRS
    return not extra


def _probe(module, x):
    with torch.no_grad():
        try:
            out = module(x)
        except Exception:  # noqa: BLE001 - a module that cannot run on a probe is not replaced
            return None
    return out if isinstance(out, torch.Tensor) and out.shape == x.shape else None


def _hf_rms_convention(module, eps: float) -> tuple[float, str] | None:
    """(offset, dtype_policy) that a duck-typed RMSNorm computes, found by running it on an fp32
    probe: x * rsqrt(mean(x^2) + eps) * (weight + offset) for offset 1 (tried first for a class
    named Gemma*) or 0; the dtype policy from a bf16 probe when the weight is not bf16 (Gemma's
    return the input's dtype, the Llama family's promote). None when neither formula matches. A
    weight without data (meta) is not run: the class name decides."""
    gemma = "Gemma" in type(module).__name__
    weight = module.weight
    if weight.device.type == "meta":
        return (1.0, "input") if gemma else (0.0, "promote")
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(3, weight.shape[0], generator=gen).to(weight.device)
    got = _probe(module, x)
    if got is None:
        return None
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    for offset in ((1.0, 0.0) if gemma else (0.0, 1.0)):
        if torch.allclose(got.float(), rms * (weight.detach().float() + offset), rtol=1e-4, atol=1e-5):
            break
    else:
        return None
    policy = "input" if offset else "promote"
    if weight.dtype != torch.bfloat16:
        low = _probe(module, x.to(torch.bfloat16))
        if low is None:
            return None
        policy = "input" if low.dtype == torch.bfloat16 else "promote"
    return offset, policy


def _is_timm_layer_norm(module) -> bool:
    return (isinstance(module, torch.nn.LayerNorm) and type(module).__name__ == "LayerNorm"
            and type(module).__module__.startswith("timm."))


def _native_below(norm):
    """`norm` set to run torch's native op on inputs under NATIVE_BELOW elements (it replaces a
    torch module whose forward is one native op)."""
    norm.native_below = NATIVE_BELOW
    return norm


def replacement_for(module: torch.nn.Module, *, fallback: str = "none") -> torch.nn.Module | None:
    """Our module standing in for `module` (sharing its parameters), or None when it is not a norm
    we replace (module docstring). Our own modules return None (patching twice changes nothing)."""
    check_fallback("nn.replacement_for", fallback)
    if isinstance(module, (RMSNorm, LayerNorm)):
        return None
    kind = type(module)
    if kind is torch.nn.RMSNorm:
        return _native_below(RMSNorm.from_module(module, fallback=fallback))
    if kind is torch.nn.LayerNorm or _is_timm_layer_norm(module):
        if module.weight is None and module.bias is not None:
            return None
        return _native_below(LayerNorm.from_module(module, fallback=fallback))
    if not _looks_like_hf_rms_norm(module):
        return None
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", None)))
    convention = _hf_rms_convention(module, eps)
    if convention is None:
        return None
    offset, policy = convention
    return RMSNorm.from_module(module, offset=offset, dtype_policy=policy, eps=eps, fallback=fallback)
