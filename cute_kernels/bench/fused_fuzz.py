"""The fused-kernel fuzz: random problems through the public `cute_kernels.nn.fused_functional` entry
points, forward and every gradient, each against float64 autograd of the textbook formula.

`problems(seed, n)` draws `n` problems deterministically over the six families: RMSNorm and
LayerNorm (weight in the input's dtype or fp32, none, bias, the residual add fused in, Gemma's
offset, an fp32 output, rows that are views of wider rows, 3-D inputs), softmax (widths up to
the streaming regime), cross-entropy (vocabularies up to 128k, ignored labels, label smoothing,
z-loss, every reduction), RoPE (both conventions, partial rotary dims, GQA, both layouts,
position ids or an offset) and SwiGLU (separate or interleaved gate/up). Sizes favour 1, primes
and values next to vector and tile boundaries. `run(seed, n)` poisons the allocator's free
memory with NaN before each call, compares the forward result and every gradient with the
float64 reference by norm-wise relative error and by the largest element error (in units of
the reference's rms), and returns a `FuzzReport` (shared with the GEMM fuzz); `result(report)`
is the `fused_fuzz` benchmark record (`cases`, `wrong`). `trace(seed, n)` makes the same calls
unchecked, for `runtime.precompile`'s workers.

The references are independent of `cute_kernels.fused.reference` (which is also the
`fallback="torch"` implementation): torch's own float64 ops, differentiated by autograd.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass

from .fuzz_record import FuzzReport, fuzz_result
from .fuzz_record import poison as _poison

__all__ = ["Problem", "problems", "run", "trace", "result", "FAMILIES"]

FAMILIES = ("rms", "layer", "softmax", "cross_entropy", "rope", "swiglu")
_SPECIAL = (1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 1023, 1024,
            1025, 2047, 2048, 4095, 4096, 4097, 8191, 8192)
_DTYPES = ("bf16", "fp16", "fp32")
# The bars per dtype (the coarser of the problem's and the result's): a result's rounding is
# about 2^-(mantissa bits + 1) / sqrt(3) norm-wise and at most 2^-mantissa of an element, and
# the kernels round saved 16-bit intermediates (x + residual, a softmax's y) the reference keeps
# exact, which doubles that; each bar is some 3x above. Elements are held to
# |diff| <= bar * (|ref| + rms(ref)): relative for large values, absolute (in units of the
# result's rms) for small ones, so a wrong element of any size costs about 1. `_SUBNORMAL`: fp16
# results below 6e-5 lose precision (a softmax over 250k classes lives there).
_NORM_TOL = {"bf16": 8e-3, "fp16": 1.5e-3, "fp32": 1e-4}
_ELEM_TOL = {"bf16": 2.4e-2, "fp16": 3e-3, "fp32": 2e-4}
_SUBNORMAL = {"bf16": 0.0, "fp16": 2.4e-7, "fp32": 0.0}
_COARSE = {"bf16": 2, "fp16": 1, "fp32": 0}


@dataclass(frozen=True)
class Problem:
    """One fuzz case. rows/width: the flattened problem (tokens x hidden, or x vocab); for RoPE
    rows = batch * seq (batch 1 or 2) and width = head dim. `opts` holds the family's options as
    sorted (name, value) pairs."""

    family: str
    rows: int
    width: int
    dtype: str
    opts: tuple = ()

    @property
    def o(self) -> dict:
        return dict(self.opts)

    @property
    def name(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.opts)
        return f"{self.family}:{self.rows}x{self.width}:{self.dtype}" + (f",{extra}" if extra else "")


def _size(rng: random.Random, hi: int) -> int:
    r = rng.random()
    if r < 0.4:
        return rng.choice([s for s in _SPECIAL if s <= hi])
    if r < 0.6:
        return rng.randint(1, 64)
    return max(1, int(math.exp(rng.uniform(0, math.log(hi)))))


def _draw(rng: random.Random, family: str) -> Problem:
    dtype = rng.choices(_DTYPES, weights=[5, 3, 2])[0]
    opts: dict = {}
    if family in ("rms", "layer"):
        from cute_kernels.fused.dispatch import max_norm_width

        width = _size(rng, 16384)
        opts["weight"] = rng.choice(["same", "same", "fp32", "none"]) if family == "rms" else \
            rng.choice(["same", "same", "none"])
        opts["residual"] = rng.random() < 0.4
        if family == "layer" and opts["weight"] != "none":
            opts["bias"] = rng.random() < 0.7
        if family == "rms" and opts["weight"] != "none":
            opts["offset"] = rng.choice([0.0, 0.0, 1.0])
        opts["out_fp32"] = dtype != "fp32" and rng.random() < 0.2
        opts["row_pad"] = rng.choice([0, 0, 0, 8, 24])
        opts["three_d"] = rng.random() < 0.3
        wdt = {"same": dtype, "fp32": "fp32", "none": None}[opts["weight"]]
        names = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
        widest = max_norm_width(names[dtype], names[wdt] if wdt else None, bias=opts.get("bias", False),
                                residual=opts["residual"])
        width = min(width, widest)
        rows = _size(rng, max(1, min(4096, (1 << 23) // width)))
    elif family == "softmax":
        width = _size(rng, 1 << 17) if rng.random() < 0.8 else rng.randint(100_000, 262_144)
        rows = _size(rng, max(1, min(4096, (1 << 23) // width)))
    elif family == "cross_entropy":
        width = rng.choice([_size(rng, 8192), rng.randint(8193, 131_072), rng.choice([32_000, 128_256 // 2])])
        rows = _size(rng, max(1, min(2048, (1 << 24) // width)))
        opts["ignore"] = rng.choice([0.0, 0.0, 0.1, 1.0]) if rows > 1 else 0.0
        opts["smoothing"] = rng.choice([0.0, 0.0, 0.1])
        opts["z_loss"] = rng.choice([0.0, 0.0, 1e-4])
        # a mean over no valid row is 0/0 in torch too: every label ignored is summed instead
        opts["reduction"] = rng.choice(["sum", "none"] if opts["ignore"] == 1.0 else ["mean", "sum", "none"])
        dtype = rng.choices(_DTYPES, weights=[6, 2, 2])[0]
    elif family == "rope":
        width = rng.choice([32, 64, 64, 80, 96, 128, 128, 256])  # head dim
        opts["rotary"] = rng.choice([width, width, width // 2])
        opts["interleaved"] = rng.random() < 0.3
        opts["layout"] = rng.choice(["bshd", "bshd", "bhsd"])
        opts["heads"] = rng.choice([1, 2, 4, 8])
        opts["kv_heads"] = rng.choice([h for h in (1, 2, 4, 8) if opts["heads"] % h == 0])
        opts["batch"] = rng.choice([1, 2])
        opts["positions"] = rng.choice(["ids", "offset", "offset"])
        opts["tables_fp32"] = rng.random() < 0.7
        rows = opts["batch"] * _size(rng, 2048)
    else:  # swiglu
        width = _size(rng, 16384)
        opts["interleaved"] = rng.random() < 0.35
        rows = _size(rng, max(1, min(4096, (1 << 23) // width)))
    return Problem(family, rows, width, dtype, tuple(sorted(opts.items())))


def problems(seed: int, n: int, families: tuple = FAMILIES) -> list[Problem]:
    """`n` problems drawn from `random.Random(seed)` (the same list in every process), the
    families in turn."""
    rng = random.Random(seed)
    return [_draw(rng, families[i % len(families)]) for i in range(n)]


def _dt(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def inputs(p: Problem, gen, device) -> dict:
    """The problem's tensors, fresh N(0, 1) draws from `gen` (leaves that require grad where the
    entry point differentiates them), plus the output gradient(s)."""
    import torch

    o, dt = p.o, _dt(p.dtype)

    def randn(*shape, dtype=dt, grad=True):
        t = torch.randn(tuple(shape), generator=gen, device=device, dtype=torch.float32).to(dtype)
        return t.requires_grad_(grad)

    t: dict = {}
    if p.family in ("rms", "layer"):
        lead = (2, -(-p.rows // 2)) if o["three_d"] and p.rows > 1 else (p.rows,)
        wide = randn(*lead, p.width + o["row_pad"], grad=False)
        t["x"] = wide[..., :p.width].requires_grad_()  # rows are views of wider rows
        if o["residual"]:
            t["residual"] = randn(*lead, p.width)
        wdt = {"same": dt, "fp32": torch.float32, "none": None}[o["weight"]]
        if wdt is not None:
            t["weight"] = (torch.randn(p.width, generator=gen, device=device) * 0.5 + 1.0).to(wdt).requires_grad_()
        if o.get("bias"):
            t["bias"] = randn(p.width, dtype=wdt)
        t["dy"] = randn(*lead, p.width, dtype=torch.float32 if o["out_fp32"] else dt, grad=False)
        if o["residual"]:
            t["ds"] = randn(*lead, p.width, grad=False)
    elif p.family == "softmax":
        t["x"] = randn(p.rows, p.width)
        t["dy"] = randn(p.rows, p.width, grad=False)
    elif p.family == "cross_entropy":
        t["logits"] = (randn(p.rows, p.width, dtype=torch.float32, grad=False) * 3).to(dt).requires_grad_()
        labels = torch.randint(0, p.width, (p.rows,), generator=gen, device=device)
        ignored = torch.rand(p.rows, generator=gen, device=device) < o["ignore"]
        t["labels"] = torch.where(ignored, torch.full_like(labels, -100), labels)
        t["dloss"] = randn(*((p.rows,) if o["reduction"] == "none" else ()), dtype=torch.float32, grad=False)
    elif p.family == "rope":
        b, s, d = o["batch"], p.rows // o["batch"], p.width
        shape = (lambda h: (b, s, h, d)) if o["layout"] == "bshd" else (lambda h: (b, h, s, d))
        t["q"], t["k"] = randn(*shape(o["heads"])), randn(*shape(o["kv_heads"]))
        positions = s + 37
        from cute_kernels.fused.rope_api import rotary_tables

        cos, sin = rotary_tables(positions, o["rotary"], device=device,
                                 dtype=torch.float32 if o["tables_fp32"] else dt)
        t["cos"], t["sin"] = cos, sin
        if o["positions"] == "ids":
            t["position_ids"] = torch.randint(0, positions, (b, s), generator=gen, device=device)
        else:
            t["offset"] = 37 if s + 37 <= positions else 0
        t["dq"], t["dk"] = randn(*shape(o["heads"]), grad=False), randn(*shape(o["kv_heads"]), grad=False)
    else:
        if o["interleaved"]:
            t["gate"] = randn(p.rows, 2 * p.width)
        else:
            t["gate"], t["up"] = randn(p.rows, p.width), randn(p.rows, p.width)
        t["dy"] = randn(p.rows, p.width, grad=False)
    return t


def _leaves(t: dict) -> list:
    import torch

    return [k for k, v in t.items() if isinstance(v, torch.Tensor) and v.requires_grad]


def call(p: Problem, t: dict, fallback: str = "none"):
    """(outputs, output gradients) of the entry point on `t`: the outputs to compare and the
    gradients to push back through them."""
    import cute_kernels.nn.fused_functional as cf

    o = p.o
    if p.family in ("rms", "layer"):
        out_dtype = _dt("fp32") if o["out_fp32"] else None
        w, b, r = t.get("weight"), t.get("bias"), t.get("residual")
        if p.family == "rms":
            if r is None:
                y = cf.rms_norm(t["x"], p.width, w, 1e-5, offset=o.get("offset", 0.0), out_dtype=out_dtype,
                                fallback=fallback)
                return (y,), (t["dy"],)
            y, s = cf.fused_add_rms_norm(t["x"], r, p.width, w, 1e-5, offset=o.get("offset", 0.0),
                                         out_dtype=out_dtype, fallback=fallback)
            return (y, s), (t["dy"], t["ds"])
        if r is None:
            return (cf.layer_norm(t["x"], p.width, w, b, 1e-5, out_dtype=out_dtype, fallback=fallback),), (t["dy"],)
        y, s = cf.fused_add_layer_norm(t["x"], r, p.width, w, b, 1e-5, out_dtype=out_dtype, fallback=fallback)
        return (y, s), (t["dy"], t["ds"])
    if p.family == "softmax":
        return (cf.softmax(t["x"], -1, fallback=fallback),), (t["dy"],)
    if p.family == "cross_entropy":
        loss = cf.cross_entropy(t["logits"], t["labels"], reduction=o["reduction"], label_smoothing=o["smoothing"],
                                z_loss=o["z_loss"], fallback=fallback)
        return (loss,), (t["dloss"],)
    if p.family == "rope":
        q, k = cf.rotary_embedding(t["q"], t["k"], t["cos"], t["sin"], position_ids=t.get("position_ids"),
                                   offset=t.get("offset", 0), interleaved=o["interleaved"], layout=o["layout"],
                                   fallback=fallback)
        return (q, k), (t["dq"], t["dk"])
    return (cf.swiglu(t["gate"], t.get("up"), interleaved=o["interleaved"], fallback=fallback),), (t["dy"],)


def reference(p: Problem, t: dict):
    """float64 (outputs, output gradients) of the textbook formula on the same tensors (leaves
    detached and promoted, so autograd of the reference never touches the kernel's graph)."""
    import torch
    import torch.nn.functional as F

    o = p.o
    d = {k: (v.detach().double().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor)
             and v.is_floating_point() else v) for k, v in t.items()}
    if p.family in ("rms", "layer"):
        s = d["x"] + d["residual"] if o["residual"] else d["x"]
        w = d.get("weight")
        if p.family == "rms":
            y = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + 1e-5)
            if w is not None:
                y = y * (w + o.get("offset", 0.0))
        else:
            y = F.layer_norm(s, (p.width,), w, d.get("bias"), 1e-5)
        return ((y, s) if o["residual"] else (y,)), d
    if p.family == "softmax":
        return (torch.softmax(d["x"], -1),), d
    if p.family == "cross_entropy":
        x, labels = d["logits"], t["labels"]
        lse = torch.logsumexp(x, -1)
        valid = labels != -100
        safe = torch.where(valid, labels, torch.zeros_like(labels))
        nll = lse - x.gather(-1, safe[:, None]).squeeze(-1)
        eps = o["smoothing"]
        rows = (1 - eps) * nll + eps * (lse - x.mean(-1)) + o["z_loss"] * lse.square()
        rows = torch.where(valid, rows, torch.zeros_like(rows))
        if o["reduction"] == "none":
            return (rows,), d
        total = rows.sum()
        return ((total if o["reduction"] == "sum" else total / valid.sum()),), d
    if p.family == "rope":
        b, rot, il = o["batch"], o["rotary"], o["interleaved"]
        s = p.rows // b
        pos = d.get("position_ids")
        if pos is None:
            pos = (torch.arange(s, device=d["q"].device) + d.get("offset", 0))[None].expand(b, s)
        inv = 10000.0 ** (-torch.arange(0, rot, 2, dtype=torch.float64, device=d["q"].device) / rot)
        ang = pos.double()[..., None] * inv  # (B, S, R/2)
        # the tables as the kernel reads them: rounded to their dtype
        cos = ang.cos().to(t["cos"].dtype).double()[:, :, None]
        sin = ang.sin().to(t["sin"].dtype).double()[:, :, None]

        def rotate(x):
            xb = x if o["layout"] == "bshd" else x.transpose(1, 2)
            part, rest = xb[..., :rot], xb[..., rot:]
            if il:
                a, c = part[..., 0::2], part[..., 1::2]
                new = torch.stack((a * cos - c * sin, c * cos + a * sin), -1).flatten(-2)
            else:
                a, c = part[..., :rot // 2], part[..., rot // 2:]
                new = torch.cat((a * cos - c * sin, c * cos + a * sin), -1)
            out = torch.cat((new, rest), -1)
            return out if o["layout"] == "bshd" else out.transpose(1, 2)

        return (rotate(d["q"]), rotate(d["k"])), d
    g, u = (d["gate"][..., 0::2], d["gate"][..., 1::2]) if o["interleaved"] else (d["gate"], d["up"])
    return (F.silu(g) * u,), d


def _compare(name: str, got, want, dtype_name: str, slack: float = 1.0) -> str | None:
    """Why `got` is not `want` (float64) within the bars of `dtype_name`, or None. A reference
    that is exactly zero (a softmax or LayerNorm row of one element has no gradient) must come
    out zero to rounding of the inputs' scale. `slack` scales the bars (the problem's condition)."""
    import torch

    if got is None:
        return f"{name}: missing"
    if tuple(got.shape) != tuple(want.shape):
        return f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if not bool(torch.isfinite(got).all()):
        return f"{name}: non-finite values"
    want = want.detach()
    if want.numel() and want.abs().max().item() <= 1e-10:  # zero, up to float64 rounding
        worst = got.detach().double().abs().max().item()
        return None if worst <= 1e-5 else f"{name}: {worst:.3g} where the reference is 0"
    diff = (got.detach().double() - want).abs()
    sub = _SUBNORMAL[dtype_name]
    norm = want.norm().item()
    if diff.norm().item() > slack * _NORM_TOL[dtype_name] * norm + sub * want.numel() ** 0.5:
        return f"{name}: rel_err {diff.norm().item() / norm:.3g}"
    if diff.numel():
        rms = want.pow(2).mean().sqrt()
        elem = (diff / (want.abs() + rms + sub / _ELEM_TOL[dtype_name])).max().item()
        if elem > slack * _ELEM_TOL[dtype_name]:
            return f"{name}: element error {elem:.3g} of (|ref| + rms)"
    return None


def _coarser(a: str, b: str) -> str:
    return a if _COARSE[a] >= _COARSE[b] else b


def _dtype_name(t) -> str:
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(t.dtype), "fp32")


def _degenerate(p: Problem) -> bool:
    """Norm rows too narrow for their gradients to be checked against exact arithmetic (their
    forward still is): rows of one (RMSNorm) or two (LayerNorm) elements, whose dx is a
    difference of nearly equal values of size eps / (x^2 + eps); and, with the residual fused
    in, rows under 16 elements, where the stored sum's rounding (which the backward reads, as
    every fused add + norm does) is comparable to the spread of the row."""
    if p.family not in ("rms", "layer"):
        return False
    return p.width < 16 if p.o["residual"] else p.width <= (1 if p.family == "rms" else 2)


def check(p: Problem, t: dict, fallback: str = "none") -> tuple[str | None, float]:
    """(why the entry point is wrong on `t`, or None; the worst norm-wise error seen)."""
    import torch

    leaves = _leaves(t)
    outs, grads_out = call(p, t, fallback)
    got = torch.autograd.grad(outs, [t[k] for k in leaves], grads_out, allow_unused=True)
    refs, d = reference(p, t)
    want = torch.autograd.grad(refs, [d[k] for k in leaves], [g.double() for g in grads_out], allow_unused=True)
    worst, slack = 0.0, 1.0
    if p.family in ("rms", "layer") and p.o["residual"]:
        # The backward reads x + residual as stored (rounded to the residual's dtype) with the
        # statistics of the exact sum, as every fused add + norm does; rounding s moves
        # (s - mean) by up to rms(s) / std(s) times its own relative size (LayerNorm), so the
        # gradient bars grow by that condition number of the worst row (about 1 for rows of
        # Gaussian values, and 1 for RMSNorm, whose mean is 0)
        sd = (t["x"].detach().double() + t["residual"].detach().double()).reshape(-1, p.width)
        if p.family == "layer":
            cond = sd.pow(2).mean(-1).sqrt() / sd.std(-1, unbiased=False).clamp_min(1e-30)
            slack = max(1.0, cond.max().item())
    for i, (a, r) in enumerate(zip(outs, refs)):
        why = _compare(f"output {i}", a, r, _coarser(p.dtype, _dtype_name(a)))
        if why:
            return why, worst
    for k, a, r in zip(leaves, got, want):
        if r is None or (k != "bias" and _degenerate(p)):
            continue
        why = _compare(f"d{k}", a, r, _coarser(p.dtype, _dtype_name(t[k])), slack)
        if why:
            return why, worst
        norm = r.norm().item()
        if norm > 0:  # (a reference of zeros is judged absolutely by _compare: no relative error)
            worst = max(worst, ((a.double() - r).norm() / norm).item())
    return None, worst


def run(seed: int = 0, n: int = 1200, *, device: str = "cuda", fallback: str = "none", max_failures: int = 20,
        families: tuple = FAMILIES) -> FuzzReport:
    """Run `problems(seed, n, families)` on `device` and check each (forward and gradients)."""
    import torch

    report = FuzzReport(seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    start = time.perf_counter()
    for p in problems(seed, n, families):
        t = inputs(p, gen, device)
        if torch.device(device).type == "cuda":
            _poison(device, 6 * p.rows * max(p.width, 1))
        report.cases += 1
        try:
            why, worst = check(p, t, fallback)
        except Exception as exc:  # noqa: BLE001 - a raising case is a wrong case; say why
            why, worst = report.raised(exc), 0.0
        report.tally(why, worst, lambda: dict(problem=p.name, why=why, **asdict(p)), max_failures)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    report.seconds = round(time.perf_counter() - start, 2)
    return report


def trace(seed: int = 0, n: int = 1200, device: str = "cuda") -> None:
    """The calls `run` makes, forward and backward, unchecked (for `runtime.precompile`)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    for p in problems(seed, n):
        try:
            t = inputs(p, gen, device)
            outs, grads_out = call(p, t)
            torch.autograd.grad(outs, [t[k] for k in _leaves(t)], grads_out, allow_unused=True)
        except Exception:  # noqa: BLE001 - `run` reports it; the trace only compiles
            pass


def result(report: FuzzReport, device: str = "cuda"):
    """The `fused_fuzz` BenchResult: one record with `cases` and `wrong` (ok when none is)."""
    return fuzz_result(report, "fused_fuzz", "cute_kernels", dict(families=list(FAMILIES)), device,
                       command="pytest -m gpu tests/fused/test_fused_fuzz_gpu.py")
