"""runtime.lean_dispatch: where it is used (the default), a call of a custom op that records no autograd runs
the op's body from the Autograd kernel (no redispatch, no aliasing check); calls that record
autograd, fake tensors, compiled graphs and opcheck behave as custom_op's own kernel makes them."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import cute_kernels.ops as ops
from cute_kernels.runtime import lean_dispatch

F64 = torch.float64
CALLS = {"body": 0}


@torch.library.custom_op("cute_kernels_test::lean_scale", mutates_args=())
def lean_scale(x: Tensor, w: Tensor, scale: float = 2.0) -> Tensor:
    CALLS["body"] += 1
    return scale * (x @ w)


@lean_scale.register_fake
def _lean_scale_fake(x, w, scale=2.0):
    return x.new_empty((x.shape[0], w.shape[1]))


def _setup(ctx, inputs, output):
    x, w, scale = inputs
    ctx.save_for_backward(x, w)
    ctx.scale = scale


def _grad(ctx, g):
    x, w = ctx.saved_tensors
    return ctx.scale * g @ w.T, ctx.scale * x.T @ g, None


lean_scale.register_autograd(_grad, setup_context=_setup)


@torch.library.custom_op("cute_kernels_test::lean_fill_", mutates_args=("x",))
def lean_fill_(x: Tensor) -> None:
    x.fill_(1.0)


@pytest.fixture
def counted(monkeypatch):
    """Counts custom_op's aliasing checks (its backend kernel's, which the lean path skips)."""
    from torch._library import utils

    check = utils._c_check_aliasing_constraint
    seen = {"alias_checks": 0}

    def counting(*args, **kwargs):
        seen["alias_checks"] += 1
        return check(*args, **kwargs)

    monkeypatch.setattr(utils, "_c_check_aliasing_constraint", counting)
    CALLS["body"] = 0
    return seen


def _xw(grad: bool = False):
    return torch.randn(4, 3, dtype=F64, requires_grad=grad), torch.randn(3, 5, dtype=F64, requires_grad=grad)


def test_install_is_idempotent_and_leaves_mutating_ops_alone():
    assert lean_dispatch.install(lean_scale) and lean_dispatch.install(lean_scale)
    assert lean_dispatch.installed(lean_scale)
    assert not lean_dispatch.install(lean_fill_) and not lean_dispatch.installed(lean_fill_)
    x = torch.zeros(3)
    lean_fill_(x)
    assert torch.equal(x, torch.ones(3))
    ops.install_lean_dispatch()
    assert all(lean_dispatch.installed(getattr(ops, name)) for name in ops.OPS + ops.FUSED_OPS if name != "rotary_")


@pytest.mark.parametrize("on", [True, False])
def test_calls_without_autograd_skip_the_redispatch_only_where_used(counted, on):
    lean_dispatch.install(lean_scale)
    x, w = _xw()
    with lean_dispatch.using(on):
        got = lean_scale(x, w, 3.0)
        with torch.no_grad():
            xg, wg = _xw(grad=True)
            got_ng = torch.ops.cute_kernels_test.lean_scale(xg, wg)
    assert torch.equal(got, 3.0 * (x @ w)) and torch.equal(got_ng, 2.0 * (xg @ wg)) and got_ng.grad_fn is None
    assert CALLS["body"] == 2 and counted["alias_checks"] == (0 if on else 2)


def test_calls_recording_autograd_keep_the_formula(counted):
    lean_dispatch.install(lean_scale)
    x, w = _xw(grad=True)
    g = torch.randn(4, 5, dtype=F64)
    with lean_dispatch.using():
        out = lean_scale(x, w, 0.5)
        dx, dw = torch.autograd.grad(out, (x, w), g)
    ref = 0.5 * (x @ w)
    want = torch.autograd.grad(ref, (x, w), g)
    assert torch.allclose(out, ref) and torch.allclose(dx, want[0]) and torch.allclose(dw, want[1])
    assert counted["alias_checks"] == 1  # custom_op's kernel ran the call


def test_fake_tensors_and_compiled_graphs_redispatch(counted):
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._subclasses.fake_tensor import FakeTensorMode

    lean_dispatch.install(lean_scale)
    with lean_dispatch.using():
        with FakeTensorMode():
            fake = lean_scale(torch.empty(7, 3), torch.empty(3, 2))
        assert fake.shape == (7, 2) and CALLS["body"] == 0  # the fake, not the body

        def f(x, w):
            return lean_scale(x.sin(), w, 2.0).cos()

        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(f, backend=counter, fullgraph=True)
        x, w = _xw(grad=True)
        got = compiled(x, w)
        gx, gw = torch.autograd.grad(got.sum(), (x, w))
        want = f(x, w)
        wx, ww = torch.autograd.grad(want.sum(), (x, w))
        assert torch.allclose(got, want) and torch.allclose(gx, wx) and torch.allclose(gw, ww)
        assert counter.frame_count == 1
        # a compiled graph runs without grad mode (AOTAutograd's forward too): warm calls take the lean path
        before = counted["alias_checks"]
        assert torch.allclose(compiled(x, w), want) and counted["alias_checks"] == before
        with torch.no_grad():
            compiled(x, w)  # (compiles the no-grad graph)
            before_no_grad = counted["alias_checks"]
            assert torch.allclose(compiled(x, w), want)
        assert counted["alias_checks"] == before_no_grad


@pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")
def test_our_ops_through_the_lean_path_match_torch_and_pass_opcheck():
    ops.install_lean_dispatch()
    x = torch.randn(6, 8, dtype=F64)
    w, b = torch.randn(5, 8, dtype=F64), torch.randn(5, dtype=F64)
    with lean_dispatch.using(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            assert torch.allclose(ops.linear(x, w, b, "gelu", fallback="torch"), F.gelu(F.linear(x, w, b)))
            y, s, rstd, mean = ops.norm(x, w[0], None, None, "rms", 1e-6, 0.0, None, "torch")
            assert torch.allclose(y, F.rms_norm(x, (8,), w[0], 1e-6))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert ops.linear(x.float(), w.float(), None, fallback="torch").dtype == torch.bfloat16
        torch.library.opcheck(ops.matmul, (x.requires_grad_(), w.T.requires_grad_()), {"fallback": "torch"})
