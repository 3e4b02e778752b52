"""Warm-path caches: one mechanism for everything a warm call looks up instead of deriving.

    WarmCache(name, max_entries=None, kind="build")   a named, registered, optionally bounded dict
    memo(cache, key, build, *args)                    cache[key], built once by build(*args)
    PlanCache(name, max_entries=1024)                 the bounded kind holding launch plans
    invalidate()                                      forget every plan (kind "plan")
    warm_caches()                                     every cache, by name (what a process holds)
    tensor_signature(t), plain_tensors(*ts), PLAN_DEVICES   what a plan may assume

Kinds: a "build" cache holds what its key determines for the life of the process (a kernel
object per config, a config per problem class, a compiled function per config); a "plan" cache
holds launch plans, which assume the choices of the checked path and so are forgotten when
those may change. A bounded cache starts afresh when full (keys that vary without bound, such
as a new sequence length every call, cost one build each).

Launch plans: what a warm call of a public entry point does instead of its checks.

Definitions:

signature: a hashable tuple describing a call completely enough that two calls with equal
    signatures take the same path through the checked code (same checks passed, same rung,
    same config, same compiled function, same views). For a tensor it is `tensor_signature`:
    (class, shape, strides, dtype, device, data pointer mod 16, requires_grad); the caller
    adds every option that can change the path (kernel name, dtypes, whether beta is zero...).
plan: a callable, stored under a signature on the first (fully checked) call that takes a
    path the entry point knows how to replay, doing only what must happen per call: allocate
    the results, form the kernel-order views from the caller's tensors (`torch.as_strided`
    with stored sizes and strides), call the compiled function. A plan never holds a caller's
    tensor, so caching one keeps no memory alive.

Rules every user of this module follows (why a hit is as safe as the checked path):
- a plan is recorded only after the checked path ran for that signature and reached the
  replayable launch, so every check it skips passed for an equal signature;
- plans are recorded only for plain tensors (`torch.Tensor`, `torch.nn.Parameter`, not
  FakeTensor or other subclasses) on a device type in `PLAN_DEVICES` (CUDA), and only for the
  TVM-FFI builds, which read torch's current stream themselves at each call (a stream is
  never part of a plan);
- anything that changes how the checked path would decide for an equal signature (a cleared
  kernel cache, a new autotuned winner) calls `invalidate()`.
The eager direct path (`runtime.eager`) keeps its plans here too, one level up.
"""

from __future__ import annotations

import weakref

__all__ = ["PLAN_DEVICES", "WarmCache", "PlanCache", "memo", "warm_caches", "tensor_signature", "plain_tensors",
           "invalidate", "cache_activity"]

# Device types whose calls get plans. CPU tests that run the rungs on CPU tensors (with their
# device checks stubbed) leave this alone, so they always exercise the checked path; the plan
# cache tests add "cpu" for their duration.
PLAN_DEVICES = frozenset({"cuda"})

_CACHES: "weakref.WeakSet[PlanCache]" = weakref.WeakSet()
_PLAIN: tuple = ()


def _plain_types() -> tuple:
    global _PLAIN
    if not _PLAIN:
        import torch

        _PLAIN = (torch.Tensor, torch.nn.Parameter)
    return _PLAIN


class WarmCache(dict):
    """key -> value (a dict, so a warm lookup is `cache.get(key)`), named and registered so that
    `warm_caches()` lists it and `invalidate()` finds the plan caches. `puts` counts the values
    stored (`put` or item assignment; only cold paths store, and a warm lookup costs nothing
    more): a count that still moves during a warm step names a cache whose calls keep missing
    (`cache_activity`).

    Post-condition of `put`: a bounded cache holds at most `max_entries` values.
    """

    def __init__(self, name: str, max_entries: int | None = None, *, kind: str = "build"):
        super().__init__()
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"{type(self).__name__} {name!r}: max_entries must be >= 1, got {max_entries}")
        if kind not in ("build", "plan"):
            raise ValueError(f"WarmCache {name!r}: kind must be 'build' or 'plan', got {kind!r}")
        self.name, self.max_entries, self.kind = name, max_entries, kind
        self.puts = 0
        _CACHES.add(self)

    def put(self, key, value):
        """Store `value` under `key` (a full bounded cache first starts afresh); returns value."""
        if self.max_entries is not None and len(self) >= self.max_entries:
            self.clear()
        self[key] = value
        return value

    def __setitem__(self, key, value):
        # Only cold paths store; warm lookups (`get`) stay dict's own.
        self.puts += 1
        dict.__setitem__(self, key, value)

    __hash__ = object.__hash__  # WeakSet membership by identity (a dict is otherwise unhashable)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self)} entries)"


class PlanCache(WarmCache):
    """signature -> plan: the bounded "plan" kind of `WarmCache`, forgotten by `invalidate()`."""

    def __init__(self, name: str, max_entries: int = 1024):
        super().__init__(name, max_entries, kind="plan")

    def __repr__(self) -> str:
        return f"PlanCache({self.name!r}, {len(self)} plans)"


_MISSING = object()


def memo(cache, key, build, *args):
    """`cache[key]`, made by `build(*args)` and stored (bound honoured) when absent: the warm path
    of every derivation a key determines. `cache` is a WarmCache (or any dict: tests replace
    caches with plain ones)."""
    value = cache.get(key, _MISSING)
    if value is _MISSING:
        value = build(*args)
        if cache.__class__ is dict:
            cache[key] = value
        else:
            cache.put(key, value)
    return value


def warm_caches() -> list:
    """Every live WarmCache of this process, sorted by name."""
    return sorted(_CACHES, key=lambda c: c.name)


def cache_activity(before: dict | None = None) -> dict:
    """{cache name: values stored so far} over the live warm caches (names shared by several
    caches are summed); with `before` (an earlier result), only the caches that stored something
    since, with how many. A warm step's activity should be empty: each entry is a cache whose
    calls took the checked path during it."""
    now: dict = {}
    for cache in _CACHES:
        now[cache.name] = now.get(cache.name, 0) + cache.puts
    if before is None:
        return now
    return {name: n - before.get(name, 0) for name, n in sorted(now.items()) if n != before.get(name, 0)}


def invalidate() -> None:
    """Forget every plan of every plan cache (the next call of each signature is checked again)."""
    for cache in list(_CACHES):
        if cache.kind == "plan":
            cache.clear()


def tensor_signature(t) -> tuple:
    """What a plan may assume about one tensor argument: (class, shape, strides, dtype, device,
    data pointer mod 16, requires_grad). Raises TypeError for anything but a plain tensor (a
    FakeTensor or other subclass has no plan, and its data pointer is not read)."""
    if t.__class__ not in _PLAIN and t.__class__ not in _plain_types():
        raise TypeError(f"not a plain tensor: {t.__class__.__name__}")
    return (t.__class__, t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15, t.requires_grad)


def plain_tensors(*tensors) -> bool:
    """True when every argument that is not None is a plain tensor (`torch.Tensor` or
    `torch.nn.Parameter`) on a device type in `PLAN_DEVICES`: the calls a plan may replay."""
    plain = _plain_types()
    for t in tensors:
        if t is None:
            continue
        if t.__class__ not in plain or t.device.type not in PLAN_DEVICES:
            return False
    return True
