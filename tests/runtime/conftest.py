"""Runtime tests keep their compile cache in a temporary directory, never ~/.cache, and can
import their helper kernels (runtime_test_kernels) whatever pytest's import mode."""

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cute_kernels_cache"))
