"""runtime.cache's claims (one compiler per disk entry across processes) and
runtime.compile_ahead (calls made by worker processes in dry-run mode, filling the disk cache
for the program's own calls)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    from cute_kernels.runtime import cache

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    cache.clear_memory_cache()
    yield cache
    cache.clear_memory_cache()


@pytest.fixture
def sleeper():
    """A live process that is not this one (its pid holds claims in these tests)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _entry(tmp_path):
    path = tmp_path / "cache" / "sm_90a" / "ck_0123.o"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, "ck_0123"


def _hold(entry, pid, host=None):
    from cute_kernels.runtime import cache

    entry[0].parent.mkdir(parents=True, exist_ok=True)
    cache._claim_path(entry).write_text(f"{host or cache._host()} {pid}")


def test_a_claim_held_by_a_live_process_is_respected_and_a_dead_ones_is_broken(tmp_path, sleeper):
    from cute_kernels.runtime import cache

    entry = _entry(tmp_path)
    assert cache.claim(entry) and cache._claim_path(entry).read_text() == f"{cache._host()} {os.getpid()}"
    cache.release(entry)
    assert not cache._claim_path(entry).exists()

    _hold(entry, sleeper.pid)
    assert not cache.claim(entry)
    assert not cache.await_release(entry, timeout=0.2)  # still held: the wait gives up
    sleeper.kill()
    sleeper.wait()
    assert cache.await_release(entry, timeout=5)  # its holder died: stale, removed
    assert not cache._claim_path(entry).exists()
    assert cache.claim(entry)
    cache.release(entry)


def test_claims_from_another_host_or_being_written_are_trusted_until_old(tmp_path):
    from cute_kernels.runtime import cache

    entry = _entry(tmp_path)
    _hold(entry, 1, host="some-other-host")
    assert not cache.claim(entry)
    cache._claim_path(entry).write_text("")  # created, not yet written
    assert not cache.claim(entry)
    old = time.time() - cache._CLAIM_STALE_S - 1
    os.utime(cache._claim_path(entry), (old, old))
    assert cache.claim(entry)
    cache.release(entry)


@pytest.mark.compile
def test_a_process_waits_for_the_claimed_compile_and_loads_it(fresh, tmp_path, sleeper, monkeypatch):
    """While another process holds the claim, compile_kernel waits; when the entry appears and
    the claim goes, it loads the entry instead of compiling."""
    from cute_kernels.elementwise.vector_copy import build_variant

    cache = fresh
    job = build_variant(element_bytes=2)
    entry = cache._disk_entry(job.jit_fn, job.key, job.options, "sm_90a")
    # the other process's work, done ahead: its object file, stored aside
    aside = (tmp_path / "aside.o", entry[1])
    cache._disk_store(cache.compile_now(job.jit_fn, *job.args, options=job.options, arch="sm_90a"), aside,
                      job.options)
    _hold(entry, sleeper.pid)

    def finish():  # the other process stores its entry and lets go, once this one waits for it
        entry[0].parent.mkdir(parents=True, exist_ok=True)
        shutil.move(aside[0], entry[0])
        cache.release(entry)

    real_wait = cache.await_release

    def wait(entry_, timeout=None):
        finish()
        return real_wait(entry_, timeout)

    monkeypatch.setattr(cache, "await_release", wait)
    before = dict(cache.stats)
    cache.compile_kernel(job.jit_fn, *job.args, key=job.key, options=job.options)
    assert cache.stats["compiled"] == before["compiled"]
    assert cache.stats["disk_loaded"] == before["disk_loaded"] + 1
    assert cache.stats["waited"] == before["waited"] + 1


@pytest.mark.compile
def test_a_dry_run_leaves_a_claimed_kernel_to_its_claimant(fresh, sleeper):
    from cute_kernels.elementwise.vector_copy import build_variant

    cache = fresh
    job = build_variant(element_bytes=4)
    entry = cache._disk_entry(job.jit_fn, job.key, job.options, "sm_90a")
    _hold(entry, sleeper.pid)
    before = dict(cache._DRY_RUN.counts)
    cache._DRY_RUN.on = True
    try:
        fn = cache.compile_kernel(job.jit_fn, *job.args, key=job.key, options=job.options)
    finally:
        cache._DRY_RUN.on = False
    assert fn is cache._no_launch and not entry[0].exists()
    assert cache._DRY_RUN.counts["others"] == before["others"] + 1
    assert cache._DRY_RUN.counts["compiled"] == before["compiled"]


def test_tensor_specs_rebuild_what_a_kernel_key_sees():
    import torch

    from cute_kernels.runtime.compile_ahead import TensorSpec, spec_args

    base = torch.randn(5, 40)
    t = base[1:, 3:35].t()  # strided, offset by 43 elements (12 bytes past 16-byte alignment)
    spec = TensorSpec.of(t.requires_grad_(False))
    made = spec.make()
    assert made.shape == t.shape and made.stride() == t.stride() and made.dtype == t.dtype
    assert made.storage_offset() % 4 == t.storage_offset() % 4 and not made.requires_grad
    labels = spec_args({"x": [torch.ones(3, dtype=torch.int64)]})["x"][0].make()
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 0, 0]
    assert TensorSpec.of(torch.randn(2, requires_grad=True)).make().requires_grad
    assert TensorSpec.of(torch.empty(0, 3)).make().shape == (0, 3)


def test_a_worker_makes_function_and_meta_module_calls_with_their_backward():
    """ahead_worker.run: a "module:function" target and a module with meta parameters, forward
    and backward, on CPU (the dry-run mode is the worker's, not run's)."""
    import torch

    from cute_kernels.runtime import ahead_worker
    from cute_kernels.runtime.compile_ahead import Call, TensorSpec

    x = TensorSpec((3, 8), (8, 1), torch.float32, "cpu", requires_grad=True)
    w = TensorSpec((4, 8), (8, 1), torch.float32, "cpu", requires_grad=True)
    ahead_worker.run(Call("torch.nn.functional:linear", (x, w), grad=True, backward=True))

    with torch.device("meta"):
        module = torch.nn.Linear(8, 4)
    seen = []
    module.register_forward_hook(lambda m, a, out: seen.append((m.weight.device.type, m.training, out.shape)))
    ahead_worker.run(Call(module, (x,), grad=True, backward=True, device="cpu", training=True))
    assert seen == [("cpu", True, (3, 4))]


@pytest.fixture
def pool(fresh, monkeypatch):
    """compile_ahead on, its workers able to import this directory's trace, reset after."""
    from cute_kernels.runtime import compile_ahead, unverified

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([_HERE, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("CUTE_KERNELS_AHEAD_WORKERS", "1")
    with unverified.allowing("compile_ahead"):
        yield compile_ahead
    compile_ahead.shutdown()
    compile_ahead._POOL[0] = None
    compile_ahead._SEEN.clear()
    compile_ahead._IMPORTS.clear()


@pytest.mark.compile
def test_workers_compile_submitted_calls_into_the_disk_cache(pool, fresh):
    from cute_kernels.runtime.compile_ahead import Call

    cache = fresh
    assert pool.active()
    call = Call("precompile_trace:trace", ((2,),))
    assert pool.submit([call, call]) == 1 and pool.submit([call]) == 0  # each distinct call once
    pool.submit([Call("precompile_trace:no_such_function")])
    assert pool.wait(timeout=300)
    counts = pool.counts()
    assert counts["calls"] == 2 and counts["failed"] == 1 and counts["compiled"] == 1, counts
    assert "no_such_function" in counts["errors"][0]
    assert len(list(Path(cache.cache_dir()).rglob("ck_*.o"))) == 1

    import precompile_trace

    before = dict(cache.stats)
    precompile_trace.trace((2,))  # the program's own call: loaded, not compiled
    assert cache.stats["compiled"] == before["compiled"]
    assert cache.stats["disk_loaded"] == before["disk_loaded"] + 1


def test_nothing_is_submitted_where_compile_ahead_is_off(monkeypatch):
    import torch

    from cute_kernels.runtime import compile_ahead, unverified
    from cute_kernels.runtime.compile_ahead import Call

    with unverified.allowing("compile_ahead", on=False):
        assert not compile_ahead.active()
        assert compile_ahead.submit([Call("precompile_trace:trace")]) == 0
    with unverified.allowing("compile_ahead"):
        monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "0")
        assert not compile_ahead.active()
        monkeypatch.delenv("CUTE_KERNELS_DISK_CACHE")
        monkeypatch.setenv(compile_ahead.WORKER_ENV, "1")
        assert not compile_ahead.active()
        monkeypatch.delenv(compile_ahead.WORKER_ENV)
        from cute_kernels.runtime import cache

        monkeypatch.setattr(cache._DRY_RUN, "on", True)  # a precompile worker
        assert not compile_ahead.active()
        monkeypatch.setattr(cache._DRY_RUN, "on", False)
        assert compile_ahead.active()
        # a call on CPU tensors has no kernels to compile ahead
        assert compile_ahead.backward_of("linear", None, (torch.randn(2, 2, requires_grad=True),)) == 0
    assert compile_ahead._POOL[0] is None


def test_an_entry_s_first_call_that_records_autograd_submits_its_backward(monkeypatch):
    import torch

    from cute_kernels.runtime import compile_ahead, plan_cache
    from cute_kernels.runtime.eager import EagerOp, call_entry

    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    seen = []
    monkeypatch.setattr(compile_ahead, "backward_of", lambda name, home, args: seen.append((name, home, len(args))))

    def build(result, *args):
        return None

    entry = EagerOp("ahead_test_scale", lambda x, s: x * s, build)
    x = torch.randn(3, requires_grad=True)
    entry(x.detach(), 2.0)  # records no autograd: nothing
    entry(x, 2.0)
    entry(x, 2.0)  # not a first call
    assert seen == [("ahead_test_scale", __name__, 2)]
    assert torch.equal(call_entry("ahead_test_scale", x.detach(), 3.0), x.detach() * 3.0)


def test_a_worker_stops_on_the_stop_message_while_its_pipe_is_still_open():
    """A program's forked children (DataLoader workers) hold copies of a worker's stdin, so the
    pool stops a worker by message, not by closing the pipe."""
    from cute_kernels.runtime.compile_ahead import _receive, _send

    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "cute_kernels.runtime.ahead_worker", str(write_fd)],
                            stdin=subprocess.PIPE, pass_fds=(write_fd,), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    results = os.fdopen(read_fd, "rb")
    held = os.dup(proc.stdin.fileno())  # another holder of the pipe's write end
    try:
        assert _receive(results) == {"ready": True}
        _send(proc.stdin, None)
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(held)
        proc.kill()
        results.close()


def test_a_call_runs_only_where_the_device_keeps_its_reserve():
    import torch

    from cute_kernels.runtime.compile_ahead import RESERVE, Call, TensorSpec, fits

    x = TensorSpec((1024, 1024), (1024, 1), torch.bfloat16, "cuda:0")  # 2 MiB
    assert x.nbytes == 2 << 20 and TensorSpec((4, 0), (1, 1), torch.float32, "cpu").nbytes == 0
    with torch.device("meta"):
        layer = torch.nn.Linear(1024, 512, dtype=torch.bfloat16)
    assert Call(layer, (x,)).memory() == 3 * ((2 << 20) + (1 << 20) + 1024)  # input, weight, bias, thrice
    assert Call("f", (x,), footprint=5).memory() == 5
    gib = 1 << 30
    total = 80 * gib
    reserve = max(RESERVE["fraction"] * total, RESERVE["bytes"])
    call = Call("f", footprint=gib)
    assert fits(call, int(reserve) + gib, total) and not fits(call, int(reserve) + gib - 1, total)
