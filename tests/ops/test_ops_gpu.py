"""The cute_kernels operators on the GPU: values and gradients against PyTorch, opcheck on CUDA
tensors, the fallback on CUDA input no rung takes, torch.compile without recompiles, CUDA-graph
capture and replay, and the caller's stream.

Sizes are multiples of 64 so every rung of the ladder can take them; each test compiles a few
kernels on first use, so the shapes repeat across tests to share the compile cache."""

from __future__ import annotations

import importlib
import math

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

from cute_kernels import ops  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")]

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def randn(*shape, dtype=BF16, grad=False):
    return torch.randn(*shape, dtype=dtype, device="cuda").requires_grad_(grad)


def poison(shape, dtype=BF16):
    """Leave a NaN-filled block of this size in the caching allocator, where the op's output
    will most likely be allocated next: an output element the kernel skips stays NaN."""
    torch.full(shape, math.nan, dtype=dtype, device="cuda")


def rel(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).norm() / ref.norm())


def _has_attention_backward() -> bool:
    return getattr(importlib.import_module("cute_kernels.attention"), "attention_backward", None) is not None


# ---- matmul ------------------------------------------------------------------------------------

@pytest.mark.parametrize("a_shape, b_shape, dtype, tol", [
    ((256, 128), (128, 192), BF16, 1e-2),
    ((3, 128, 64), (64, 128), BF16, 1e-2),
    ((3, 128, 64), (3, 64, 128), BF16, 1e-2),
    ((128, 64), (64, 128), torch.float32, 1e-5),
])
def test_matmul_matches_torch(a_shape, b_shape, dtype, tol):
    a, b = randn(*a_shape, dtype=dtype), randn(*b_shape, dtype=dtype)
    ref = torch.matmul(a.double(), b.double())
    poison(ref.shape, dtype)
    out = ops.matmul(a, b)
    assert out.shape == ref.shape and out.dtype == dtype and torch.isfinite(out).all()
    assert rel(out, ref) < tol


def test_matmul_propagates_nan_to_its_row_only():
    a, b = randn(128, 64), randn(64, 128)
    a[5, 7] = math.nan
    out = ops.matmul(a, b)
    assert torch.isnan(out[5]).all()
    assert torch.isfinite(torch.cat([out[:5], out[6:]])).all()


def test_matmul_gradients_match_torch():
    a, b = randn(3, 128, 64, grad=True), randn(64, 128, grad=True)
    out = ops.matmul(a, b)
    g = randn(*out.shape)
    da, db = torch.autograd.grad(out, (a, b), g)
    ra, rb = (a.detach().double().requires_grad_(), b.detach().double().requires_grad_())
    want = torch.autograd.grad(torch.matmul(ra, rb), (ra, rb), g.double())
    assert da.dtype == BF16 and rel(da, want[0]) < 1e-2 and rel(db, want[1]) < 1e-2


def test_unsupported_cuda_dtype_raises_or_falls_back_visibly():
    a, b = randn(64, 64, dtype=torch.float64), randn(64, 64, dtype=torch.float64)
    with pytest.raises(ValueError, match="no GEMM kernel supports"):
        ops.matmul(a, b)
    ops.FALLBACK_COUNTS.clear()
    out = ops.matmul(a, b, fallback="torch")
    assert rel(out, a @ b) < 1e-12
    assert sum(n for (op, _), n in ops.FALLBACK_COUNTS.items() if op == "matmul") == 1


# ---- linear ------------------------------------------------------------------------------------

def _torch_linear(x, w, b, activation):
    y = F.linear(x, w, b)
    return {None: y, "relu": torch.relu(y), "silu": F.silu(y), "gelu": F.gelu(y),
            "gelu_tanh": F.gelu(y, approximate="tanh")}[activation]


@pytest.mark.parametrize("activation", ops.ACTIVATIONS)
def test_linear_values_and_gradients_match_torch(activation):
    x, w, b = randn(2, 64, 128, grad=True), randn(192, 128, grad=True), randn(192, grad=True)
    poison((128, 192))
    out = ops.linear(x, w, b, activation)
    refs = [t.detach().float().requires_grad_() for t in (x, w, b)]
    ref = _torch_linear(*refs, activation)
    assert out.shape == ref.shape and out.dtype == BF16 and torch.isfinite(out).all()
    assert rel(out, ref) < 1e-2
    g = randn(*out.shape)
    got = torch.autograd.grad(out, (x, w, b), g)
    want = torch.autograd.grad(ref, refs, g.float())
    for name, a, r in zip(("dx", "dw", "db"), got, want):
        assert a.shape == r.shape and a.dtype == BF16, name
        assert rel(a, r) < 2e-2, name


@pytest.mark.parametrize("rung", ["sm90_persistent", "sm80_mma"])
def test_linear_fused_and_unfused_epilogues_agree_with_torch(rung):
    # sm90 rungs fuse bias + activation into the GEMM's epilogue; sm80_mma runs them after.
    x, w, b = randn(200, 136), randn(264, 136), randn(264)
    poison((200, 264))
    out = ops.linear(x, w, b, "gelu_tanh", rung=rung)
    ref = _torch_linear(x.float(), w.float(), b.float(), "gelu_tanh")
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert rel(out, ref) < 1e-2


def test_scaled_mm_matches_dequantized_product():
    fp8 = torch.float8_e4m3fn
    a, b = randn(256, 512).to(fp8), randn(384, 512).to(fp8).t()
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")
    poison((256, 384))
    out = ops.scaled_mm(a, b, sa, sb, out_dtype=BF16)
    ref = (a.float() * 0.5) @ (b.float() * 2.0)
    assert out.dtype == BF16 and rel(out, ref) < 1e-2
    want = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16)
    assert rel(out, want.float()) < 1e-2


# ---- sdpa ----------------------------------------------------------------------------------------

def _torch_sdpa(q, k, v, causal):
    hq = q.shape[-3]
    k, v = (t.repeat_interleave(hq // t.shape[-3], dim=-3) for t in (k, v))
    if causal == "bottom_right":
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[-2], k.shape[-2]))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal == "top_left")


SDPA_CASES = [  # (B, Hq, Hkv, Sq, Sk, D, causal)
    (2, 4, 4, 128, 128, 64, None),
    (2, 4, 2, 128, 128, 64, "top_left"),
    (1, 4, 4, 64, 192, 128, "bottom_right"),
]


@pytest.mark.parametrize("b, hq, hk, sq, sk, d, causal", SDPA_CASES)
def test_sdpa_forward_matches_torch(b, hq, hk, sq, sk, d, causal):
    q, k, v = randn(b, hq, sq, d), randn(b, hk, sk, d), randn(b, hk, sk, d)
    poison((b, hq, sq, d))
    out, lse = ops.sdpa(q, k, v, causal, None, hk != hq)
    qf, kf, vf = (t.float() for t in (q, k, v))
    ref = _torch_sdpa(qf, kf, vf, causal)
    assert out.dtype == BF16 and torch.isfinite(out).all() and rel(out, ref) < 1e-2
    _, ref_lse = ops.sdpa(qf.double().cpu(), kf.double().cpu(), vf.double().cpu(), causal, None, hk != hq,
                          fallback="torch")
    assert torch.allclose(lse.cpu(), ref_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("b, hq, hk, sq, sk, d, causal", SDPA_CASES[:2])
def test_sdpa_gradients_match_torch(b, hq, hk, sq, sk, d, causal):
    q, k, v = randn(b, hq, sq, d, grad=True), randn(b, hk, sk, d, grad=True), randn(b, hk, sk, d, grad=True)
    g = randn(b, hq, sq, d)
    refs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(_torch_sdpa(*refs, causal), refs, g.float())
    if _has_attention_backward():
        fallback = "none"
    else:
        out, _ = ops.sdpa(q, k, v, causal, None, hk != hq)
        with pytest.raises(NotImplementedError, match="attention backward .*not written yet"):
            torch.autograd.grad(out, (q, k, v), g)
        fallback = "torch"  # forward on our kernel, backward by definition
    out, _ = ops.sdpa(q, k, v, causal, None, hk != hq, fallback=fallback)
    got = torch.autograd.grad(out, (q, k, v), g)
    for name, a, r in zip(("dq", "dk", "dv"), got, want):
        assert a.shape == r.shape and a.dtype == BF16, name
        assert rel(a, r) < 2e-2, name


# ---- opcheck on CUDA tensors -------------------------------------------------------------------------

def test_opcheck_on_cuda():
    torch.library.opcheck(ops.matmul, (randn(2, 128, 64, grad=True), randn(64, 128, grad=True)))
    torch.library.opcheck(ops.linear, (randn(128, 128, grad=True), randn(192, 128, grad=True), randn(192, grad=True)),
                          {"activation": "silu"})
    qkv = (randn(2, 4, 128, 64, grad=True), randn(2, 4, 128, 64, grad=True), randn(2, 4, 128, 64, grad=True))
    torch.library.opcheck(ops.sdpa, qkv, {"causal": "top_left", "fallback": "torch"})
    # The backward op itself: its gradients stored (B, S, H, D) on every path, as its fake says.
    q, k, v = (t.detach() for t in qkv)
    out, lse = ops.sdpa(q, k, v, "top_left")
    torch.library.opcheck(ops.sdpa_backward, (torch.randn_like(out), q, k, v, out, lse), {"causal": "top_left"})
    dq, dk, dv = ops.sdpa_backward(torch.randn_like(out), q, k, v, out, lse, "top_left")
    assert all(g.transpose(1, 2).is_contiguous() for g in (dq, dk, dv))


# ---- torch.compile, CUDA graphs, streams --------------------------------------------------------------

def _block(x, w, b, q, k, v):
    y = ops.linear(x, w, b, "gelu_tanh")
    o, _ = ops.sdpa(q, k, v, "top_left")
    return y * 2 + 1, o.float().sum(-1)


def test_compile_fullgraph_size_change_does_not_recompile():
    w, b = randn(192, 128), randn(192)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_block, backend=counter, fullgraph=True)
    frames = []
    # Sizes that differ from each other and from every static dim (128, 192, 64), so that
    # duck sizing does not tie two of them to one symbol.
    for m, s in ((256, 384), (320, 512), (448, 640)):
        x = randn(m, 128)
        q, k, v = randn(1, 2, s, 64), randn(1, 2, s, 64), randn(1, 2, s, 64)
        for t, dim in ((x, 0), (q, 2), (k, 2), (v, 2)):
            torch._dynamo.mark_dynamic(t, dim)
        got = compiled(x, w, b, q, k, v)
        frames.append(counter.frame_count)
        want = _block(x, w, b, q, k, v)
        for a, r in zip(got, want):
            assert a.shape == r.shape and rel(a, r) < 1e-2
    assert frames[0] >= 1 and frames == [frames[0]] * 3, f"recompiled: frame counts {frames}"


def test_cuda_graph_capture_and_replay():
    w, b = randn(192, 128), randn(192)
    x, q, k, v = randn(128, 128), randn(1, 2, 128, 64), randn(1, 2, 128, 64), randn(1, 2, 128, 64)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # compiles the kernels and warms the allocator outside the capture
            _block(x, w, b, q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _block(x, w, b, q, k, v)
    for _ in range(2):
        new = randn(128, 128), randn(1, 2, 128, 64), randn(1, 2, 128, 64), randn(1, 2, 128, 64)
        for dst, src in zip((x, q, k, v), new):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        want = _block(*new[:1], w, b, *new[1:])
        for a, r in zip(static_out, want):
            assert rel(a, r) < 1e-2  # a stale replay would be off by ~1


def test_runs_on_the_callers_stream():
    a, b = randn(256, 128), randn(128, 192)
    ref = ops.matmul(a, b)  # compiles outside the timed part
    staged = torch.full_like(a, math.nan)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # The side stream sleeps, then writes the input: a kernel launched on any other stream
        # would read the NaNs still there.
        torch.cuda._sleep(400_000_000)  # ~0.2 s: longer than a loaded host takes to enqueue the rest
        staged.copy_(a)
        out = ops.matmul(staged, b)
        done = torch.cuda.Event()
        done.record(side)
    if done.query():  # the precondition, not the property: a host stalled for 0.2 s proves nothing
        pytest.skip("the side stream finished before the check (host too slow to enqueue)")
    done.synchronize()
    assert torch.isfinite(out).all() and rel(out, ref) < 1e-3
