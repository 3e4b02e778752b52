"""Configurations of the Hopper GEMM rungs, and the heuristic that picks one per problem.

`Sm90GemmConfig` fixes everything static about a kernel build (tile, cluster, pipeline depth,
schedule, rasterization); problem sizes stay dynamic. `pick_config` is the default heuristic
used by the rungs when no config is given and no autotuned winner is stored
(`cute_kernels.gemm.autotune`, which searches configs around it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

SMEM_BYTES = 232448  # sm_90 opt-in shared memory per block (227 KiB)
# mbarriers (up to 1 KiB before the 1024-aligned operand buffers) and up to 1 KiB the allocator pads
# to align the dynamic smem base: without it a fit with no slack (64x16 fp32-out at 21 stages) overflows
_BARRIER_BYTES = 2048

SCHEDULES = ("cooperative", "pingpong")


@dataclass(frozen=True)
class Sm90GemmConfig:
    """Static shape of one sm_90a GEMM build.

    tile_m x tile_n x tile_k: the CTA tile (tile_k elements of K per pipeline stage).
    cluster_m x cluster_n: CTAs per cluster; A is multicast along cluster_n, B along cluster_m.
    stages: smem pipeline depth (0 = as many as fit beside the epilogue buffers).
    epi_stages: TMA-store ring depth. schedule: "cooperative" (the consumer warpgroups split one
    tile along M) or "pingpong" (each consumer warpgroup owns whole tiles, alternating).
    raster: "m" or "n", the order tiles are walked; swizzle: clusters per L2 band (1 = none).
    fp8_fast_accum: with 8-bit inputs, accumulate every k-tile straight into one accumulator
    (wgmma's fp8 accumulation keeps fewer bits); False adds each k-tile's fresh partial into a
    full-fp32 accumulator ("promotion", CUTLASS's fast-accum-off mode) at some speed cost.
    swap_ab: the host computes C^T = B^T . A^T (`sm90_skinny`): the kernel's rows are the
    problem's N and its columns the problem's M, so tile_m tiles N and tile_n tiles M. The
    kernel build is the same either way; only the host glue reads this flag.
    """

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 64
    cluster_m: int = 2
    cluster_n: int = 1
    stages: int = 0
    epi_stages: int = 4
    schedule: str = "cooperative"
    raster: str = "m"
    swizzle: int = 1
    fp8_fast_accum: bool = False
    swap_ab: bool = False

    def validate(self) -> "Sm90GemmConfig":
        if self.tile_m not in (64, 128, 192, 256):
            raise ValueError(f"tile_m must be 64, 128, 192 or 256, got {self.tile_m}")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"tile_n must be a multiple of 16 in [16, 256], got {self.tile_n}")
        if self.tile_k not in (32, 64, 128):
            raise ValueError(f"tile_k must be 32, 64 or 128, got {self.tile_k}")
        for c in (self.cluster_m, self.cluster_n):
            if c not in (1, 2, 4):
                raise ValueError(f"cluster dims must be 1, 2 or 4, got {self.cluster_m}x{self.cluster_n}")
        if self.cluster_m * self.cluster_n > 4:
            raise ValueError(f"at most 4 CTAs per cluster, got {self.cluster_m}x{self.cluster_n}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.schedule == "cooperative" and self.tile_m % 128:
            raise ValueError(f"cooperative schedule splits tile_m across 2 warpgroups: tile_m must be 128 or 256, got {self.tile_m}")
        if self.schedule == "pingpong" and self.tile_m * self.tile_n > 128 * 128:
            raise ValueError(f"ping-pong: one warpgroup holds the whole {self.tile_m}x{self.tile_n} fp32 accumulator; "
                             "at most 128x128 fits its registers")
        if self.raster not in ("m", "n"):
            raise ValueError(f"raster must be 'm' or 'n', got {self.raster!r}")
        if self.swizzle < 1:
            raise ValueError(f"swizzle must be >= 1, got {self.swizzle}")
        if self.epi_stages < 1 or self.stages < 0:
            raise ValueError("stages must be >= 0 (0 = auto) and epi_stages >= 1")
        return self

    @property
    def consumer_warpgroups(self) -> int:
        return 2 if self.schedule == "cooperative" else 1

    @property
    def mma_warpgroups(self) -> int:
        """Warpgroups sharing one tile's accumulator (2 cooperative, 1 ping-pong)."""
        return 2 if self.schedule == "cooperative" else 1

    def fp8_promotion_fits(self) -> bool:
        """Whether fp8 promotion's two fp32 accumulators (each tile_m/mma_warpgroups x tile_n per
        warpgroup) fit in a consumer's registers: at most 2 x 64 of them per thread."""
        return self.tile_m * self.tile_n // self.mma_warpgroups <= 64 * 128

    def ab_stage_bytes(self, in_bytes: int) -> int:
        return (self.tile_m + self.tile_n) * self.tile_k * in_bytes

    def epi_tile(self, out_bits: int) -> tuple[int, int]:
        if self.consumer_warpgroups == 2:
            return (min(128, self.tile_m), min(32, self.tile_n))
        return (min(64, self.tile_m), min(64 if out_bits == 8 else 32, self.tile_n))

    def resolved_stages(self, in_bytes: int, out_bits: int, extra_bytes: int = 0) -> int:
        """Pipeline depth: `stages`, or the most that fit beside the epilogue's buffers and
        `extra_bytes` more (a staged bias); raises if fewer than 2 fit."""
        em, en = self.epi_tile(out_bits)
        epi_bytes = em * en * out_bits // 8 * self.epi_stages
        fit = (SMEM_BYTES - _BARRIER_BYTES - epi_bytes - extra_bytes) // self.ab_stage_bytes(in_bytes)
        stages = self.stages or fit
        if stages < 2 or stages > fit:
            raise ValueError(f"{self}: {stages} stages requested, {fit} fit in shared memory (need >= 2)")
        return stages


def pick_fp8_config(m: int, n: int, k: int) -> Sm90GemmConfig:
    """The default config for fp8 inputs (tile_k = 128 elements = one 128-byte swizzle row).

    Promotion keeps a second accumulator, so each consumer warpgroup holds 2 x 64 x tile_n fp32
    values: tile_n = 128 keeps that to 128 registers (128 x 256 would spill).
    """
    if m <= 128:
        return Sm90GemmConfig(tile_m=128, tile_n=64 if m > 64 else 128, tile_k=128, cluster_m=1, cluster_n=1)
    return Sm90GemmConfig(tile_m=128, tile_n=128, tile_k=128, cluster_m=2, cluster_n=1,
                          swizzle=8 if m * n >= 8192 * 8192 else 1, raster="n" if m * n >= 8192 * 8192 else "m")


SKINNY_M = 128  # problems with M at most this take the swap-AB configs (`pick_skinny_config`)
SKINNY_TILE_N = (16, 32, 64, 128)


def pick_skinny_config(m: int, n: int, k: int, in_bytes: int = 2) -> Sm90GemmConfig:
    """The swap-AB config for small M (decode-like; M <= SKINNY_M): the kernel computes C^T.

    Such a problem is a stream of B (N x K) past a few rows of A. Swapped, N lies on the wgmma
    M side (tile_m = 64 rows of N per tile, ping-pong so one warpgroup owns a tile) and M on
    the wgmma N side (tile_n = the smallest of 16, 32, 64, 128 covering M), so a stage holds
    little zero fill and the pipeline gets as many stages as shared memory allows (about 20 at
    M = 16): that depth of loads in flight is what lets one CTA per SM pull its share of HBM
    bandwidth. 64-row tiles make N / 64 CTAs (128 at N = 8192); `pick_split_k` splits K when
    that leaves more than half the SMs idle.
    """
    tile_n = next(t for t in SKINNY_TILE_N if t >= min(m, SKINNY_TILE_N[-1]))
    # measured (H200, N = K = 8192, vs torch.matmul in the same run): 64x16 and 64x64 tiles
    # with 64-wide k-tiles reach 1.01x cuBLAS at M = 16 and 64; at M = 128 (64x128 tiles)
    # 128-wide k-tiles give 0.97x against 0.94x; splitting K costs 15-25% at N = 8192
    return _skinny_config(tile_n, 128 if in_bytes == 1 or tile_n == SKINNY_TILE_N[-1] else 64)


@functools.lru_cache(maxsize=None)
def _skinny_config(tile_n: int, tile_k: int) -> Sm90GemmConfig:
    # one frozen instance per tile shape: the per-call host path builds no dataclass
    return Sm90GemmConfig(tile_m=64, tile_n=tile_n, tile_k=tile_k, cluster_m=1, cluster_n=1, schedule="pingpong",
                          swap_ab=True).validate()


def pick_config(m: int, n: int, k: int, in_bytes: int = 2, swap_ab: bool = True) -> Sm90GemmConfig:
    """The default config for an M x N x K problem (heuristic; an autotuner may override it).

    Measured on H200 (`scripts/gemm_config_sweep.py`, 26 model shapes, docs/gemm_hopper.md):
    128x256 tiles win from about one wave of them (128 tiles: 1.05-1.14x cuBLAS against
    128x128's 0.87-0.94x). A cluster only pays when its shape tiles the grid: with an even count
    of N tiles a 1x2 cluster (A multicast along N) won 19 of 26 shapes, by up to 1.33x over 2x1
    (ViT's M = 12608 is an odd 99 M tiles, so a 2x1 cluster idles a CTA); with an odd count of N
    tiles a 2x1 cluster, rastered along N in bands of 8 on large outputs so the B panels of
    running CTAs stay in L2. With a short K (<= 1024: ViT's and EVA-02's K = 768 layers) a
    ping-pong 128x128 won (ViT-B: 0.93-0.98x against 0.80-0.97x cluster-less; EVA-02: 1.03x
    with a 1x2 cluster where the 128-wide N tiles pair up, `_pick_wide`). Those classes
    give way to 128x192 tiles where the time model (`split_seconds`: whole waves, the split of
    K `pick_split_k` would take) says they are more than 3% faster: ViT's layers at N or K = 768
    (measured 0.96-1.01x cuBLAS with 128x192 against 0.70-0.94x with the classes' tiles; the
    weight gradients 0.66-0.69x -> 0.90-0.94x, and 0.64x -> 0.81x at 768x768x12608 with K split
    in 4). Skinny M (<= SKINNY_M) computes C^T (`pick_skinny_config`); with `swap_ab=False` (a
    path that cannot swap) it uses 128x64 tiles (a full wave at N = 8192). The batch count is not
    part of the choice: tiles are those of one batch.
    """
    if m <= SKINNY_M and swap_ab:
        return pick_skinny_config(m, n, k, in_bytes)
    if in_bytes == 1:
        return pick_fp8_config(m, n, k)
    if m <= SKINNY_M:
        # measured (H200, N = K = 8192): 128x64 tiles without split-K beat 128x128 + split-K 4
        # by 1.9x at M = 16 and 2.0x at M = 64 (same call path, same run)
        return Sm90GemmConfig(tile_m=128, tile_n=64, cluster_m=1, cluster_n=1)
    base = _pick_wide(m, n, k)
    m_tiles, n_tiles = -(-m // 128), -(-n // 192)
    # under one wave no CTA waits for a panel another loaded, so a cluster only adds its
    # handshakes: measured 0.90-0.92x cuBLAS cluster-less against 0.87-0.91x with 1x2 on ViT's
    # weight gradients (0.81x against 0.76x with K split in 4)
    narrow = _NARROW[False, False] if m_tiles * n_tiles < 132 else _NARROW[n_tiles % 2 == 0, m_tiles % 2 == 0]
    # the measured classes stand unless another tile (with its best split of K) is estimated
    # faster by more than the noise margin
    best_t = estimated_seconds(m, n, k, base, in_bytes) / _SWITCH
    narrow_t = estimated_seconds(m, n, k, narrow, in_bytes)
    if n_tiles <= _FEW_N_TILES and narrow.cluster_n > base.cluster_n:
        narrow_t /= _MULTICAST_GAIN
    return narrow if narrow_t < best_t else base


def _pick_wide(m: int, n: int, k: int) -> Sm90GemmConfig:
    """The 128x256 / 128x128 classes (measured on 26 model shapes; `pick_config`).

    Short K (<= 1024): ping-pong 128x128, whose epilogue hides under the other warpgroup's main
    loop (at K = 768 a tile's main loop is only 12 k-tiles), with a 1x2 cluster (A multicast)
    where the 128-wide N tiles pair up. Measured on EVA-02's M = 16448 layers at K = 768 (H200,
    L2 flushed / left warm as in a model): 1.03 / 1.12x cuBLAS at N = 768 (cluster-less
    ping-pong 0.94 / 1.10x, 128x256 1.00 / 1.03x), 0.95 / 1.05x at N = 2048 (128x256 with a
    1x2 cluster 0.95 / 0.98x)."""
    m_tiles, n_tiles = -(-m // 128), -(-n // 256)
    if m_tiles * n_tiles < 118:  # under 0.9 of a wave of 128x256 tiles
        return _WIDE["small"]
    if k <= 1024:
        return _WIDE["pingpong_1x2" if -(-n // 128) % 2 == 0 else "pingpong"]
    if n_tiles % 2 == 0:
        return _WIDE["1x2"]
    return _WIDE["2x1_swizzled" if m * n >= 8192 * 8192 else "2x1"]


_WIDE = {
    "small": Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1),
    "1x2": Sm90GemmConfig(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2),
    "pingpong": Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong"),
    "pingpong_1x2": Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, schedule="pingpong"),
    "2x1_swizzled": Sm90GemmConfig(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, swizzle=8, raster="n"),
    "2x1": Sm90GemmConfig(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1),
}
# 128x192 tiles by (even count of N tiles, even count of M tiles): the cluster goes where it
# tiles the grid (as for 128x256), none when both counts are odd
_NARROW = {
    (True, True): Sm90GemmConfig(tile_m=128, tile_n=192, cluster_m=1, cluster_n=2),
    (True, False): Sm90GemmConfig(tile_m=128, tile_n=192, cluster_m=1, cluster_n=2),
    (False, True): Sm90GemmConfig(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1),
    (False, False): Sm90GemmConfig(tile_m=128, tile_n=192, cluster_m=1, cluster_n=1),
}
_SWITCH = 1.03  # another tile replaces the measured classes only past this estimated gain (noise)
# Where few N tiles share each A panel, a 1x2 cluster's multicast of A halves traffic that the
# FLOP model does not count. Measured on EVA-02's 16448x768x2048 (H100, 2026-12-05, cuBLAS in
# the same run; forward and input gradient): 128x192 tiles 0.84-0.86x with a 1x2 cluster, 0.61x
# without and with 2x1; 128x256 (3 N tiles, no pair) 0.74x. The model called them a tie.
_FEW_N_TILES = 8
_MULTICAST_GAIN = 1.1

# The time model behind the choices above (`estimated_seconds`), fitted to H200 sweeps
# (scripts/gemm_config_sweep.py, ViT-B/16's forward, input- and weight-gradient GEMMs, each
# config and split timed beside cuBLAS in one process): it ranks the 16 (config, split) pairs of
# each weight-gradient shape in the measured order but for near-ties (within 5% measured), and
# puts times within 15%.
_SM_FLOPS = 6.0e12  # 16-bit FLOP/s one SM sustains in a 128x256 cooperative tile
# relative speed of a tile class at equal waves (measured where the wave terms are equal):
# 128x192 within 3% of 128x256, ping-pong 128x128 3% ahead of both at K <= 1024 (its epilogue
# hides under the other warpgroup's main loop) and far behind beyond, cooperative 128x128 behind
_TILE_SPEED = {(256, "cooperative"): 1.0, (192, "cooperative"): 0.97, (128, "pingpong"): 1.03,
               (128, "cooperative"): 0.88}
_PARTIALS_BYTES_PER_S = 3.0e12  # split-K's fp32 partials: written, summed, cast (HBM streaming)
_SPLIT_FIXED_S = 6e-6  # the sum and the cast: two more kernels
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
# Split-K reduced in the kernel (`sm90_persistent.SplitKLaunch`): any chunk count, the chunks
# whole k-tiles. Estimated constants (the splits they pick measured 0.93-1.01x cuBLAS on the
# H200's weight-gradient and skinny shapes, 2026-12-05, but no sweep has fitted them): a unit
# writes its fp32 tile to the L2 workspace and the tile's last unit reads all S back, at about
# what one SM streams from L2 with 21 16-byte loads in flight per thread; plus a microsecond of
# counter and latency.
SPLITS_IN_KERNEL = tuple(range(1, 17))
_SM_L2_BYTES_PER_S = 2.5e11
_REDUCE_FIXED_S = 1e-6
MIN_CHUNK_K_TILES = 4  # in-kernel chunks of fewer k-tiles than this leave the pipeline no depth


def _tile_speed(config: Sm90GemmConfig, k: int) -> float:
    if config.schedule == "pingpong" and k > 1024:
        return 0.8  # measured 0.71x cuBLAS at K = 3072 where 128x192 gave 0.96x
    return _TILE_SPEED.get((config.tile_n, config.schedule), 0.9)


def split_seconds(m: int, n: int, k: int, config: Sm90GemmConfig, splits: int, in_bytes: int = 2,
                  num_sms: int = 132, in_kernel: bool = False) -> float:
    """Estimated GPU seconds of an M x N x K problem with `config` and K cut into `splits`: whole
    waves of (tile, chunk) units over the SMs, the last one partly idle (why: ViT's M = 12608
    makes 99 x 3 = 297 tiles of 128x256 at N = 768, 2.25 waves of 132 SMs, so a quarter of the
    machine idles in the last one; 128x192 tiles make 396, 3.0 waves: 0.77x cuBLAS against 0.96x
    measured at 12608x768x3072), each unit a tile's FLOPs at `_SM_FLOPS` times its class speed,
    plus, when split, the fp32 partials' traffic (8 bytes per output element per split, written
    and read, then the sum's and the cast's 10) and two launches. With `in_kernel` the chunks
    are whole k-tiles and the partials go through L2: each wave's units write their tiles and
    the last unit of a tile reads all `splits` back (`_SM_L2_BYTES_PER_S`). Tiles are counted
    in the kernel's orientation (N x M for a `swap_ab` config)."""
    rows, cols = (n, m) if config.swap_ab else (m, n)
    units = -(-rows // config.tile_m) * -(-cols // config.tile_n) * splits
    waves = -(-units // num_sms)
    if in_kernel:  # whole k-tiles per chunk
        k_tiles = -(-k // config.tile_k)
        chunk = -(-k_tiles // splits) * config.tile_k
    else:
        chunk = -(-k // splits)
    flops = 2.0 * config.tile_m * config.tile_n * chunk
    t = waves * flops / (_SM_FLOPS * _tile_speed(config, k) * (2 if in_bytes == 1 else 1))
    if splits > 1 and in_kernel:
        t += (waves + splits) * 4 * config.tile_m * config.tile_n / _SM_L2_BYTES_PER_S + _REDUCE_FIXED_S
    elif splits > 1:
        t += (8 * splits + 10) * m * n / _PARTIALS_BYTES_PER_S + _SPLIT_FIXED_S
    return t


def valid_split(k: int, splits: int, config: Sm90GemmConfig, in_bytes: int = 2, in_kernel: bool = False) -> bool:
    """Whether K cuts into `splits` equal chunks the kernel can take as its batch mode: chunks
    of at least 8 k-tiles whose length keeps TMA's 16-byte stride alignment. With `in_kernel`
    (chunks of whole k-tiles, `SplitKLaunch`): chunks of at least `MIN_CHUNK_K_TILES` k-tiles,
    the last one not empty."""
    if splits == 1:
        return True
    if in_kernel:
        tiles = -(-k // config.tile_k)
        chunk = -(-tiles // splits)
        return chunk >= MIN_CHUNK_K_TILES and (splits - 1) * chunk < tiles
    ks = k // splits
    return k % splits == 0 and (ks * in_bytes) % 16 == 0 and ks >= 8 * config.tile_k


def estimated_seconds(m: int, n: int, k: int, config: Sm90GemmConfig, in_bytes: int = 2, num_sms: int = 132) -> float:
    """`split_seconds` at the split `pick_split_k` would take for `config`."""
    return split_seconds(m, n, k, config, pick_split_k(m, n, k, 1, config, in_bytes, num_sms), in_bytes, num_sms)


def pick_split_k(m: int, n: int, k: int, l: int, config: Sm90GemmConfig, in_bytes: int = 2,
                 num_sms: int = 132, in_kernel: bool = False) -> int:
    """How many K chunks to split an unbatched problem with less than half a wave of tiles into
    (1 = none), among the splits `valid_split` admits. The split becomes the kernel's batch mode,
    so a batched problem is not split; with half a wave or more the partials cost more than the
    split gains (measured). A 16-bit problem takes the split of least `split_seconds`; a swap-AB
    (small-M, memory-bound) or fp8 one, which the FLOP model does not describe, the most splits
    that keep within two waves of (tile, chunk) units. Tiles are counted in the kernel's
    orientation (N x M for a `swap_ab` config). `in_kernel`: the splits of a reduction in the
    kernel (`SPLITS_IN_KERNEL`, `valid_split(in_kernel=True)`, its `split_seconds`)."""
    rows, cols = (n, m) if config.swap_ab else (m, n)
    tiles = -(-rows // config.tile_m) * -(-cols // config.tile_n)
    if l != 1 or 2 * tiles > num_sms:
        return 1
    valid = [s for s in (SPLITS_IN_KERNEL if in_kernel else SPLITS) if valid_split(k, s, config, in_bytes, in_kernel)]
    if config.swap_ab or in_bytes == 1:
        return max(s for s in valid if s == 1 or tiles * s <= 2 * num_sms)
    return min(valid, key=lambda s: split_seconds(m, n, k, config, s, in_bytes, num_sms, in_kernel))


def with_overrides(config: Sm90GemmConfig, **kw) -> Sm90GemmConfig:
    return replace(config, **kw).validate()
