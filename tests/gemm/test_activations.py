"""gemm.activations: the torch definitions every torch-side path shares, against the functions'
formulas in float64, and their derivatives against autograd."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.gemm import activations  # noqa: E402

F64 = torch.float64


def _formula(x, name):
    if name == "relu":
        return x.clamp(min=0)
    if name == "silu":
        return x / (1 + torch.exp(-x))
    if name == "gelu":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("name", activations.NAMES)
def test_apply_backward_and_in_place_follow_the_formulas(name):
    torch.manual_seed(0)
    z = torch.randn(64, 33, dtype=F64) * 3
    want = _formula(z, name)
    assert torch.allclose(activations.apply(z, name), want, rtol=1e-12, atol=1e-12)
    y = z.clone()
    out = activations.apply_(y, name)
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12)
    zg = z.clone().requires_grad_()
    g = torch.randn_like(z)
    (expected,) = torch.autograd.grad(_formula(zg, name), zg, g)
    assert torch.allclose(activations.backward(g, z, name), expected, rtol=1e-10, atol=1e-12)


def test_nan_propagates_and_unknown_names_raise():
    x = torch.tensor([float("nan"), -1.0, 2.0], dtype=F64)
    for name in activations.NAMES:
        assert torch.isnan(activations.apply(x, name)[0])
    assert activations.apply(x, None) is x
    with pytest.raises(ValueError, match="activation must be None or one of"):
        activations.apply(x, "tanh")


def test_of_module_names_exactly_the_torch_classes():
    assert activations.of_module(torch.nn.GELU()) == "gelu"
    assert activations.of_module(torch.nn.GELU(approximate="tanh")) == "gelu_tanh"
    assert activations.of_module(torch.nn.ReLU()) == "relu" and activations.of_module(torch.nn.SiLU()) == "silu"

    class Scaled(torch.nn.GELU):  # a subclass may compute something else
        pass

    assert activations.of_module(Scaled()) is None and activations.of_module(torch.nn.Tanh()) is None
