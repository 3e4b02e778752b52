"""The compile cache: each kernel compiles once per (key, options, arch, DSL version).

Lookup order: memory (a dict keyed by a cheap tuple, the warm path), then disk (an object
file the DSL exported, loaded in milliseconds, so a second process starts warm), then the
compiler, under a claim on the disk entry (`claim`): a process that finds another compiling
the same kernel (a compile-ahead worker, a precompile worker, another rank) waits for its
entry instead of compiling it again. Problem sizes are not part of any key: kernels are compiled with dynamic sizes
(see `tensors`), so a new M, N, K or sequence length reuses the compiled function.

The disk cache lives in $CUTE_KERNELS_CACHE_DIR (default ~/.cache/cute_kernels); set
CUTE_KERNELS_DISK_CACHE=0 to bypass it. A disk entry is keyed also by a fingerprint of the
kernels' source, so editing a kernel never loads a stale binary.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from .arch import dsl_version, target_arch

# (key, options, arch) -> compiled function. Never evicted: a process compiles a bounded
# set of (kernel, config, dtype) combinations.
_MEMORY: dict[tuple, Any] = {}
_LOCK = threading.Lock()
_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")

# Counters tests and benchmarks read to prove what happened (no recompiles, warm starts).
stats = {"compiled": 0, "disk_loaded": 0, "disk_stored": 0, "memory_hits": 0, "waited": 0}
# What this process compiled (not loaded), one line each (the key's repr, cut at 200
# characters), in order: what a cold start reports, so a kernel precompile missed can be named.
compiled_log: list[str] = []
# Called (no arguments) after this process compiled a kernel itself, not loaded one, nor in a dry
# run: a program meeting kernels it lacks is where compile-ahead predicts the next (`nn.ahead`).
compile_listeners: list[Callable[[], None]] = []


def cache_dir() -> Path:
    """The on-disk cache root: $CUTE_KERNELS_CACHE_DIR, else ~/.cache/cute_kernels."""
    env = os.environ.get("CUTE_KERNELS_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cute_kernels"


def disk_cache_enabled() -> bool:
    return os.environ.get("CUTE_KERNELS_DISK_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def _check_key(key) -> None:
    if not isinstance(key, tuple):
        raise TypeError(f"compile key must be a tuple, got {type(key).__name__}")
    try:
        hash(key)
    except TypeError as err:
        raise TypeError(f"compile key must be hashable (use frozen dataclasses and tuples): {err}") from None


TVM_FFI_OPTION = "--enable-tvm-ffi"


@functools.cache
def tvm_ffi_available() -> bool:
    """True when apache-tvm-ffi is importable and CUTE_KERNELS_NO_TVM_FFI is not "1", so
    compiles may pass `TVM_FFI_OPTION`. Decided once per process (call
    `tvm_ffi_available.cache_clear()` after changing the variable).

    A function compiled with it takes torch tensors directly (validating dtype, rank,
    device, alignment and divisibility itself) and, given `fake_stream(tvm_ffi_env_stream=True)`
    at compile time, launches on torch's current stream: the cheapest warm call.
    CUTE_KERNELS_NO_TVM_FFI=1 selects the DSL-tensor path everywhere (for comparisons).

    Absent where a CUDA device is present, it warns once (`TvmFfiMissingWarning`): the DSL-tensor
    path wraps every tensor of every launch in Python, which measured 0.85 ms of host time per
    linear layer on the H200's host and made a patched ViT-B/16's inference 8x slower than stock.
    """
    import importlib.util

    if os.environ.get("CUTE_KERNELS_NO_TVM_FFI") == "1":
        return False
    found = importlib.util.find_spec("tvm_ffi") is not None
    torch = sys.modules.get("torch")
    if not found and torch is not None and torch.cuda.is_available():
        import warnings

        warnings.warn("apache-tvm-ffi is not installed, so every kernel launch wraps its tensors in Python "
                      "(about 1 ms of host time per call, several times the stock layer's); install it "
                      "(pip install apache-tvm-ffi, part of cute-kernels[gpu]) or set CUTE_KERNELS_NO_TVM_FFI=1 "
                      "to choose this path knowingly", TvmFfiMissingWarning, stacklevel=2)
    return found


class TvmFfiMissingWarning(RuntimeWarning):
    """apache-tvm-ffi is absent on a machine with a CUDA device (`tvm_ffi_available`)."""


def tvm_ffi_requested(options: str | None) -> bool:
    return bool(options) and "enable-tvm-ffi" in options


def lookup_kernel(key: tuple, options: str | None = None):
    """The compiled function for `key` if this process already has it, else None."""
    return _MEMORY.get((key, options, target_arch()))


def compile_kernel(jit_fn: Callable, *args, key: tuple, options: str | None = None):
    """`cute.compile(jit_fn, *args, options=...)`, cached in memory and on disk.

    `key` identifies what is compiled: kernel name, frozen config, dtypes; anything that
    changes the generated code other than problem sizes. The target arch and the DSL
    version are added here. `args` may be fake tensors (compile-only) or real ones; on a
    cache hit they are not touched. Returns the compiled function (a callable taking the
    runtime arguments; with "--enable-tvm-ffi" in `options`, a TVM-FFI function taking
    torch tensors directly).
    """
    memo = (key, options, target_arch())
    try:
        fn = _MEMORY.get(memo)
    except TypeError:  # unhashable: say so in terms of the key
        _check_key(key)
        raise
    if fn is not None:
        stats["memory_hits"] += 1
        return fn
    _check_key(key)
    with _LOCK:
        fn = _MEMORY.get(memo)
        if fn is None:
            fn = _DRY_RUN.compile(jit_fn, args, key, options, memo[2]) if _DRY_RUN.on else \
                _load_or_compile(jit_fn, args, key, options, memo[2])
            _MEMORY[memo] = fn
    return fn


class _DryRun:
    """Dry-run mode (`runtime.precompile`'s and `runtime.compile_ahead`'s workers), while `on`.

    Then every compile whose disk entry is not on disk yet and not claimed by another process
    (`claim`) is compiled and stored; the function handed back, for every key, is a no-op, so
    the code being traced launches nothing.
    """

    on = False
    counts = {"compiled": 0, "present": 0, "others": 0, "uncacheable": 0}

    def compile(self, jit_fn, args, key, options, arch):
        entry = _disk_entry(jit_fn, key, options, arch) if disk_cache_enabled() else None
        if entry is None:
            self.counts["uncacheable"] += 1
        elif entry[0].is_file():
            self.counts["present"] += 1
        elif not claim(entry):
            self.counts["others"] += 1  # another process is compiling it
        else:
            try:
                if entry[0].is_file():  # stored between the look and the claim
                    self.counts["present"] += 1
                else:
                    _disk_store(compile_now(jit_fn, *args, options=options, arch=arch), entry, options)
                    self.counts["compiled"] += 1
            finally:
                release(entry)
        return _no_launch


def _no_launch(*args, **kwargs) -> None:
    return None


def dry_run() -> bool:
    """Whether this process is in dry-run mode (its kernels launch nothing: whatever would time
    or read their results, such as the GEMM autotuner, must not run)."""
    return _DRY_RUN.on


_DRY_RUN = _DryRun()


def clear_memory_cache() -> None:
    """Forget every compiled function held in memory (the disk cache is kept)."""
    _MEMORY.clear()


def clear_disk_cache() -> int:
    """Delete every cached object file under `cache_dir()`; returns how many were removed."""
    removed = 0
    root = cache_dir()
    if root.is_dir():
        for path in root.rglob("ck_*.o"):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _load_or_compile(jit_fn, args, key, options, arch):
    entry = _disk_entry(jit_fn, key, options, arch) if disk_cache_enabled() else None
    claimed = False
    while entry is not None:
        fn = _disk_load(entry, options)
        if fn is not None:
            stats["disk_loaded"] += 1
            return fn
        claimed = claim(entry)
        if claimed or not await_release(entry):
            break  # ours to compile (or its compiler outlived the wait: compile it too)
        stats["waited"] += 1  # another process compiled it (or gave up): look again
    try:
        compiled = compile_now(jit_fn, *args, options=options, arch=arch)
        stats["compiled"] += 1
        compiled_log.append(repr(key)[:200])
        if entry is not None:
            _disk_store(compiled, entry, options)
    finally:
        if claimed:
            release(entry)
    for listener in compile_listeners:
        try:
            listener()
        except Exception:  # noqa: BLE001 - a listener's failure must not fail the compile
            pass
    return _fast_callable(compiled)


# Compiled functions whose raw TVM-FFI function is what the cache hands out; held so that
# nothing they own is finalized while the raw function is in use.
_KEEP_ALIVE: list = []


def _fast_callable(compiled):
    """The cheapest callable for a compiled function.

    For a TVM-FFI compile that is the underlying `tvm_ffi.Function` (positional arguments,
    no Python wrapper): the same object a disk-cache load returns, so warm calls behave
    identically whichever way the function arrived.
    """
    get_raw = getattr(compiled, "__tvm_ffi_object__", None)
    if get_raw is None:
        return compiled
    execution_args = getattr(compiled, "execution_args", None)
    if execution_args is not None and getattr(execution_args, "has_pointer_address_arg_specs", False):
        return compiled  # needs the wrapper's conversion of Python pointer arguments
    raw = get_raw()
    if raw is None:
        return compiled
    _KEEP_ALIVE.append(compiled)
    return raw


def compile_options(options: str | None, arch: str) -> str:
    """The option string passed to `cute.compile`: ours plus the explicit target arch."""
    text = (options or "").strip()
    if "--gpu-arch" not in text:
        text = f"--gpu-arch {arch} {text}".strip()
    return text


def compile_now(jit_fn: Callable, *args, options: str | None = None, arch: str | None = None):
    """Compile without any cache (every call runs the DSL compiler)."""
    import cutlass.cute as cute

    return cute.compile(jit_fn, *args, options=compile_options(options, arch or target_arch()))


# ---- disk -------------------------------------------------------------------------------


def _stable_repr(key) -> str | None:
    """repr(key), or None when it embeds an object address and so differs per process."""
    text = repr(key)
    return None if _ADDRESS_RE.search(text) else text


_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
# Subpackages every kernel may trace through: the layout algebra, the Hopper building blocks,
# and the runtime itself (to_cute).
_SHARED_SUBPACKAGES = ("layouts", "hopper", "runtime")


@functools.cache
def _tree_fingerprint(directory: str) -> str:
    """sha256 over the relative paths and contents of the .py files under `directory`."""
    root = Path(directory)
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _file_fingerprint(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def _source_fingerprint(jit_fn) -> str:
    """A digest of the source `jit_fn` can trace through.

    That is the shared subpackages (layouts, hopper, runtime), plus the kernel's own
    subpackage (e.g. all of cute_kernels/gemm) when it lives in cute_kernels, else its
    defining file. Edits elsewhere (CLI, benchmarks, other kernel families) leave the
    disk cache valid.
    """
    parts = [_tree_fingerprint(str(_PACKAGE_ROOT / name)) for name in _SHARED_SUBPACKAGES]
    fn = getattr(jit_fn, "__func__", jit_fn)
    module_name = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", "") or ""
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if path:
        resolved = Path(path).resolve()
        try:
            relative = resolved.relative_to(_PACKAGE_ROOT)
        except ValueError:
            parts.append(_file_fingerprint(str(resolved)))
        else:
            if len(relative.parts) > 1 and relative.parts[0] not in _SHARED_SUBPACKAGES:
                parts.append(_tree_fingerprint(str(_PACKAGE_ROOT / relative.parts[0])))
            elif len(relative.parts) == 1:
                parts.append(_file_fingerprint(str(resolved)))
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def _qualified_name(jit_fn) -> str:
    """module.qualname of a function, bound method, or callable kernel object."""
    fn = getattr(jit_fn, "__func__", jit_fn)
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', None) or type(fn).__module__}.{qualname}"


def _disk_entry(jit_fn, key, options, arch) -> tuple[Path, str] | None:
    """(object file path, symbol prefix) for this compile, or None if not disk-cacheable."""
    text = _stable_repr(key)
    if text is None:
        return None
    name = _qualified_name(jit_fn)
    material = "\n".join([text, options or "", arch, dsl_version(), name, _source_fingerprint(jit_fn)])
    digest = hashlib.sha256(material.encode()).hexdigest()[:32]
    prefix = f"ck_{digest}"
    return cache_dir() / arch / f"dsl-{dsl_version()}" / f"{prefix}.o", prefix


def _disk_load(entry, options):
    path, prefix = entry
    if not path.is_file():
        return None
    from cutlass.cute.runtime import load_module

    try:
        module = load_module(str(path), enable_tvm_ffi=tvm_ffi_requested(options))
        return getattr(module, prefix)
    except Exception:  # noqa: BLE001 - a corrupt or foreign entry is recompiled, not fatal
        return None


def _disk_store(fn, entry, options) -> None:
    path, prefix = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.o")
        if tvm_ffi_requested(options):
            # TVM-FFI functions export under "__tvm_ffi_<name>", the symbol load_module looks up.
            fn.export_to_c(str(tmp), function_name=prefix)
        else:
            tmp.write_bytes(fn.dump_to_object(prefix))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
        stats["disk_stored"] += 1
    except Exception:  # noqa: BLE001 - caching is an optimization; compile results stand
        pass


# ---- claims: one compiler per disk entry across processes ------------------------------------
#
# A process about to compile a disk-cacheable kernel first creates "<entry>.lock" (O_EXCL),
# holding "<host> <pid>", and removes it once the entry is stored. Another process that needs
# the entry meanwhile waits for the file instead of compiling the same kernel again: what lets
# compile-ahead workers (`runtime.compile_ahead`), precompile's workers and the ranks of one
# job share compiles. A claim whose holder is gone (same host, no such pid; or older than
# `_CLAIM_STALE_S`) is broken; a wait longer than $CUTE_KERNELS_COMPILE_WAIT_S (default 300)
# gives up and compiles. A claim only ever delays a compile: what is loaded is the entry.

_CLAIM_STALE_S = 900.0
_HOST = None


def _claim_path(entry) -> Path:
    return entry[0].with_name(entry[0].name + ".lock")


def _host() -> str:
    global _HOST
    if _HOST is None:
        import socket

        _HOST = socket.gethostname()
    return _HOST


def claim(entry) -> bool:
    """Claim the compile of disk `entry` for this process; False when another live process
    holds it (a stale claim is broken and taken)."""
    path = _claim_path(entry)
    for _ in range(2):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _stale(path):
                return False
            path.unlink(missing_ok=True)
            continue
        except OSError:  # an unwritable cache directory: compile unclaimed, as before claims
            return True
        with os.fdopen(fd, "w") as f:
            f.write(f"{_host()} {os.getpid()}")
        return True
    return False


def release(entry) -> None:
    _claim_path(entry).unlink(missing_ok=True)


def _stale(path: Path) -> bool:
    """Whether the claim file at `path` is left over: its holder process is gone (or is this
    process, which holds no claim while it looks) or it is older than `_CLAIM_STALE_S`."""
    import time

    try:
        text = path.read_text()
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if age > _CLAIM_STALE_S:
        return True
    host, _, pid = text.partition(" ")
    if host != _host() or not pid.strip().isdigit():
        return not text and age > 5.0  # a claim being written has no text for microseconds
    pid = int(pid)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


def await_release(entry, timeout: float | None = None) -> bool:
    """Wait until the claim on `entry` is released (or found stale); False when `timeout`
    (default $CUTE_KERNELS_COMPILE_WAIT_S, 300 s) passed first."""
    import time

    if timeout is None:
        timeout = float(os.environ.get("CUTE_KERNELS_COMPILE_WAIT_S", "300"))
    path = _claim_path(entry)
    deadline = time.monotonic() + timeout
    delay = 0.005
    while path.exists():
        if _stale(path):
            path.unlink(missing_ok=True)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True
