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
    assert s == 1 or k // s >= 8 * cfg.tile_k
    if cfg.swap_ab:  # memory-bound: the most splits within two waves of units
        assert s == 1 or tiles * s <= 264
    if (m, n, k, l) == (16, 8192, 8192, 1):
        assert pick_split_k(m, n, k, l, Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=1)) > 1


# (M, N, K, (tile_m, tile_n), (cluster_m, cluster_n), split): ViT-B/16's GEMMs at batch 64, where
# 128x256 tiles leave a partial last wave (the H200 sweeps behind `split_seconds`), and shapes
# the measured 128x256 classes keep
VIT_AND_LARGE = [
    (12608, 768, 3072, (128, 192), (1, 2), 1),    # fc2: 99 x 4 tiles = 3.0 waves (128x256: 2.25)
    (12608, 768, 768, (128, 192), (1, 2), 1),     # attention projection
    (768, 768, 12608, (128, 192), (1, 1), 4),     # its weight gradient: 24 tiles, K split in 4
    (3072, 768, 12608, (128, 192), (1, 1), 1),    # fc1's weight gradient: 96 tiles, no split
    (2304, 768, 12608, (128, 128), (2, 1), 1),    # qkv's weight gradient: 108 tiles of 128x128
    (12608, 2304, 768, (128, 128), (1, 2), 1),    # qkv: ping-pong at short K, 18 N tiles paired
    (16448, 768, 768, (128, 128), (1, 2), 1),     # EVA-02 B/14 (M = 64 x 257): q, k, v, projection
    (16448, 2048, 768, (128, 128), (1, 2), 1),    # its SwiGLU gate and up
    (16448, 768, 2048, (128, 192), (1, 2), 1),    # its down projection: 4 N tiles share A, multicast in pairs
    (2049, 2400, 520, (128, 128), (1, 1), 1),     # short K, 19 N tiles of 128: no cluster
    (8192, 8192, 8192, (128, 256), (1, 2), 1),
    (4096, 14336, 4096, (128, 256), (1, 2), 1),
    (8192, 2048, 2048, (128, 256), (1, 2), 1),
]


@pytest.mark.parametrize("m,n,k,tile,cluster,split", VIT_AND_LARGE)
def test_heuristic_picks_tiles_and_splits_by_waves(m, n, k, tile, cluster, split):
    cfg = pick_config(m, n, k)
    assert ((cfg.tile_m, cfg.tile_n), (cfg.cluster_m, cfg.cluster_n)) == (tile, cluster)
    assert pick_split_k(m, n, k, 1, cfg) == split
    cfg.validate().resolved_stages(2, 16)


def test_split_seconds_counts_waves_and_partials():
    from cute_kernels.gemm.sm90_config import split_seconds, valid_split

    c192 = Sm90GemmConfig(tile_m=128, tile_n=192, cluster_m=1)
    # 297 tiles of 128x256 take 3 waves, 396 of 128x192 too: the narrower tile does 3/4 the work
    wide = split_seconds(12608, 768, 3072, Sm90GemmConfig(), 1)
    assert split_seconds(12608, 768, 3072, c192, 1) < 0.8 * wide
    # splitting adds the fp32 partials' traffic: 16x more units in one wave is not 16x faster
    one, four = split_seconds(768, 768, 12608, c192, 1), split_seconds(768, 768, 12608, c192, 4)
    assert four < one < 4 * four
    assert valid_split(12608, 4, c192) and not valid_split(12608, 3, c192) and not valid_split(1024, 4, c192)
    # batched problems are never split (the split is the batch mode)
    assert pick_split_k(768, 768, 12608, 2, c192) == 1


def test_in_kernel_splits_are_whole_k_tile_chunks_of_any_count():
    """A split reduced in the kernel (`SplitKLaunch`) cuts K's k-tiles into chunks of
    ceil(tiles / S), any S, the last one not empty; so K = 12608 (197 k-tiles of 64), which the
    batch-mode split can only cut in 2 or 4, cuts in 5: 24 tiles x 5 = 120 units, one wave."""
    from cute_kernels.gemm.sm90_config import MIN_CHUNK_K_TILES, split_seconds, valid_split

    c192 = Sm90GemmConfig(tile_m=128, tile_n=192, cluster_m=1)
    assert valid_split(12608, 5, c192, in_kernel=True) and not valid_split(12608, 5, c192)
    assert valid_split(4104, 11, c192, in_kernel=True)  # 65 k-tiles, the last one partial: chunks of 6
    assert not valid_split(4104, 16, c192, in_kernel=True)  # chunks of 5: the 16th would be empty
    assert not valid_split(64 * (MIN_CHUNK_K_TILES + 1), 2, c192, in_kernel=True)  # chunks too short
    assert pick_split_k(768, 768, 12608, 1, c192, in_kernel=True) == 5
    # the in-kernel reduction costs less than the partials' HBM pass at every split
    for s in (2, 4):
        assert split_seconds(768, 768, 12608, c192, s, in_kernel=True) < split_seconds(768, 768, 12608, c192, s)
    # still never a batched problem nor half a wave of tiles
    assert pick_split_k(768, 768, 12608, 2, c192, in_kernel=True) == 1
    assert pick_split_k(3072, 768, 12608, 1, c192, in_kernel=True) == 1
