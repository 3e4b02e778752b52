"""Host overhead of the layers a model calls: `cute_kernels.nn.Linear` beside `torch.nn.Linear`, and
`cute_kernels.nn.functional.scaled_dot_product_attention` beside F.scaled_dot_product_attention,
per warm call, forward alone and forward + backward (`bench.overhead` times them).

Cases (bf16), named `linear_<label>_<M>x<N>x<K>[_bias]/<mode>` and `sdpa_B.._H.._S.._D../<mode>`:
- Linear: `square` 256³ with bias; `decode` (8 x 4096) . 4096 (a decode step's projection); `vit`
  (64 x 197 = 12608 x 768) . 3072 with bias (ViT-B/16's MLP, batch 64); `llama` (4 x 2048 = 8192 x
  2048) . 2048 (a 1B-class Llama projection, batch 4 x 2048 tokens). The input keeps its 3-D
  (batch, tokens, features) shape where the model has one.
- SDPA: B1 H8 S256 D64 and ViT-B/16's B64 H12 S197 D64, separate contiguous tensors; and ViT's
  shape as a ViT block holds it (`_vit`: q, k, v views of one projection, the output gradient in
  (B, S, H, D) storage).
- Norms, `norm_<kind>_<label>_<rows>x<width>/<mode>`: LayerNorm with weight and bias over ViT-B/16's
  (64 x 197) x 768 tokens, RMSNorm over a 1B-class Llama's (4 x 2048) x 2048 and over a decode
  step's 8 x 4096 (`cute_kernels.nn.LayerNorm` / `RMSNorm.from_module` beside the torch modules).
Modes: `fwd` is one call under torch.no_grad() (what inference pays, weights requiring grad as a
model's do); `fwd_bwd` is the call with autograd, then torch.autograd.grad of the output for a
fixed gradient (dx and dW, db; dq, dk, dv), the result checked being dx (dq). Impls: `stock`
(torch) and `cute_kernels`, the same module objects (`Linear.from_linear` shares the weights).

`compile_checks()`: a block (Linear, SDPA, Linear) under torch.compile(fullgraph=True), stock and
patched, over two sequence lengths marked dynamic: records whether it compiled as one graph
without a recompile (`graph_breaks`, `frames`), and its agreement with eager.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cute_kernels.bench.cases import TOLERANCE, _fp32_highest, _generator, _randn, torch_dtype
from cute_kernels.bench.impls import Impl, Prepared
from cute_kernels.bench.records import Record

MODES = ("fwd", "fwd_bwd")
# Host-timed calls per round: backward cases enqueue several kernels per call, and a full launch
# queue would block the host on the sleeping GPU (the round then counts as drained).
CALLS = {"fwd": 200, "fwd_bwd": 50}


class _LayerCase:
    """What every layer case derives the same way from its `dtype` and `mode`; a case's
    `grad_tolerance` widens the tolerance of its forward + backward mode (gradients through
    softmax and normalization round more than one product)."""

    grad_tolerance = 1

    @property
    def result_dtype(self) -> str:
        return self.dtype

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype] * (self.grad_tolerance if self.mode == "fwd_bwd" else 1)

    @property
    def calls(self) -> int:
        return CALLS[self.mode]


@dataclass(frozen=True)
class LinearCase(_LayerCase):
    """y = x Wᵀ (+ b): x (*lead, k), W (n, k)."""

    label: str
    lead: tuple
    k: int
    n: int
    bias: bool
    mode: str = "fwd"
    dtype: str = "bf16"

    family = "linear"

    @property
    def m(self) -> int:
        return math.prod(self.lead)

    @property
    def name(self) -> str:
        return f"linear_{self.label}_{self.m}x{self.n}x{self.k}{'_bias' if self.bias else ''}/{self.mode}"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * (3 if self.mode == "fwd_bwd" else 1)

    @property
    def bytes(self) -> float:
        return 2.0 * (self.m * self.k + self.n * self.k + self.m * self.n)

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        import torch

        gen = _generator(device, seed)
        w = _randn((self.n, self.k), self.dtype, device, gen) / math.sqrt(self.k)
        inputs = {"x": _randn((*self.lead, self.k), self.dtype, device, gen), "w": w,
                  "b": _randn((self.n,), self.dtype, device, gen) if self.bias else None,
                  "g": _randn((*self.lead, self.n), self.dtype, device, gen)}
        layer = torch.nn.Linear(self.k, self.n, bias=self.bias, device=device, dtype=torch_dtype(self.dtype))
        with torch.no_grad():
            layer.weight.copy_(w)
            if self.bias:
                layer.bias.copy_(inputs["b"])
        inputs["layer"] = layer
        return inputs

    @staticmethod
    def ours(layer):
        from cute_kernels.nn import Linear

        return Linear.from_linear(layer)

    def reference(self, inputs: dict[str, Any]):
        import torch

        with _fp32_highest():
            if self.mode == "fwd_bwd":
                return inputs["g"].float() @ inputs["w"].float()  # dx
            y = inputs["x"].float() @ inputs["w"].float().T
            return y if inputs["b"] is None else y + inputs["b"].float()


@dataclass(frozen=True)
class SdpaCase(_LayerCase):
    """Attention of q, k, v (b, h, s, d), no mask. layout "bhsd": q, k, v and the output
    gradient contiguous tensors of their own; "vit": as a ViT block holds them, q, k, v views of
    one (b, s, 3, h, d) projection output (the gradient taken for it) and the output gradient in
    (b, s, h, d) storage (what the output projection hands back)."""

    b: int
    h: int
    s: int
    d: int
    mode: str = "fwd"
    dtype: str = "bf16"
    layout: str = "bhsd"

    family = "sdpa"
    grad_tolerance = 2

    @property
    def name(self) -> str:
        tag = "" if self.layout == "bhsd" else f"_{self.layout}"
        return f"sdpa_B{self.b}_H{self.h}_S{self.s}_D{self.d}{tag}/{self.mode}"

    @property
    def flops(self) -> float:
        return 4.0 * self.b * self.h * self.s * self.s * self.d * (3.5 if self.mode == "fwd_bwd" else 1)

    @property
    def bytes(self) -> float:
        return 8.0 * self.b * self.h * self.s * self.d

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        gen = _generator(device, seed)
        shape = (self.b, self.h, self.s, self.d)
        if self.layout == "bhsd":
            return {n: _randn(shape, self.dtype, device, gen) for n in ("q", "k", "v", "g")}
        qkv = _randn((self.b, self.s, 3, self.h, self.d), self.dtype, device, gen)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        g = _randn((self.b, self.s, self.h, self.d), self.dtype, device, gen).transpose(1, 2)
        return {"qkv": qkv, "q": q, "k": k, "v": v, "g": g}

    def reference(self, inputs: dict[str, Any]):
        import torch

        q, k, v = (inputs[n].float().requires_grad_(self.mode == "fwd_bwd") for n in ("q", "k", "v"))
        with _fp32_highest(), torch.enable_grad():
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.d)
            out = torch.softmax(scores, dim=-1) @ v
            if self.mode == "fwd_bwd":
                return torch.autograd.grad(out, q, inputs["g"].float())[0]
        return out.detach()


@dataclass(frozen=True)
class NormCase(_LayerCase):
    """A torch.nn.LayerNorm (weight and bias) or torch.nn.RMSNorm (weight) over x (*lead, width)."""

    kind: str  # "layer" or "rms"
    label: str
    lead: tuple
    width: int
    mode: str = "fwd"
    dtype: str = "bf16"

    family = "norm"
    grad_tolerance = 2

    @property
    def name(self) -> str:
        return f"norm_{self.kind}_{self.label}_{math.prod(self.lead)}x{self.width}/{self.mode}"

    @property
    def flops(self) -> float:
        return 8.0 * math.prod(self.lead) * self.width

    @property
    def bytes(self) -> float:
        return 2.0 * 2 * math.prod(self.lead) * self.width * (2 if self.mode == "fwd_bwd" else 1)

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        import torch

        gen = _generator(device, seed)
        dt = torch_dtype(self.dtype)
        layer = torch.nn.LayerNorm(self.width, device=device, dtype=dt) if self.kind == "layer" else \
            torch.nn.RMSNorm(self.width, eps=1e-6, device=device, dtype=dt)
        with torch.no_grad():  # weights away from their initial ones and zeros
            for p in layer.parameters():
                p.copy_(_randn(p.shape, self.dtype, device, gen) * 0.5 + 1.0)
        return {"x": _randn((*self.lead, self.width), self.dtype, device, gen),
                "g": _randn((*self.lead, self.width), self.dtype, device, gen), "layer": layer}

    def ours(self, layer):
        from cute_kernels.nn import norms

        return (norms.LayerNorm if self.kind == "layer" else norms.RMSNorm).from_module(layer)

    def reference(self, inputs: dict[str, Any]):
        import torch

        layer = inputs["layer"]
        x = inputs["x"].double().requires_grad_(self.mode == "fwd_bwd")
        w = layer.weight.double()
        with torch.enable_grad():
            if self.kind == "layer":
                y = torch.nn.functional.layer_norm(x, (self.width,), w, layer.bias.double(), layer.eps)
            else:
                y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + layer.eps) * w
            if self.mode == "fwd_bwd":
                return torch.autograd.grad(y, x, inputs["g"].double())[0].float()
        return y.detach().float()


LINEAR_CASES = tuple(LinearCase(label, lead, k, n, bias, mode) for label, lead, k, n, bias in (
    ("square", (256,), 256, 256, True),
    ("decode", (8,), 4096, 4096, False),
    ("vit", (64, 197), 768, 3072, True),
    ("llama", (4, 2048), 2048, 2048, False),
) for mode in MODES)
SDPA_CASES = tuple(SdpaCase(b, h, s, d, mode, layout=layout) for b, h, s, d, layout in (
    (1, 8, 256, 64, "bhsd"), (64, 12, 197, 64, "bhsd"), (64, 12, 197, 64, "vit")) for mode in MODES)
NORM_CASES = tuple(NormCase(kind, label, lead, width, mode) for kind, label, lead, width in (
    ("layer", "vit", (64, 197), 768),
    ("rms", "llama", (4, 2048), 2048),
    ("rms", "decode", (8,), 4096),
) for mode in MODES)


def _module_prepare(ours: bool):
    """A layer case whose inputs hold a torch module (`layer`), x and the output gradient g: the
    module itself, or with `ours` the case's `ours(layer)` sharing its parameters."""
    def prepare(case, inputs) -> Prepared:
        import torch

        layer = case.ours(inputs["layer"]) if ours else inputs["layer"]
        x, g = inputs["x"], inputs["g"]
        if case.mode == "fwd":
            def fn():
                with torch.no_grad():
                    return layer(x)
            return Prepared(fn)
        xg = x.detach().requires_grad_()
        wrt = (xg, *layer.parameters())

        def fn():
            return torch.autograd.grad(layer(xg), wrt, g)[0]
        return Prepared(fn)
    return prepare


def _sdpa_prepare(ours: bool):
    def prepare(case: SdpaCase, inputs) -> Prepared:
        import torch

        if ours:
            from cute_kernels.nn.functional import scaled_dot_product_attention as sdpa
        else:
            sdpa = torch.nn.functional.scaled_dot_product_attention
        q, k, v, g = (inputs[n] for n in ("q", "k", "v", "g"))
        if case.mode == "fwd":
            def fn():
                with torch.no_grad():
                    return sdpa(q, k, v)
            return Prepared(fn)
        if case.layout == "vit":  # the gradient of the projection the views share; dq checked
            leaf = inputs["qkv"].detach().requires_grad_()

            def fn():
                d_qkv = torch.autograd.grad(sdpa(*leaf.permute(2, 0, 3, 1, 4).unbind(0)), leaf, g)[0]
                return d_qkv[:, :, 0].transpose(1, 2)
            return Prepared(fn)
        qkv = tuple(t.detach().requires_grad_() for t in (q, k, v))

        def fn():
            return torch.autograd.grad(sdpa(*qkv), qkv, g)[0]
        return Prepared(fn)
    return prepare


def _ours_available() -> str | None:
    try:
        import cute_kernels.nn  # noqa: F401
    except ImportError as err:
        return f"cute_kernels.nn does not import: {err}"
    return None


def layer_impls() -> dict[Any, dict[str, Impl]]:
    """case -> {impl: Impl} for the layer cases (`overhead.overhead_impls` adds them)."""
    impls: dict[Any, dict[str, Impl]] = {}
    for cases, prepare in ((LINEAR_CASES, _module_prepare), (SDPA_CASES, _sdpa_prepare),
                           (NORM_CASES, _module_prepare)):
        for case in cases:
            impls[case] = {"stock": Impl("stock", "peer", prepare(False)),
                           "cute_kernels": Impl("cute_kernels", "ours", prepare(True), _ours_available)}
    return impls


# ---- torch.compile: one graph, no recompile ---------------------------------------------------

def _block(device: str, dtype, dim: int = 256, heads: int = 4):
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(dim, 3 * dim, device=device, dtype=dtype)
            self.proj = torch.nn.Linear(dim, dim, device=device, dtype=dtype)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, s, d))

    return Block()


def compile_checks(device: str = "cuda", *, backend: str = "aot_eager", seqlens=(128, 192),
                   dtype: str = "bf16", fallback: str = "none") -> list[Record]:
    """One record per impl (`stock`, `cute_kernels`: the block patched with cute_kernels.nn.patch):
    case `compile/block`, ok when torch.compile(fullgraph=True) captured the forward and backward
    as one graph that two sequence lengths (marked dynamic) ran without a recompile, and the
    compiled output matched eager. extra: frames compiled, graph breaks, the error if any.
    fallback: passed to `patch` (CPU tests run the harness with "torch")."""
    import torch
    from torch._dynamo.testing import CompileCounterWithBackend

    from cute_kernels.bench.cases import rel_err
    from cute_kernels.nn import patch

    records = []
    for impl in ("stock", "cute_kernels"):
        torch.manual_seed(0)
        model = _block(device, torch_dtype(dtype))
        if impl == "cute_kernels":
            patch(model, fallback=fallback)
        torch._dynamo.reset()
        counter = CompileCounterWithBackend(backend)
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        worst, error = 0.0, None
        try:
            for s in seqlens:
                x = torch.randn(2, s, 256, device=device, dtype=torch_dtype(dtype), requires_grad=True)
                torch._dynamo.mark_dynamic(x, 1)
                got = compiled(x)
                got.float().sum().backward()
                want = model(x)
                worst = max(worst, rel_err(got, want))
        except Exception as exc:  # noqa: BLE001 - a graph break under fullgraph=True raises: that is the finding
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        frames = counter.frame_count
        ok = error is None and frames == 1 and worst <= TOLERANCE[dtype]
        if error is None and frames != 1:
            error = f"compiled {frames} frames for {len(seqlens)} sequence lengths (a recompile)"
        records.append(Record(case="compile/block", impl=impl, dtype=dtype, tflops=None, ms=None,
                              rel_err=worst if error is None else None, ok=ok,
                              kind="ours" if impl == "cute_kernels" else "peer", error=error,
                              extra={"frames": frames, "graph_breaks": 0 if error is None else None,
                                     "backend": backend}))
    return records
