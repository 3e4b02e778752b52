"""bench.environment: a result's versions say which not-yet-default paths the run turned on."""

from __future__ import annotations

from cute_kernels.bench.environment import versions
from cute_kernels.runtime import unverified


def test_versions_name_the_unverified_paths_a_run_turned_on(monkeypatch):
    monkeypatch.setattr(unverified, "PATHS", {"fast_path": "a path", "other_path": "another"})
    monkeypatch.setattr(unverified, "ENABLED", set())
    assert versions("cpu")["cute_kernels_unverified"] is None
    with unverified.allowing("other_path", "fast_path"):
        assert versions("cpu")["cute_kernels_unverified"] == "fast_path,other_path"
