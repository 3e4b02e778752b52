"""Hopper (sm_90a) building blocks for CuTe-DSL kernels.

One concern per module, composed by the GEMM rungs and (later) attention:

- `smem_layouts`: the GMMA shared-memory layout atoms (swizzle + atom shape) as data, and their
  staged DSL form for a CTA tile.
- `tma`: TMA load (optionally multicast across a cluster) and TMA store atoms.
- `pipeline`: the mbarrier pipelines (TMA producer -> wgmma consumers, TMA-store ring).
- `wgmma`: the tiled warpgroup MMA and one k-tile of `wgmma.mma_async` issues.
- `warp_roles`: warp-specialization roles and their `setmaxnreg` register budgets.
- `tile_scheduler`: persistent static tile scheduling with rasterization and L2 swizzle.
- `epilogue`: accumulators -> shared memory (stmatrix) -> global memory (TMA store).

Importing this package does not import the DSL; each module does, when imported.
"""
