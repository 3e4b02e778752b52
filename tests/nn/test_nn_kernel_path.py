"""cute_kernels.nn's `kernel=` keyword reaches the kernel layer: the modules and functions pass
it to the operators as `rung`, and the operators hand it down as the entry points' `kernel=`.
The entry points are replaced by stand-ins computing with PyTorch, so this runs on CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.ops import attention as attention_ops  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402
from cute_kernels.ops import gemm as gemm_ops  # noqa: E402

F64 = torch.float64


def _rel(x, ref):
    return float((x - ref).detach().norm() / ref.detach().norm())


@pytest.fixture
def kernels(monkeypatch):
    """The `kernel=` each stand-in entry point received, in call order."""
    seen = []

    def gemm(a, b, *, kernel="auto", out_dtype=None):
        seen.append(("gemm", kernel))
        return torch.matmul(a, b)

    def forward(q, k, v, *, causal, scale, enable_gqa, window_size, kernel):
        seen.append(("sdpa", kernel))
        return reference.forward(q, k, v, causal, scale, enable_gqa, window_size)

    def backward(grad_out, q, k, v, out, lse, *, causal, scale, enable_gqa, window_size, kernel):
        seen.append(("sdpa_backward", kernel))
        return reference.backward(grad_out, q, k, v, causal, scale, enable_gqa, window_size)

    monkeypatch.setattr(gemm_ops, "_gemm", lambda: gemm)
    monkeypatch.setattr(attention_ops, "_found", {"sdpa": forward, "sdpa_backward": backward})
    return seen


def test_linear_module_and_function_pass_kernel_as_rung(kernels):
    layer = cnn.Linear(5, 3, dtype=F64, kernel="sm90_persistent")
    x = torch.randn(4, 5, dtype=F64, requires_grad=True)
    out = layer(x)
    assert _rel(out, F.linear(x, layer.weight, layer.bias)) < 1e-12
    out.sum().backward()
    assert kernels == [("gemm", "sm90_persistent")] * 3  # forward, dX, dW
    kernels.clear()
    out = cnn.functional.linear(x, layer.weight, None, activation="relu", kernel="sm80_mma")
    assert _rel(out, torch.relu(x @ layer.weight.T)) < 1e-12
    assert kernels == [("gemm", "sm80_mma")]


def test_sdpa_function_passes_kernel_as_rung_to_forward_and_backward(kernels):
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=F64, requires_grad=True) for _ in range(3))
    out = cnn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, kernel="sm80_flash")
    assert _rel(out, F.scaled_dot_product_attention(q, k, v, is_causal=True)) < 1e-12
    out.sum().backward()
    assert kernels == [("sdpa", "sm80_flash"), ("sdpa_backward", "sm80_flash")]


def test_route_and_patch_pass_the_attention_kernel(kernels):
    class Attend(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(1, 2, 4, 8, dtype=F64) for _ in range(3))
    with cnn.route(linear=False, attention_kernel="sm90_flash"):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert kernels == [("sdpa", "sm90_flash")]
    kernels.clear()
    model = cnn.patch(Attend(), linear=False, attention_kernel="sm80_flash")
    assert _rel(model(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)) < 1e-12
    assert kernels == [("sdpa", "sm80_flash")]
