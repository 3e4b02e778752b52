"""The eager direct path of the fused norms, softmax and SwiGLU (`cute_kernels.ops.eager_fused`),
on CPU.

With the kernel layer's entries and its stored forward plans replaced by stand-ins that compute
by definition (`fused.reference`), a warm `cute_kernels.nn.LayerNorm` / `RMSNorm` call skips the
`cute_kernels::norm` op and computes torch's output and gradients (weight, bias, residual); a
warm `softmax` / `swiglu` call skips its op likewise, and its backward goes straight to the kernel
layer's backward entry; a call whose kernel layer kept no plan (or a softmax over another dim)
keeps the op.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import cute_kernels.fused as fused  # noqa: E402
import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.fused import norm_api, reference, softmax_api, swiglu_api  # noqa: E402
from cute_kernels.nn import fused_functional as ff  # noqa: E402
from cute_kernels.ops import eager_fused  # noqa: E402
from cute_kernels.runtime import plan_cache  # noqa: E402

F64 = torch.float64


def _rel(x, ref):
    return float((x - ref).detach().norm() / ref.detach().norm())


def _detached(*tensors):
    for t in tensors:
        assert t is None or not t.requires_grad, "a tensor requiring grad reached a kernel"


def _stats(out):
    y, s, rstd, mean = out  # the kernels' statistics are fp32
    return y, s, None if rstd is None else rstd.float(), None if mean is None else mean.float()


@pytest.fixture
def entries(monkeypatch):
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    plan_cache.invalidate()
    seen = {"op": 0, "forward": 0, "backward": 0, "plan": 0, "keep_plan": True}

    def forward(x, weight=None, bias=None, residual=None, **kw):
        _detached(x, weight, bias, residual)
        seen["forward"] += 1
        return _stats(reference.norm_forward(x, weight, bias, residual, **kw))

    def backward(*args, **kw):
        _detached(*args)
        seen["backward"] += 1
        return reference.norm_backward(*args, **kw)

    def plan_for(x, weight=None, bias=None, residual=None, *, kind, offset, save_stats, out_dtype):
        _detached(x, weight, bias, residual)
        if not seen["keep_plan"]:
            return None

        def plan(x, weight, bias, residual, eps):
            _detached(x, weight, bias, residual)
            seen["plan"] += 1
            return _stats(reference.norm_forward(x, weight, bias, residual, kind=kind, eps=eps, offset=offset,
                                                 save_stats=save_stats, out_dtype=out_dtype))
        return plan

    monkeypatch.setattr(fused, "norm_forward", forward)
    monkeypatch.setattr(fused, "norm_backward", backward)
    monkeypatch.setattr(norm_api, "forward_plan_for", plan_for)
    op = eager_fused.norm.op

    def counted(*args, **kwargs):
        seen["op"] += 1
        return op(*args, **kwargs)

    monkeypatch.setattr(eager_fused.norm, "op", counted)
    yield seen
    plan_cache.invalidate()


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("residual", [False, True])
def test_warm_norm_skips_the_op_and_matches_torch(entries, kind, residual):
    n = 24
    x = torch.randn(3, 5, n, dtype=F64, requires_grad=True)
    r = torch.randn(3, 5, n, dtype=F64, requires_grad=True) if residual else None
    if kind == "layer":
        mod = cnn.LayerNorm(n, dtype=F64)
        torch.nn.init.normal_(mod.bias)
    else:
        mod = cnn.RMSNorm(n, eps=1e-6, dtype=F64)
    torch.nn.init.normal_(mod.weight)
    params = [p for p in (mod.weight, getattr(mod, "bias", None)) if p is not None]
    s = x + r if residual else x
    ref = (F.layer_norm(s, (n,), mod.weight, mod.bias, mod.eps) if kind == "layer"
           else F.rms_norm(s, (n,), mod.weight, mod.eps))
    g = torch.randn_like(ref)
    wrt = [x] + ([r] if residual else []) + params
    want = torch.autograd.grad(ref, wrt, g)
    for _ in range(3):
        out = mod(x, r) if residual else mod(x)
        y = out[0] if residual else out
        assert _rel(y, ref) < 1e-6
        if residual:
            assert _rel(out[1], s) == 0.0
        for got, w in zip(torch.autograd.grad(y, wrt, g), want):
            assert _rel(got, w) < 1e-5
    assert entries["op"] == 1 and entries["forward"] == 1 and entries["plan"] == 2
    assert entries["backward"] == 3  # every backward through the body of the backward op
    assert type(y.grad_fn).__name__ == "CuteKernelsNormBackward"
    with torch.no_grad():  # another key (no autograd), which the op's body recorded on call 0
        for _ in range(2):  # (an autograd.Function's forward runs without grad mode): replayed
            y = mod(x, r)[0] if residual else mod(x)
            assert y.grad_fn is None and _rel(y, ref) < 1e-6
    assert entries["op"] == 1 and entries["plan"] == 4


def test_a_call_without_a_kernel_plan_keeps_the_op(entries):
    entries["keep_plan"] = False
    mod = cnn.LayerNorm(16, dtype=F64)
    x = torch.randn(4, 16, dtype=F64)
    for _ in range(3):
        y = mod(x)
    assert entries["op"] == 3 and entries["plan"] == 0
    assert _rel(y, F.layer_norm(x, (16,), mod.weight, mod.bias, mod.eps)) < 1e-6


def test_the_norm_entry_is_the_op_under_compile_tracing(entries):
    """Traced calls see only the op (one opaque node); the direct path is eager's alone."""
    w = torch.randn(8, dtype=F64)
    x = torch.randn(2, 8, dtype=F64)

    class Norm(torch.nn.Module):
        def forward(self, t):
            return eager_fused.norm(t, w, None, None, "rms", 1e-6, 0.0, None, "none")[0]

    gm = torch.fx.symbolic_trace(Norm())
    assert torch.ops.cute_kernels.norm.default in [n.target for n in gm.graph.nodes]  # the op is the node
    for _ in range(2):
        assert _rel(gm(x), F.rms_norm(x, (8,), w, 1e-6)) < 1e-6
    # the op's body checks the first call and replays the entry's plan for the second (`eager.inside`)
    assert entries["plan"] == 1 and entries["forward"] == 1


@pytest.fixture
def rowwise(monkeypatch):
    """softmax and SwiGLU kernel-layer stand-ins (by definition), counting what each path calls."""
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    plan_cache.invalidate()
    seen = {"softmax_op": 0, "swiglu_op": 0, "forward": 0, "plan": 0, "backward": 0}

    def softmax_forward(x):
        _detached(x)
        seen["forward"] += 1
        return reference.softmax_forward(x)

    def softmax_backward(y, dy):
        _detached(y, dy)
        seen["backward"] += 1
        return reference.softmax_backward(y, dy)

    def swiglu_forward(gate, up=None, *, interleaved=False):
        _detached(gate, up)
        seen["forward"] += 1
        return reference.swiglu_forward(gate, up, interleaved=interleaved)

    def swiglu_backward(dout, gate, up=None, *, interleaved=False):
        _detached(dout, gate, up)
        seen["backward"] += 1
        return reference.swiglu_backward(dout, gate, up, interleaved=interleaved)

    def planned(fn):
        def plan(*args):
            seen["plan"] += 1
            return fn(*(a.detach() if a is not None else None for a in args))
        return plan

    monkeypatch.setattr(fused, "softmax_forward", softmax_forward)
    monkeypatch.setattr(fused, "softmax_backward", softmax_backward)
    monkeypatch.setattr(fused, "swiglu_forward", swiglu_forward)
    monkeypatch.setattr(fused, "swiglu_backward", swiglu_backward)
    monkeypatch.setattr(softmax_api, "forward_plan_for", lambda x, out_dtype=None: planned(reference.softmax_forward))
    monkeypatch.setattr(swiglu_api, "forward_plan_for",
                        lambda gate, up=None, interleaved=False: planned(
                            lambda g, u: reference.swiglu_forward(g, u, interleaved=interleaved)))
    for name in ("softmax", "swiglu"):
        entry = getattr(eager_fused, name)
        op = entry.op

        def counted(*args, _op=op, _name=name, **kwargs):
            seen[_name + "_op"] += 1
            return _op(*args, **kwargs)

        monkeypatch.setattr(entry, "op", counted)
    yield seen
    plan_cache.invalidate()


def test_warm_softmax_skips_the_op_and_its_backward_is_the_kernel_layers(rowwise):
    x = torch.randn(3, 4, 37, dtype=F64, requires_grad=True)
    g = torch.randn(3, 4, 37, dtype=F64)
    ref = torch.softmax(x, -1)
    want = torch.autograd.grad(ref, x, g)[0]
    for _ in range(3):
        y = ff.softmax(x, -1)
        assert _rel(y, ref) < 1e-12
        assert _rel(torch.autograd.grad(y, x, g)[0], want) < 1e-12
    assert rowwise["softmax_op"] == 1 and rowwise["forward"] == 1 and rowwise["plan"] == 2
    assert rowwise["backward"] == 1 + 2  # the op's own backward once, then the kernel layer's
    assert type(y.grad_fn).__name__ == "CuteKernelsSoftmaxBackward"


def test_softmax_over_another_dim_keeps_the_op(rowwise):
    x = torch.randn(5, 7, dtype=F64)
    for _ in range(3):
        y = ff.softmax(x, 0)
    assert rowwise["softmax_op"] == 3 and rowwise["plan"] == 0
    assert _rel(y, torch.softmax(x, 0)) < 1e-12


@pytest.mark.parametrize("interleaved", [False, True])
def test_warm_swiglu_skips_the_op_and_matches_torch(rowwise, interleaved):
    if interleaved:
        gu = torch.randn(6, 2 * 24, dtype=F64, requires_grad=True)
        leaves, gate_ref, up_ref = (gu,), gu[:, 0::2], gu[:, 1::2]
        call = lambda: ff.swiglu(gu, interleaved=True)  # noqa: E731
    else:
        gate = torch.randn(6, 24, dtype=F64, requires_grad=True)
        up = torch.randn(6, 24, dtype=F64, requires_grad=True)
        leaves, gate_ref, up_ref = (gate, up), gate, up
        call = lambda: ff.swiglu(gate, up)  # noqa: E731
    ref = F.silu(gate_ref) * up_ref
    d = torch.randn_like(ref)
    want = torch.autograd.grad(ref, leaves, d)
    for _ in range(3):
        out = call()
        assert _rel(out, ref) < 1e-12
        for got, w in zip(torch.autograd.grad(out, leaves, d), want):
            assert _rel(got, w) < 1e-12
    assert rowwise["swiglu_op"] == 1 and rowwise["plan"] == 2 and rowwise["backward"] == 3
    assert type(out.grad_fn).__name__ == "CuteKernelsSwigluBackward"
