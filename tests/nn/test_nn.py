"""cute_kernels.nn on CPU (through fallback="torch"): Linear as a drop-in for torch.nn.Linear,
the functional forms, routing an existing model (patch, route), torch.compile without graph
breaks or recompiles, and a short training loop against eager PyTorch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend  # noqa: E402

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels import ops  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")

F64 = torch.float64


def _rel(x, ref):
    return float((x - ref).detach().norm() / ref.detach().norm())


# ---- Linear --------------------------------------------------------------------------------------

def test_linear_has_torch_constructor_and_state_dict():
    torch.manual_seed(0)
    ours = cnn.Linear(7, 4, True, None, F64, activation="silu", fallback="torch")
    theirs = torch.nn.Linear(7, 4, dtype=F64)
    assert isinstance(ours, torch.nn.Linear)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 7, dtype=F64)
    assert _rel(ours(x), F.silu(theirs(x))) < 1e-12
    assert "activation='silu'" in repr(ours)
    no_bias = cnn.Linear(7, 4, bias=False, dtype=F64, fallback="torch")
    assert no_bias.bias is None and _rel(no_bias(x), x @ no_bias.weight.T) < 1e-12


def test_linear_rejects_bad_options():
    with pytest.raises(ValueError, match="activation must be one of"):
        cnn.Linear(3, 4, activation="tanh")
    with pytest.raises(ValueError, match="fallback must be one of"):
        cnn.Linear(3, 4, fallback="yes")


def test_linear_without_fallback_rejects_cpu_input_clearly():
    with pytest.raises(ValueError, match="CUDA"):
        cnn.Linear(3, 4)(torch.randn(2, 3))


def test_from_linear_shares_parameters():
    base = torch.nn.Linear(5, 6, dtype=F64)
    ours = cnn.Linear.from_linear(base, activation="relu", fallback="torch")
    assert ours.weight is base.weight and ours.bias is base.bias
    x = torch.randn(2, 5, dtype=F64)
    assert _rel(ours(x), torch.relu(base(x))) < 1e-12


@pytest.mark.parametrize("activation,module", [("gelu", torch.nn.GELU()), ("gelu_tanh", torch.nn.GELU("tanh")),
                                               ("relu", torch.nn.ReLU()), ("silu", torch.nn.SiLU())])
def test_linear_fuses_its_activation_for_inference_only(monkeypatch, activation, module):
    # fuse_activation="inference": the activation goes into the op (the GEMM's epilogue) only
    # where the call records no gradient; with one recorded the op computes the product and
    # torch's function follows. Both give module(x @ w.T + b), values and gradients.
    import cute_kernels.nn.linear as linear_module

    seen = []
    entry = linear_module.linear_entry
    monkeypatch.setattr(linear_module, "linear_entry", lambda *a: seen.append(a[3]) or entry(*a))
    torch.manual_seed(0)
    ours = cnn.Linear(7, 4, dtype=F64, activation=activation, fuse_activation="inference", fallback="torch")
    ref = torch.nn.Linear(7, 4, dtype=F64)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 7, dtype=F64)
    with torch.no_grad():
        assert _rel(ours(x), module(ref(x))) < 1e-12
    assert seen == [activation]
    got, want = ours(x), module(ref(x))
    assert seen == [activation, None] and _rel(got, want) < 1e-12
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, list(ours.parameters()), g),
                    torch.autograd.grad(want, list(ref.parameters()), g)):
        assert _rel(a, b) < 1e-12
    assert "fuse_activation='inference'" in repr(ours)
    with pytest.raises(ValueError, match="fuse_activation must be one of"):
        cnn.Linear(7, 4, activation="relu", fuse_activation="training")


def _timm_like_mlp(order=("fc1", "act")):
    """A stand-in for timm.layers.Mlp (timm is not importable in CI): a class named Mlp defined,
    as far as its __module__ says, in timm, whose forward reads `order` first."""
    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        return self.drop2(self.fc2(x))

    def forward_scaled(self, x):
        x = self.norm(self.fc1(x))
        return self.drop2(self.fc2(self.drop1(self.act(x))))

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.fc1, self.act, self.drop1 = torch.nn.Linear(8, 16, dtype=F64), torch.nn.GELU(), torch.nn.Dropout(0.0)
        self.norm = torch.nn.LayerNorm(16, dtype=F64) if order[1] == "norm" else torch.nn.Identity()
        self.fc2, self.drop2 = torch.nn.Linear(16, 8, dtype=F64), torch.nn.Dropout(0.0)

    body = forward if order == ("fc1", "act") else forward_scaled
    return type("Mlp", (torch.nn.Module,), {"__init__": __init__, "forward": body, "__module__": "timm.layers.mlp"})


def test_patch_folds_timm_mlp_activation_into_fc1():
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(_timm_like_mlp()(), _timm_like_mlp(("fc1", "norm"))())
    stock = copy.deepcopy(model)
    cnn.patch(model, fallback="torch")
    assert model.cute_kernels_patch.folded == ["0"]  # the second reads norm between fc1 and act: kept
    folded, kept = model[0], model[1]
    assert folded.fc1.activation == "gelu" and folded.fc1.fuse_activation == "inference"
    assert isinstance(folded.act, torch.nn.Identity) and isinstance(kept.act, torch.nn.GELU)
    assert kept.fc1.activation is None
    x = torch.randn(2, 5, 8, dtype=F64)
    with torch.no_grad():
        assert _rel(model(x), stock(x)) < 1e-12
    got, want = model(x), stock(x)
    assert _rel(got, want) < 1e-12
    for (name, p), q in zip(stock.named_parameters(), model.parameters()):
        a, b = torch.autograd.grad(got.square().sum(), q, retain_graph=True)[0], \
            torch.autograd.grad(want.square().sum(), p, retain_graph=True)[0]
        assert _rel(a, b) < 1e-12, name
    cnn.patch(model, fallback="torch")  # idempotent: fc1 already carries the activation
    assert model.cute_kernels_patch.folded == [] and model[0].fc1.fuse_activation == "inference"


# ---- functional -----------------------------------------------------------------------------------

def test_functional_sdpa_masks():
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=F64) for _ in range(3))
    got = cnn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, fallback="torch")
    assert _rel(got, F.scaled_dot_product_attention(q, k, v, is_causal=True)) < 1e-12
    from torch.nn.attention.bias import causal_lower_right

    k2, v2 = torch.randn(1, 2, 9, 8, dtype=F64), torch.randn(1, 2, 9, 8, dtype=F64)
    mask = causal_lower_right(5, 9)
    got = cnn.functional.scaled_dot_product_attention(q, k2, v2, attn_mask=mask, fallback="torch")
    assert _rel(got, F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask)) < 1e-12


def test_functional_sdpa_dense_mask_and_dropout_need_the_fallback():
    q = torch.randn(1, 2, 5, 8, dtype=F64)
    dense = torch.randn(5, 5, dtype=F64)
    with pytest.raises(NotImplementedError, match="dense attn_mask"):
        cnn.functional.scaled_dot_product_attention(q, q, q, attn_mask=dense)
    with pytest.raises(NotImplementedError, match="dropout_p=0.5"):
        cnn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    ops.FALLBACK_COUNTS.clear()
    got = cnn.functional.scaled_dot_product_attention(q, q, q, attn_mask=dense, fallback="torch")
    assert _rel(got, F.scaled_dot_product_attention(q, q, q, attn_mask=dense)) < 1e-12
    assert sum(n for (op, _), n in ops.FALLBACK_COUNTS.items() if op == "scaled_dot_product_attention") == 1


def _window_mask(sq, sk, left, right, base):
    """The boolean window mask written out: i + base - left <= j <= i + base + right (-1 unbounded)."""
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        keep &= j <= i + base + right
    if left >= 0:
        keep &= j >= i + base - left
    return keep


def test_functional_sdpa_window_size():
    """window_size reaches the op (bottom-right aligned without causality, top-left with
    is_causal) and, on the PyTorch fallback for a dense mask, is and-ed into it."""
    q, k, v = torch.randn(1, 2, 6, 8, dtype=F64), torch.randn(1, 2, 9, 8, dtype=F64), torch.randn(1, 2, 9, 8, dtype=F64)
    sdpa = cnn.functional.scaled_dot_product_attention
    got = sdpa(q, k, v, window_size=(2, 1), fallback="torch")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=_window_mask(6, 9, 2, 1, 3))
    assert _rel(got, want) < 1e-12
    got = sdpa(q, k, v, is_causal=True, window_size=(3, 0), fallback="torch")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=_window_mask(6, 9, 3, 0, 0))
    assert _rel(got, want) < 1e-12
    dense = torch.rand(6, 9) > 0.2
    dense[:, 3:] = True  # every row keeps a key inside its window
    got = sdpa(q, k, v, attn_mask=dense, window_size=(-1, 1), fallback="torch")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense & _window_mask(6, 9, -1, 1, 3))
    assert _rel(got, want) < 1e-12
    with pytest.raises(ValueError, match="bounds the window on the right at 0"):
        sdpa(q, k, v, is_causal=True, window_size=(3, 2), fallback="torch")
    with pytest.raises(TypeError, match="window_size must be None or a pair of ints"):
        sdpa(q, k, v, window_size=3, fallback="torch")


# ---- routing ----------------------------------------------------------------------------------------

class Block(torch.nn.Module):
    """A model written against plain PyTorch: Linear layers and F.scaled_dot_product_attention."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, dtype=F64)
        self.out = torch.nn.Linear(dim, dim, dtype=F64)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def _op_calls():
    return {op: sum(n for (o, _), n in ops.FALLBACK_COUNTS.items() if o == op) for op in ("linear", "sdpa")}


def test_patch_routes_linear_and_sdpa_and_keeps_the_state_dict():
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 5, 16, dtype=F64)
    ref = model(x)
    keys = model.state_dict().keys()
    assert cnn.patch(model, fallback="torch") is model
    assert type(model.qkv) is cnn.Linear and type(model.out) is cnn.Linear
    assert model.state_dict().keys() == keys
    ops.FALLBACK_COUNTS.clear()
    assert _rel(model(x), ref) < 1e-12
    assert _op_calls() == {"linear": 2, "sdpa": 1}
    cnn.patch(model, fallback="torch")  # idempotent: no double routing
    ops.FALLBACK_COUNTS.clear()
    model(x)
    assert _op_calls() == {"linear": 2, "sdpa": 1}


def test_route_context_manager():
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 5, 16, dtype=F64)
    ref = model(x)
    ops.FALLBACK_COUNTS.clear()
    with cnn.route(fallback="torch"):
        got = model(x)
    assert _rel(got, ref) < 1e-12 and _op_calls() == {"linear": 2, "sdpa": 1}
    ops.FALLBACK_COUNTS.clear()
    model(x)
    assert _op_calls() == {"linear": 0, "sdpa": 0}


# ---- torch.compile: no graph breaks, no recompiles when only sizes change ------------------------

def test_compile_fullgraph_dynamic_sizes_do_not_recompile():
    torch.manual_seed(0)
    w, b = torch.randn(4, 16, requires_grad=True), torch.randn(4, requires_grad=True)

    def f(x, q, k, v):
        y = cnn.functional.linear(x, w, b, activation="gelu_tanh", fallback="torch")
        o = cnn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, fallback="torch")
        return y.square().mean() + o.square().mean() + ops.matmul(x, w.t(), fallback="torch").mean()

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for m in (10, 13, 22):
        x = torch.randn(m, 16, requires_grad=True)
        q, k, v = (torch.randn(1, 2, m, 8, requires_grad=True) for _ in range(3))
        got = compiled(x, q, k, v)
        frames.append(counter.frame_count)
        want = f(x, q, k, v)
        assert abs(float(got.detach()) - float(want.detach())) <= 1e-5 * abs(float(want.detach()))
        g_got = torch.autograd.grad(got, (x, q, w))
        g_want = torch.autograd.grad(want, (x, q, w))
        for a, r in zip(g_got, g_want):
            assert _rel(a, r) < 1e-5
    # Compiled once, on the first call (fullgraph: one graph); the new sizes reuse it.
    assert frames[0] >= 1 and frames == [frames[0]] * 3


def test_compile_through_patched_model():
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 6, 16, dtype=F64)
    ref = model(x)
    cnn.patch(model, fallback="torch")
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    assert _rel(compiled(x), ref) < 1e-12 and counter.frame_count == 1
    assert counter.op_count > 0


# ---- a short training loop against eager PyTorch ---------------------------------------------------

def _mlp(cls, **kw):
    torch.manual_seed(1)
    return torch.nn.Sequential(cls(12, 32, dtype=F64, **kw), torch.nn.ReLU(), cls(32, 3, dtype=F64, **kw))


def test_training_loop_matches_eager():
    ref_model, our_model = _mlp(torch.nn.Linear), _mlp(cnn.Linear, fallback="torch")
    our_model.load_state_dict(ref_model.state_dict())
    torch.manual_seed(2)
    x, target = torch.randn(64, 12, dtype=F64), torch.randn(64, 3, dtype=F64)
    curves = []
    for model in (ref_model, our_model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(20):
            opt.zero_grad()
            loss = F.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    ref, ours = curves
    assert ref[-1] < ref[0]
    assert all(abs(a - b) <= 1e-10 * abs(b) for a, b in zip(ours, ref))
