"""timm models on cute_kernels attention (CPU, fallback="torch"): `nn.patch` rebinds the
attention modules' SDPA calls on the instance, the outputs and every gradient match stock, and
torch.compile(fullgraph=True) traces the rebound forwards. timm needs an importable torchvision,
which CI's CPU torch lacks (PyPI's torchvision is built against CUDA torch): skipped there."""

from __future__ import annotations

import copy

import pytest
import torch

try:
    import timm  # noqa: F401
except Exception as err:  # noqa: BLE001 - a torchvision that fails to load raises RuntimeError, not ImportError
    pytest.skip(f"timm is not importable here ({type(err).__name__}: {err})", allow_module_level=True)

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels import ops  # noqa: E402
from cute_kernels.bench import model_specs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name,folded", [("vit_b16", 2), ("eva02_b14", 0)])
def test_patched_timm_model_matches_stock(name, folded):
    spec = model_specs.spec(name)
    stock = model_specs.build(spec, size="tiny", dtype=torch.float64, device="cpu")
    ours = copy.deepcopy(stock)
    cnn.patch(ours, fallback="torch")
    report = ours.cute_kernels_patch
    assert report.attention == "rebound" and len(report.rebound) == 2 and report.linears > 0
    # ViT's blocks hold timm's Mlp (its GELU moves into fc1 for inference); EVA-02's SwiGLU does not
    assert len(report.folded) == folded
    x = model_specs.make_batch(spec, size="tiny", device="cpu", dtype=torch.float64)["x"]
    with torch.no_grad():
        assert _rel(ours(x), stock(x)) < 1e-10
    ops.FALLBACK_COUNTS.clear()
    got, want = ours(x), stock(x)
    assert _rel(got, want) < 1e-10
    assert sum(n for (op, _), n in ops.FALLBACK_COUNTS.items() if op == "sdpa") == 2
    got.square().sum().backward()
    want.square().sum().backward()
    for (n, p), q in zip(stock.named_parameters(), ours.parameters()):
        assert _rel(q.grad, p.grad) < 1e-9, n
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    compiled = torch.compile(ours, backend=counter, fullgraph=True)
    assert _rel(compiled(x), want) < 1e-10 and counter.frame_count == 1
    torch._dynamo.reset()


def test_attention_dropout_in_training_is_refused():
    spec = model_specs.spec("vit_b16")
    model = model_specs.build(spec, size="tiny", dtype=torch.float32, device="cpu", overrides={"attn_drop_rate": 0.1})
    cnn.patch(model, linear=False)
    x = model_specs.make_batch(spec, size="tiny", device="cpu", dtype=torch.float32)["x"]
    with pytest.raises(NotImplementedError, match="dropout_p"):
        model(x)
