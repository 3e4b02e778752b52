"""Sm90GemmConfig validation, stage budgeting and the default heuristic (pure Python)."""

import pytest

from cute_kernels.gemm.sm90_config import SMEM_BYTES, Sm90GemmConfig, pick_config, pick_split_k


def test_default_is_valid_and_fits():
    cfg = Sm90GemmConfig().validate()
    stages = cfg.resolved_stages(2, 16)
    em, en = cfg.epi_tile(16)
    used = stages * cfg.ab_stage_bytes(2) + em * en * 2 * cfg.epi_stages
    assert stages >= 3 and used <= SMEM_BYTES
    # one more stage would not fit
    assert used + cfg.ab_stage_bytes(2) > SMEM_BYTES - 1024


@pytest.mark.parametrize("kw,msg", [
    ({"tile_m": 96}, "tile_m"),
    ({"tile_n": 264}, "tile_n"),
    ({"tile_k": 48}, "tile_k"),
    ({"cluster_m": 4, "cluster_n": 2}, "at most 4"),
    ({"cluster_m": 3}, "cluster dims"),
    ({"schedule": "splitk"}, "schedule"),
    ({"tile_m": 64}, "cooperative"),
    ({"raster": "k"}, "raster"),
    ({"swizzle": 0}, "swizzle"),
])
def test_invalid_configs_raise(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Sm90GemmConfig(**kw).validate()


def test_too_many_stages_raise():
    with pytest.raises(ValueError, match="fit"):
        Sm90GemmConfig(stages=8).resolved_stages(2, 16)


@pytest.mark.parametrize("m,n,k", [(2048, 2048, 2048), (8192, 8192, 8192), (16, 8192, 8192), (4096, 14336, 4096),
                                   (1, 1, 1), (100000, 7, 3)])
def test_heuristic_returns_valid_configs(m, n, k):
    cfg = pick_config(m, n, k).validate()
    cfg.resolved_stages(2, 16)
    if m >= 4096 and n >= 4096:
        assert (cfg.tile_m, cfg.tile_n) == (128, 256)


@pytest.mark.parametrize("m,n,k,l", [(16, 8192, 8192, 1), (128, 8192, 8192, 1), (100, 3000, 4096, 1),
                                     (64, 8192, 8192, 2), (4096, 4096, 4096, 1), (64, 8192, 1000, 1)])
def test_split_k_keeps_chunks_aligned_and_waves_bounded(m, n, k, l):
    cfg = pick_config(m, n, k)
    s = pick_split_k(m, n, k, l, cfg)
    tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
    if l != 1 or 2 * tiles > 132:
        assert s == 1
    assert k % s == 0 and (k // s * 2) % 16 == 0
    assert s == 1 or (tiles * s <= 264 and k // s >= 8 * cfg.tile_k)
    if (m, n, k, l) == (16, 8192, 8192, 1):
        assert pick_split_k(m, n, k, l, Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=1)) > 1
