"""Persistent static tile scheduling: each CTA walks output tiles `grid`-strided.

Tiles are visited cluster by cluster; with `swizzle` > 1 consecutive clusters are grouped in
bands of `swizzle` clusters along M (raster "m") or N (raster "n") so that CTAs running at the
same time share A rows / B columns in L2.
"""

from __future__ import annotations

import cutlass.cute as cute
import cutlass.utils as utils


def make_params(c_mnl, tile_mn: tuple[int, int], cluster_mn: tuple[int, int], swizzle: int, raster_m: bool):
    """Scheduler parameters for an (M, N, L) output tiled by `tile_mn`."""
    tiles = cute.zipped_divide(c_mnl, tiler=tile_mn)
    ntiles_mnl = tiles[(0, (None, None, None))].shape
    return utils.PersistentTileSchedulerParams(ntiles_mnl, (*cluster_mn, 1), swizzle, raster_m)


def grid_shape(params, max_active_clusters: int):
    """(cluster_m, cluster_n, persistent clusters): one wave of resident clusters."""
    return utils.StaticPersistentTileScheduler.get_grid_shape(params, max_active_clusters)


def create(params):
    """The scheduler for this CTA; `.initial_work_tile_info()`, `.advance_to_next_work()`,
    `.get_current_work()` give WorkTileInfo(tile_idx=(m, n, l), is_valid_tile)."""
    return utils.StaticPersistentTileScheduler.create(params, cute.arch.block_idx(), cute.arch.grid_dim())


def has_tile_after(sched, steps: int = 1):
    """Whether this CTA's scheduler has a valid tile `steps` positions after its current one
    (peeks without advancing; used to pair ping-pong hand-offs with a consumer that exists)."""
    linear = sched._current_work_linear_idx + steps * sched.num_persistent_clusters
    return linear < cute.size(sched.params.problem_layout_ncluster_mnl)
