"""Side-by-side benchmarks: our kernels and the peers, timed in one process on the same tensors.

Modules, in the order data flows:
- `cases`: problem shapes (GEMM, attention, copy) with FLOP/byte counts, N(0,1) inputs and a
  float32 reference; `suites`: the named suites and `--impl` selection;
- `impls`: ours (discovered from the kernel registries) and the peers, as `Impl`s;
- `timing`: do_bench / CUDA-event timers and the interleaved round-robin; `ceilings`: the
  measured math and HBM ceilings;
- `runner`: correctness first (NaN-poisoned outputs), then timing, then derived metrics;
- `records` (the JSON schema), `table`, `plot`, `compare`; `overhead` (host time per call);
  `sanitize` (one small case per kernel, for compute-sanitizer).

The CLI is `cute-kernels bench` (cute_kernels/cli/bench.py). Nothing here imports torch or the
DSL at import time.
"""
