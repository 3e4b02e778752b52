"""compile_kernel: memory cache, disk cache, warm second process, key checks."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty disk cache and memory cache, and zeroed counters."""
    from cute_kernels.runtime import cache

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    cache.clear_memory_cache()
    for k in cache.stats:
        cache.stats[k] = 0
    yield cache
    cache.clear_memory_cache()


def _compile(cache, threads=128, dtype="float32", tvm_ffi=False):
    from cute_kernels.runtime.scale import compile_job

    job = compile_job(threads, dtype, tvm_ffi)
    return cache.compile_kernel(job.jit_fn, *job.args, key=job.key, options=job.options)


def test_memory_hit_returns_the_same_function(fresh):
    first = _compile(fresh)
    assert fresh.stats["compiled"] == 1
    again = _compile(fresh)
    assert again is first
    assert fresh.stats["compiled"] == 1 and fresh.stats["memory_hits"] == 1
    # Another static configuration is another compile.
    other = _compile(fresh, threads=256)
    assert other is not first and fresh.stats["compiled"] == 2
    assert fresh.lookup_kernel(("runtime.scale", ("not", "compiled"))) is None


def test_warm_lookup_does_not_touch_args(fresh, monkeypatch):
    fn = _compile(fresh)
    from cute_kernels.runtime.scale import ScaleConfig

    key = ("runtime.scale", ScaleConfig(128, "float32"), False)
    # No args at all: a hit never looks at them, nor at the disk or the compiler (a dict hit).
    assert fresh.compile_kernel(object(), key=key) is fn

    def forbidden(*args, **kwargs):
        raise AssertionError("a warm lookup reached the disk cache or the compiler")

    monkeypatch.setattr(fresh, "_load_or_compile", forbidden)
    monkeypatch.setattr(fresh, "_disk_entry", forbidden)
    hits = fresh.stats["memory_hits"]
    for _ in range(100):
        assert fresh.compile_kernel(None, key=key) is fn
    assert fresh.stats["memory_hits"] == hits + 100


def test_disk_cache_serves_a_cleared_process(fresh):
    _compile(fresh)
    assert fresh.stats["disk_stored"] == 1
    files = list(Path(os.environ["CUTE_KERNELS_CACHE_DIR"]).rglob("*.o"))
    assert len(files) == 1 and "sm_90a" in str(files[0])
    fresh.clear_memory_cache()
    logged = len(fresh.compiled_log)
    fn = _compile(fresh)
    assert fresh.stats["compiled"] == 1 and fresh.stats["disk_loaded"] == 1
    assert callable(fn)
    assert len(fresh.compiled_log) == logged  # a load is not a compile
    assert "runtime.scale" in fresh.compiled_log[-1]  # the compile before it, named by its key


def test_disk_cache_can_be_disabled(fresh, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "0")
    _compile(fresh)
    assert fresh.stats["disk_stored"] == 0
    assert not list(Path(os.environ["CUTE_KERNELS_CACHE_DIR"]).rglob("*.o"))


def test_corrupt_disk_entry_is_recompiled(fresh):
    _compile(fresh)
    (path,) = Path(os.environ["CUTE_KERNELS_CACHE_DIR"]).rglob("*.o")
    path.write_bytes(b"not an object file")
    fresh.clear_memory_cache()
    assert callable(_compile(fresh))
    assert fresh.stats["compiled"] == 2 and fresh.stats["disk_loaded"] == 0


def test_key_with_an_address_is_kept_off_disk(fresh):
    from cute_kernels.runtime.scale import compile_job

    job = compile_job()
    key = ("scale-with-object", object())  # repr embeds an address: differs per process
    fresh.compile_kernel(job.jit_fn, *job.args, key=key)
    assert fresh.stats["compiled"] == 1 and fresh.stats["disk_stored"] == 0


@pytest.mark.parametrize("key", [["a", "list"], ("unhashable", [1, 2])])
def test_bad_keys_are_rejected(fresh, key):
    with pytest.raises(TypeError, match="key"):
        fresh.compile_kernel(None, key=key)


def test_tvm_ffi_function_round_trips_through_disk(fresh):
    pytest.importorskip("tvm_ffi")
    import tvm_ffi

    fn = _compile(fresh, tvm_ffi=True)
    assert isinstance(fn, tvm_ffi.Function)
    fresh.clear_memory_cache()
    loaded = _compile(fresh, tvm_ffi=True)
    assert isinstance(loaded, tvm_ffi.Function)
    assert fresh.stats["compiled"] == 1 and fresh.stats["disk_loaded"] == 1
    # The TVM-FFI entry point validates its arguments before any launch.
    torch = pytest.importorskip("torch")
    x = torch.randn(64)
    with pytest.raises(TypeError, match="Expects 3 parameters"):
        loaded(x)


_SECOND_PROCESS = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    from cute_kernels.runtime import cache
    from cute_kernels.runtime.scale import compile_job
    t1 = time.perf_counter()
    for threads in (128, 256):
        job = compile_job(threads)
        cache.compile_kernel(job.jit_fn, *job.args, key=job.key, options=job.options)
    t2 = time.perf_counter()
    print(json.dumps({"stats": cache.stats, "import_s": t1 - t0, "compile_s": t2 - t1}))
    """
)


def test_second_process_starts_warm(tmp_path):
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(tmp_path / "cache"), CUTE_DSL_ARCH="sm_90a",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    import json

    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _SECOND_PROCESS], env=env, capture_output=True, text=True,
                             timeout=300, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["stats"]["compiled"] == 2 and cold["stats"]["disk_stored"] == 2
    assert warm["stats"]["compiled"] == 0 and warm["stats"]["disk_loaded"] == 2
    assert warm["compile_s"] < 1.0, warm
    # Nothing was dumped into the working directory.
    assert not [p for p in tmp_path.iterdir() if p.name != "cache"]


def test_clear_disk_cache(fresh):
    _compile(fresh)
    _compile(fresh, threads=64)
    assert fresh.clear_disk_cache() == 2
    assert not list(Path(os.environ["CUTE_KERNELS_CACHE_DIR"]).rglob("*.o"))
    fresh.clear_memory_cache()
    _compile(fresh)
    assert fresh.stats["compiled"] == 3 and fresh.stats["disk_loaded"] == 0


def test_a_missing_tvm_ffi_warns_once_where_a_gpu_would_pay_for_it(monkeypatch):
    import importlib.util
    import warnings

    import torch

    from cute_kernels.runtime import cache

    monkeypatch.delenv("CUTE_KERNELS_NO_TVM_FFI", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    try:
        for gpu, warns in ((False, False), (True, True)):
            monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
            cache.tvm_ffi_available.cache_clear()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                assert cache.tvm_ffi_available() is False
                assert cache.tvm_ffi_available() is False  # decided once: one warning
            assert [w.category for w in seen] == ([cache.TvmFfiMissingWarning] if warns else [])
            assert not warns or "pip install apache-tvm-ffi" in str(seen[0].message)
        monkeypatch.setenv("CUTE_KERNELS_NO_TVM_FFI", "1")  # chosen knowingly: no warning
        cache.tvm_ffi_available.cache_clear()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert cache.tvm_ffi_available() is False
        assert seen == []
    finally:
        cache.tvm_ffi_available.cache_clear()
