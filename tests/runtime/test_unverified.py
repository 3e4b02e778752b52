"""runtime.unverified: paths built without a GPU stay off unless named, and the switch says
which names it knows."""

from __future__ import annotations

import pytest

from cute_kernels.runtime import unverified


def test_off_by_default_and_on_within_allowing():
    assert not unverified.enabled("split_k_in_kernel") or "split_k_in_kernel" in unverified._from_env()
    before = set(unverified.ENABLED)
    with unverified.allowing("split_k_in_kernel", "sm90_bwd_d96"):
        assert unverified.enabled("split_k_in_kernel") and unverified.enabled("sm90_bwd_d96")
        with unverified.allowing("sm90_bwd_d96", on=False):
            assert not unverified.enabled("sm90_bwd_d96") and unverified.enabled("split_k_in_kernel")
        assert unverified.enabled("sm90_bwd_d96")
    assert unverified.ENABLED == before


def test_the_environment_names_paths(monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_UNVERIFIED", " sm90_bwd_d96 , ")
    assert unverified._from_env() == {"sm90_bwd_d96"}
    monkeypatch.setenv("CUTE_KERNELS_UNVERIFIED", "all")
    assert unverified._from_env() == set(unverified.PATHS)
    monkeypatch.setenv("CUTE_KERNELS_UNVERIFIED", "split_k,sm90_bwd_d96")
    with pytest.raises(ValueError, match=r"unknown paths \['split_k'\]"):
        unverified._from_env()


def test_unknown_names_raise():
    with pytest.raises(KeyError, match="unknown unverified path 'nope'"):
        unverified.enabled("nope")
    with pytest.raises(KeyError):
        with unverified.allowing("nope"):
            pass
