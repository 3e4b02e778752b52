"""A Llama-style Transformer block, forward and backward, in three versions that must agree.

The block (one definition, plain PyTorch): x -> x + Attention(RMSNorm(x)) -> h + SwiGLU(RMSNorm(h)),
where Attention projects q, k, v with one fused bias-free nn.Linear, rotates q and k (RoPE),
runs causal grouped-query attention through `F.scaled_dot_product_attention(is_causal=True,
enable_gqa=True)` and projects back with nn.Linear; SwiGLU is down(silu(gate(x)) * up(x)) with
gate and up fused in one nn.Linear.

The versions, all on the same weights and inputs:
- `eager`: the block as written;
- `torch_compile`: `torch.compile(block)`;
- `cute_kernels`: a structural copy of the block sharing its parameters, routed by
  `cute_kernels.nn.patch` (its nn.Linear layers become `cute_kernels.nn.Linear`, its SDPA calls
  go to `cute_kernels::sdpa`, whose backward is `cute_kernels::sdpa_backward`), then
  `torch.compile(fullgraph=True)`: Inductor compiles the norms, RoPE and SwiGLU glue around our
  GEMM and attention kernels;
- `cute_kernels_fused`: the same block computed with our fused kernels throughout, in eager mode
  (`FusedBlock`): our RMSNorm, RoPE, attention, the residual add fused into the second norm, and
  the gate/up GEMM gating in its epilogue (`linear_swiglu`, the block's [gate; up] weight
  interleaved in the forward, a differentiable copy of 2I x H elements).

Each is checked against an fp32 eager reference (output, input gradient and every weight
gradient, by relative Frobenius error), then forward+backward is timed interleaved in one process
and the results are written as the `transformer` suite of the benchmark JSON schema
(`cute_kernels.bench.records`) with its plot.

    python examples/transformer_block.py                       # the issue's config, on CUDA
    python examples/transformer_block.py --tiny --device cpu   # plumbing check, seconds

On CPU our ops run with fallback="torch" (PyTorch computes what our CUDA kernels would): that
run checks routing, autograd through the custom ops and compiling with no graph break, not our
kernels' numerics or speed.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import math
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from cute_kernels.bench.records import BenchResult

VERSIONS = ("eager", "torch_compile", "cute_kernels", "cute_kernels_fused")
OURS = "cute_kernels"  # every version whose name starts with it is ours
SUITE = "transformer"
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Relative Frobenius error against the fp32 reference. bf16 rounds each stored activation to
# 2^-9 relative; through the block's ~10 rounded stages and a backward that re-reads them the
# output lands near 1e-2 and the gradients a little above.
TOLERANCE = {"bf16": 3e-2, "fp16": 1e-2, "fp32": 1e-4}


# ---- configuration -----------------------------------------------------------------------------

@dataclass(frozen=True)
class BlockConfig:
    """Shape of one block and its input: batch x seq tokens of width `hidden`, `heads` query heads
    sharing `kv_heads` key/value heads (head_dim = hidden / heads), MLP width `intermediate`."""

    batch: int = 8
    seq: int = 4096
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    rope_theta: float = 500000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        for name in ("batch", "seq", "hidden", "heads", "kv_heads", "intermediate"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"BlockConfig.{name} must be a positive int, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"BlockConfig: hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"BlockConfig: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"BlockConfig: head_dim ({self.head_dim}) must be even for rotary embeddings")
        if not (self.rope_theta > 0 and self.eps > 0):
            raise ValueError(f"BlockConfig: rope_theta and eps must be positive, got {self.rope_theta}, {self.eps}")

    @property
    def name(self) -> str:
        """The benchmark case name."""
        return (f"B{self.batch}_S{self.seq}_H{self.hidden}_h{self.heads}_kv{self.kv_heads}"
                f"_I{self.intermediate}")


ISSUE_CONFIG = BlockConfig()
TINY_CONFIG = BlockConfig(batch=2, seq=16, hidden=64, heads=4, kv_heads=2, intermediate=96)


def block_flops(config: BlockConfig) -> dict[str, float]:
    """FLOPs of one forward+backward of the block, counting only its matmuls and attention.

    - linear layers: a forward GEMM costs 2 FLOPs per multiply-add, so 2·tokens·params; the
      backward computes dX and dW, each the same size, so fwd+bwd = 6·tokens·params, where
      params = hidden·(heads + 2·kv_heads)·head_dim (qkv) + heads·head_dim·hidden (o)
      + hidden·2·intermediate (gate, up) + intermediate·hidden (down);
    - attention (causal): QKᵀ and PV are each 2·B·heads·S²·D forward when unmasked, so
      4·B·heads·S²·D, of which the causal mask keeps half; the backward recomputes QKᵀ and
      computes dV, dP, dQ, dK (five such products against the forward's two), 2.5× the forward.

    Norms, RoPE, softmax and SwiGLU's elementwise work are not counted (the usual convention, so
    TFLOP/s compares with GEMM and attention figures). Returns {"linear", "attention", "total"}.
    """
    config.validate()
    d, tokens = config.head_dim, config.batch * config.seq
    params = (config.hidden * (config.heads + 2 * config.kv_heads) * d + config.heads * d * config.hidden
              + config.hidden * 2 * config.intermediate + config.intermediate * config.hidden)
    linear = 6.0 * tokens * params
    attention_fwd = 0.5 * 4.0 * config.batch * config.heads * config.seq ** 2 * d
    attention = attention_fwd * (1.0 + 2.5)
    return {"linear": linear, "attention": attention, "total": linear + attention}


def block_bytes(config: BlockConfig, element_bytes: int) -> float:
    """A lower bound on the HBM bytes of one forward+backward (for the roofline): the weights
    read by the forward and again by the backward, their gradients written, and x, the output,
    the output gradient and the input gradient each moved once. Activations kept between the
    passes are not counted (how many a version keeps is its own choice)."""
    d, tokens = config.head_dim, config.batch * config.seq
    params = (config.hidden * (config.heads + 2 * config.kv_heads) * d + config.heads * d * config.hidden
              + 3 * config.hidden * config.intermediate + 2 * config.hidden)
    return float(element_bytes * (3 * params + 4 * tokens * config.hidden))


# ---- the block -----------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dim, computed in fp32 and returned in x's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(seq: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (seq, head_dim / 2), fp32: position p, pair i turns by p·theta^(-2i/head_dim)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """Rotate the halves (x1, x2) of x (B, S, H, D) by the angles of its position, in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary embeddings; q, k, v from one projection."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        self.qkv = nn.Linear(config.hidden, (config.heads + 2 * config.kv_heads) * config.head_dim, bias=False)
        self.o = nn.Linear(config.heads * config.head_dim, config.hidden, bias=False)
        cos, sin = rope_tables(config.seq, config.head_dim, config.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        hq, hk, d = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv(x).split((hq * d, hk * d, hk * d), dim=-1)
        cos, sin = self.cos[:s], self.sin[:s]
        q = apply_rope(q.view(b, s, hq, d), cos, sin)
        k = apply_rope(k.view(b, s, hk, d), cos, sin)
        v = v.view(b, s, hk, d)
        # (B, S, H, D) viewed as (B, H, S, D): the head dim stays contiguous, no copy.
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=True)
        return self.o(o.transpose(1, 2).reshape(b, s, hq * d))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up as one projection."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.gate_up = nn.Linear(config.hidden, 2 * config.intermediate, bias=False)
        self.down = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    """Pre-norm Llama block: h = x + attn(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.attn_norm = RMSNorm(config.hidden, config.eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.hidden, config.eps)
        self.mlp = SwiGLU(config)

    def forward(self, x):
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.mlp_norm(h))


def build_block(config: BlockConfig, *, device: str, dtype: torch.dtype, seed: int = 0) -> TransformerBlock:
    """The block with seeded weights on `device` in `dtype`: every Linear weight N(0,1)/sqrt(fan_in)
    (the scale of real initializations, so activations stay O(1)), every norm weight
    1 + 0.1·N(0,1) (not all ones, so its gradient path is exercised). Drawn on the CPU in fp32,
    so a seed gives the same weights on every device."""
    gen = torch.Generator().manual_seed(seed)
    block = TransformerBlock(config)
    with torch.no_grad():
        for module in block.modules():
            if isinstance(module, nn.Linear):
                w = torch.randn(module.weight.shape, generator=gen) / math.sqrt(module.in_features)
                module.weight.copy_(w)
            elif isinstance(module, RMSNorm):
                module.weight.copy_(1.0 + 0.1 * torch.randn(module.weight.shape, generator=gen))
    # Only parameters take the dtype; the RoPE tables stay fp32.
    block.to(device=device)
    for p in block.parameters():
        p.data = p.data.to(dtype)
    return block


def make_inputs(config: BlockConfig, *, device: str, dtype: torch.dtype, seed: int = 1):
    """(x, grad_out): N(0,1) input (requires grad) and output gradient, (batch, seq, hidden)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (config.batch, config.seq, config.hidden)
    x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    grad_out = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    return x, grad_out


class FusedBlock(nn.Module):
    """`block`'s function on our fused kernels (the module docstring's `cute_kernels_fused`),
    reading `block`'s own parameters, so gradients land on them as the other versions'."""

    def __init__(self, block: TransformerBlock, fallback: str = "none"):
        super().__init__()
        self.block, self.fallback = block, fallback

    def forward(self, x):
        import cute_kernels.nn.functional as cf
        import cute_kernels.nn.fused_functional as ff
        from cute_kernels.gemm.gated import interleave_gate_up

        blk, fb = self.block, self.fallback
        attn, cfg = blk.attn, blk.config
        b, s, hidden = x.shape
        hq, hk, d = attn.heads, attn.kv_heads, attn.head_dim
        y = ff.rms_norm(x, (hidden,), blk.attn_norm.weight, cfg.eps, fallback=fb)
        q, k, v = cf.linear(y, attn.qkv.weight, fallback=fb).split((hq * d, hk * d, hk * d), dim=-1)
        q, k = ff.rotary_embedding(q.reshape(b, s, hq, d), k.reshape(b, s, hk, d), attn.cos[:s], attn.sin[:s],
                                   fallback=fb)
        o = cf.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                            v.reshape(b, s, hk, d).transpose(1, 2), is_causal=True,
                                            enable_gqa=True, fallback=fb)
        a = cf.linear(o.transpose(1, 2).reshape(b, s, hq * d), attn.o.weight, fallback=fb)
        y, h = ff.fused_add_rms_norm(a, x, (hidden,), blk.mlp_norm.weight, cfg.eps, fallback=fb)
        w_gate, w_up = blk.mlp.gate_up.weight.chunk(2, dim=0)
        g = ff.linear_swiglu(y, interleave_gate_up(w_gate, w_up), fallback=fb)
        return h + cf.linear(g, blk.mlp.down.weight, fallback=fb)


def shared_copy(block: nn.Module) -> nn.Module:
    """A structural copy of `block` holding the very same Parameter and buffer objects."""
    memo = {id(t): t for t in (*block.parameters(), *block.buffers())}
    return copy.deepcopy(block, memo)


def make_versions(block: TransformerBlock, *, device: str, backend: str = "inductor",
                  gemm_kernel: str = "auto") -> dict[str, nn.Module]:
    """The versions of `block` (see the module docstring), all on its parameters.
    `cute_kernels` raises for any input our kernels refuse on CUDA (fallback="none"); on CPU
    it uses fallback="torch", so PyTorch computes our ops' calls (plumbing only). `gemm_kernel`
    is the GEMM rung of its linear layers ("auto": the dispatcher's pick)."""
    import cute_kernels.nn as cnn

    fallback = "none" if device.startswith("cuda") else "torch"
    ours = cnn.patch(shared_copy(block), kernel=gemm_kernel, fallback=fallback)
    return {
        "eager": block,
        "torch_compile": torch.compile(shared_copy(block), backend=backend),
        OURS: torch.compile(ours, backend=backend, fullgraph=True),
        "cute_kernels_fused": FusedBlock(block, fallback=fallback),
    }


# ---- forward + backward, agreement -------------------------------------------------------------

def forward_backward(model: nn.Module, x, grad_out, params):
    """(out, grad_x, *grad_params) of one forward and backward; grads returned, not accumulated."""
    out = model(x)
    grads = torch.autograd.grad(out, (x, *params), grad_out)
    return (out, *grads)


def reference(block: TransformerBlock, x, grad_out, *, chunk: int) -> list[torch.Tensor]:
    """The fp32 eager (out, grad_x, *grad_params), computed `chunk` sequences at a time (the
    sequences are independent; weight gradients sum over them) so fp32 math attention fits."""
    ref = copy.deepcopy(block).float()
    params = list(ref.parameters())
    outs, gxs, gparams = [], [], [torch.zeros_like(p) for p in params]
    for xc, gc in zip(x.detach().float().split(chunk), grad_out.float().split(chunk)):
        out, gx, *gp = forward_backward(ref, xc.requires_grad_(True), gc, params)
        outs.append(out.detach())
        gxs.append(gx)
        for acc, g in zip(gparams, gp):
            acc += g
    return [torch.cat(outs), torch.cat(gxs), *gparams]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (Frobenius); inf when got is not finite."""
    g, w = got.detach().double(), want.detach().double()
    if not torch.isfinite(g).all():
        return math.inf
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


def tensor_names(block: TransformerBlock) -> list[str]:
    return ["out", "grad_x", *(f"grad_{name}" for name, _ in block.named_parameters())]


def check_agreement(block: TransformerBlock, versions: dict[str, nn.Module], x, grad_out, *,
                    chunk: int, failures: dict[str, str] | None = None) -> dict[str, dict[str, float]]:
    """{version: {tensor: relative error vs the fp32 reference}} for the output, the input
    gradient and every weight gradient; outputs are fresh each call (nothing reused).
    A version that raises propagates the error, or, when a `failures` dict is given, gets inf
    errors and its exception text in `failures[version]`."""
    want = reference(block, x, grad_out, chunk=chunk)
    names = tensor_names(block)
    params = list(block.parameters())
    errors = {}
    for name, model in versions.items():
        try:
            got = forward_backward(model, x, grad_out, params)
        except Exception as err:
            if failures is None:
                raise
            failures[name] = f"{type(err).__name__}: {err}"
            errors[name] = dict.fromkeys(names, math.inf)
            continue
        errors[name] = {t: rel_err(g, w) for t, g, w in zip(names, got, want)}
        del got
    return errors


# ---- timing and results --------------------------------------------------------------------------

def time_versions(versions: dict[str, nn.Module], x, grad_out, params, *, device: str, rounds: int):
    """{version: Timing} of forward+backward, interleaved round-robin in this process (each
    version compiled and warmed up first): do_bench / CUDA-event medians on CUDA, wall clock on CPU."""
    from cute_kernels.bench.timing import interleaved, make_gpu_timer, wall_clock_timer

    fns = {name: (lambda m=model: forward_backward(m, x, grad_out, params)) for name, model in versions.items()}
    for fn in fns.values():  # compile and warm the allocator outside the timed region
        fn()
    # A block step takes tens of ms at the issue's size: 500 ms per round is about five calls.
    timer = make_gpu_timer(warmup_ms=100.0, rep_ms=500.0) if device.startswith("cuda") else wall_clock_timer()
    return interleaved(fns, timer, rounds), timer.backend


def build_result(config: BlockConfig, dtype_name: str, device_label: str, errors, timings, *,
                 settings: dict, failures: dict[str, str] | None = None) -> BenchResult:
    """The `transformer` suite result: one record per version, tflops from `block_flops`.
    A version that raised or missed the tolerance has ok=False and no timing (ms, tflops null)."""
    failures = failures or {}
    from cute_kernels.bench.environment import versions as env_versions
    from cute_kernels.bench.records import BenchResult, Record
    from cute_kernels.bench.runner import fill_ratios

    flops = block_flops(config)
    nbytes = block_bytes(config, ELEMENT_BYTES[dtype_name])
    tol = TOLERANCE[dtype_name]
    records = []
    for name, errs in errors.items():
        worst_name, worst = max(errs.items(), key=lambda kv: kv[1])
        ok = name not in failures and math.isfinite(worst) and worst <= tol
        t = timings.get(name) if ok else None
        error = failures.get(name) or (None if ok else f"{worst_name} rel_err {worst:.3g} > {tol:g}")
        records.append(Record(
            case=config.name, impl=name, dtype=dtype_name, kind="ours" if name.startswith(OURS) else "peer",
            ms=t.median if t else None, tflops=flops["total"] / (t.median * 1e9) if t else None,
            rel_err=worst if math.isfinite(worst) else None, ok=ok, tolerance=tol, flops=flops["total"],
            bytes=nbytes, spread=t.spread if t else None, p20_ms=t.p20 if t else None,
            p80_ms=t.p80 if t else None, rounds=len(t.samples) if t else None, error=error,
            extra={"rel_errs": {k: (v if math.isfinite(v) else None) for k, v in errs.items()},
                   "flops_linear": flops["linear"], "flops_attention": flops["attention"]},
        ))
    fill_ratios(records)
    now = datetime.datetime.now(datetime.timezone.utc)
    device_kind = "cpu" if device_label == "cpu" else "cuda"
    return BenchResult(date=now.strftime("%Y-%m-%d"), timestamp=now.isoformat(timespec="seconds"),
                       device=device_label, versions=env_versions(device_kind), suite=SUITE, records=records,
                       settings={**settings, "config": asdict(config)})


def write_result(result, out_dir: Path) -> tuple[Path, Path]:
    """Write `<date>-transformer-<device>.json` (validated) and its .png under `out_dir`."""
    from cute_kernels.bench.plot import plot_result
    from cute_kernels.bench.records import result_stem

    stem = result_stem(result.date, result.suite, result.device)
    json_path = result.write(out_dir / f"{stem}.json")
    return json_path, plot_result(result, out_dir / f"{stem}.png")


# ---- command line --------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("batch", "seq", "hidden", "heads", "kv_heads", "intermediate"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                       help=f"default {getattr(ISSUE_CONFIG, name)} ({getattr(TINY_CONFIG, name)} with --tiny)")
    p.add_argument("--tiny", action="store_true", help="a small config that runs in seconds (CI, CPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    p.add_argument("--dtype", default="bf16", choices=sorted(TOLERANCE))
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the results JSON and plot go (default docs/results on CUDA; none on CPU, "
                        "whose timings mean nothing)")
    p.add_argument("--check-only", action="store_true", help="check agreement, time nothing, write nothing")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--backend", default="inductor", help="torch.compile backend for both compiled versions")
    p.add_argument("--gemm-kernel", default="auto", help="GEMM rung of our linear layers (default: auto)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def config_from_args(args: argparse.Namespace) -> BlockConfig:
    base = TINY_CONFIG if args.tiny else ISSUE_CONFIG
    fields = {k: getattr(args, k) for k in ("batch", "seq", "hidden", "heads", "kv_heads", "intermediate")
              if getattr(args, k) is not None}
    config = BlockConfig(**{**asdict(base), **fields})
    config.validate()
    return config


def run(args: argparse.Namespace):
    """Build, check, time and (optionally) write; returns (errors, result or None, paths)."""
    from cute_kernels.bench.cases import torch_dtype
    from cute_kernels.bench.table import format_table
    from cute_kernels.ops import FALLBACK_COUNTS, FallbackWarning

    config = config_from_args(args)
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; use --device cpu (plumbing check only)")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise SystemExit(f"--device must be cuda or cpu, got {device!r}")
    dtype = torch_dtype(args.dtype)
    on_cpu = device == "cpu"
    flops = block_flops(config)
    print(f"block {config.name} {args.dtype} on {device}: {flops['total'] / 1e12:.2f} TFLOP per fwd+bwd "
          f"(linear {flops['linear'] / 1e12:.2f}, attention {flops['attention'] / 1e12:.2f})")

    block = build_block(config, device=device, dtype=dtype, seed=args.seed)
    x, grad_out = make_inputs(config, device=device, dtype=dtype, seed=args.seed + 1)
    versions = make_versions(block, device=device, backend=args.backend, gemm_kernel=args.gemm_kernel)
    before = dict(FALLBACK_COUNTS)
    with warnings.catch_warnings():
        # On CPU every call of ours falls back by design; the counts below say so instead.
        warnings.simplefilter("ignore" if on_cpu else "error", FallbackWarning)
        failures: dict[str, str] = {}
        errors = check_agreement(block, versions, x, grad_out, chunk=config.batch if on_cpu else 1,
                                 failures=failures)
        tol = TOLERANCE[args.dtype]
        print(f"relative error vs fp32 eager (tolerance {tol:g}):")
        for name, errs in errors.items():
            if name in failures:
                print(f"  {name:14s} FAILED: {failures[name]}")
                continue
            worst = max(errs, key=errs.get)
            print(f"  {name:14s} out {errs['out']:.2e}  grad_x {errs['grad_x']:.2e}  worst {worst} {errs[worst]:.2e}")
        routed = {k: v - before.get(k, 0) for k, v in FALLBACK_COUNTS.items() if v != before.get(k, 0)}
        if on_cpu:
            ops = sorted({op for op, _ in routed})
            print(f"  cute_kernels ops called (computed by PyTorch on CPU, fallback='torch'): {', '.join(ops)}")
        if args.check_only:
            return errors, None, ()
        passed = {n: m for n, m in versions.items() if n not in failures and max(errors[n].values()) <= tol}
        timings, timer_name = time_versions(passed, x, grad_out, list(block.parameters()), device=device,
                                            rounds=args.rounds)
    device_label = "cpu" if on_cpu else torch.cuda.get_device_name(torch.device(device))
    command = " ".join(["python examples/transformer_block.py", *getattr(args, "argv", [])])
    result = build_result(config, args.dtype, device_label, errors, timings, failures=failures,
                          settings={"timer": timer_name, "rounds": args.rounds, "backend": args.backend,
                                    "gemm_kernel": args.gemm_kernel,
                                    "command": command, "seed": args.seed})
    print(format_table(result.records))
    out_dir = args.out_dir if args.out_dir is not None else (None if on_cpu else Path("docs/results"))
    paths = write_result(result, out_dir) if out_dir is not None else ()
    for path in paths:
        print(f"wrote {path}")
    return errors, result, paths


def main(argv=None) -> int:
    args = parse_args(argv)
    errors, result, _ = run(args)
    tol = TOLERANCE[args.dtype]
    bad = [name for name, errs in errors.items() if not max(errs.values()) <= tol]
    if bad:
        print(f"FAILED: {', '.join(bad)} disagree with the fp32 reference beyond {tol:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
    sys.exit(main())
