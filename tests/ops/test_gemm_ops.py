"""cute_kernels::matmul, ::linear, ::scaled_mm on CPU: schemas, fakes (meta tensors and
FakeTensorMode), opcheck through fallback="torch", the autograd formulas against PyTorch's, and
the errors. The CUDA paths are in test_ops_gpu.py."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cute_kernels import ops  # noqa: E402
from cute_kernels.ops import fallback as fallback_mod  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")

F64 = torch.float64


def randn(*shape, dtype=F64, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


# ---- schemas -------------------------------------------------------------------------------------

def test_schemas_are_registered_under_the_namespace():
    schemas = {name: str(getattr(torch.ops.cute_kernels, name).default._schema) for name in ops.OPS}
    assert schemas["matmul"] == ('cute_kernels::matmul(Tensor a, Tensor b, ScalarType? out_dtype=None, '
                                 'str rung="auto", str fallback="none") -> Tensor')
    assert schemas["linear"].startswith("cute_kernels::linear(Tensor x, Tensor weight, Tensor? bias=None, "
                                        "str? activation=None")
    assert "Tensor scale_a, Tensor scale_b" in schemas["scaled_mm"]
    assert schemas["sdpa"].endswith("-> (Tensor, Tensor)")
    assert schemas["sdpa_backward"].endswith("-> (Tensor, Tensor, Tensor)")
    for name, schema in schemas.items():
        assert "mutates" not in schema and "(a!)" not in schema, f"{name} must be functional: {schema}"


# ---- fakes: shape and dtype inference without data ------------------------------------------------

@pytest.mark.parametrize("a_shape, b_shape, out_shape", [
    ((5, 7), (7, 3), (5, 3)),
    ((4, 5, 7), (7, 3), (4, 5, 3)),
    ((5, 7), (4, 7, 3), (4, 5, 3)),
    ((1, 5, 7), (4, 7, 3), (4, 5, 3)),
    ((4, 5, 7), (4, 7, 3), (4, 5, 3)),
])
def test_matmul_fake_shapes(a_shape, b_shape, out_shape):
    out = ops.matmul(meta(*a_shape), meta(*b_shape), out_dtype=torch.float32)
    assert out.shape == out_shape and out.dtype == torch.float32 and out.device.type == "meta"
    with FakeTensorMode():
        out = ops.matmul(torch.empty(a_shape, dtype=torch.float16), torch.empty(b_shape, dtype=torch.float16))
    assert out.shape == out_shape and out.dtype == torch.float16 and out.is_contiguous()


def test_matmul_fake_rejects_mismatched_k():
    with pytest.raises(RuntimeError, match="do not compose"):
        ops.matmul(meta(5, 7), meta(6, 3))


@pytest.mark.parametrize("x_shape", [(7,), (5, 7), (2, 3, 7)])
def test_linear_fake_shapes(x_shape):
    out = ops.linear(meta(*x_shape), meta(4, 7), meta(4), activation="silu")
    assert out.shape == (*x_shape[:-1], 4) and out.dtype == torch.bfloat16


def test_linear_fake_rejects_unknown_activation():
    with pytest.raises(ValueError, match="activation must be one of .*'gelu_erf'"):
        ops.linear(meta(5, 7), meta(4, 7), None, activation="gelu_erf")


def test_scaled_mm_fake_shapes():
    fp8 = torch.float8_e4m3fn
    scale = torch.empty((), device="meta")
    out = ops.scaled_mm(meta(5, 32, dtype=fp8), meta(32, 16, dtype=fp8), scale, scale, out_dtype=torch.bfloat16)
    assert out.shape == (5, 16) and out.dtype == torch.bfloat16
    assert ops.scaled_mm(meta(5, 32, dtype=fp8), meta(32, 16, dtype=fp8), scale, scale).dtype == fp8


# ---- opcheck (schema, fake, autograd registration, AOT dispatch) through the fallback -------------

@pytest.mark.parametrize("a_shape, b_shape", [((6, 5), (5, 4)), ((3, 6, 5), (5, 4)), ((6, 5), (3, 5, 4)),
                                              ((3, 6, 5), (3, 5, 4))])
def test_opcheck_matmul(a_shape, b_shape):
    torch.library.opcheck(ops.matmul, (randn(*a_shape, grad=True), randn(*b_shape, grad=True)), {"fallback": "torch"})


@pytest.mark.parametrize("activation", ops.ACTIVATIONS)
def test_opcheck_linear(activation):
    args = (randn(2, 3, 7, grad=True), randn(4, 7, grad=True), randn(4, grad=True))
    torch.library.opcheck(ops.linear, args, {"activation": activation, "fallback": "torch"})


def test_opcheck_scaled_mm():
    fp8 = torch.float8_e4m3fn
    args = (randn(4, 32).to(fp8), randn(32, 8).to(fp8), torch.tensor(0.5), torch.tensor(2.0))
    # test_schema compares inputs with allclose, which PyTorch does not implement for FP8 on CPU.
    torch.library.opcheck(ops.scaled_mm, args, {"out_dtype": torch.float32, "fallback": "torch"},
                          test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"))


# ---- autograd formulas against PyTorch's ----------------------------------------------------------

def _rel(x, ref):
    return float((x - ref).detach().norm() / ref.detach().norm())


@pytest.mark.parametrize("a_shape, b_shape", [((6, 5), (5, 4)), ((3, 6, 5), (5, 4)), ((6, 5), (3, 5, 4)),
                                              ((1, 6, 5), (3, 5, 4)), ((3, 6, 5), (1, 5, 4)), ((3, 6, 5), (3, 5, 4))])
def test_matmul_gradients_match_torch(a_shape, b_shape):
    a, b = randn(*a_shape, grad=True), randn(*b_shape, grad=True)
    out = ops.matmul(a, b, fallback="torch")
    ref = torch.matmul(a, b)
    assert out.shape == ref.shape and _rel(out, ref) < 1e-12
    g = randn(*ref.shape)
    da, db = torch.autograd.grad(out, (a, b), g)
    ra, rb = torch.autograd.grad(ref, (a, b), g)
    assert da.shape == a.shape and db.shape == b.shape
    assert _rel(da, ra) < 1e-12 and _rel(db, rb) < 1e-12


def test_matmul_gradient_of_a_stride_zero_grad():
    # out.sum() hands back an expanded gradient with all strides 0: the backward must still work.
    a, b = randn(6, 5, grad=True), randn(5, 4, grad=True)
    ops.matmul(a, b, fallback="torch").sum().backward()
    assert torch.allclose(a.grad, b.sum(1).expand(6, 5)) and torch.allclose(b.grad, a.sum(0)[:, None].expand(5, 4))


def _torch_linear(x, w, b, activation):
    y = torch.nn.functional.linear(x, w, b)
    return {None: y, "relu": torch.relu(y), "silu": torch.nn.functional.silu(y),
            "gelu": 0.5 * y * (1 + torch.erf(y / 2 ** 0.5)),
            "gelu_tanh": torch.nn.functional.gelu(y, approximate="tanh")}[activation]


@pytest.mark.parametrize("activation", ops.ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_values_and_gradients_match_torch(activation, with_bias):
    x, w = randn(2, 3, 7, grad=True), randn(4, 7, grad=True)
    b = randn(4, grad=True) if with_bias else None
    out = ops.linear(x, w, b, activation, fallback="torch")
    ref = _torch_linear(x, w, b, activation)
    assert _rel(out, ref) < 1e-12
    g = randn(*ref.shape)
    inputs = (x, w, b) if with_bias else (x, w)
    for got, want in zip(torch.autograd.grad(out, inputs, g), torch.autograd.grad(ref, inputs, g)):
        assert got.shape == want.shape and _rel(got, want) < 1e-12


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_linear_gradcheck(activation):
    args = (randn(3, 5, grad=True), randn(4, 5, grad=True), randn(4, grad=True))
    assert torch.autograd.gradcheck(lambda x, w, b: ops.linear(x, w, b, activation, fallback="torch"), args)


def test_scaled_mm_fallback_is_the_dequantized_product():
    fp8 = torch.float8_e4m3fn
    a8, b8 = randn(6, 32).to(fp8), randn(32, 8).to(fp8)
    sa, sb, bias = torch.rand(6, 1) + 0.5, torch.rand(1, 8) + 0.5, randn(8).float()
    out = ops.scaled_mm(a8, b8, sa.float(), sb.float(), bias, out_dtype=torch.float32, fallback="torch")
    ref = (a8.double() * sa.double()) @ (b8.double() * sb.double()) + bias.double()
    assert _rel(out.double(), ref) < 1e-6


# ---- errors and the fallback option -------------------------------------------------------------

def test_cpu_input_without_fallback_names_the_device_and_the_option():
    with pytest.raises(ValueError, match="device 'cpu'") as info:
        ops.matmul(randn(4, 5), randn(5, 6))
    if hasattr(BaseException, "add_note"):  # Python >= 3.11
        assert "fallback='torch'" in " ".join(info.value.__notes__)
    with pytest.raises(ValueError, match="device 'cpu'"):
        ops.linear(randn(4, 5), randn(6, 5))


def test_unknown_fallback_is_rejected():
    with pytest.raises(ValueError, match="fallback must be one of"):
        ops.matmul(randn(4, 5), randn(5, 6), fallback="cpu")


def test_linear_checks_shapes_before_anything_runs():
    with pytest.raises(ValueError, match="in_features = 5"):
        ops.linear(randn(4, 6), randn(3, 5))
    with pytest.raises(ValueError, match=r"bias must have shape \(3,\)"):
        ops.linear(randn(4, 5), randn(3, 5), randn(4))


def test_scaled_mm_names_what_it_cannot_run():
    fp8 = torch.float8_e4m3fn
    a, b = randn(4, 32).to(fp8), randn(32, 8).to(fp8)
    for sa, sb in ((torch.ones(4, 1), torch.ones(1, 8)), (torch.tensor(1.0), torch.tensor(1.0))):
        with pytest.raises(ValueError, match="CUDA device"):  # row-wise and per-tensor scales reach the sm90 rung
            ops.scaled_mm(a, b, sa, sb)
    with pytest.raises(ValueError, match=r"scale_b must be float32 with one element .* or shape \(1, 8\)"):
        ops.scaled_mm(a, b, torch.ones(4, 1), torch.ones(8, 1))
    with pytest.raises(TypeError, match="FP8 dtype"):
        ops.scaled_mm(randn(4, 32).float(), randn(32, 8).float(), torch.tensor(1.0), torch.tensor(1.0))


def test_fallback_warns_once_per_reason_and_counts_every_call(monkeypatch):
    monkeypatch.setattr(fallback_mod, "_warned", set())
    fallback_mod.FALLBACK_COUNTS.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in (4, 5, 6):
            ops.matmul(randn(m, 5), randn(5, 6), fallback="torch")
    routed = [w for w in caught if issubclass(w.category, ops.FallbackWarning)]
    assert len(routed) == 1 and "computed by PyTorch" in str(routed[0].message)
    assert fallback_mod.FALLBACK_COUNTS[("matmul", "inputs on cpu/cpu")] == 3


def test_strides_and_dtypes_no_rung_takes_are_named():
    a = randn(4, 10)[:, ::2]  # neither of the last two strides is 1
    with pytest.raises(ValueError, match="one of its last two strides must be 1"):
        ops.matmul(a, randn(5, 6))
    with pytest.raises(TypeError, match="floating-point"):
        ops.matmul(torch.ones(4, 5, dtype=torch.int32), torch.ones(5, 6, dtype=torch.int32))
    out = ops.matmul(a, randn(5, 6), fallback="torch")
    assert out.shape == (4, 6) and torch.isfinite(out).all()
