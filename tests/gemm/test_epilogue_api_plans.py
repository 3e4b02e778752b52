"""Launch plans for `matmul_epilogue` and `scaled_mm` (CPU, recorded launches): a warm call of a
seen signature skips the checks and launches with exactly the checked call's arguments; a bad
argument still raises the checked path's error. Fixtures come from tests/runtime/test_plan_cache.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.runtime.test_plan_cache import (  # noqa: E402,F401 - gemm and plans are fixtures
    _bf16,
    _checks_counted,
    _same_launch,
    gemm,
    plans,
)

from cute_kernels.gemm import epilogue_api  # noqa: E402

# Launch arguments compared between the checked call and the replay: all but the output (index
# 2, a fresh tensor each call); for scaled_mm also all but the C stand-in (3), which is the output.
EPILOGUE_ARGS = (0, 1, 3, 4, 5, 6, 7, 8)
SCALED_ARGS = (0, 1, 4, 5, 6, 7, 8)


def test_matmul_epilogue_and_scaled_mm_replay_the_checked_launch(gemm, monkeypatch):
    x, w = _bf16(256, 512), _bf16(384, 512)
    bias, c = _bf16(384), _bf16(256, 384)
    first = epilogue_api.matmul_epilogue(x, w.t(), bias=bias, activation="gelu_tanh", beta=0.5, c=c)
    checks = _checks_counted(monkeypatch)
    again = epilogue_api.matmul_epilogue(x, w.t(), bias=bias, activation="gelu_tanh", beta=0.5, c=c)
    assert checks == [] and len(epilogue_api._PLANS) == 1
    checked, replayed = gemm.launches
    _same_launch([checked[i] for i in EPILOGUE_ARGS], [replayed[i] for i in EPILOGUE_ARGS])
    assert first.shape == again.shape and first.stride() == again.stride()

    a8, b8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.rand(()) + 0.5, torch.rand(1) + 0.5
    epilogue_api.scaled_mm(a8, b8.t(), scale_a, scale_b)
    checks.clear()
    epilogue_api.scaled_mm(a8, b8.t(), scale_a, scale_b)
    assert checks == [] and len(epilogue_api._PLANS) == 2
    checked, replayed = gemm.launches[-2:]
    _same_launch([checked[i] for i in SCALED_ARGS], [replayed[i] for i in SCALED_ARGS])
    assert replayed[5].shape == (1,)  # a 0-d scale reaches the kernel as one element
    with pytest.raises(TypeError):
        epilogue_api.scaled_mm(a8, b8.t(), scale_a, scale_b, out_dtype=torch.int8)
