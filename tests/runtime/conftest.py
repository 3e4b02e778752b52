"""Runtime tests keep their compile cache in a temporary directory, never ~/.cache."""

import pytest


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cute_kernels_cache"))
