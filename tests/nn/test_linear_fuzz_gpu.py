"""GPU: the linear-layer training fuzz (`cute_kernels.bench.linear_fuzz`): random problems
through `cute_kernels.nn.Linear`, forward and backward, the checked call and two warm ones
(the replayed forward and `linear_backward` plans), and the `linear_backward` op as a compiled
graph calls it, against float64; zero wrong.

CUTE_KERNELS_LINEAR_FUZZ_CASES sets the count (default 200), CUTE_KERNELS_FUZZ_SEED the seed
(else a fresh one, printed and kept in the record). The kernels compile first in parallel
processes (`runtime.precompile`). With CUTE_KERNELS_RESULTS_DIR set the `linear_fuzz` record
(cases, wrong) is written there."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_random_linear_training_steps_are_all_right():
    from cute_kernels.bench import linear_fuzz
    from cute_kernels.bench.fuzz_record import run_recorded

    report, n = run_recorded(linear_fuzz, "CUTE_KERNELS_LINEAR_FUZZ_CASES", 200, "linear fuzz")
    assert report.cases == n
    assert report.wrong == 0, report.failure_lines()
