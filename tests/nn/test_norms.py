"""`cute_kernels.nn` norm modules on CPU (fallback="torch"): drop-in for torch's (constructor,
state_dict, from_module sharing the parameters), `replacement_for` on torch's, timm's and the
exact Hugging Face modules it replaces (compared with them), and `patch(norms=True)`."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.ops.fallback import FallbackWarning  # noqa: E402

F64, BF16 = torch.float64, torch.bfloat16


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        yield


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def test_rms_norm_is_torch_rms_norm():
    torch.manual_seed(0)
    ref = torch.nn.RMSNorm((4, 6), eps=None, dtype=F64)
    with torch.no_grad():
        ref.weight.normal_()
    ours = cnn.replacement_for(ref, fallback="torch")
    assert type(ours) is cnn.RMSNorm and ours.weight is ref.weight
    assert ours.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(3, 4, 6, dtype=F64, requires_grad=True)
    assert _rel(ours(x), ref(x)) < 1e-12  # eps=None: the dtype's epsilon, as torch
    fresh = cnn.RMSNorm(6, eps=1e-5, fallback="torch", dtype=F64)
    fresh.load_state_dict(torch.nn.RMSNorm(6, eps=1e-5, dtype=F64).state_dict())


def test_layer_norm_is_torch_layer_norm_and_fuses_the_residual():
    torch.manual_seed(1)
    ref = torch.nn.LayerNorm(10, dtype=F64)
    with torch.no_grad():
        ref.weight.normal_(), ref.bias.normal_()
    ours = cnn.replacement_for(ref, fallback="torch")
    assert type(ours) is cnn.LayerNorm and ours.bias is ref.bias
    x, r = torch.randn(2, 10, dtype=F64), torch.randn(2, 10, dtype=F64)
    assert _rel(ours(x), ref(x)) < 1e-12
    y, s = ours(x, r)
    assert _rel(s, x + r) < 1e-15 and _rel(y, ref(x + r)) < 1e-12
    assert cnn.replacement_for(torch.nn.LayerNorm(10, elementwise_affine=False)).weight is None
    assert cnn.replacement_for(torch.nn.GroupNorm(2, 4)) is None
    assert cnn.replacement_for(ours) is None  # ours already


def test_subclasses_with_their_own_forward_are_left_alone():
    class Channels(torch.nn.LayerNorm):
        def forward(self, x):
            return super().forward(x.transpose(1, -1)).transpose(1, -1)

    assert cnn.replacement_for(Channels(4)) is None


def test_duck_typed_rms_norm_of_a_model_is_recognized_by_its_behaviour():
    class MyRMSNorm(torch.nn.Module):  # the shape of examples/transformer_block.py's
        def __init__(self, dim, eps):
            super().__init__()
            self.eps, self.weight = eps, torch.nn.Parameter(torch.randn(dim))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)

    class OddRMSNorm(MyRMSNorm):  # named like one, computes something else
        def forward(self, x):
            return x * self.weight

    m = MyRMSNorm(16, 1e-5)
    ours = cnn.replacement_for(m, fallback="torch")
    assert type(ours) is cnn.RMSNorm and ours.offset == 0.0 and ours.dtype_policy == "input"
    x = torch.randn(3, 16, dtype=BF16)
    assert ours(x).dtype == BF16 and _rel(ours(x), m(x)) < 1e-2
    assert cnn.replacement_for(OddRMSNorm(16, 1e-5)) is None


def test_patch_swaps_norms_in_place_and_keeps_the_state_dict():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, dtype=F64), torch.nn.LayerNorm(8, dtype=F64),
                                torch.nn.Sequential(torch.nn.RMSNorm(8, dtype=F64)))
    x = torch.randn(4, 8, dtype=F64)
    ref, keys = model(x), model.state_dict().keys()
    assert cnn.patch(model, sdpa=False, fallback="torch") is model
    assert type(model[1]) is cnn.LayerNorm and type(model[2][0]) is cnn.RMSNorm
    assert model.state_dict().keys() == keys and _rel(model(x), ref) < 1e-12
    cnn.patch(model, sdpa=False, fallback="torch")  # idempotent
    assert type(model[1]) is cnn.LayerNorm
    plain = torch.nn.Sequential(torch.nn.LayerNorm(8))
    cnn.patch(plain, norms=False, sdpa=False)
    assert type(plain[0]) is torch.nn.LayerNorm


def test_timm_layer_norm_is_recognized_by_name():
    timm_like = type("LayerNorm", (torch.nn.LayerNorm,), {"__module__": "timm.layers.norm"})
    assert type(cnn.replacement_for(timm_like(8), fallback="torch")) is cnn.LayerNorm
    other = type("LayerNorm2d", (torch.nn.LayerNorm,), {"__module__": "timm.layers.norm"})
    assert cnn.replacement_for(other(8)) is None


HF = [("llama", "LlamaRMSNorm", 0.0, "promote"), ("mistral", "MistralRMSNorm", 0.0, "promote"),
      ("qwen2", "Qwen2RMSNorm", 0.0, "promote"), ("gemma", "GemmaRMSNorm", 1.0, "input"),
      ("gemma2", "Gemma2RMSNorm", 1.0, "input")]


@pytest.mark.parametrize("family, name, offset, policy", HF)
@pytest.mark.parametrize("weight_dtype", [torch.float32, BF16])
def test_each_hugging_face_rms_norm_is_replaced_by_an_equal_module(family, name, offset, policy, weight_dtype):
    transformers = pytest.importorskip("transformers")
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), name)
    torch.manual_seed(3)
    hf = cls(64, eps=1e-5).to(weight_dtype)
    with torch.no_grad():
        hf.weight.normal_(0.0, 0.5)
    ours = cnn.replacement_for(hf, fallback="torch")
    assert type(ours) is cnn.RMSNorm and ours.weight is hf.weight and transformers.__version__
    assert (ours.offset, ours.eps) == (offset, 1e-5)
    assert ours.state_dict().keys() == hf.state_dict().keys() and ours.variance_epsilon == 1e-5
    for x_dtype in (torch.float32, BF16):
        x = torch.randn(2, 3, 64, dtype=x_dtype, requires_grad=True)
        want = hf(x)
        got = ours(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        # HF rounds x / rms to the input dtype before the weight (Llama) or not (Gemma); ours once.
        assert _rel(got, want) < (1e-6 if x_dtype == torch.float32 and weight_dtype == torch.float32 else 1e-2)
        g = torch.randn_like(want)
        (gx,) = torch.autograd.grad(got, x, g)
        (wx,) = torch.autograd.grad(want, x, g)
        assert _rel(gx, wx) < (1e-5 if x_dtype == torch.float32 and weight_dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_replaced_native_norms_call_torch_below_the_size_where_the_kernel_pays(kind, monkeypatch):
    """A replacement of torch's own fused module runs torch's native op on inputs under
    `native_below` elements and the fused op at and above it (with a residual, always ours);
    modules built directly, and Hugging Face RMSNorm replacements, never defer."""
    from cute_kernels.nn import fused_functional as ff
    from cute_kernels.nn import norms

    torch.manual_seed(2)
    ref = torch.nn.LayerNorm(8, dtype=F64) if kind == "layer" else torch.nn.RMSNorm(8, eps=1e-6, dtype=F64)
    ours = cnn.replacement_for(ref, fallback="torch")
    assert ours.native_below == norms.NATIVE_BELOW > 0
    assert cnn.LayerNorm(8).native_below == 0 and cnn.RMSNorm(8).native_below == 0
    calls = []
    entry = "layer_norm" if kind == "layer" else "rms_norm"
    real = getattr(ff, entry)
    monkeypatch.setattr(ff, entry, lambda *a, **k: calls.append(a[0].numel()) or real(*a, **k))
    ours.native_below = 40
    small, large = torch.randn(4, 8, dtype=F64), torch.randn(5, 8, dtype=F64)
    assert _rel(ours(small), ref(small)) < 1e-12 and calls == []
    assert _rel(ours(large), ref(large)) < 1e-12 and calls == [40]
