"""runtime.unverified: paths built without a GPU stay off unless named, and the switch says
which names it knows (a stand-in registry)."""

from __future__ import annotations

import pytest

from cute_kernels.runtime import unverified

PATHS = {"fast_path": "a path built without a GPU", "other_path": "another"}


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    monkeypatch.setattr(unverified, "PATHS", PATHS)
    monkeypatch.setattr(unverified, "ENABLED", set())


def test_off_by_default_and_on_within_allowing():
    assert not unverified.enabled("fast_path")
    with unverified.allowing("fast_path", "other_path"):
        assert unverified.enabled("fast_path") and unverified.enabled("other_path")
        with unverified.allowing("other_path", on=False):
            assert not unverified.enabled("other_path") and unverified.enabled("fast_path")
        assert unverified.enabled("other_path")
    assert unverified.ENABLED == set()


def test_the_environment_names_paths(monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_UNVERIFIED", " other_path , ")
    assert unverified._from_env() == {"other_path"}
    monkeypatch.setenv("CUTE_KERNELS_UNVERIFIED", "all")
    assert unverified._from_env() == set(PATHS)
    monkeypatch.setenv("CUTE_KERNELS_UNVERIFIED", "fast,other_path")
    with pytest.raises(ValueError, match=r"unknown paths \['fast'\]"):
        unverified._from_env()


def test_unknown_names_raise():
    with pytest.raises(KeyError, match="unknown unverified path 'nope'"):
        unverified.enabled("nope")
    with pytest.raises(KeyError):
        with unverified.allowing("nope"):
            pass
