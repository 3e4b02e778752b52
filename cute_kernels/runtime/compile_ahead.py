"""Compile ahead: the kernels a program is about to need, compiled in background processes.

A cold process compiles each kernel when it first meets it, one after another (a GEMM about
1.5 s, an attention backward several). When calls can be predicted (the backward of a call that
records autograd; a patched model's layers at its first call: `cute_kernels.nn.ahead`), `submit`
hands them to worker processes that make them in dry-run mode (`cache._DryRun`): each kernel not
yet on disk is compiled and stored, nothing launches. The program's own calls then load those
kernels from disk, or wait for the worker compiling one (`cache.claim`: one compiler per disk
entry across processes) instead of compiling it a second time.

    Call(target, args, ...)     a call to make: a "module:function" path or a picklable object
                                (a module with meta parameters), args whose `TensorSpec` leaves
                                become empty tensors of that shape, strides, dtype and device
    submit(calls)               queue calls (each distinct call once per process)
    start(imports)              start the workers now (their interpreters and imports take seconds)
    backward_of(name, home, args)   a call of eager entry `name` that records autograd: its
                                backward (the forward is being compiled by the caller)
    wait(timeout)               block until every submitted call is made (tests, benchmarks)
    active()                    whether compile-ahead is on here

A prediction is a hint: a wrong one costs a worker's time, never a result, since a disk entry
is keyed by what it compiles. Workers are fresh interpreters (`python -m
cute_kernels.runtime.ahead_worker`), not multiprocessing's spawn, which would run an unguarded
user script again in every child; each exits after `IDLE_S` seconds without work, freeing its
CUDA context. Off unless the unverified path `compile_ahead` is on (`runtime.unverified`), the
disk cache is on, and this process is not itself a worker nor in a dry run (precompile's).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TensorSpec", "Call", "RESERVE", "fits", "backward_of", "submit", "start", "wait", "shutdown", "active",
           "workers", "counts", "spec_args", "map_leaves", "leaves", "IDLE_S", "WORKER_ENV"]

WORKER_ENV = "CUTE_KERNELS_AHEAD_WORKER"  # set in workers: they predict nothing themselves
IDLE_S = 30.0


@dataclass(frozen=True)
class TensorSpec:
    """What a tensor argument looks like to a kernel's compile key: shape, strides, dtype,
    device, requires_grad, and its storage offset modulo 16 bytes (the alignment keys hold)."""

    shape: tuple
    stride: tuple
    dtype: Any
    device: str
    requires_grad: bool = False
    offset: int = 0

    @classmethod
    def of(cls, t) -> "TensorSpec":
        per16 = max(1, 16 // t.element_size())
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device), bool(t.requires_grad),
                   t.storage_offset() % per16)

    @property
    def extent(self) -> int:
        """Elements of storage the tensor reaches (its offset included)."""
        if any(n == 0 for n in self.shape):
            return self.offset
        return self.offset + 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride))

    @property
    def nbytes(self) -> int:
        import torch

        return self.extent * torch.empty((), dtype=self.dtype).element_size()

    def make(self):
        """An uninitialized tensor like this (integer ones zeroed: host checks read indices)."""
        import torch

        base = torch.empty(self.extent, dtype=self.dtype, device=self.device)
        if not (base.is_floating_point() or base.is_complex()):
            base.zero_()
        t = base.as_strided(self.shape, self.stride, self.offset)
        return t.requires_grad_() if self.requires_grad else t


def map_leaves(fn, tree):
    """`tree` (nested tuples, lists and dicts) with `fn` applied to every other value."""
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_leaves(fn, a) for a in tree)
    if isinstance(tree, dict):
        return {k: map_leaves(fn, v) for k, v in tree.items()}
    return fn(tree)


def leaves(tree):
    """The values of `tree` (nested tuples, lists and dicts) that are none of those, in order."""
    if isinstance(tree, (tuple, list)):
        for item in tree:
            yield from leaves(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from leaves(item)
    else:
        yield tree


def spec_args(args):
    """`args` (a tuple, list or dict tree) with every tensor replaced by its `TensorSpec`."""
    import torch

    return map_leaves(lambda a: TensorSpec.of(a) if isinstance(a, torch.Tensor) else a, args)


@dataclass(frozen=True)
class Call:
    """One call for a worker to make: `target(*args, **kwargs)` with grad mode `grad`, then,
    with `backward`, a backward pass from every output that requires grad (empty gradients).

    target: a "module:function" path, or a picklable callable (an `nn.Module` whose tensors are
    on the meta device is moved to `device`, empty, and set to `training`). imports: modules to
    import first (where a target registers what it looks up). footprint: the device memory the
    call takes, in bytes (0: three times its tensors', the module's parameters included); a
    worker skips a call that would leave the device less than `RESERVE` free, so that the
    program keeps the memory its own step needs."""

    target: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    grad: bool = False
    backward: bool = False
    device: str | None = None
    training: bool = False
    imports: tuple = ()
    footprint: int = 0

    def digest(self) -> str:
        return hashlib.sha256(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)).hexdigest()

    def memory(self) -> int:
        """`footprint`, or its estimate."""
        if self.footprint:
            return self.footprint
        total = sum(s.nbytes for s in leaves((self.args, self.kwargs)) if isinstance(s, TensorSpec))
        parameters = getattr(self.target, "parameters", None)
        if callable(parameters):
            total += sum(p.numel() * p.element_size() for p in parameters())
        return 3 * total


# Device memory a worker leaves free: a call that would take more is skipped (the program's own
# step, running meanwhile, needs its memory more than a worker needs a prediction).
RESERVE = {"fraction": 0.25, "bytes": 4 << 30}


def fits(call: Call, free: int, total: int) -> bool:
    """Whether `call` may run on a device with `free` of `total` bytes free (`RESERVE`)."""
    return free - call.memory() >= max(RESERVE["fraction"] * total, RESERVE["bytes"])


def active() -> bool:
    """Whether compile-ahead runs here (module docstring)."""
    from . import unverified
    from .cache import disk_cache_enabled, dry_run

    return (unverified.enabled("compile_ahead") and disk_cache_enabled() and os.environ.get(WORKER_ENV) != "1"
            and not dry_run())  # a dry run (precompile's workers, these workers) only compiles


def workers() -> int:
    """Worker processes: $CUTE_KERNELS_AHEAD_WORKERS, else one per two cores, at most 8 (each
    holds a CUDA context, a few hundred MB of device memory, while it has work)."""
    from .precompile import default_workers

    raw = os.environ.get("CUTE_KERNELS_AHEAD_WORKERS")
    return max(1, int(raw)) if raw else min(8, default_workers())


# ---- the pool ---------------------------------------------------------------------------------

_STOP = object()
_IMPORTS: set = set()  # modules every new worker imports before it reports ready


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("compile-ahead worker closed its pipe")
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("compile-ahead worker closed its pipe")
    return pickle.loads(data)


class _Pool:
    """Up to `size` worker processes, each served by a thread that feeds it one call at a
    time from a shared queue and exits (closing its worker) after `IDLE_S` idle seconds."""

    def __init__(self, size: int):
        self.size = size
        self.queue: queue.Queue = queue.Queue()
        self.cond = threading.Condition()
        self.pending = 0
        self.live = 0
        self.procs: set = set()
        self.counts = {"calls": 0, "failed": 0, "skipped": 0, "compiled": 0, "present": 0, "others": 0,
                       "uncacheable": 0}
        self.errors: list[str] = []

    def put(self, calls: list) -> None:
        with self.cond:
            self.pending += len(calls)
            for call in calls:
                self.queue.put(call)
            for _ in range(min(self.size - self.live, self.queue.qsize())):  # a worker per waiting call
                self._spawn_thread()

    def warm(self) -> None:
        with self.cond:
            while self.live < self.size:
                self._spawn_thread()

    def _spawn_thread(self) -> None:
        self.live += 1
        threading.Thread(target=self._serve, name="cute-kernels-ahead", daemon=True).start()

    def _serve(self) -> None:
        proc = call = results = None
        try:
            read_fd, write_fd = os.pipe()
            results = os.fdopen(read_fd, "rb")
            env = {**os.environ, WORKER_ENV: "1"}
            log = os.environ.get("CUTE_KERNELS_AHEAD_LOG")
            try:
                with open(log or os.devnull, "ab") as stderr:
                    proc = subprocess.Popen([sys.executable, "-m", "cute_kernels.runtime.ahead_worker",
                                             str(write_fd), *sorted(_IMPORTS)],
                                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr,
                                            pass_fds=(write_fd,), env=env, close_fds=True)
            finally:
                os.close(write_fd)  # the worker's end: EOF here once the worker is gone
            with self.cond:
                self.procs.add(proc)
            _receive(results)  # ready: imports done
            while True:
                try:
                    call = self.queue.get(timeout=IDLE_S)
                except queue.Empty:
                    call = None
                    break
                if call is _STOP:
                    call = None
                    break
                _send(proc.stdin, call)
                result = _receive(results)
                call = None
                self._done(result)
        except Exception as err:  # noqa: BLE001 - a lost worker loses hints, never results
            if call is not None:
                self._done({"ok": False, "error": f"worker lost: {err}"})
        finally:
            with self.cond:
                self.live -= 1
                self.procs.discard(proc)
                if self.live == 0:  # nobody left to make what is queued
                    while not self.queue.empty():
                        if self.queue.get_nowait() is not _STOP:
                            self.pending -= 1
                    self.cond.notify_all()
            if proc is not None:
                _close(proc)
            if results is not None:
                results.close()

    def _done(self, result: dict) -> None:
        with self.cond:
            self.counts["calls"] += 1
            if not result.get("ok"):
                self.counts["failed"] += 1
                self.errors.append(str(result.get("error"))[:500])
            for k in self.counts.keys() - {"calls", "failed"}:  # the worker's own counts
                self.counts[k] += result.get(k, 0)
            self.pending -= 1
            self.cond.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.pending <= 0, timeout)

    def stop(self) -> None:
        with self.cond:
            for _ in range(self.live):
                self.queue.put(_STOP)
            procs = list(self.procs)
        for proc in procs:
            _close(proc, kill=True)


def _close(proc, kill: bool = False) -> None:
    try:
        if proc.stdin:
            _send(proc.stdin, None)  # stop: EOF alone may never come (a forked child holds the pipe)
            proc.stdin.close()
    except (OSError, ValueError):
        pass
    if kill:
        proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()


_POOL: list = [None]
_SEEN: set = set()
_LOCK = threading.Lock()


def _pool() -> _Pool:
    with _LOCK:
        if _POOL[0] is None:
            _POOL[0] = _Pool(workers())
            atexit.register(shutdown)
        return _POOL[0]


def start(imports=()) -> None:
    """Start every worker now, where `active()`, each importing `imports` (module names) before
    it takes calls: interpreters and imports take seconds, which a program can overlap with
    building its model (`nn.patch` calls this)."""
    _IMPORTS.update(imports)
    if active():
        _pool().warm()


def submit(calls) -> int:
    """Queue `calls` (each distinct one once per process) for the workers; returns how many
    were new. Does nothing unless `active()`."""
    if not active():
        return 0
    new = []
    for call in calls:
        _IMPORTS.update(call.imports)
        try:
            digest = call.digest()
        except Exception:  # noqa: BLE001 - an unpicklable call is skipped: a hint lost
            continue
        with _LOCK:
            if digest in _SEEN:
                continue
            _SEEN.add(digest)
        new.append(call)
    if new:
        _pool().put(new)
    return len(new)


def backward_of(name: str, home: str | None, args: tuple) -> int:
    """Submit the call `args` of the eager entry `name` (`runtime.eager.EagerOp`, defined in
    module `home`) with its backward: called at a key's first call that records autograd, on
    the entry's cold path, so that its backward kernels compile while the program goes on."""
    import torch

    if not active() or not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        return 0
    call = Call("cute_kernels.runtime.eager:call_entry", (name, *spec_args(args)), grad=True, backward=True,
                imports=(home,) if home else ())
    return submit([call])


def wait(timeout: float | None = None) -> bool:
    """Block until every submitted call is made (or its worker was lost); False on timeout."""
    pool = _POOL[0]
    return True if pool is None else pool.wait(timeout)


def counts() -> dict:
    """What the workers did: calls made, failed, skipped (no device memory to spare: `fits`),
    kernels compiled, found on disk, left to another process's claim, not disk-cacheable; with
    failures, the first errors."""
    pool = _POOL[0]
    if pool is None:
        return {}
    with pool.cond:
        out = dict(pool.counts)
        if pool.errors:
            out["errors"] = pool.errors[:3]
    return out


def shutdown() -> None:
    """Stop the workers (a compile they were making is abandoned; its claim goes stale)."""
    pool = _POOL[0]
    if pool is not None:
        pool.stop()
