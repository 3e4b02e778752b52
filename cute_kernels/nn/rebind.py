"""Route a module's own `F.scaled_dot_product_attention` calls to ours, on the instance.

A module whose `forward` calls torch.nn.functional.scaled_dot_product_attention through a name
in its defining module's globals (`F.scaled_dot_product_attention` with `F` bound to
torch.nn.functional, or the function imported by name) gets, on the instance, a copy of that
forward whose globals see `cute_kernels.nn.functional.scaled_dot_product_attention` (with the
options given) under the name instead. Nothing global changes, no other torch call pays a
Python hop (what `route()`'s TorchFunctionMode costs), and torch.compile traces the copy as it
would the original. timm's attention modules and most hand-written models call SDPA this way.

Not rebound (`rebind_sdpa` lists what it did rebind): a forward that reaches SDPA through a
helper function or the full `torch.nn.functional.scaled_dot_product_attention` path; for those,
`cute_kernels.nn.route()` remains. A rebound module deep-copies; it no longer pickles (its
forward is not importable by name).
"""

from __future__ import annotations

import re
import sys
import types

import torch

__all__ = ["rebind_sdpa", "is_rebound"]

_SDPA = torch.nn.functional.scaled_dot_product_attention
_MARK = "_cute_kernels_rebound"
# (kernel, fallback) -> (the routed SDPA, a module standing in for torch.nn.functional)
_STAND_INS: dict = {}
# (defining module, kernel, fallback) -> the module whose dict is a rebound forward's globals
_SCOPES: dict = {}


def _stand_in(kernel: str, fallback: str):
    entry = _STAND_INS.get((kernel, fallback))
    if entry is None:
        from . import functional as cf

        def scaled_dot_product_attention(*args, **kwargs):
            return cf.scaled_dot_product_attention(*args, **kwargs, kernel=kernel, fallback=fallback)

        module = _module(f"functional_{kernel}_{fallback}")
        module.__dict__.update({k: v for k, v in torch.nn.functional.__dict__.items() if not k.startswith("__")})
        module.scaled_dot_product_attention = scaled_dot_product_attention
        entry = _STAND_INS[(kernel, fallback)] = (scaled_dot_product_attention, module)
    return entry


def _module(suffix: str) -> types.ModuleType:
    """A module registered in sys.modules under cute_kernels.nn.rebind.<suffix>: torch.compile
    resolves an inlined function's globals through the module its `__name__` names, so a
    rebound forward's globals must be a real, importable module's dict."""
    name = f"{__name__}.{re.sub(r'[^0-9A-Za-z_]', '_', suffix)}"
    module = sys.modules.get(name)
    if module is None:
        module = sys.modules[name] = types.ModuleType(name)
    return module


def _replacements(fn, kernel: str, fallback: str) -> dict:
    """{global name: stand-in} for the names through which `fn` reaches SDPA (empty: none)."""
    code = getattr(fn, "__code__", None)
    if code is None or "scaled_dot_product_attention" not in _names(code):
        return {}
    routed, functional = _stand_in(kernel, fallback)
    found = {}
    for name in code.co_names:
        value = fn.__globals__.get(name)
        if value is torch.nn.functional:
            found[name] = functional
        elif value is _SDPA:
            found[name] = routed
    return found


def _names(code) -> set:
    """co_names of a code object and the code objects nested in it (comprehensions, lambdas)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def is_rebound(module: torch.nn.Module):
    """The (kernel, fallback) options `module`'s forward was rebound with, or None."""
    forward = module.__dict__.get("forward")
    return getattr(getattr(forward, "__func__", None), _MARK, None)


def _scope(fn, replacements: dict, options: tuple) -> dict:
    """The globals of `fn`'s rebound copy: its module's, with the replacements (one scope per
    defining module and options, refreshed from the module's globals on each patch)."""
    origin = fn.__globals__.get("__name__", "unknown")
    module = _SCOPES.get((origin, *options))
    if module is None:
        module = _SCOPES[(origin, *options)] = _module(f"{origin}__{options[0]}_{options[1]}")
    name = module.__name__
    module.__dict__.update(fn.__globals__)
    module.__dict__.update(replacements)
    module.__dict__["__name__"] = name
    return module.__dict__


def _rebound(fn, replacements: dict, options: tuple):
    scope = _scope(fn, replacements, options)
    new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, scope["__name__"], fn.__doc__
    new.__dict__.update(fn.__dict__)
    setattr(new, _MARK, options)
    return new


def rebind_sdpa(model: torch.nn.Module, *, kernel: str = "auto", fallback: str = "none") -> list[str]:
    """Rebind, on each submodule of `model` (itself included) whose class's forward calls SDPA
    through a global name, a forward that calls ours (module docstring). In place and
    idempotent; returns the qualified names of the modules rebound now or before."""
    done = []
    for name, module in model.named_modules():
        options = is_rebound(module)
        if options == (kernel, fallback):
            done.append(name)
            continue
        if options is None and "forward" in module.__dict__:  # an instance forward set elsewhere: leave it
            continue
        fn = type(module).forward
        replacements = _replacements(fn, kernel, fallback)
        if replacements:
            module.forward = types.MethodType(_rebound(fn, replacements, (kernel, fallback)), module)
            done.append(name)
    return done
