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


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).float()


def test_fuse_gated_mlps_in_a_transformers_llama_keeps_its_function_and_checkpoint():
    import copy

    stock = _tiny_llama()
    ours = copy.deepcopy(stock)
    replaced = cnn.fuse_gated_mlps(ours, fallback="torch")
    assert replaced == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert all(isinstance(layer.mlp, cnn.GatedMLP) for layer in ours.model.layers)
    ids = torch.randint(0, 100, (2, 7))
    out_s, out_o = stock(ids, labels=ids), ours(ids, labels=ids)
    assert torch.allclose(out_o.logits, out_s.logits, rtol=1e-4, atol=1e-5)
    out_s.loss.backward()
    out_o.loss.backward()
    layer_s, layer_o = stock.model.layers[0].mlp, ours.model.layers[0].mlp
    want = interleave_gate_up(layer_s.gate_proj.weight.grad, layer_s.up_proj.weight.grad)
    assert torch.allclose(layer_o.gate_up.grad, want, rtol=1e-4, atol=1e-6)
    # the checkpoint keys and values are the stock model's, both ways
    sd_s, sd_o = stock.state_dict(), ours.state_dict()
    assert list(sd_o) == list(sd_s) and all(torch.equal(sd_o[k], sd_s[k]) for k in sd_s)
    fresh = copy.deepcopy(ours)
    for p in fresh.parameters():
        torch.nn.init.zeros_(p)
    fresh.load_state_dict(sd_s)
    assert torch.equal(fresh.model.layers[1].mlp.gate_up, ours.model.layers[1].mlp.gate_up)


def test_fuse_gated_mlps_leaves_other_mlps_alone():
    class GeluGated(torch.nn.Module):  # Gemma's shape of MLP, another activation
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = torch.nn.Linear(16, 24, bias=False), torch.nn.Linear(16, 24, bias=False)
            self.down_proj = torch.nn.Linear(24, 16, bias=False)

        def forward(self, x):
            return self.down_proj(torch.nn.functional.gelu(self.gate_proj(x)) * self.up_proj(x))

    model = torch.nn.Sequential(GeluGated())
    assert cnn.fuse_gated_mlps(model, fallback="torch") == [] and isinstance(model[0], GeluGated)
