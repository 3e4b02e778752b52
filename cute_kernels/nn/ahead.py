"""Compile ahead for a patched model: at its first call, the kernels of all its layers.

A cold first step compiles each distinct kernel when the model first meets it, one after
another. A patched model's layers are known at `patch` time (widths, dtypes, options); its
token count is not, but the first call of any of them shows it, and in a transformer or a ViT
every linear layer and norm sees the same leading dimensions. So `arm(model)` puts a forward
pre-hook on each of our layers; the first to run removes them all and submits to
`runtime.compile_ahead`, for each distinct layer, its forward and (where the call records
autograd) its backward at those leading dimensions, made by copies of the layer whose
parameters are on the meta device (`meta_copy`). A linear layer's forward, input gradient and
weight gradient are three calls (one GEMM each, so three workers can share a layer); forwards
are queued first, then backwards in reverse layer order, as the step meets them. What the layers
do not show (a library's attention) comes from `PREDICTORS`.

A model meets new kernels again later (a generate's prefill and decode run other token counts,
so other GEMM tile shapes): each compile this process makes itself re-arms its armed models
(`cache.compile_listeners`), and the next layer call predicts at its own leading dimensions,
unless that prediction was made already.

Worker processes compile those kernels while the model runs; its own calls load them or wait
for them. A layer that sees other leading dimensions (a classifier head on one token) is
mispredicted: a worker compiles a kernel nobody uses, and the model compiles its own as it
would without compile-ahead. Off unless `runtime.compile_ahead.active()`. Under torch.compile
the hooks do nothing.
"""

from __future__ import annotations

import copy
import itertools
import weakref

import torch

from cute_kernels.runtime import cache, compile_ahead
from cute_kernels.runtime.compile_ahead import Call, TensorSpec

from .linear import Linear
from .mlp import GatedMLP
from .norms import LayerNorm, RMSNorm

__all__ = ["PREDICTORS", "arm", "armed", "disarm", "predict", "meta_copy", "layers"]

# layer -> weakref of the model it was armed for; model -> the hooks' handles; the models
# `arm` was called for (re-armed after each compile); model -> the predictions made for it
_ROOTS: "weakref.WeakKeyDictionary[torch.nn.Module, weakref.ref]" = weakref.WeakKeyDictionary()
_HANDLES: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = weakref.WeakKeyDictionary()
_MODELS: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
_PREDICTED: "weakref.WeakKeyDictionary[torch.nn.Module, set]" = weakref.WeakKeyDictionary()


# Callables (model, x) -> (forward calls, backward calls) predicting, at the first layer call's
# input x, what `layers` cannot see: a library's attention (`integrations.transformers` adds one).
PREDICTORS: list = []


def _width(module) -> tuple | None:
    """The trailing dimensions of `module`'s input (None: not a layer predicted here)."""
    if isinstance(module, Linear):
        return (module.in_features,)
    if isinstance(module, (RMSNorm, LayerNorm)):
        return tuple(module.normalized_shape)
    if isinstance(module, GatedMLP):
        return (module.hidden,)
    return None


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Our layers in `model` (itself included), outermost only, in module order."""
    found, skip = [], None
    for name, module in model.named_modules():  # pre-order: a layer's submodules follow it
        if skip is not None and name.startswith(skip):
            continue
        if _width(module) is not None:
            found.append(module)
            skip = f"{name}." if name else ""
    return found


def arm(model: torch.nn.Module) -> int:
    """Arm `model` (module docstring) and start the workers; returns how many layers were armed
    (0 where compile-ahead is off)."""
    if not compile_ahead.active():
        return 0
    if _rearm not in cache.compile_listeners:
        cache.compile_listeners.append(_rearm)
    _MODELS.add(model)
    found = _hook(model)
    if found:
        compile_ahead.start(imports=("cute_kernels.nn",))
    return found


def _hook(model: torch.nn.Module) -> int:
    disarm(model)
    found = layers(model)
    ref = weakref.ref(model)
    for layer in found:
        _ROOTS[layer] = ref
    _HANDLES[model] = [layer.register_forward_pre_hook(_first_call) for layer in found]
    return len(found)


def _rearm() -> None:
    """After a compile of this process: hook every armed model again (one not hooked now)."""
    if not compile_ahead.active():
        return
    for model in list(_MODELS):
        if not armed(model):
            _hook(model)


def armed(model: torch.nn.Module) -> bool:
    """Whether `model`'s layers carry the first-call hooks now."""
    return model in _HANDLES


def disarm(model: torch.nn.Module) -> None:
    for handle in _HANDLES.pop(model, []):
        handle.remove()


def _first_call(layer, args):
    if torch.compiler.is_compiling():
        return None
    ref = _ROOTS.get(layer)
    model = ref() if ref is not None else None
    if model is None:
        return None
    disarm(model)
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and _has_kernels(x):
        seen = _PREDICTED.setdefault(model, set())
        signature = (tuple(x.shape[:-1]), x.dtype, str(x.device), x.requires_grad, torch.is_grad_enabled(),
                     model.training)
        if signature not in seen:
            seen.add(signature)
            compile_ahead.submit(predict(model, x))
    return None


def _has_kernels(x: torch.Tensor) -> bool:
    return x.is_cuda  # elsewhere the layers compute with torch: nothing to compile


def predict(model: torch.nn.Module, x: torch.Tensor) -> list[Call]:
    """The calls of each distinct layer of `model` at `x`'s leading dimensions, dtype and
    device, in grad mode as now: forwards in layer order, then backwards (where the call
    records autograd) in reverse; a linear layer's backward as two calls, the input's gradient
    and the weights'."""
    lead, grad = tuple(x.shape[:-1]), torch.is_grad_enabled()
    forwards, backwards, seen = [], [], set()
    device = str(x.device)
    for layer in layers(model):
        shape = lead + _width(layer)
        stride = tuple(itertools.accumulate(reversed(shape[1:]), lambda a, b: a * b, initial=1))[::-1]
        spec = TensorSpec(shape, stride, x.dtype, device, requires_grad=grad and x.requires_grad)
        params = tuple((tuple(p.shape), p.dtype, p.requires_grad) for p in layer.parameters())
        trains = grad and any(p[2] for p in params)
        signature = (type(layer), layer.extra_repr(), params, spec, grad, layer.training)
        if signature in seen:
            continue
        seen.add(signature)

        def call(frozen: bool, requires_grad: bool, backward: bool, layer=layer, shape=shape, stride=stride):
            arg = TensorSpec(shape, stride, x.dtype, device, requires_grad=requires_grad)
            footprint = 0  # Call's estimate, but a linear layer's output can dwarf its input and weight
            if isinstance(layer, Linear):
                out_bytes = arg.nbytes // layer.in_features * layer.out_features
                footprint = (arg.nbytes + out_bytes + layer.weight.numel() * x.element_size()) * (
                    2 if backward else 1) + (1 << 20)  # with the backward, each has its gradient
            return Call(meta_copy(layer, frozen=frozen), (arg,), grad=grad, backward=backward, device=device,
                        training=layer.training, imports=("cute_kernels.nn",), footprint=footprint)

        forwards.append(call(False, spec.requires_grad, False))
        if not (spec.requires_grad or trains):
            continue
        if isinstance(layer, Linear) and spec.requires_grad and trains:
            backwards.append([call(True, True, True), call(False, False, True)])  # dX; dW (and the bias's)
        else:
            backwards.append([call(False, spec.requires_grad, True)])
    for predictor in PREDICTORS:
        try:
            more_forwards, more_backwards = predictor(model, x)
        except Exception:  # noqa: BLE001 - a prediction is a hint; the model compiles what it lacks
            continue
        forwards += more_forwards
        backwards.append(more_backwards)  # queued first among the backwards: attention's compile is the longest
    return forwards + [c for group in reversed(backwards) for c in group]


def meta_copy(module: torch.nn.Module, *, frozen: bool = False) -> torch.nn.Module:
    """A deep copy of `module` whose parameters and buffers are empty tensors on the meta device
    (same shapes, dtypes, and requires_grad unless `frozen`: none) and which has no hooks:
    small, picklable, and `to_empty(device=...)` makes it runnable."""
    memo = {}
    for t in itertools.chain(module.parameters(), module.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = torch.nn.Parameter(meta, requires_grad=t.requires_grad and not frozen) if isinstance(
            t, torch.nn.Parameter) else meta
    clone = copy.deepcopy(module, memo)
    for sub in clone.modules():
        for hooks in (sub._forward_pre_hooks, sub._forward_hooks, sub._backward_pre_hooks, sub._backward_hooks):
            hooks.clear()
    return clone
