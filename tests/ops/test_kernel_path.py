"""The operators' kernel path (fallback="none") on CPU, with the kernel layer's entry points
replaced by stand-ins that check what they are handed and compute with PyTorch. This runs in
CI the code the GPU runs around the kernels: views and strides handed down, tensors handed down
detached (DLPack, so TVM-FFI, refuses tensors that require grad), the `rung` argument passed
through as the entry's `kernel` (also to the backward kernels), the in-place unfused epilogue of
`linear`, and opcheck of the ops as they are on the device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from cute_kernels import ops  # noqa: E402
from cute_kernels.ops import attention as attention_ops  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402
from cute_kernels.ops import fallback as fallback_mod  # noqa: E402
from cute_kernels.ops import gemm as gemm_ops  # noqa: E402

F64 = torch.float64


def _detached(*tensors):
    for t in tensors:
        assert not t.requires_grad, "a tensor requiring grad was handed to the kernel entry (DLPack refuses it)"


def randn(*shape, grad=False):
    return torch.randn(*shape, dtype=F64).requires_grad_(grad)


def _rel(x, ref):
    return float((x - ref).detach().norm() / ref.detach().norm())


@pytest.fixture
def gemm_calls(monkeypatch):
    """Replace cute_kernels.gemm.matmul; returns the list of (a shape, b shape, kernel) calls."""
    calls = []

    def stand_in(a, b, *, kernel="auto", out_dtype=None):
        assert not torch.is_grad_enabled(), "the kernel entry must be called below autograd"
        _detached(a, b)
        for name, t in (("a", a), ("b", b)):
            assert t.dim() in (2, 3), f"{name} handed down {t.dim()}-D"
            assert t.stride(-1) == 1 or t.stride(-2) == 1, f"{name} handed down with strides {t.stride()}"
        calls.append((tuple(a.shape), tuple(b.shape), kernel))
        return torch.matmul(a, b).to(a.dtype if out_dtype is None else out_dtype)

    monkeypatch.setattr(gemm_ops, "_gemm", lambda: stand_in)
    return calls


@pytest.fixture
def attention_calls(monkeypatch):
    calls = []

    def forward(q, k, v, *, causal, scale, enable_gqa, window_size, kernel):
        _detached(q, k, v)
        calls.append(("forward", causal, window_size, kernel))
        # stored as the kernels store a fresh output: (B, S, H, D) under the (B, H, S, D) view
        return attention_ops._stored_as_kernels(*reference.forward(q, k, v, causal, scale, enable_gqa, window_size))

    def backward(grad_out, q, k, v, out, lse, *, causal, scale, enable_gqa, window_size, kernel):
        _detached(grad_out, q, k, v, out, lse)
        calls.append(("backward", causal, window_size, kernel))
        assert lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
        return reference.backward(grad_out, q, k, v, causal, scale, enable_gqa, window_size)

    monkeypatch.setattr(attention_ops, "_found", {"sdpa": forward, "sdpa_backward": backward})
    return calls


# ---- matmul and linear -------------------------------------------------------------------------

def test_matmul_passes_rung_to_forward_and_backward_gemms(gemm_calls):
    a, b = randn(3, 6, 5, grad=True), randn(5, 4, grad=True)
    out = ops.matmul(a, b, rung="naive")
    out.backward(randn(3, 6, 4))
    assert [c[2] for c in gemm_calls] == ["naive"] * 3
    assert gemm_calls[0][:2] == ((3, 6, 5), (5, 4))
    # dB over a shared b is one GEMM over the flattened batch: (K, L*M) @ (L*M, N).
    assert gemm_calls[2][:2] == ((5, 18), (18, 4))


@pytest.mark.parametrize("activation", ops.ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_kernel_path_matches_torch(gemm_calls, activation, with_bias):
    x, w = randn(2, 3, 7, grad=True), randn(4, 7, grad=True)
    b = randn(4, grad=True) if with_bias else None
    out = ops.linear(x, w, b, activation, rung="sm80_mma")
    y = F.linear(x, w, b)
    ref = {None: y, "relu": torch.relu(y), "silu": F.silu(y), "gelu": F.gelu(y),
           "gelu_tanh": F.gelu(y, approximate="tanh")}[activation]
    assert out.shape == ref.shape and out.is_contiguous() and _rel(out, ref) < 1e-12
    assert gemm_calls[0] == ((6, 7), (7, 4), "sm80_mma")  # x flattened to 2-D, weight as a transposed view
    g = randn(*ref.shape)
    inputs = (x, w, b) if with_bias else (x, w)
    for got, want in zip(torch.autograd.grad(out, inputs, g), torch.autograd.grad(ref, inputs, g)):
        assert _rel(got, want) < 1e-12
    recompute = activation in ("silu", "gelu", "gelu_tanh")
    assert len(gemm_calls) == 3 + recompute and {c[2] for c in gemm_calls} == {"sm80_mma"}


@pytest.mark.parametrize("activation", ops.ACTIVATIONS)
def test_opcheck_linear_kernel_path(gemm_calls, activation):
    args = (randn(2, 3, 7, grad=True), randn(4, 7, grad=True), randn(4, grad=True))
    torch.library.opcheck(ops.linear, args, {"activation": activation})


def test_opcheck_matmul_kernel_path(gemm_calls):
    torch.library.opcheck(ops.matmul, (randn(3, 6, 5, grad=True), randn(3, 5, 4, grad=True)))


def test_kernel_layer_errors_propagate_or_fall_back(monkeypatch):
    def refuses(a, b, *, kernel="auto", out_dtype=None):
        raise ValueError("no GEMM kernel supports this problem (test)")

    monkeypatch.setattr(gemm_ops, "_gemm", lambda: refuses)
    monkeypatch.setattr(gemm_ops, "on_cuda", lambda *tensors: True)  # as if on the GPU
    monkeypatch.setattr(fallback_mod, "_warned", set())
    x, w = randn(3, 5), randn(4, 5)
    with pytest.raises(ValueError, match=r"no GEMM kernel supports this problem \(test\)"):
        ops.linear(x, w)
    ops.FALLBACK_COUNTS.clear()
    with pytest.warns(ops.FallbackWarning, match="test"):
        out = ops.linear(x, w, None, "relu", fallback="torch")
    assert _rel(out, torch.relu(x @ w.T)) < 1e-12
    assert ops.FALLBACK_COUNTS[("linear", "no GEMM kernel supports this problem (test)")] == 1


# ---- sdpa --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", ops.CAUSAL)
def test_sdpa_kernel_path_forward_and_backward(attention_calls, causal):
    q, k, v = randn(2, 4, 5, 8, grad=True), randn(2, 2, 6, 8, grad=True), randn(2, 2, 6, 8, grad=True)
    out, lse = ops.sdpa(q, k, v, causal, None, True, rung="sm80_flash")
    # out is the (B, H, S, D) view of (B, S, H, D) storage: a model's transpose + reshape is a view
    assert out.transpose(1, 2).is_contiguous() and lse.is_contiguous()
    out.backward(randn(*out.shape))
    assert attention_calls == [("forward", causal, None, "sm80_flash"), ("backward", causal, None, "sm80_flash")]
    assert not lse.requires_grad
    torch.library.opcheck(ops.sdpa, (q, k, v), {"causal": causal, "enable_gqa": True})


def test_sdpa_kernel_path_hands_the_window_down(attention_calls):
    """window_left/right reach both entries as window_size; (-1, -1) as None (no window)."""
    q, k, v = randn(1, 2, 6, 8, grad=True), randn(1, 2, 9, 8, grad=True), randn(1, 2, 9, 8, grad=True)
    out, _ = ops.sdpa(q, k, v, None, None, False, 2, 1, rung="sm80_flash")
    want = reference.forward(q, k, v, None, None, False, (2, 1))[0]
    assert _rel(out, want) < 1e-12
    out.backward(randn(*out.shape))
    assert attention_calls == [("forward", None, (2, 1), "sm80_flash"), ("backward", None, (2, 1), "sm80_flash")]
    torch.library.opcheck(ops.sdpa, (q, k, v), {"window_left": 3, "window_right": -1, "causal": "top_left"})


def test_varlen_kernel_path_forward_and_backward(monkeypatch):
    """sdpa_varlen differentiates through sdpa_varlen_backward, which hands the forward's
    out/lse, the offsets, max lengths, window and rung to attention_varlen_backward."""
    calls = []

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, causal, scale, window_size, kernel):
        _detached(q, k, v, cu_q, cu_k)
        calls.append(("forward", max_q, max_k, causal, window_size, kernel))
        return reference.varlen_forward(q, k, v, cu_q, cu_k, causal, scale, window_size)

    def varlen_backward(grad_out, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, *, causal, scale, window_size,
                        kernel):
        _detached(grad_out, q, k, v, out, lse, cu_q, cu_k)
        assert lse.shape == (q.shape[1], q.shape[0]) and out.shape == grad_out.shape
        calls.append(("backward", max_q, max_k, causal, window_size, kernel))
        return reference.varlen_backward(grad_out, q, k, v, cu_q, cu_k, causal, scale, window_size)

    monkeypatch.setattr(attention_ops, "_found", {"sdpa_varlen": varlen, "sdpa_varlen_backward": varlen_backward})
    cu_q, cu_k = torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([0, 4, 11], dtype=torch.int32)
    q, k, v = randn(8, 4, 16, grad=True), randn(11, 2, 16, grad=True), randn(11, 2, 16, grad=True)
    out, _ = ops.sdpa_varlen(q, k, v, cu_q, cu_k, 5, 7, None, 0.3, 1, 2, rung="sm80_flash")
    g = randn(*out.shape)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = reference.varlen_backward(g, q, k, v, cu_q, cu_k, None, 0.3, (1, 2))
    for a, r in zip(got, want):
        assert _rel(a, r) < 1e-12
    assert calls == [("forward", 5, 7, None, (1, 2), "sm80_flash"), ("backward", 5, 7, None, (1, 2), "sm80_flash")]


def test_varlen_and_paged_decode_kernel_path(monkeypatch):
    calls = []

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, causal, scale, window_size, kernel):
        _detached(q, k, v, cu_q, cu_k)
        calls.append(("varlen", max_q, max_k, causal, kernel))
        return reference.varlen_forward(q, k, v, cu_q, cu_k, causal, scale, window_size)

    def decode(q, k_cache, v_cache, block_table, seqlens_k, *, scale, kernel):
        _detached(q, k_cache, v_cache, block_table, seqlens_k)
        calls.append(("decode", scale, kernel))
        return reference.paged_decode(q, k_cache, v_cache, block_table, seqlens_k, scale)

    monkeypatch.setattr(attention_ops, "_found", {"sdpa_varlen": varlen, "paged_decode": decode})
    cu_q, cu_k = torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([0, 4, 11], dtype=torch.int32)
    q, k, v = randn(8, 4, 16, grad=True), randn(11, 2, 16, grad=True), randn(11, 2, 16, grad=True)
    out, lse = ops.sdpa_varlen(q, k, v, cu_q, cu_k, 5, 7, "bottom_right", rung="sm80_flash")
    want_out, want_lse = reference.varlen_forward(q, k, v, cu_q, cu_k, "bottom_right", None)
    assert _rel(out, want_out) < 1e-12 and _rel(lse, want_lse) < 1e-12

    k_cache, v_cache = randn(6, 4, 2, 16, grad=True), randn(6, 4, 2, 16, grad=True)
    table, seqlens = torch.tensor([[5, 0, 3], [2, 1, 0]], dtype=torch.int32), torch.tensor([10, 3], dtype=torch.int32)
    qd = randn(2, 4, 16, grad=True)
    out = ops.paged_decode(qd, k_cache, v_cache, table, seqlens, 0.5, rung="decode")
    assert _rel(out, reference.paged_decode(qd, k_cache, v_cache, table, seqlens, 0.5)) < 1e-12
    assert calls == [("varlen", 5, 7, "bottom_right", "sm80_flash"), ("decode", 0.5, "decode")]
