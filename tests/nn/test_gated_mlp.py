"""`cute_kernels.nn.GatedMLP` on the CPU (fallback="torch"): the same function and gradients as
the three nn.Linear layers it is built from, its errors, and one opaque op under torch.compile."""

import warnings

import pytest

torch = pytest.importorskip("torch")

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.gemm.gated import interleave_gate_up  # noqa: E402
from cute_kernels.ops.fallback import FallbackWarning  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        yield


def _projections(h=16, i=24):
    torch.manual_seed(0)
    return (torch.nn.Linear(h, i, bias=False, dtype=torch.float64), torch.nn.Linear(h, i, bias=False, dtype=torch.float64),
            torch.nn.Linear(i, h, bias=False, dtype=torch.float64))


def test_matches_the_three_projections_forward_and_backward():
    g, u, d = _projections()
    mlp = cnn.GatedMLP.from_projections(g, u, d, fallback="torch")
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    y, ref = mlp(x), d(torch.nn.functional.silu(g(xr)) * u(xr))
    assert torch.allclose(y, ref, rtol=1e-12, atol=1e-12)
    seed = torch.randn_like(y)
    y.backward(seed)
    ref.backward(seed)
    assert torch.allclose(x.grad, xr.grad, rtol=1e-12, atol=1e-12)
    assert torch.allclose(mlp.gate_up.grad, interleave_gate_up(g.weight.grad, u.weight.grad), rtol=1e-12, atol=1e-12)
    assert torch.allclose(mlp.down.weight.grad, d.weight.grad, rtol=1e-12, atol=1e-12)
    wg, wu = mlp.projections()
    assert torch.equal(wg, g.weight.detach()) and torch.equal(wu, u.weight.detach())


def test_bad_configurations_raise():
    with pytest.raises(ValueError, match="multiple of 8"):
        cnn.GatedMLP(16, 20)
    g, u, d = _projections()
    with pytest.raises(ValueError, match="gate_proj has a bias"):
        cnn.GatedMLP.from_projections(torch.nn.Linear(16, 24), u, d)


def test_compiles_to_one_graph_without_breaks():
    g, u, d = _projections()
    mlp = cnn.GatedMLP.from_projections(g, u, d, fallback="torch").float()
    x = torch.randn(3, 16, requires_grad=True)
    explained = torch._dynamo.explain(mlp)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    y.sum().backward()
    assert torch.allclose(y, mlp(x), rtol=1e-5, atol=1e-6) and x.grad is not None
