"""`cute_kernels.nn.CrossEntropyLoss` and `LinearCrossEntropyLoss` on CPU (fallback="torch")
against torch's."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.ops.fallback import FallbackWarning  # noqa: E402

F64 = torch.float64


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        yield


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_loss_is_torchs(reduction):
    torch.manual_seed(0)
    x = torch.randn(6, 5, 3, dtype=F64, requires_grad=True)  # (N, C, d1): the class dim is 1
    target = torch.randint(0, 5, (6, 3))
    target[0, 1] = -100
    ours = cnn.CrossEntropyLoss(reduction=reduction, label_smoothing=0.1, fallback="torch")
    ref = torch.nn.CrossEntropyLoss(reduction=reduction, label_smoothing=0.1)
    got, want = ours(x, target), ref(x, target)
    # The loss is fp32 whatever the logits' dtype (torch returns the logits' dtype).
    assert got.shape == want.shape and got.dtype == torch.float32 and torch.allclose(got.double(), want)
    seed = torch.randn_like(want)
    (g,) = torch.autograd.grad(got, x, seed.float())
    (w,) = torch.autograd.grad(want, x, seed)
    assert g.dtype == F64 and torch.allclose(g, w, atol=1e-6)


def test_class_weights_need_the_torch_fallback():
    x, t = torch.randn(3, 4), torch.tensor([0, 1, 2])
    with pytest.raises(NotImplementedError, match="class weights"):
        cnn.CrossEntropyLoss(weight=torch.ones(4))(x, t)
    assert torch.allclose(cnn.CrossEntropyLoss(weight=torch.ones(4), fallback="torch")(x, t).float(),
                          torch.nn.functional.cross_entropy(x, t))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_cross_entropy_loss_shares_the_head_and_matches(bias):
    torch.manual_seed(1)
    head = torch.nn.Linear(6, 13, bias=bias, dtype=F64)
    loss_fn = cnn.LinearCrossEntropyLoss.from_module(head, label_smoothing=0.05, fallback="torch")
    assert loss_fn.weight is head.weight and loss_fn.state_dict().keys() == head.state_dict().keys()
    x = torch.randn(2, 5, 6, dtype=F64, requires_grad=True)
    target = torch.randint(0, 13, (2, 5))
    loss = loss_fn(x, target)
    ref = torch.nn.functional.cross_entropy(head(x).view(-1, 13), target.view(-1), label_smoothing=0.05)
    assert torch.allclose(loss.double(), ref)
    params = [x, head.weight] + ([head.bias] if bias else [])
    for g, w in zip(torch.autograd.grad(loss, params), torch.autograd.grad(ref, params)):
        assert torch.allclose(g, w, atol=1e-10)
    fresh = cnn.LinearCrossEntropyLoss(6, 13, bias=bias, fallback="torch")
    fresh.load_state_dict(head.state_dict())
    with pytest.raises(ValueError, match="reduction"):
        cnn.LinearCrossEntropyLoss(6, 13, reduction="avg")
