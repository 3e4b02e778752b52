"""Fuzz of a linear layer's training step: random problems through `cute_kernels.nn.Linear`,
forward and backward, three times each (the checked call, then the replayed plans of the eager
path: `ops.eager_gemm`'s forward and `linear_backward` entries), and the gradients twice more
through the `linear_backward` op as a compiled backward graph calls it, against float64.

A problem draws M (rows, 2-D or split into a batch of 3-D), K and N from 1 to `max_size`
(primes and 1 among them), bf16 or fp16, a bias or none, an activation, and which of the input
and the weight require grad (a first layer, a frozen weight); the output gradient is fresh
N(0, 1). Each of the output, dX, dW and db is judged against the float64 reference computed
from the same rounded tensors, norm-wise and by its worst element (`tolerance`,
`element_tolerance`), the allocator poisoned before each call.

    run(seed, n, device="cuda") -> FuzzReport    (`fuzz_record`: cases, wrong, failures; the
                                                  worst passing case as error over its bar)
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass

from .fuzz_record import FuzzReport, fuzz_result, poison

__all__ = ["Problem", "problems", "run", "trace", "check", "tolerance", "element_tolerance", "result", "CALLS"]

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
CALLS = 3  # the checked call and two warm ones


@dataclass(frozen=True)
class Problem:
    m: int
    k: int
    n: int
    dtype: str = "bf16"
    bias: bool = True
    activation: str | None = None
    batch: int = 1  # M split into (batch, M / batch) rows: a 3-D input
    input_grad: bool = True
    weight_grad: bool = True


def _size(rng: random.Random, hi: int) -> int:
    r = rng.random()
    if r < 0.1:
        return rng.choice((1, 2, 3, 7, 8, 13, 16, 31, 64, 127))
    if r < 0.2:
        return min(hi, rng.choice((251, 509, 1021, 2039, 4093)))
    return rng.randint(1, hi)


def problems(seed: int, n: int, max_size: int = 3000) -> list[Problem]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m = _size(rng, max_size)
        batch = rng.choice([d for d in (1, 2, 3, 4) if m % d == 0])
        grads = rng.choice(((True, True), (True, True), (False, True), (True, False)))
        out.append(Problem(m=m, k=_size(rng, max_size), n=_size(rng, max_size), dtype=rng.choice(("bf16", "fp16")),
                           bias=rng.random() < 0.6, activation=rng.choice(ACTIVATIONS), batch=batch,
                           input_grad=grads[0], weight_grad=grads[1]))
    return out


def tolerance(p: Problem, what: str) -> float:
    """The relative-error bar of one result. The output's is the GEMM fuzz's (its rounding, some 3x
    above the expected error, plus the approximate tanh/exp of gelu_tanh and silu); a gradient's
    passes through the activation's derivative at the recomputed (rounded) pre-activation and
    one more rounding to the dtype before its GEMM, so it gets three times that."""
    base = {"bf16": 4e-3, "fp16": 6e-4}[p.dtype] + (1.5e-3 if p.activation in ("gelu_tanh", "silu") else 0.0)
    return base if what == "out" else 3 * base + (2e-3 if p.activation is not None else 0.0)


def element_tolerance(p: Problem, what: str) -> float:
    """The bar on the worst element, max |got - ref| / rms(ref): a norm-wise error cannot see a
    few wrong elements of a large result (the GEMM fuzz's bar; twice that for a gradient)."""
    base = {"bf16": 6e-2, "fp16": 1e-2}[p.dtype] + (1e-2 if p.activation is not None else 0.0)
    return base if what == "out" else 2 * base


def _reference(p: Problem, x, w, b, g):
    import torch
    import torch.nn.functional as F

    act = {None: lambda y: y, "relu": torch.relu, "gelu": F.gelu, "silu": F.silu,
           "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[p.activation]
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bd = None if b is None else b.detach().double().requires_grad_()
    out = act(F.linear(xd, wd, bd))
    wrt = [t for t, need in ((xd, p.input_grad), (wd, p.weight_grad), (bd, p.weight_grad and bd is not None)) if need]
    return out.detach(), torch.autograd.grad(out, wrt, g.double())


def _errors(p: Problem, got, ref, what: str) -> float:
    """The worse of the result's norm-wise and element-wise errors, each over its bar."""
    diff = got.double() - ref
    rms = ref.pow(2).mean().sqrt().clamp_min(1e-30)
    norm = float(diff.norm() / ref.norm().clamp_min(1e-30)) / tolerance(p, what)
    element = float(diff.abs().max() / rms) / element_tolerance(p, what) if diff.numel() else 0.0
    return max(norm, element) if norm == norm and element == element else math.nan


def _setup(p: Problem, seed: int, device: str):
    """(layer, x, output gradient, the tensors to differentiate, their names) of problem `p`."""
    import torch

    import cute_kernels.nn as cnn

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[p.dtype]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (p.m,) if p.batch == 1 else (p.batch, p.m // p.batch)
    x = torch.randn(*shape, p.k, generator=gen).to(device=device, dtype=dtype).requires_grad_(p.input_grad)
    layer = cnn.Linear(p.k, p.n, bias=p.bias, activation=p.activation, device=device, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(p.n, p.k, generator=gen) / math.sqrt(p.k))
        if p.bias:
            layer.bias.copy_(torch.randn(p.n, generator=gen))
    layer.weight.requires_grad_(p.weight_grad)
    if p.bias:
        layer.bias.requires_grad_(p.weight_grad)
    g = torch.randn(*shape, p.n, generator=gen).to(device=device, dtype=dtype)
    wrt = [t for t, need in ((x, p.input_grad), (layer.weight, p.weight_grad),
                             (layer.bias, p.weight_grad and p.bias)) if need]
    names = [n for n, need in (("dx", p.input_grad), ("dw", p.weight_grad), ("db", p.weight_grad and p.bias)) if need]
    return layer, x, g, wrt, names


def check(p: Problem, seed: int, device: str = "cuda") -> tuple[str | None, float]:
    """(None when every call of problem `p` is right, else why not; the worst error of its
    results over their bars)."""
    import torch

    layer, x, g, wrt, names = _setup(p, seed, device)
    want_out, want_grads = _reference(p, x, layer.weight, layer.bias, g)
    worst = 0.0
    for call in range(CALLS):
        poison(device, 2 * (p.m * (p.n + p.k) + p.n * p.k))
        out = layer(x)
        if p.activation == "relu":
            want_grads = _relu_grads(p, x, layer.weight, g, out)
        results = [("output", out, want_out, "out")]
        if wrt:
            grads = torch.autograd.grad(out, wrt, g)
            results += [(name, got, ref, "grad") for name, got, ref in zip(names, grads, want_grads)]
        if call == 0:
            results += _op_results(p, layer, x, g, out, names, want_grads)
        for name, got, ref, what in results:
            ratio = _errors(p, got, ref, what)
            if not ratio <= 1.0:  # (NaN fails too)
                return f"call {call}: {name} error {ratio:.3g} times its bar", worst
            worst = max(worst, ratio)
    return None, worst


def _relu_grads(p: Problem, x, w, g, out) -> list:
    """The float64 gradients of a relu layer with the derivative read off the tested output, as
    torch's relu backward reads it: a pre-activation within rounding of 0 may land on either
    side, and each such element moves dX by a whole row of W (measured on the H200: 4 of 100
    problems 1.2-4.4x over the bar against the float64 derivative), which no GEMM error causes."""
    gm = g.double() * (out.detach() > 0)
    g2, x2 = gm.reshape(-1, p.n), x.detach().double().reshape(-1, p.k)
    grads = []
    if p.input_grad:
        grads.append((g2 @ w.detach().double()).reshape(x.shape))
    if p.weight_grad:
        grads.append(g2.T @ x2)
        if p.bias:
            grads.append(g2.sum(0))
    return grads


def _op_results(p: Problem, layer, x, g, out, names, want_grads) -> list:
    """The gradients as a compiled backward graph computes them (`cute_kernels::linear_backward`
    called as an op, without grad mode), twice: the checked body, then the replayed plan; none
    where nothing needs a gradient."""
    import torch

    needs = (p.input_grad, p.weight_grad, p.weight_grad and p.bias)
    if not any(needs):
        return []
    w, b = layer.weight, layer.bias
    results = []
    with torch.no_grad():
        for call in range(2):
            dx, dw, db = torch.ops.cute_kernels.linear_backward(
                g, x, w, b, out.detach() if p.activation == "relu" else None, p.activation, *needs, layer.kernel,
                layer.fallback)
            got = [t for t, need in zip((dx, dw, db), needs) if need]
            results += [(f"op call {call} {name}", t, ref, "grad") for name, t, ref in zip(names, got, want_grads)]
    return results


def run(seed: int = 0, n: int = 300, *, device: str = "cuda", max_failures: int = 20, **draw) -> FuzzReport:
    report = FuzzReport(seed=seed, measure="error/bound")
    t0 = time.time()
    for i, p in enumerate(problems(seed, n, **draw)):
        try:
            why, worst = check(p, seed * 1_000_003 + i, device)
        except Exception as exc:  # noqa: BLE001 - a raise on admissible input is a wrong case too
            why, worst = report.raised(exc), 0.0
        report.cases += 1
        report.tally(why, worst, lambda p=p, why=why: {"problem": asdict(p), "why": why}, max_failures)
    report.seconds = round(time.time() - t0, 1)
    return report


def trace(seed: int = 0, n: int = 300, device: str = "cuda") -> None:
    """The calls `run` makes, unchecked (for `runtime.precompile`'s workers)."""
    import torch

    for i, p in enumerate(problems(seed, n)):
        try:
            layer, x, g, wrt, _ = _setup(p, seed * 1_000_003 + i, device)
            out = layer(x)
            if wrt:
                torch.autograd.grad(out, wrt, g)
        except Exception:  # noqa: BLE001 - `run` reports it; the trace only compiles
            pass


def result(report: FuzzReport, device: str = "cuda"):
    """The `linear_fuzz` BenchResult of a run (cases, wrong; see `fuzz_record`)."""
    return fuzz_result(report, "linear_fuzz", "cute_kernels.nn.Linear", {"calls": CALLS}, device,
                       command="pytest -m gpu tests/nn/test_linear_fuzz_gpu.py")
