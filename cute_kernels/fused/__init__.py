"""Fused memory-bound kernels (layer 4): norms, softmax, cross-entropy, RoPE, SwiGLU, and a fused
linear + cross-entropy, each forward and backward, on CuTe-DSL row kernels.

Structure:
- `tiling` (pure Python): the row tiling, its TV layout (`row_tv_layout`) and the heuristics;
  `dispatch` (pure Python): which tiling each kernel takes per (width, dtype).
- `rowkit`: the DSL building blocks (a thread's row view, predicated vector copies, row reductions).
- kernels, one module per family: `norms` (RMSNorm / LayerNorm, residual fused), `softmax`,
  `cross_entropy`, `rope`, `swiglu`; each registers its compile-only variants for SASS checks.
- torch entry points (checked once per signature, then replayed from a plan): `norm_api`,
  `softmax_api`, `cross_entropy_api`, `rope_api`, `swiglu_api`, and `linear_ce` (the chunked linear + cross-entropy; a module name unlike its functions, which the package exports).
- `reference`: the same functions in PyTorch (fp32 math), for `fallback="torch"` and tests.

Autograd, `torch.library` registration and fallbacks live in `cute_kernels.ops.fused`; drop-in
modules in `cute_kernels.nn`. Names resolve lazily: importing this package loads neither the DSL
nor torch until a name is used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "norm_forward": "norm_api",
    "norm_backward": "norm_api",
    "softmax_forward": "softmax_api",
    "softmax_backward": "softmax_api",
    "cross_entropy_forward": "cross_entropy_api",
    "cross_entropy_backward": "cross_entropy_api",
    "apply_rotary_": "rope_api",
    "rotary": "rope_api",
    "rotary_tables": "rope_api",
    "swiglu_forward": "swiglu_api",
    "swiglu_backward": "swiglu_api",
    "linear_cross_entropy": "linear_ce",
    "linear_cross_entropy_backward": "linear_ce",
    "RowTiling": "tiling",
    "row_tv_layout": "tiling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cute_kernels.fused' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
