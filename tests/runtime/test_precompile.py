"""runtime.precompile: a trace run in worker processes fills the disk cache (each kernel
compiled by exactly one worker); a process that then runs the trace compiles nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.compile


def test_workers_fill_the_disk_cache_and_the_program_compiles_nothing(tmp_path, monkeypatch):
    from cute_kernels.runtime import cache
    from cute_kernels.runtime.precompile import precompile

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # spawned workers inherit sys.path
    counts = precompile("precompile_trace:trace", (2, 4), workers=2)
    assert counts["compiled"] == 2 and counts["present"] == 0 and counts["uncacheable"] == 0
    assert len(list(tmp_path.rglob("ck_*.o"))) == 2
    again = precompile("precompile_trace:trace", (2, 4), workers=2)
    assert again["compiled"] == 0 and again["present"] == 2

    import precompile_trace

    monkeypatch.setattr(cache, "_MEMORY", {})
    before = dict(cache.stats)
    precompile_trace.trace((2, 4))
    assert cache.stats["compiled"] == before["compiled"] and cache.stats["disk_loaded"] == before["disk_loaded"] + 2


def test_bad_targets_and_a_disabled_disk_cache_are_refused(monkeypatch):
    from cute_kernels.runtime.precompile import precompile

    with pytest.raises(ValueError, match="module:function"):
        precompile("no_colon_here")
    with pytest.raises(ModuleNotFoundError):
        precompile("no_such_module_xyz:trace")
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "0")
    with pytest.raises(RuntimeError, match="disk cache is off"):
        precompile("precompile_trace:trace")
