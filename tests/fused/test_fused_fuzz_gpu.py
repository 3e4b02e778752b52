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

    from cute_kernels.bench.fuzz_record import run_recorded

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    report, n = run_recorded(fused_fuzz, "CUTE_KERNELS_FUSED_FUZZ_CASES", 1200, "fused fuzz")
    assert report.cases == n
    assert report.wrong == 0, report.failure_lines()
