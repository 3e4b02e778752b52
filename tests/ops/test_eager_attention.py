"""The eager direct path of `sdpa` (`cute_kernels.ops.eager_attention`), on CPU.

1. Values: with the attention layer's entries and forward plans replaced by stand-ins that
   compute by definition (`attention_reference`), a warm
   `cute_kernels.nn.functional.scaled_dot_product_attention` call skips the op and computes
   F.scaled_dot_product_attention's output and gradients (causal or not, GQA, a bottom-right
   CausalBias, a window), handing `kernel=` to the backward entry.
2. Structure: with the real flash rungs (compiler replaced by a recorder), a warm call launches
   what the checked call launched, enters no torch.library op and allocates only out and lse.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.attention import api as attention_api  # noqa: E402
from cute_kernels.ops import attention as attention_ops  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402
from cute_kernels.ops import eager_attention  # noqa: E402
from cute_kernels.runtime import plan_cache  # noqa: E402

F64 = torch.float64
sdpa = cnn.functional.scaled_dot_product_attention


def _rel(x, ref):
    return float((x - ref).detach().norm() / ref.detach().norm())


def _detached(*tensors):
    for t in tensors:
        assert not t.requires_grad, "a tensor requiring grad reached a kernel"


@pytest.fixture
def cpu_plans(monkeypatch):
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    plan_cache.invalidate()
    yield
    plan_cache.invalidate()


@pytest.fixture
def entries(cpu_plans, monkeypatch):
    """The attention layer on CPU: the op body's entries and the plan the eager path replays;
    returns the record of what ran."""
    seen = {"op": 0, "forward": [], "backward": [], "plan": [], "replay": []}

    def forward(q, k, v, *, causal, scale, enable_gqa, window_size, kernel):
        _detached(q, k, v)
        seen["forward"].append(kernel)
        return reference.forward(q, k, v, causal, scale, enable_gqa, window_size)

    def backward(grad_out, q, k, v, out, lse, *, causal, scale, enable_gqa, window_size, kernel):
        _detached(grad_out, q, k, v, out, lse)
        seen["backward"].append((kernel, causal, window_size))
        return reference.backward(grad_out, q, k, v, causal, scale, enable_gqa, window_size)

    def plan_for(q, k, v, *, causal, scale, enable_gqa, kernel, window_size):
        def plan(q, k, v):
            _detached(q, k, v)
            seen["plan"].append(kernel)
            return reference.forward(q, k, v, causal, scale, enable_gqa, window_size)
        return plan

    def backward_plan_for(dout, q, k, v, out, lse, *, causal, scale, enable_gqa, window_size, kernel,
                          deterministic=None):
        def replay(*tensors):
            _detached(*tensors)
            seen["replay"].append((kernel, causal, window_size))
            return reference.backward(tensors[0], *tensors[1:4], causal, scale, enable_gqa, window_size)
        return replay

    monkeypatch.setattr(attention_ops, "_found", {"sdpa": forward, "sdpa_backward": backward})
    monkeypatch.setattr(attention_api, "plan_for", plan_for)
    monkeypatch.setattr(attention_api, "backward_plan_for", backward_plan_for)
    op = eager_attention.sdpa.op

    def counted(*args, **kwargs):
        seen["op"] += 1
        return op(*args, **kwargs)

    monkeypatch.setattr(eager_attention.sdpa, "op", counted)
    return seen


def _qkv(hq=4, hkv=4, s=6, sk=None, grad=True):
    sk = s if sk is None else sk
    return (torch.randn(2, hq, s, 8, dtype=F64, requires_grad=grad), torch.randn(2, hkv, sk, 8, dtype=F64,
            requires_grad=grad), torch.randn(2, hkv, sk, 8, dtype=F64, requires_grad=grad))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_warm_sdpa_skips_the_op_and_matches_torch(entries, is_causal, gqa):
    q, k, v = _qkv(hkv=2 if gqa else 4)
    kw = dict(is_causal=is_causal, enable_gqa=gqa)
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for _ in range(3):
        out = sdpa(q, k, v, **kw, kernel="sm90_flash")
        assert _rel(out, ref) < 1e-12
        for a, r in zip(torch.autograd.grad(out, (q, k, v), g), want):
            assert _rel(a, r) < 1e-12
    assert entries["op"] == 1 and entries["plan"] == ["sm90_flash"] * 2
    causal = "top_left" if is_causal else None
    # call 0's forward entered the op, whose backward called the sdpa_backward op: its body
    # records the plan, which the later calls replay
    assert entries["backward"] == [("sm90_flash", causal, None)]
    assert entries["replay"] == [("sm90_flash", causal, None)] * 2
    assert type(out.grad_fn).__name__ == "CuteKernelsSdpaBackward"
    with torch.no_grad():
        sdpa(q, k, v, **kw, kernel="sm90_flash")
        out = sdpa(q, k, v, **kw, kernel="sm90_flash")
    # the op's body recorded this key on call 0: an autograd.Function's forward runs without grad
    # mode, so the body's key is the no-grad call's (`runtime.eager.inside`)
    assert out.grad_fn is None and _rel(out, ref) < 1e-12 and entries["op"] == 1


def test_masks_and_windows_take_the_entry_too(entries):
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = _qkv(s=5, sk=9)
    for _ in range(2):
        out = sdpa(q, k, v, attn_mask=causal_lower_right(5, 9))
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(5, 9))
        assert _rel(out, want) < 1e-12
        out = sdpa(q, k, v, window_size=(2, 1))
        assert _rel(out, reference.forward(q, k, v, None, None, False, (2, 1))[0]) < 1e-12
        out.sum().backward()
    assert entries["op"] == 2 and len(entries["plan"]) == 2
    assert entries["backward"][-1] == ("auto", None, (2, 1))
    out = sdpa(q, k, v, window_size=(2, 1))
    out.sum().backward()
    assert entries["replay"] == [("auto", None, (2, 1))] * 2  # as above


def test_unknown_arguments_keep_the_op(entries):
    """A schema grown by options the eager module does not know (another helper's softcap, say)
    is never replayed: its key stores USE_OP."""
    from cute_kernels.runtime.eager import USE_OP

    q, k, v = _qkv(grad=False)
    assert eager_attention._build_sdpa(None, q, k, v, None, None, False, -1, -1, "auto", "none", 30.0) is None
    eager_attention.sdpa(q, k, v, None, None, False, -1, -1, "auto", "none")
    assert [p for p in eager_attention.sdpa.plans.values() if p is not USE_OP]


# ---- structure, on the real flash rungs -------------------------------------------------------

class Compiler:
    def __init__(self):
        self.launches = []

    def __call__(self, jit_fn, *args, key, options=None):
        return lambda *launch_args: self.launches.append(launch_args)


def _profile(fn):
    py, c = [], []

    def tracer(frame, event, arg):
        if event == "call":
            py.append(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_qualname}")
        elif event == "c_call":
            c.append((getattr(arg, "__qualname__", None) or getattr(arg, "__name__", "")).rsplit(".", 1)[-1])

    sys.setprofile(tracer)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return py, c


@pytest.mark.parametrize("grad", [False, True])
def test_warm_sdpa_replays_the_checked_launch_without_the_op(cpu_plans, monkeypatch, grad):
    if importlib.util.find_spec("cutlass") is None:
        pytest.skip("needs the CuTe DSL")
    from cute_kernels.attention import dispatch, sm90_flash

    compiler = Compiler()
    monkeypatch.setattr(attention_api, "_device_reason", lambda q, k, v: None)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(sm90_flash, "compile_kernel", compiler)
    monkeypatch.setattr(sm90_flash, "tvm_ffi_available", lambda: True)
    for cache in ("_KERNELS", "_CONFIGS", "_COMPILED"):
        monkeypatch.setattr(sm90_flash, cache, {})
    q, k, v = (torch.randn(1, 8, 256, 64).to(torch.bfloat16).requires_grad_(grad) for _ in range(3))
    first = sdpa(q, k, v, is_causal=True)
    got = {}
    py, c = _profile(lambda: got.setdefault("out", sdpa(q, k, v, is_causal=True)))
    again = got["out"]
    assert (again.shape, again.stride(), again.dtype) == (first.shape, first.stride(), first.dtype)
    l0, l1 = compiler.launches
    geometry = lambda ts: [(t.shape, t.stride(), t.data_ptr()) for t in ts]  # noqa: E731
    assert geometry(l0[:3]) == geometry(l1[:3])
    assert l0[5:] == l1[5:] and l1[3].data_ptr() == again.data_ptr()
    assert not any(t.requires_grad for t in l1[:3])
    assert not [f for f in py if f.startswith(("torch._ops", "torch._library", "cute_kernels.ops.attention.sdpa",
                                                  "cute_kernels.attention.api.check",
                                                  "cute_kernels.attention.dispatch"))]
    assert [f for f in c if f in ("empty", "empty_like", "zeros", "clone", "contiguous", "to")] == ["empty", "empty"]
    assert ("cute_kernels.runtime.eager.EagerFunction.forward" in py) == grad
