"""Shared pieces of the model tests: tiny models from the bench's specs, the stock model beside
a copy on cute_kernels attention, and comparisons of loss, logits and every gradient."""

from __future__ import annotations

import copy

import torch

from cute_kernels.bench import model_specs


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def pair(name: str, *, dtype=torch.float64, device="cpu", fallback="torch", patch=False, **build):
    """(stock, ours, batch): the tiny model of spec `name` and a copy switched to cute_kernels
    attention (`integrations.transformers.use`, or the whole `nn.patch` with patch=True)."""
    import cute_kernels.integrations.transformers as hf
    import cute_kernels.nn as cnn

    spec = model_specs.spec(name)
    stock = model_specs.build(spec, size="tiny", dtype=dtype, device=device, **build)
    ours = copy.deepcopy(stock)
    if patch:
        cnn.patch(ours, fallback=fallback)
    else:
        hf.use(ours, fallback=fallback)
    return stock, ours, model_specs.make_batch(spec, size="tiny", device=device, dtype=dtype)


def train_step(model, batch: dict):
    """(loss, logits, {parameter name: grad}) of one forward and backward."""
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), out.logits.detach(), grads


def compare_training(stock, ours, batch: dict, tol: float, *, real=None):
    """Assert loss, logits (at the real tokens: `real` (B, S) bool) and every gradient agree."""
    loss_s, logits_s, grads_s = train_step(stock, batch)
    loss_o, logits_o, grads_o = train_step(ours, batch)
    assert rel(loss_o, loss_s) < tol, (float(loss_o), float(loss_s))
    if real is not None:
        logits_s, logits_o = logits_s[real], logits_o[real]
    assert rel(logits_o, logits_s) < tol
    assert grads_s.keys() == grads_o.keys() and grads_s
    worst = max(grads_s, key=lambda n: rel(grads_o[n], grads_s[n]))
    assert rel(grads_o[worst], grads_s[worst]) < tol, (worst, rel(grads_o[worst], grads_s[worst]))
    return logits_o
