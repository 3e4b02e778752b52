"""The GEMM fuzz: random problems through the public GEMM entry points, each against float64.

`problems(seed, n)` draws `n` problems deterministically: M, N, K from 1 to about 5000 (1, small
primes and values around tile and 16-byte boundaries over-represented), every major of A, B
and the addend C, leading-dimension padding (operands that are slices of larger tensors),
batches with and without broadcast, bf16 / fp16 / fp32 inputs, `out_dtype`, alpha, beta with C,
and the fused epilogues (bias per column or row, relu / gelu / gelu_tanh / silu) through
`matmul_epilogue`, and SwiGLU gate-up products through `gemm.gated.matmul_swiglu` (the gated
epilogue where M is past the skinny bound). `run(seed, n)` runs them on the GPU with the allocator poisoned with NaN
before each call (an element the kernel does not write stays NaN), compares each result with
a float64 reference by relative error against a tolerance for its dtypes, and returns a
`FuzzReport`; `result(report)` is the `gemm_fuzz` benchmark record (`cases`, `wrong`).

`trace(seed, n)` makes the same calls and checks nothing: what `runtime.precompile` runs in
its workers so the fuzz's kernels compile in parallel before `run` needs them.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass

from cute_kernels.gemm import activations

from .fuzz_record import FuzzReport, fuzz_result
from .fuzz_record import poison as _poison

__all__ = ["Problem", "FuzzReport", "problems", "run", "trace", "result", "tolerance", "element_tolerance",
           "element_error"]

_SPECIAL = (1, 1, 2, 3, 5, 7, 8, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 255, 256, 257, 1021,
            1024, 2047, 4093, 4096, 4099, 4801)
_ACTIVATIONS = activations.NAMES


@dataclass(frozen=True)
class Problem:
    """One fuzz case: `entry` is "matmul" (alpha, beta, c, out_dtype), "epilogue"
    (`matmul_epilogue`: bias, activation as well) or "swiglu" (`matmul_swiglu` of a and the
    interleaved weight b^T: n = 2I, the output (m, n / 2); alpha only). Majors are "row" (unit stride along the
    last mode) or "col"; pads add that many elements to the leading dimension."""

    m: int
    n: int
    k: int
    dtype: str
    out_dtype: str
    entry: str = "matmul"
    batch: int | None = None  # None: 2-D operands
    bcast: str | None = None  # "a" or "b": that operand is 2-D, broadcast over the batch
    a_major: str = "row"
    b_major: str = "row"
    a_pad: int = 0
    b_pad: int = 0
    alpha: float = 1.0
    beta: float = 0.0
    c_major: str = "row"
    c_bcast: bool = False  # c is one row, broadcast over M
    bias: str | None = None  # None, "n" or "m"
    activation: str | None = None

    @property
    def name(self) -> str:
        parts = [f"{self.m}x{self.n}x{self.k}", f"{self.dtype}->{self.out_dtype}", self.entry,
                 f"a{self.a_major}{'+' + str(self.a_pad) if self.a_pad else ''}",
                 f"b{self.b_major}{'+' + str(self.b_pad) if self.b_pad else ''}"]
        if self.batch:
            parts.append(f"L{self.batch}" + (f"bcast_{self.bcast}" if self.bcast else ""))
        if self.alpha != 1.0:
            parts.append(f"alpha={self.alpha}")
        if self.beta:
            parts.append(f"beta={self.beta}:c{self.c_major}{'_row' if self.c_bcast else ''}")
        if self.bias:
            parts.append(f"bias_{self.bias}")
        if self.activation:
            parts.append(self.activation)
        return ",".join(parts)


def _size(rng: random.Random, hi: int) -> int:
    r = rng.random()
    if r < 0.35:
        return rng.choice([s for s in _SPECIAL if s <= hi])
    if r < 0.6:
        return rng.randint(1, 64)
    return max(1, int(math.exp(rng.uniform(0, math.log(hi)))))


def problems(seed: int, n: int, max_size: int = 5000, dtypes: tuple = ("bf16", "fp16", "fp32")) -> list[Problem]:
    """`n` problems drawn from `random.Random(seed)` (the same list in every process), with
    input dtypes among `dtypes`."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        m, nn, k = (_size(rng, max_size) for _ in range(3))
        # keep each problem's float64 reference and data small: at most ~2.5e9 multiply-adds
        while m * nn * k > min(2_500_000_000, max_size ** 3 // 8):
            m, nn, k = max(1, m // 2), max(1, nn // 2), k if k < 64 else k // 2
        dtype = rng.choices(["bf16", "fp16", "fp32"], weights=[5, 3, 1])[0]
        if dtype not in dtypes:
            continue
        out_dtype = rng.choice([dtype, dtype, "fp32"] if dtype != "fp32" else ["fp32"])
        entry = "epilogue" if dtype != "fp32" and rng.random() < 0.35 else "matmul"
        if entry == "matmul" and dtype != "fp32" and rng.random() < 0.2:
            entry, nn = "swiglu", max(16, nn - nn % 16)  # whole gate/up block pairs
        batch = rng.choice([None, None, None, 1, 2, 3])
        bcast = rng.choice([None, "a", "b"]) if batch and batch > 1 else None
        beta = rng.choice([0.0, 0.0, 1.0, -0.5])
        if entry == "swiglu":
            out_dtype, batch, bcast, beta = dtype, None, None, 0.0
        out.append(Problem(
            m=m, n=nn, k=k, dtype=dtype, out_dtype=out_dtype, entry=entry, batch=batch, bcast=bcast,
            a_major=rng.choice(["row", "row", "col"]), b_major=rng.choice(["row", "col"]),
            a_pad=rng.choice([0, 0, 0, 1, 8]), b_pad=rng.choice([0, 0, 0, 3, 8]),
            alpha=rng.choice([1.0, 1.0, 0.5, -1.25]), beta=beta,
            c_major=rng.choice(["row", "row", "col"]), c_bcast=bool(beta) and rng.random() < 0.2,
            bias=rng.choice([None, "n", "n", "m"]) if entry == "epilogue" else None,
            activation=rng.choice((None,) + _ACTIVATIONS) if entry == "epilogue" else None))
    return out


def tolerance(p: Problem) -> float:
    """The relative-error bar of a problem. The reference is computed from the same rounded
    inputs, so what remains is the output's rounding (its norm-wise relative error is about
    2^-(mantissa bits + 1) / sqrt(3): 1.1e-3 for bf16, 1.4e-4 for fp16), fp32 accumulation
    (below 1e-5 for these K), and the approximate tanh/exp of gelu_tanh and silu (about 5e-4);
    each bar is some 3x above its expected error, far below what a wrong element costs. A SwiGLU
    product below the skinny bound rounds g and u to the output dtype before gating (as torch's
    silu(g) * u does): three roundings of up to 2^-(mantissa bits) each, and on a small result
    (measured: 3x16x1 bf16, 24 elements, 9.3e-3) the largest elements' set the norm."""
    if p.entry == "swiglu":
        return {"bf16": 1.2e-2, "fp16": 1.5e-3, "fp32": 5e-5}[p.out_dtype] + 1.5e-3
    out = {"bf16": 4e-3, "fp16": 6e-4, "fp32": 5e-5}[p.out_dtype]
    return out + (1.5e-3 if p.activation in ("gelu_tanh", "silu") else 0.0)


def element_error(p: Problem, out, ref) -> float:
    """The worst element of a result, as `element_tolerance` bounds it: max |out - ref| /
    rms(ref), or for a SwiGLU product max |out - ref| / (|ref| + rms(ref)) (relative to the
    element: silu(g) * u is heavy-tailed, its largest elements tens of rms at small K, and
    their rounding alone is a few hundredths of an rms; measured 0.20 at 3595x4080x31)."""
    diff = (out.double() - ref).abs()
    rms = ref.pow(2).mean().sqrt().clamp_min(1e-30)
    if p.entry == "swiglu":
        return (diff / (ref.abs() + rms)).max().item()
    return (diff.max() / rms).item()


def element_tolerance(p: Problem) -> float:
    """The bar on `element_error`: a norm-wise error cannot see a few wrong elements of a
    large result, this can. An element's rounding is at most 2^-(mantissa bits) of its
    magnitude, and the largest of millions of Gaussian values is about 6 rms, so a correct
    result stays near 2.5e-2 (bf16), 3e-3 (fp16); one wrong element costs about 1. A SwiGLU
    element is judged against its own magnitude: below the skinny bound g and u are rounded
    to the output dtype before gating (as torch's own silu(g) * u is), three roundings of
    2^-(mantissa bits + 1) each, then the product's; a wrong element still costs about 1."""
    if p.entry == "swiglu":
        return {"bf16": 3e-2, "fp16": 8e-3, "fp32": 1e-4}[p.out_dtype] + 1e-2
    out = {"bf16": 6e-2, "fp16": 1e-2, "fp32": 2e-3}[p.out_dtype]
    return out + (1e-2 if p.activation in ("gelu_tanh", "silu") else 0.0)


def _dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _matrix(gen, rows, cols, dtype, major, pad, batch, device):
    import torch

    lead = (batch,) if batch else ()
    if major == "row":
        t = torch.randn(*lead, rows, cols + pad, generator=gen, device=device, dtype=torch.float32)[..., :cols]
    else:
        t = torch.randn(*lead, cols, rows + pad, generator=gen, device=device,
                        dtype=torch.float32)[..., :rows].transpose(-1, -2)
    return t.to(dtype) if t.dtype != dtype else t


def inputs(p: Problem, gen, device) -> dict:
    """The problem's tensors, fresh N(0, 1) draws from `gen`."""
    import torch

    dt, odt = _dtype(p.dtype), _dtype(p.out_dtype)
    a = _matrix(gen, p.m, p.k, dt, p.a_major, p.a_pad, None if p.bcast == "a" else p.batch, device)
    b = _matrix(gen, p.k, p.n, dt, p.b_major, p.b_pad, None if p.bcast == "b" else p.batch, device)
    c = None
    if p.beta:
        rows = 1 if p.c_bcast else p.m
        c = _matrix(gen, rows, p.n, odt, p.c_major, 0, None, device)
    bias = None
    if p.bias:
        bias = torch.randn(p.n if p.bias == "n" else p.m, generator=gen, device=device).to(odt)
    return dict(a=a, b=b, c=c, bias=bias)


def call(p: Problem, t: dict):
    """The entry point's result for problem `p` on tensors `t`."""
    from cute_kernels.gemm import matmul
    from cute_kernels.gemm.epilogue_api import matmul_epilogue

    odt = _dtype(p.out_dtype)
    if p.entry == "swiglu":
        from cute_kernels.gemm.gated import matmul_swiglu

        return matmul_swiglu(t["a"], t["b"].transpose(-1, -2), alpha=p.alpha)[0]
    if p.entry == "matmul":
        return matmul(t["a"], t["b"], out_dtype=odt, alpha=p.alpha, beta=p.beta, c=t["c"])
    return matmul_epilogue(t["a"], t["b"], bias=t["bias"], bias_dim=p.bias or "n", activation=p.activation,
                           alpha=p.alpha, beta=p.beta, c=t["c"], out_dtype=odt)


def reference(p: Problem, t: dict):
    import torch

    ref = p.alpha * torch.matmul(t["a"].double(), t["b"].double())
    if p.entry == "swiglu":
        from cute_kernels.gemm.gated import swiglu_of_product

        return swiglu_of_product(ref)
    if p.beta:
        ref = ref + p.beta * t["c"].double()
    if p.bias == "n":
        ref = ref + t["bias"].double()
    elif p.bias == "m":
        ref = ref + t["bias"].double()[:, None]
    return activations.apply(ref, p.activation)


def run(seed: int = 0, n: int = 2000, *, device: str = "cuda", max_failures: int = 20, **draw) -> FuzzReport:
    """Run `problems(seed, n, **draw)` on `device` and compare each with its float64 reference."""
    import torch

    report = FuzzReport(seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    start = time.perf_counter()
    for p in problems(seed, n, **draw):
        t = inputs(p, gen, device)
        out_numel = (p.batch or 1) * p.m * p.n
        _poison(device, 2 * out_numel + (p.m + p.n) * p.k)
        report.cases += 1
        try:
            out = call(p, t)
            ref = reference(p, t)
            if tuple(out.shape) != tuple(ref.shape) or out.dtype != _dtype(p.out_dtype):
                raise AssertionError(f"result {tuple(out.shape)} {out.dtype}, expected {tuple(ref.shape)} {p.out_dtype}")
            diff = (out.double() - ref)
            finite = bool(torch.isfinite(out).all())
            err, elem = math.inf, math.inf
            if finite:
                err = (diff.norm() / ref.norm().clamp_min(1e-30)).item()
                elem = element_error(p, out, ref)
        except Exception as exc:  # noqa: BLE001 - a raising case is a wrong case; say why
            err, why = math.inf, report.raised(exc)
        else:
            why = "non-finite output" if not finite else \
                f"rel_err {err:.3g}" if err > tolerance(p) else \
                f"max element error {elem:.3g}" if elem > element_tolerance(p) else None
        report.tally(why, err, lambda: dict(problem=p.name, why=why, **asdict(p)), max_failures)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    report.seconds = round(time.perf_counter() - start, 2)
    return report


def trace(seed: int = 0, n: int = 2000, device: str = "cuda") -> None:
    """The calls `run` makes, unchecked (for `runtime.precompile`'s workers)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    for p in problems(seed, n):
        try:
            call(p, inputs(p, gen, device))
        except Exception:  # noqa: BLE001 - `run` reports it; the trace only compiles
            pass


def result(report: FuzzReport, device: str = "cuda"):
    """The `gemm_fuzz` BenchResult: one record with `cases` and `wrong` (ok when none is)."""
    return fuzz_result(report, "gemm_fuzz", "auto", dict(max_size=5000), device,
                       command="pytest -m gpu tests/gemm/test_gemm_fuzz_gpu.py")
