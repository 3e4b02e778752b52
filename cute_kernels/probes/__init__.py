"""Probe kernels: small CuTe-DSL kernels that each measure one thing about the GPU, for the course.

They sit at the kernel layer (beside `gemm` and `attention`: they import `layouts` and
`runtime` only) and are not part of any ladder. Each module registers its variants with the
runtime's inspection registry, so `cute-kernels sass probes.NAME` shows their SASS and the
`compile` tier builds them for sm_90a; `scripts/course_figures.py --gpu` times them.

- `vector_add`: the first kernel, scalar and 16-byte vectorized (course page 2);
- `memory`: pointer-chase latency (global, shared) and read bandwidth per level (page 3);
- `access`: strided reads (coalescing) and a shared-memory transpose under three layouts (page 4);
- `warps`: divergence, and independent FMA chains for ILP, occupancy and spills (pages 5, 7);
- `reduce`: four ways to sum: per-element atomics, per-thread atomics, a shared-memory tree,
  warp shuffles (pages 6, 8).

`_launch.run(job, *args)` compiles a probe's registered job once and launches it on torch's
current stream. Importing this package imports no probe module (and so not the DSL).
"""
