"""The eager direct path on the GPU (sm_90): warm `cute_kernels.nn.Linear`, functional SDPA,
softmax, SwiGLU and norm calls replay their plans (the op is entered once per key) and compute
what the op computes, bit for bit, close to float64 references forward and backward, with NaN
propagating, on the caller's stream, under autocast; a patched block compiles to one graph under
Inductor."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.nn import fused_functional as ff  # noqa: E402
from cute_kernels.ops import eager_attention, eager_fused, eager_gemm  # noqa: E402
from cute_kernels.runtime.eager import USE_OP  # noqa: E402

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


def _rel(x, ref) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.fixture
def op_calls(monkeypatch):
    """How often each eager entry entered its op."""
    calls = {"linear": 0, "sdpa": 0, "softmax": 0, "swiglu": 0, "norm": 0}
    for name, entry in (("linear", eager_gemm.linear), ("sdpa", eager_attention.sdpa), ("softmax", eager_fused.softmax),
                        ("swiglu", eager_fused.swiglu), ("norm", eager_fused.norm)):
        op = entry.op

        def counted(*args, _op=op, _name=name, **kwargs):
            calls[_name] += 1
            return _op(*args, **kwargs)

        monkeypatch.setattr(entry, "op", counted)
    return calls


LINEAR_SHAPES = {"square": ((256,), 256, 256, True), "decode": ((8,), 4096, 4096, False),
                 "vit": ((2, 197), 768, 3072, True), "llama": ((2, 512), 2048, 2048, False)}


@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
@pytest.mark.parametrize("case", sorted(LINEAR_SHAPES))
def test_gpu_warm_linear_matches_float64_and_the_op(op_calls, case, activation):
    _hopper()
    lead, k, n, bias = LINEAR_SHAPES[case]
    torch.manual_seed(0)
    layer = cnn.Linear(k, n, bias=bias, device="cuda", dtype=BF16, activation=activation)
    x = torch.randn(*lead, k, device="cuda", dtype=BF16, requires_grad=True)
    g = torch.randn(*lead, n, device="cuda", dtype=BF16)
    params = [x, layer.weight] + ([layer.bias] if bias else [])
    ref_params = [p.detach().double().requires_grad_() for p in params]
    y = F.linear(*ref_params[:2], ref_params[2] if bias else None)
    ref = F.gelu(y, approximate="tanh") if activation else y
    ref_grads = torch.autograd.grad(ref, ref_params, g.double())
    outs, grads = [], []
    for _ in range(3):
        out = layer(x)
        outs.append(out)
        grads.append(torch.autograd.grad(out, params, g))
    assert op_calls["linear"] == 1
    assert [p for p in eager_gemm.linear.plans.values() if p is not USE_OP], "no plan was recorded"
    for out in outs:
        assert torch.equal(out, outs[0]) and _rel(out, ref) < 1e-2  # the plan computes the op's bits
    for gs in grads:
        for a, r in zip(gs, ref_grads):
            assert _rel(a, r) < 2e-2
    with torch.no_grad():  # another key, which the op's body recorded on call 0 (`runtime.eager.inside`:
        layer(x)           # an autograd.Function's forward runs without grad mode): replayed
        again = layer(x)
    assert torch.equal(again, outs[0]) and op_calls["linear"] == 1


def test_gpu_warm_linear_propagates_nan_and_takes_in_place_ops(op_calls):
    _hopper()
    layer = cnn.Linear(512, 256, device="cuda", dtype=BF16)
    x = torch.randn(4, 64, 512, device="cuda", dtype=BF16)
    x[1, 3, 7] = float("nan")
    for _ in range(2):
        out = layer(x)
        assert torch.isnan(out[1, 3]).all() and torch.isfinite(out[0]).all() and torch.isfinite(out[1, 4:]).all()
        out.relu_()  # not an autograd view: in-place is fine
    assert op_calls["linear"] == 1


def test_gpu_warm_linear_launches_on_the_current_stream(op_calls):
    _hopper()
    layer = cnn.Linear(384, 512, device="cuda", dtype=BF16).requires_grad_(False)
    x = torch.randn(256, 384, device="cuda", dtype=BF16)
    layer(x), layer(x)
    side, x2, new = torch.cuda.Stream(), x.clone(), torch.randn_like(x)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        x2.copy_(new)
        out = layer(x2)  # a plan launching on another stream would read the old x2
    side.synchronize()
    assert _rel(out, F.linear(new.double(), layer.weight.double(), layer.bias.double())) < 1e-2
    assert op_calls["linear"] == 1


def test_gpu_autocast_linear_casts_as_f_linear(op_calls):
    _hopper()
    layer = cnn.Linear(1024, 512, device="cuda")  # fp32 parameters
    x = torch.randn(128, 1024, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=BF16):
        want = F.linear(x, layer.weight, layer.bias)
        outs = [layer(x) for _ in range(3)]
    for out in outs:
        assert out.dtype == want.dtype == BF16 and _rel(out, want) < 1e-2
    outs[-1].float().sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32
    assert op_calls["linear"] == 1


SDPA_SHAPES = {"small": (1, 8, 8, 256, 64), "vit": (64, 12, 12, 197, 64), "gqa": (2, 16, 4, 512, 128)}


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("case", sorted(SDPA_SHAPES))
def test_gpu_warm_sdpa_matches_float64_and_the_op(op_calls, case, is_causal):
    _hopper()
    b, hq, hkv, s, d = SDPA_SHAPES[case]
    torch.manual_seed(1)
    q = torch.randn(b, hq, s, d, device="cuda", dtype=BF16, requires_grad=True)
    k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=BF16, requires_grad=True) for _ in range(2))
    g = torch.randn(b, hq, s, d, device="cuda", dtype=BF16)
    gqa = hq != hkv
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, is_causal=is_causal, enable_gqa=gqa)
    ref_grads = torch.autograd.grad(ref, ref_in, g.double())
    outs = []
    for _ in range(3):
        out = cnn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)
        outs.append(out)
        for a, r in zip(torch.autograd.grad(out, (q, k, v), g), ref_grads):
            assert _rel(a, r) < 2e-2
    assert op_calls["sdpa"] == 1
    for out in outs:
        assert torch.equal(out, outs[0]) and _rel(out, ref) < 1e-2
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(cnn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                                           enable_gqa=gqa), outs[0])
    assert op_calls["sdpa"] == 1  # the no-grad key: recorded by the op's body on call 0, replayed
    # the warm plans (forward and backward) on fresh values of the same layouts
    for t in (q, k, v, g):
        with torch.no_grad():
            t.normal_()
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, is_causal=is_causal, enable_gqa=gqa)
    out = cnn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    assert _rel(out, ref) < 1e-2
    for a, r in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, ref_in, g.double())):
        assert _rel(a, r) < 2e-2
    assert op_calls["sdpa"] == 1


def test_gpu_patched_block_compiles_to_one_graph_under_inductor():
    _hopper()
    from cute_kernels.bench.overhead_layers import compile_checks

    records = compile_checks("cuda", backend="inductor")
    assert all(r.ok for r in records), [(r.impl, r.error, r.extra) for r in records]


# rows, width: one narrow and one streaming softmax width, a SwiGLU width with a half-empty tile
ROWWISE = [((4, 77), 4096), ((3,), 130000), ((2, 50), 1000)]


@pytest.mark.parametrize("lead, width", ROWWISE)
def test_gpu_warm_softmax_swiglu_and_norm_match_float64(op_calls, lead, width):
    """Each warm call (fresh values in the same tensors) computes the float64 forward and
    gradients; the op is entered once per key (the first call)."""
    _hopper()
    x = torch.empty(*lead, width, device="cuda", dtype=BF16, requires_grad=True)
    up = torch.empty_like(x, requires_grad=True)
    w = torch.empty(width, device="cuda", dtype=BF16, requires_grad=True)
    g = torch.empty_like(x)
    for _ in range(3):
        with torch.no_grad():
            for t in (x, up, w, g):
                t.normal_()
        xd, ud, wd = (t.detach().double().requires_grad_() for t in (x, up, w))
        for name, ours, ref, leaves, refs in (
                ("softmax", lambda: ff.softmax(x, -1), lambda: torch.softmax(xd, -1), (x,), (xd,)),
                ("swiglu", lambda: ff.swiglu(x, up), lambda: F.silu(xd) * ud, (x, up), (xd, ud)),
                ("norm", lambda: ff.rms_norm(x, (width,), w, 1e-6), lambda: F.rms_norm(xd, (width,), wd, 1e-6),
                 (x, w), (xd, wd))):
            if name == "norm" and width > 8192:
                continue  # past the norm kernel's widest row
            y = ours()
            want = ref()
            assert _rel(y, want) < 1e-2, name
            for got, exp in zip(torch.autograd.grad(y, leaves, g), torch.autograd.grad(want, refs, g.double())):
                assert _rel(got, exp) < 2e-2, name
    assert op_calls["softmax"] == 1 and op_calls["swiglu"] == 1
    assert op_calls["norm"] == (0 if width > 8192 else 1)


@pytest.mark.parametrize("lean", [False, True], ids=["custom_op_dispatch", "lean_dispatch"])
def test_gpu_ops_called_as_a_compiled_graph_calls_them_replay_the_plans(monkeypatch, lean):
    """A compiled graph calls the ops themselves (`torch.ops.cute_kernels.*`), not the eager
    entries: each op's body runs its checked path once per key and then replays the entry's
    plan (`runtime.eager.inside`), computing the same values bit for bit, close to float64;
    the same with the bodies entered from the dispatcher's Autograd kernel (`runtime.lean_dispatch`)."""
    _hopper()
    from cute_kernels.ops import attention as attention_ops
    from cute_kernels.ops import fused as fused_ops
    from cute_kernels.ops import gemm as gemm_ops
    from cute_kernels.runtime import lean_dispatch, plan_cache

    bodies = {"linear": 0, "sdpa": 0, "norm": 0, "linear_backward": 0, "sdpa_backward": 0}
    for module, fn, name in ((gemm_ops, "_linear", "linear"), (attention_ops, "_sdpa", "sdpa"),
                             (fused_ops, "_norm", "norm"), (gemm_ops, "_linear_backward_checked", "linear_backward"),
                             (attention_ops, "_sdpa_backward", "sdpa_backward")):
        def counted(*args, _fn=getattr(module, fn), _name=name):
            bodies[_name] += 1
            return _fn(*args)

        monkeypatch.setattr(module, fn, counted)
    plan_cache.invalidate()  # keys recorded by earlier tests would skip the counted bodies
    with lean_dispatch.using(lean):
        _ops_replay_plans(bodies)


def _ops_replay_plans(bodies):
    torch.manual_seed(3)
    x = torch.randn(3, 77, 768, device="cuda", dtype=BF16)
    w, b = torch.randn(2304, 768, device="cuda", dtype=BF16) / 28, torch.randn(2304, device="cuda", dtype=BF16)
    q, k, v = (torch.randn(2, 12, 197, 64, device="cuda", dtype=BF16) for _ in range(3))
    xn, wn = torch.randn(4, 1000, 768, device="cuda", dtype=BF16), torch.randn(768, device="cuda", dtype=BF16)
    ops = torch.ops.cute_kernels
    g = torch.randn(3, 77, 2304, device="cuda", dtype=BF16)
    with torch.no_grad():
        out, lse = ops.sdpa(q, k, v, None, None, False, -1, -1, "auto", "none")
    dout = torch.randn_like(out)
    calls = {"linear": lambda: ops.linear(x, w, b, "gelu_tanh", "auto", "none"),
             "sdpa": lambda: ops.sdpa(q, k, v, None, None, False, -1, -1, "auto", "none")[0],
             "norm": lambda: ops.norm(xn, wn, None, None, "rms", 1e-6, 0.0, None, "none")[0],
             "linear_backward": lambda: ops.linear_backward(g, x, w, b, None, None, True, True, True, "auto", "none"),
             "sdpa_backward": lambda: ops.sdpa_backward(dout, q, k, v, out, lse, None, None, False, -1, -1, "auto",
                                                        "none")}
    first = {name: call() for name, call in calls.items()}
    for _ in range(3):
        for name, call in calls.items():
            got = call()
            for a, e in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (got, first[name]))):
                # attention's dq sums in whatever order the tiles arrive; everything else is bit for bit
                assert _rel(a, e) < 1e-3 if name == "sdpa_backward" else torch.equal(a, e), name
    assert bodies == {"linear": 1, "sdpa": 1, "norm": 1, "linear_backward": 1, "sdpa_backward": 1}
    d = torch.float64
    refs = {"linear": F.gelu(x.to(d) @ w.to(d).T + b.to(d), approximate="tanh"),
            "sdpa": F.scaled_dot_product_attention(q.to(d), k.to(d), v.to(d)),
            "norm": xn.to(d) * torch.rsqrt(xn.to(d).pow(2).mean(-1, keepdim=True) + 1e-6) * wn.to(d)}
    for name, ref in refs.items():
        assert _rel(first[name], ref) < 1e-2, name
    g2, x2 = g.to(d).reshape(-1, 2304), x.to(d).reshape(-1, 768)
    for got, ref in zip(first["linear_backward"], (g2 @ w.to(d), g2.T @ x2, g2.sum(0))):
        assert _rel(got.reshape(ref.shape), ref) < 1e-2
    qd, kd, vd = (t.to(d).requires_grad_() for t in (q, k, v))
    refs = torch.autograd.grad(F.scaled_dot_product_attention(qd, kd, vd), (qd, kd, vd), dout.to(d))
    for got, ref in zip(first["sdpa_backward"], refs):
        assert _rel(got, ref) < 2e-2


def test_gpu_backward_ops_compute_alike_through_either_dispatch():
    """What a compiled backward graph calls (matmul, linear_backward, sdpa_backward, norm_backward, without grad
    mode) gives the same values whether custom_op's Autograd kernel or the lean one
    (`runtime.lean_dispatch`) enters the body: bit for bit, but for attention's dq, which sums
    in whatever order the tiles arrive."""
    _hopper()
    from cute_kernels.runtime import lean_dispatch

    torch.manual_seed(5)
    ops = torch.ops.cute_kernels
    g2, x2 = torch.randn(2048, 768, device="cuda", dtype=BF16), torch.randn(2048, 3072, device="cuda", dtype=BF16)
    q, k, v = (torch.randn(2, 12, 197, 64, device="cuda", dtype=BF16) for _ in range(3))
    xn, wn = torch.randn(4, 1000, 768, device="cuda", dtype=BF16), torch.randn(768, device="cuda", dtype=BF16)
    with torch.no_grad():
        out, lse = ops.sdpa(q, k, v, None, None, False, -1, -1, "auto", "none")
        dout = torch.randn_like(out)
        rstd = ops.norm(xn, wn, None, None, "rms", 1e-6, 0.0, None, "none")[2]
        dy = torch.randn_like(xn)
        w2 = torch.randn(768, 3072, device="cuda", dtype=BF16)
        calls = {"matmul": lambda: (ops.matmul(g2.mT, x2, None, "auto", "none"),),
                 "linear_backward": lambda: ops.linear_backward(g2, x2, w2, None, None, None, True, True, False,
                                                                "auto", "none"),
                 "sdpa_backward": lambda: ops.sdpa_backward(dout, q, k, v, out, lse, None, None, False, -1, -1,
                                                            "auto", "none"),
                 "norm_backward": lambda: ops.norm_backward(dy, xn, wn, rstd, None, None, "rms", 0.0, False, True,
                                                            "none")}
        results = {}
        for lean in (False, True):
            with lean_dispatch.using(lean):
                for name, call in calls.items():
                    for _ in range(2):  # the checked call, then the warm one
                        results[name, lean] = call()
    for name in calls:
        for a, b in zip(results[name, False], results[name, True]):
            assert a.shape == b.shape and (_rel(a, b) < 1e-3 if name == "sdpa_backward" else torch.equal(a, b)), name
    d = torch.float64
    assert _rel(results["matmul", True][0], g2.to(d).mT @ x2.to(d)) < 1e-2
