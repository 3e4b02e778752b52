"""The linear-layer training fuzz (`bench.linear_fuzz`) on CPU: the draw covers its classes,
and with fallback-free stand-ins it can fail (a wrong gradient is caught). The real run is the
GPU test beside it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.bench import linear_fuzz  # noqa: E402


def test_the_draw_covers_the_classes():
    ps = linear_fuzz.problems(1, 400)
    assert {p.dtype for p in ps} == {"bf16", "fp16"} and {p.activation for p in ps} == set(linear_fuzz.ACTIVATIONS)
    assert {p.batch for p in ps} >= {1, 2} and any(not p.input_grad for p in ps) and any(not p.weight_grad for p in ps)
    assert min(p.m for p in ps) == 1 and min(p.k for p in ps) == 1 and min(p.n for p in ps) == 1
    assert all(p.m % p.batch == 0 for p in ps)


def _cpu_layers(monkeypatch, grad_scale=1.0):
    """nn.Linear on CPU computing with PyTorch (the torch fallback), optionally with a wrong
    weight gradient."""
    import cute_kernels.nn as cnn

    real = cnn.Linear

    class CpuLinear(torch.nn.Linear):
        kernel, fallback = "auto", "torch"  # what the fuzz's op calls hand the op (PyTorch on CPU)

        def __init__(self, k, n, *, bias, activation, device, dtype):
            super().__init__(k, n, bias=bias, device="cpu", dtype=dtype)
            self.activation = activation

        def forward(self, x):
            import torch.nn.functional as F

            w = self.weight * 1.0
            if grad_scale != 1.0:
                w = _Scaled.apply(w, grad_scale)
            y = F.linear(x.float(), w.float(), None if self.bias is None else self.bias.float())
            act = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu, "silu": F.silu,
                   "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[self.activation]
            return act(y)

    monkeypatch.setattr(cnn, "Linear", CpuLinear)
    return real


class _Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, s):
        ctx.s = s
        return w.clone()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s, None


def test_a_right_layer_passes_and_a_wrong_gradient_fails(monkeypatch):
    monkeypatch.setattr(linear_fuzz, "poison", lambda device, numel: None)
    _cpu_layers(monkeypatch)
    report = linear_fuzz.run(3, 12, device="cpu", max_size=40)
    assert report.cases == 12 and report.wrong == 0, report.failures
    linear_fuzz.trace(3, 4, device="cpu")  # what precompile's workers run: the same calls, unchecked
    _cpu_layers(monkeypatch, grad_scale=1.05)  # a 5% wrong weight gradient
    p = linear_fuzz.Problem(m=30, k=20, n=10, dtype="bf16", weight_grad=True)
    why, _ = linear_fuzz.check(p, 0, "cpu")
    assert why is not None and "dw" in why
