"""The fused `cute_kernels::` operators on CPU (fallback="torch" computes them with the torch
references): schemas, opcheck (fakes, autograd registration, AOT dispatch), gradients against
torch autograd, visible fallbacks, Inductor's fallback lowering, one compiled graph."""

from __future__ import annotations

import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")

import cute_kernels.ops as ops  # noqa: E402
from cute_kernels.fused.rope_api import rotary_tables  # noqa: E402
from cute_kernels.ops.fallback import FALLBACK_COUNTS, FallbackWarning  # noqa: E402

F32 = torch.float32
T = dict(fallback="torch")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        yield


def randn(*shape, grad=False, dtype=F32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _labels(n, v):
    lab = torch.randint(0, v, (n,))
    lab[::3] = -100
    return lab


def _cases():
    torch.manual_seed(0)
    cos, sin = rotary_tables(16, 8)
    lab = _labels(5, 11)
    return {
        "norm": [((randn(4, 8, grad=True), randn(8, grad=True), None, randn(4, 8, grad=True)), dict(kind="rms", **T)),
                 ((randn(4, 8, grad=True), randn(8, grad=True), randn(8, grad=True), None), dict(kind="layer", **T))],
        "norm_backward": [((randn(4, 8), randn(4, 8), randn(8), randn(4).abs(), None, randn(4, 8)),
                           dict(kind="rms", **T))],
        "softmax": [((randn(3, 5, 4, grad=True),), dict(dim=1, **T))],
        "softmax_backward": [((torch.softmax(randn(3, 6), -1), randn(3, 6)), T)],
        "cross_entropy": [((randn(5, 11, grad=True), lab), dict(label_smoothing=0.1, z_loss=1e-3, **T))],
        "cross_entropy_backward": [((randn(5, 11), lab, randn(5), randn(5)), T)],
        "rotary": [((randn(2, 5, 3, 10, grad=True), randn(2, 5, 1, 10, grad=True), cos, sin), dict(offset=2, **T))],
        "rotary_": [((randn(2, 5, 3, 10), randn(2, 5, 1, 10), cos, sin), dict(offset=2, interleaved=True, **T))],
        "swiglu": [((randn(3, 8, grad=True), randn(3, 8, grad=True)), T),
                   ((randn(3, 16, grad=True), None), dict(interleaved=True, **T))],
        "swiglu_backward": [((randn(3, 8), randn(3, 8), randn(3, 8)), T)],
        "linear_cross_entropy": [((randn(9, 6, grad=True), randn(13, 6, grad=True), _labels(9, 13),
                                   randn(13, grad=True)), T),
                                 ((randn(9, 6, grad=True), randn(13, 6, grad=True), _labels(9, 13), None),
                                  dict(reduction="none", **T))],
        "linear_cross_entropy_backward": [((randn(9, 6), randn(13, 6), _labels(9, 13), randn(9)), T)],
    }


def test_every_fused_op_is_registered_with_a_fallback_and_no_reserved_name():
    for name in ops.FUSED_OPS:
        schema = getattr(torch.ops.cute_kernels, name).default._schema
        args = {a.name for a in schema.arguments}
        assert "fallback" in args, name
        assert not args & ops.RESERVED_ARGUMENT_NAMES, (name, args & ops.RESERVED_ARGUMENT_NAMES)
    assert "Tensor(a0!) q, Tensor(a1!) k" in str(torch.ops.cute_kernels.rotary_.default._schema)  # in place
    assert set(_cases()) == set(ops.FUSED_OPS)


@pytest.mark.parametrize("name", ops.FUSED_OPS)
def test_opcheck(name):
    for args, kwargs in _cases()[name]:
        result = torch.library.opcheck(getattr(torch.ops.cute_kernels, name).default, args, kwargs)
        assert set(result.values()) == {"SUCCESS"}, (name, result)


def test_fallback_is_counted_and_none_raises_the_kernel_error():
    FALLBACK_COUNTS.clear()
    ops.softmax(randn(2, 3), -1, "torch")
    assert sum(n for (op, _), n in FALLBACK_COUNTS.items() if op == "softmax") == 1
    with pytest.raises(ValueError, match="device 'cpu'") as info:
        ops.softmax(randn(2, 3), -1, "none")
    assert any("fallback='torch'" in note for note in getattr(info.value, "__notes__", []))
    with pytest.raises(ValueError, match="fallback must be one of"):
        ops.softmax(randn(2, 3), -1, "cpu")


def _grads(out, inputs, seed):
    outs = out if isinstance(out, tuple) else (out,)
    return torch.autograd.grad(outs, inputs, seed, allow_unused=True)


def test_gradients_match_torch_autograd():
    torch.manual_seed(1)
    x, w, r = randn(4, 6, 8, grad=True), randn(8, grad=True), randn(4, 6, 8, grad=True)
    y, s, _, _ = ops.norm(x, w, None, r, "rms", 1e-6, 0.0, None, "torch")
    gy, gs = torch.randn_like(y), torch.randn_like(s)
    got = _grads((y, s), (x, w, r), (gy, gs))
    sd = x + r
    want = _grads((torch.nn.functional.rms_norm(sd, (8,), w, 1e-6), sd), (x, w, r), (gy, gs))
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)

    logits, lab = randn(7, 20, grad=True), _labels(7, 20)
    rows, lse = ops.cross_entropy(logits, lab, -100, 0.1, 0.0, True, "torch")
    loss = rows.sum() / (lab != -100).sum()
    (g,) = torch.autograd.grad(loss, logits)
    (want,) = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, lab, label_smoothing=0.1), logits)
    assert torch.allclose(g, want, atol=1e-6)

    q, k = randn(2, 5, 3, 8, grad=True), randn(2, 5, 1, 8, grad=True)
    cos, sin = rotary_tables(8, 8)
    qo, ko = ops.rotary(q, k, cos, sin, None, 1, False, "bshd", False, "torch")
    gq = torch.randn_like(qo)
    dq, dk = torch.autograd.grad(qo, (q, k), gq, allow_unused=True)
    back, _ = ops.rotary(gq, torch.zeros_like(k), cos, sin, None, 1, False, "bshd", True, "torch")
    assert torch.allclose(dq, back, atol=1e-6) and torch.count_nonzero(dk) == 0

    xs, ws = randn(9, 6, grad=True), randn(13, 6, grad=True)
    lab = _labels(9, 13)
    for reduction in ("mean", "sum", "none"):
        loss, *_ = ops.linear_cross_entropy(xs, ws, lab, None, reduction=reduction, **T)
        seed = torch.randn_like(loss) if reduction == "none" else torch.tensor(2.5)
        got = torch.autograd.grad(loss, (xs, ws), seed)
        ref = torch.nn.functional.cross_entropy(xs @ ws.t(), lab, reduction=reduction)
        want = torch.autograd.grad(ref, (xs, ws), seed)
        for a, b in zip(got, want):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), reduction


def test_inductor_fallback_lowering_binds_every_fused_op():
    from torch._inductor.ir import FallbackKernel
    from torch.fx.operator_schemas import normalize_function

    for name, cases in _cases().items():
        op = getattr(torch.ops.cute_kernels, name).default
        normalized = normalize_function(op, cases[0][0], {})
        inspect.signature(FallbackKernel.create.__func__).bind(FallbackKernel, op, *normalized.args,
                                                               **normalized.kwargs)


def test_compiled_graph_holds_one_op_per_kernel_and_no_break():
    from torch._dynamo.testing import CompileCounterWithBackend

    import cute_kernels.nn.fused_functional as ff

    cos, sin = rotary_tables(16, 8)

    def f(x, w, gate, up, logits, lab, q, k):
        y = ff.rms_norm(x, (8,), w, 1e-6, fallback="torch")
        p = ff.softmax(y, -1, fallback="torch")
        a = ff.swiglu(gate, up, fallback="torch")
        loss = ff.cross_entropy(logits, lab, fallback="torch")
        qo, ko = ff.rotary_embedding(q, k, cos, sin, fallback="torch")
        return p.sum() + a.sum() + loss + qo.sum() + ko.sum()

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    args = (randn(3, 8, grad=True), randn(8, grad=True), randn(3, 8, grad=True), randn(3, 8, grad=True),
            randn(4, 9, grad=True), _labels(4, 9), randn(1, 4, 2, 8, grad=True), randn(1, 4, 1, 8, grad=True))
    got = compiled(*args)
    want = f(*args)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5) and counter.frame_count == 1
    leaves = [a for a in args if a.requires_grad]
    for a, b in zip(torch.autograd.grad(got, leaves), torch.autograd.grad(want, leaves)):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


class _ZeroFills(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the shape of every tensor an aten zeros/fill op makes while active."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if "zero" in func.__name__ or "fill" in func.__name__:
            self.shapes.append(tuple(out.shape))
        return out


def test_backward_makes_no_zeros_for_outputs_without_a_gradient():
    # Autograd's default fills every unused output's gradient with zeros before the backward
    # runs: for linear_cross_entropy's dweight output a vocab x hidden tensor (1 GB at Llama-3's
    # vocabulary), for the norms' rstd and the lse of cross-entropy and attention a fill kernel
    # per call.
    torch.manual_seed(2)
    xs, ws, lab = randn(9, 6, grad=True), randn(13, 6, grad=True), _labels(9, 13)
    loss, dx, dw, _ = ops.linear_cross_entropy(xs, ws, lab, None, **T)
    x, w = randn(4, 8, grad=True), randn(8, grad=True)
    y, _, rstd, _ = ops.norm(x, w, None, None, "rms", 1e-6, 0.0, None, "torch")
    logits = randn(7, 20, grad=True)
    rows, lse = ops.cross_entropy(logits, _labels(7, 20), -100, 0.0, 0.0, True, "torch")
    q, k, v = randn(1, 3, 5, 4, grad=True), randn(1, 3, 7, 4, grad=True), randn(1, 3, 7, 4, grad=True)
    out, attn_lse = ops.sdpa(q, k, v, fallback="torch")
    unused = {tuple(t.shape) for t in (dx, dw, rstd, lse, attn_lse)}
    with _ZeroFills() as fills:
        grads = torch.autograd.grad((loss, y.sum(), rows.sum(), out.sum()), (xs, ws, x, w, logits, q, k, v))
    assert not unused & set(fills.shapes), fills.shapes
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_importing_the_torch_layers_loads_no_dsl():
    # The ops, nn modules and bench cases import torch only; the CuTe DSL loads on the first
    # kernel call (a CPU user of the fallbacks, the CLI and the docs never pay its import).
    import subprocess
    import sys

    code = ("import sys, cute_kernels.ops, cute_kernels.nn, cute_kernels.gemm.gated, cute_kernels.bench.gemm_fuzz, "
            "cute_kernels.bench.fused_cases; print('cutlass' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_linear_cross_entropy_hands_its_weight_gradient_over_without_a_copy():
    # computed in the forward, the gradients are given to autograd, not kept by the graph: a
    # training step's backward() makes the tensor weight.grad itself instead of copying it
    # (vocab x hidden); a second backward through the graph raises rather than reuse them
    torch.manual_seed(3)
    xs, ws, lab = randn(9, 6, grad=True), randn(13, 6, grad=True), _labels(9, 13)
    loss, _, dw, _ = ops.linear_cross_entropy(xs, ws, lab, None, **T)
    ptr = dw.data_ptr()
    del dw
    loss.backward(retain_graph=True)
    assert ws.grad.data_ptr() == ptr
    want = torch.autograd.grad(torch.nn.functional.cross_entropy(xs @ ws.t(), lab), ws)[0]
    assert torch.allclose(ws.grad, want, rtol=1e-4, atol=1e-6)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
