"""The fused-kernel fuzz on the GPU: random problems over norms (residual, weights, offset),
softmax, cross-entropy, RoPE and SwiGLU through `cute_kernels.nn.fused_functional`, forward and
every gradient against float64 (cute_kernels.bench.fused_fuzz), zero wrong.

Each run draws a fresh seed (printed, and kept in the record) unless CUTE_KERNELS_FUZZ_SEED
sets one; CUTE_KERNELS_FUSED_FUZZ_CASES sets the count (default 1200). The kernels compile
first in parallel processes (`runtime.precompile`). With CUTE_KERNELS_RESULTS_DIR set, the
`fused_fuzz` record (cases, wrong) is written there, as the GEMM fuzz's is.
"""

from __future__ import annotations


import pytest

from cute_kernels.bench import fused_fuzz

pytestmark = pytest.mark.gpu


def test_random_fused_problems_are_all_right():
    import torch

    from cute_kernels.bench.fuzz_record import seed_and_cases, write_to_results_dir
    from cute_kernels.runtime.precompile import precompile

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    seed, n = seed_and_cases("CUTE_KERNELS_FUSED_FUZZ_CASES", 1200)
    print(f"fused fuzz: seed {seed}, {n} cases")
    print(f"precompiled: {precompile('cute_kernels.bench.fused_fuzz:trace', seed, n)}")
    report = fused_fuzz.run(seed, n)
    print(report.summary("fused fuzz"))
    write_to_results_dir(fused_fuzz.result(report))
    assert report.cases == n
    assert report.wrong == 0, report.failure_lines()
