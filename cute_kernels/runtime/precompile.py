"""Fill the disk compile cache in parallel, from a trace of the calls a program will make.

A cold process compiles each kernel it meets one after another (about a second each). When
the calls are known ahead (a fuzz's problem list, a model's first step), `precompile` runs the
same calls in `workers` fresh processes with the compile cache in dry-run mode
(`cache._DryRun`): each worker compiles the kernels it meets that are neither on disk nor
claimed by another worker (`cache.claim`), stores them, and launches nothing. The workers trace
the same calls in the same order, so they spread the kernels among themselves as they go: the
first to reach a kernel compiles it while the others move on to the next. The program's own run
then loads every kernel from disk in milliseconds.

The trace is `target(*args)`, `target` a "module:function" string importable in a fresh
process. It must make the same kernel calls in every process (seeded data, no dependence on
results: in a dry run kernels compute nothing) and needs whatever devices those calls need.
Kernels whose compile key is not stable across processes (it embeds an object address) are
not disk-cacheable and are left to the program's own run; the counts say how many.
"""

from __future__ import annotations

import importlib
import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

__all__ = ["precompile", "default_workers"]


def default_workers() -> int:
    """One worker per two CPU cores (a compile keeps one core busy and loads the other), at
    least 1."""
    return max(1, (os.cpu_count() or 2) // 2)


def _resolve(target: str):
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"precompile: target must be 'module:function', got {target!r}")
    return getattr(importlib.import_module(module), name)


def _worker(target: str, args: tuple) -> dict:
    from . import cache

    cache._DRY_RUN.on = True  # any kernel it meets: claims keep each to one worker
    before = dict(cache._DRY_RUN.counts)  # a pool process may run two of the tasks
    try:
        _resolve(target)(*args)
    finally:
        cache._DRY_RUN.on = False
    return {k: v - before[k] for k, v in cache._DRY_RUN.counts.items()}


def precompile(target: str, *args, workers: int | None = None) -> dict:
    """Compile into the disk cache every cacheable kernel that `target(*args)` compiles, in
    `workers` processes (default `default_workers()`); returns {"compiled", "present" (already
    on disk), "uncacheable", "workers", "seconds"}. Raises the first worker's exception, and
    RuntimeError when the disk cache is off (CUTE_KERNELS_DISK_CACHE=0: nothing would last).

    Post-condition: a process that then runs `target(*args)` with the same cache directory
    compiles nothing that a worker could store.
    """
    from .cache import disk_cache_enabled

    if not disk_cache_enabled():
        raise RuntimeError("precompile: the disk cache is off (CUTE_KERNELS_DISK_CACHE=0); nothing would be kept")
    _resolve(target)  # a bad target fails here, not in every worker
    workers = default_workers() if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"precompile: workers must be >= 1, got {workers}")
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        counts = [f.result() for f in [pool.submit(_worker, target, tuple(args)) for _ in range(workers)]]
    compiled = sum(c["compiled"] for c in counts)
    # every worker meets the same kernels: what one of them met, less what all compiled, was on disk
    first = counts[0]
    met = first["compiled"] + first["present"] + first["others"]
    return {"compiled": compiled, "present": met - compiled, "uncacheable": first["uncacheable"], "workers": workers,
            "seconds": round(time.perf_counter() - start, 2)}
