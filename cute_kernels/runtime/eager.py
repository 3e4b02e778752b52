"""The eager direct path: a warm call of an operator, made in plain eager mode, replays a
recorded plan instead of entering its `torch.library` op.

Why: entering a `torch.library.custom_op` costs tens of µs of host time per call in eager mode
(the dispatcher, the generated autograd function binding its arguments, the op body's checks),
more than the launch it wraps. Compiled graphs, tracers and every mode still need the op (one
opaque node, no graph break), so both exist side by side and each call picks one.

    EagerOp(name, op, build)        the entry: `entry(*args)` computes `op(*args)`
    inside(name, body, args)        in the op's body: the entry's plan for the call, if any
    direct_state()                  whether the global state admits the direct path (below)
    call_key(args)                  what a plan may assume about a call
    Plan, USE_OP                    what a key's warm call does; "call the op" as a plan
    EagerFunction                   the autograd.Function a plan's differentiable calls run in
    autocast_args, register_autocast    autocast as torch applies it to F.linear and SDPA
    transparent_mode(cls)           declare a TorchFunctionMode the direct path may ignore
    op_body(op)                     a custom op's Python body, callable without the dispatcher

A call takes the direct path when all of these hold, and otherwise calls the op:
- it is not traced: not under torch.compile or torch.export (`torch.compiler.is_compiling()`,
  tested first, which dynamo folds to True so that a traced call sees only the op), not FX
  symbolic tracing, not torch.jit tracing;
- no mode is active: no TorchFunctionMode but those declared `transparent_mode` (the direct
  path then runs with torch functions disabled), no TorchDispatchMode (FakeTensorMode,
  FunctionalTensorMode and proxy modes included), no functorch transform (vmap, grad, jvp), no
  forward-AD dual level;
- the arguments are positional (the op's schema order) and plain: every tensor a
  `torch.Tensor` or `nn.Parameter` with strided storage on a device type in
  `plan_cache.PLAN_DEVICES` (a FakeTensor, other subclass, functorch wrapper, sparse or meta
  tensor fails this), every other argument None or a bool, int, float, str or torch.dtype;
- its key (`call_key`) has a plan other than `USE_OP`.
Autocast is applied first (`autocast_args`, the rule the op's own autocast kernel applies), so
both paths see the same dtypes. A key seen for the first time calls the op, whose checked path
raises what it raises and leaves the kernel layer's own plans behind, then asks
`build(result, *args)` for a plan of the same call (None: `USE_OP`). With grad mode on and a tensor argument requiring
grad the plan runs inside `EagerFunction` (the key says which), whose backward is the plan's.

Post-condition (the rule of `plan_cache`, one level up): a plan runs only for a key whose
checked call succeeded, and the key holds everything the op's path decides on, so a plan
computes what the op computes. `plan_cache.invalidate()` forgets eager plans too.

Adopting it, for an operator `ops.fused_op(x, weight, eps, rung, fallback)` whose body calls
a kernel-layer entry that keeps plans (`plan_cache.PlanCache`, looked up by a `plan_for` with
the entry's own arguments), with the op's autograd formula `_setup` / `_backward`:

    class FusedPlan(Plan):
        def __init__(self, launch): self.launch = launch     # the kernel layer's plan; no tensors
        def run(self, x, weight, eps, rung, fallback):
            return self.launch(x.detach(), weight.detach(), eps)
        def forward(self, ctx, *args):
            out = self.run(*args); _setup(ctx, args, out); return out   # save as the op does
        def backward(self, ctx, grad):                        # the op's formula, bodies not ops
            return _grads(ctx, grad, op_body(fused_op_backward))
        def backward_op(self, ctx, grad):
            return _backward(ctx, grad)                       # the op's registered backward

    def _build(result, x, weight, eps, rung, fallback):
        launch = fused_api.plan_for(x.detach(), weight.detach(), eps=eps, kernel=rung)
        return None if launch is None else FusedPlan(launch)

    fused = EagerOp("fused_op", ops.fused_op, _build)         # nn calls fused(x, w, eps, rung, fb)
    register_autocast(ops.fused_op)                           # where torch would autocast it

The kernel layer's own warm path uses the same caches: `plan_cache.WarmCache` and `memo` for
what a key determines (configs, kernel objects, compiled functions), `PlanCache` for launch
plans; a family's ladder is a `kernel_registry.LadderRegistry`.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _forward_ad
import torch.fx._symbolic_trace as _fx_trace

from . import compile_ahead, plan_cache
from .plan_cache import PlanCache

__all__ = ["EagerOp", "EagerFunction", "Plan", "USE_OP", "direct_state", "call_key", "autocast_args",
           "register_autocast", "transparent_mode", "op_body", "inside", "detached"]

_C = torch._C
_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
_SCALARS = frozenset({bool, int, float, str, type(None), torch.dtype})
_is_compiling = torch.compiler.is_compiling
_function_modes_on = _C._is_torch_function_mode_enabled
_dispatch_modes = _C._len_torch_dispatch_stack
_functorch_on = _C._are_functorch_transforms_active
_jit_tracing = _C._get_tracing_state
_any_autocast = _C._is_any_autocast_enabled
_grad_on = _C.is_grad_enabled
_cuda_device = getattr(_C, "_cuda_getDevice", None)

# TorchFunctionMode classes the direct path may run under (with torch functions disabled).
_TRANSPARENT: set = set()

# direct_state() values
NO, YES, YES_UNDER_MODES = 0, 1, 2


def transparent_mode(cls):
    """Declare TorchFunctionMode class `cls` transparent to the direct path: a mode that passes
    every torch function through unchanged except those it reroutes, none of which a plan
    calls (cute_kernels.nn.route reroutes F.linear and SDPA). Under such modes alone a warm call
    still takes the direct path, with torch functions disabled for its duration. Returns cls."""
    _TRANSPARENT.add(cls)
    return cls


def direct_state() -> int:
    """YES when the global state admits the direct path, YES_UNDER_MODES when it does but only
    transparent TorchFunctionModes are active, NO otherwise (see the module docstring)."""
    return NO if _is_compiling() else _untraced_state()


def _untraced_state() -> int:
    """`direct_state` once `torch.compiler.is_compiling()` was found False (the entry tests it
    first, alone, so that dynamo folds it and traces none of the calls below)."""
    if (_dispatch_modes() or _functorch_on() or _jit_tracing() is not None or _fx_trace._is_fx_tracing_flag
            or _forward_ad._current_level >= 0):
        return NO
    if not _function_modes_on():
        return YES
    for i in range(_C._len_torch_function_stack()):
        if type(_C._get_function_stack_at(i)) not in _TRANSPARENT:
            return NO
    return YES_UNDER_MODES


def call_key(args: tuple):
    """The key of a call with positional `args`, or None when it cannot have a plan.

    A tensor contributes (shape, strides, dtype, device index, data pointer mod 16,
    requires_grad), any other argument (type, value); the key ends with the current CUDA
    device (when a tensor is on CUDA) and whether the call records autograd (grad mode on and
    a tensor requiring grad), which is `key[-1]`."""
    key = []
    grad = cuda = False
    devices = plan_cache.PLAN_DEVICES
    cuda_ok, cpu_ok = "cuda" in devices, "cpu" in devices  # the device types plans exist for
    try:
        for a in args:
            c = a.__class__
            if c is _Tensor or c is _Parameter:
                if a.is_cuda:  # (device.type would build a string per tensor)
                    if not cuda_ok:
                        return None
                    cuda = True
                elif not (cpu_ok and a.is_cpu):
                    return None
                r = a.requires_grad
                grad = grad or r
                key += (a.shape, a.stride(), a.dtype, a.get_device(), a.data_ptr() & 15, r)
            elif c in _SCALARS:
                key += (c, a)
            else:
                return None
    except RuntimeError:  # no strides or no storage: sparse, nested, a functorch wrapper
        return None
    if cuda:
        key.append(_cuda_device())
    key.append(grad and _grad_on())
    return tuple(key)


def op_body(op):
    """The function `torch.library.custom_op` wrapped into `op`: the op's computation without
    the dispatcher, for a plan's backward, which runs below autograd (`EagerFunction.backward`
    without create_graph) and so needs none of what the dispatcher adds. `op` itself where torch
    keeps no such function."""
    return getattr(op, "_init_fn", None) or op


def detached(*tensors) -> tuple:
    """The tensors without autograd history, for the kernel layer (DLPack export refuses a tensor
    that requires grad). Only those that require grad are replaced: the others keep their
    identity, which the kernel layer's memos of tensor contents key on (`TensorMemo`: a varlen
    batch's offsets read to the host once for every layer, not once per call). None passes."""
    return tuple(t.detach() if t is not None and t.requires_grad else t for t in tensors)


class Plan:
    """What the warm call of one key does. `run(*args)` computes the op's outputs without
    autograd; `forward(ctx, *args)` computes them inside `EagerFunction`, saving on ctx what
    `backward(ctx, *grads)` needs to return one gradient (or None) per argument;
    `backward_op(ctx, *grads)` returns the same gradients through differentiable ops (used for
    create_graph=True and compiled autograd). A plan holds no caller tensor."""

    __slots__ = ()

    def run(self, *args):
        raise NotImplementedError

    def forward(self, ctx, *args):
        raise NotImplementedError

    def backward(self, ctx, *grads):
        raise NotImplementedError

    def backward_op(self, ctx, *grads):
        raise NotImplementedError


USE_OP = Plan()  # the plan of a key whose path cannot be replayed: every call enters the op


class EagerFunction(torch.autograd.Function):
    """The autograd node of a differentiable direct call: apply(*args, plan). Each `EagerOp`
    derives its own subclass, so a graph names the operator (`CuteKernelsLinearBackward`)."""

    @staticmethod
    def forward(ctx, *args):
        plan = args[-1]
        ctx.plan = plan
        return plan.forward(ctx, *args[:-1])

    @staticmethod
    def backward(ctx, *grads):
        plan = ctx.plan
        if _grad_on() or _is_compiling():  # a differentiable backward, or one being traced
            return (*plan.backward_op(ctx, *grads), None)
        return (*plan.backward(ctx, *grads), None)


# Function.apply in Python binds arguments for setup_context-style functions and unwraps dead
# functorch wrappers; neither applies here (forward takes ctx; no transform is active and
# call_key refuses wrappers), so the direct path enters the C implementation it then calls.
_BASE_APPLY = _C._FunctionBase.__dict__.get("apply")


class EagerOp:
    """`entry(*args)`: `op(*args)`, through a plan when the call admits one (module docstring).

    name: names the plan cache (`eager.<name>`) and the autograd node; op: the torch.library
    op (a callable taking the same positional arguments); build(result, *args) -> Plan | None:
    called after the op completed a call (returning `result`), it returns the replay of that
    call (from the kernel layer's stored plans), or None; autocast: apply `autocast_args` first
    (operators torch's autocast would cast, as F.linear).

    family: None, or (family_key, family_build) for calls whose keys differ only in sizes a
    plan can read per call (a decode loop's growing KV cache makes a new key every step). For
    a call that records no autograd and has no plan of its own, `family_key(args)` gives the
    family's key (None: no family), and the family's plan, built once by `family_build(result,
    *args)` like `build`, runs it. The rule of `plan_cache` holds per family: `family_key` must
    hold everything the op's path decides on for every call it admits."""

    def __init__(self, name: str, op, build, *, autocast: bool = True, max_plans: int = 1024, family=None):
        self.name, self.op, self.build, self.autocast = name, op, build, autocast
        self.home = getattr(build, "__module__", None)  # where the entry is made (compile-ahead imports it)
        self.plans = PlanCache(f"eager.{name}", max_plans)
        self.family = family
        self.family_plans = PlanCache(f"eager.{name}.family", 64) if family is not None else None
        _ENTRIES[name] = self
        camel = "".join(part.capitalize() for part in name.replace(".", "_").split("_"))
        self.function = type(f"CuteKernels{camel}", (EagerFunction,), {"__module__": __name__})
        self._apply = _BASE_APPLY.__get__(None, self.function) if _BASE_APPLY is not None else self.function.apply

    def __call__(self, *args, **kwargs):
        if kwargs or _is_compiling():
            return self.op(*args, **kwargs)
        state = _untraced_state()
        if state == YES:
            return self._direct(args)
        if state == YES_UNDER_MODES:
            with _C.DisableTorchFunction():
                return self._direct(args)
        return self.op(*args)

    def _direct(self, args: tuple):
        if self.autocast and _any_autocast():
            args = autocast_args(args)
        key = call_key(args)
        if key is None:
            return self.op(*args)
        plan = self.plans.get(key)
        if plan is None:
            if self.family is None or key[-1]:
                return self._first(key, args)
            return self._family(key, args)
        if plan is USE_OP:
            return self.op(*args)
        if key[-1]:
            return self._apply(*args, plan)
        return plan.run(*args)

    def _family(self, key, args: tuple):
        family_key, family_build = self.family
        fkey = family_key(args)
        if fkey is None:
            return self._first(key, args)
        plan = self.family_plans.get(fkey)
        if plan is None:
            result = self.op(*args)
            self.plans.pop(key, None)  # the op's body (`inside`) kept this one-off key's plan
            plan = family_build(result, *args)
            self.family_plans.put(fkey, USE_OP if plan is None else plan)
            return result
        if plan is USE_OP:
            return self._first(key, args)
        return plan.run(*args)

    def _first(self, key, args: tuple):
        result = self.op(*args)
        if self.plans.get(key) is None:  # the op's body may have recorded it (`inside`)
            self.record(key, result, args)
        if key[-1]:  # its backward comes next: a compile-ahead worker may compile it meanwhile
            compile_ahead.backward_of(self.name, self.home, args)
        return result

    def record(self, key, result, args: tuple) -> None:
        """Keep `build`'s plan of the call `args` that just returned `result` under `key` (or
        `USE_OP` where it has none): what the entry's first call and the op's body both do."""
        plan = self.build(result, *args)
        self.plans.put(key, USE_OP if plan is None else plan)

    def __repr__(self) -> str:
        return f"EagerOp({self.name!r}, {len(self.plans)} plans)"


# The entries by name, for `inside`.
_ENTRIES: dict = {}


def call_entry(name: str, *args):
    """The entry called `name` on `args` (a compile-ahead worker's target: `compile_ahead.backward_of`)."""
    return _ENTRIES[name](*args)


def inside(name: str, body, args: tuple):
    """`body(*args)`, the body of the op the `EagerOp` called `name` wraps, replaying that
    entry's plan for the call where it has one.

    The op's body runs where the direct path cannot: a compiled graph calls the op (so do
    tracers' eager runs, modes, and the first call of a key). There the dispatcher has already
    been paid, but the body's checks and dispatch (tens of µs: a patched ViT under
    torch.compile idled the GPU for 100 µs before each linear layer) need not be: a call whose
    key (`call_key`, autograd never recorded inside an op's body) has a plan runs it; the first
    call of a key runs `body` and records the entry's plan for it, as the entry's own first
    call does. Calls that cannot have a key (fake and functional tensors, wrappers) run `body`.
    `args` are the op's arguments in its schema order, as the entry is called."""
    entry = _ENTRIES.get(name)
    key = None if entry is None else call_key(args)
    if key is None or key[-1]:
        return body(*args)
    plan = entry.plans.get(key)
    if plan is None:
        result = body(*args)
        entry.record(key, result, args)
        return result
    if plan is USE_OP:
        return body(*args)
    return plan.run(*args)


# ---- autocast ---------------------------------------------------------------------------------

def autocast_args(args: tuple) -> tuple:
    """`args` with every floating tensor cast as torch's autocast casts the inputs of F.linear
    and scaled_dot_product_attention (its `lower_precision_fp` rule): to the autocast dtype of
    its device type when autocast is enabled there; float64 tensors and tensors of that dtype
    already are left alone. Not cached across calls (torch caches the casts of leaf tensors
    that require grad within an autocast region; here each call casts again)."""
    out = None
    for i, a in enumerate(args):
        if isinstance(a, _Tensor) and a.is_floating_point() and a.dtype is not torch.float64:
            device_type = a.device.type
            if torch.is_autocast_enabled(device_type):
                dtype = torch.get_autocast_dtype(device_type)
                if a.dtype is not dtype:
                    out = out or list(args)
                    out[i] = a.to(dtype)
    return args if out is None else tuple(out)


_AUTOCAST_LIBS: dict = {}


def register_autocast(op, device_types=("cuda", "cpu")) -> None:
    """Register, for custom op `op` (a `torch.library.custom_op`), autocast kernels that apply
    `autocast_args` and run the op with autocast off: what torch does for F.linear, so the op
    (under torch.compile too) and the direct path cast alike. Idempotent per op."""
    qualname = op._qualname
    if qualname in _AUTOCAST_LIBS:
        return
    namespace, name = qualname.split("::")
    lib = torch.library.Library(namespace, "FRAGMENT")
    overload = op._opoverload
    excluded = _C.DispatchKeySet(_C.DispatchKey.AutocastCPU) | _C.DispatchKeySet(_C.DispatchKey.AutocastCUDA)

    def kernel(keyset, *args, **kwargs):
        args = autocast_args(args)
        with _C._ExcludeDispatchKeyGuard(excluded):
            return overload(*args, **kwargs)

    for device_type in device_types:
        if _C._is_autocast_available(device_type):
            lib.impl(name, kernel, "Autocast" + _C._dispatch_key_for_device(device_type), with_keyset=True)
    _AUTOCAST_LIBS[qualname] = lib
