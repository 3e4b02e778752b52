"""Rung 6, `sm90_warp_specialized`: producer/consumer warpgroups, one CTA per output tile.

What it adds over `sm90_tma_wgmma`: the roles split. Warpgroup 0 only loads (one warp issues
TMA, the group drops to 40 registers with `setmaxnreg.dec`), warpgroups 1-2 only compute
(`setmaxnreg.inc` to 232 registers: room for a 128x256 fp32 accumulator split between them,
the *cooperative* schedule), so the load of stage k+S never waits behind wgmma issue.
Clusters (2x1 / 1x2) multicast A or B across CTAs.

The kernel body is the one `sm90_persistent` runs (`Sm90PersistentGemm`); this rung launches
it with a grid of every tile, so each CTA computes exactly one tile and there is no
cross-tile overlap; `sm90_persistent` adds the persistent grid, rasterization and the
epilogue/main-loop overlap across tiles. The ping-pong schedule (each consumer warpgroup
owning whole tiles, alternating) needs several tiles per CTA, so it belongs to sm90_persistent.
"""

from __future__ import annotations

from cute_kernels.gemm.sm90_config import Sm90GemmConfig, pick_fp8_config
from cute_kernels.gemm.sm90_persistent import Sm90PersistentGemm


class Sm90WarpSpecializedGemm(Sm90PersistentGemm):
    """Cooperative warp-specialized GEMM; the rung launches it non-persistently."""


def _pick(m: int, n: int, k: int, in_bytes: int = 2) -> Sm90GemmConfig:
    if in_bytes == 1:
        return pick_fp8_config(m, n, k)
    if m <= 128 or -(-m // 128) * -(-n // 256) < 132:
        return Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=2 if m > 128 else 1, cluster_n=1)
    return Sm90GemmConfig(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1)


def _make_rung():
    from cute_kernels.gemm.sm90_rung import Sm90Rung

    return Sm90Rung("sm90_warp_specialized", Sm90WarpSpecializedGemm, pick=_pick, split_k=False, persistent=False)


rung = _make_rung()

VARIANTS = {"default": {}, "cluster_1x2": {"cluster_m": 1, "cluster_n": 2}, "tile_128x128": {"tile_n": 128}}


def _register() -> None:
    from cute_kernels.gemm.sm90_rung import register_compile_variants

    register_compile_variants("gemm.sm90_warp_specialized", Sm90WarpSpecializedGemm, VARIANTS,
                              {"HGMMA", "UTMALDG", "UTMASTG"})


_register()
