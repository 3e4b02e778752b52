"""Benchmark cases: a problem shape with its FLOP and byte counts, inputs and reference.

Every case draws fresh N(0, 1) inputs from a seeded generator (never zeros or small integers:
data that toggles few bits lets the clocks run higher) and computes its reference in float32
with TF32 disabled. `rel_err(out, ref)` is the relative Frobenius error
||out - ref|| / ||ref||, or NaN when `out` holds a NaN or Inf.

Case names are the strings records carry and `--cases` parses:
- GEMM C = A·Bᵀ (A: M×K, B: N×K, both K-major): `MxNxK`, e.g. `4096x4096x4096`;
- attention (B, H, S, D): `B4_H32_S2048_D128` or `B4_H32_S2048_D128_causal` (the same names
  for the backward pass, suite `attention_bwd`);
- copy: `1024MiB` (bytes of the source) or a plain element count;
- paged decode (one query token per sequence over a paged KV cache):
  `B64_Hq32_Hkv8_D128_ctx8192_page16`.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

# Short dtype names used in records -> torch dtype attribute names.
DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp8_e4m3": "float8_e4m3fn",
}
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1}

# Largest rel_err counted as correct, per input dtype: output rounding dominates for the 16-bit
# types (2^-9 relative per element for bf16); fp32 leaves room for TF32 rungs (2^-11 inputs).
TOLERANCE = {"bf16": 1e-2, "fp16": 4e-3, "fp32": 2e-3, "fp8_e4m3": 1e-2}


def torch_dtype(name: str):
    """The torch dtype for a short dtype name ('bf16', 'fp32', ...)."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(DTYPES)}")
    return getattr(torch, DTYPES[name])


def rel_err(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64, NaN when `out` has a non-finite element.

    Raises ValueError when the shapes differ (a wrong shape is a wrong answer, never broadcast).
    """
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    if not bool(torch.isfinite(o).all()):
        return float("nan")
    denom = float(torch.linalg.vector_norm(r))
    num = float(torch.linalg.vector_norm(o - r))
    return num / denom if denom > 0 else num


def _generator(device: str, seed: int):
    import torch

    return torch.Generator(device=device).manual_seed(seed)


def _randn(shape, dtype: str, device: str, gen):
    import torch

    x = torch.randn(*shape, device=device, dtype=torch.float32, generator=gen)
    return x.to(torch_dtype(dtype))


# GEMM operand layouts by the case-name suffix: which of A (M, K) and B (N, K) is stored with
# unit stride along its M / N side instead of along K. "" is nn.Linear's forward y = x·Wᵀ;
# "bn" its input gradient dX = dY·W (B = W read N-major); "am_bn" its weight gradient
# dW = dYᵀ·X (A = dYᵀ read M-major, B = X read N-major); "bias" the forward of a layer with a bias,
# y = x·Wᵀ + b (both K-major, one bias value per output column), as nn.Linear runs it.
GEMM_LAYOUTS = ("", "bn", "am_bn", "rowwise", "bias")  # "rowwise": fp8 with row-wise scales (A and B K-major)


@dataclass(frozen=True)
class GemmCase:
    """C = A·Bᵀ with A (M, K) and B (N, K), output (M, N) row-major. `layout` (GEMM_LAYOUTS)
    says which operands are stored M- or N-major instead of K-major (the default)."""

    m: int
    n: int
    k: int
    dtype: str = "bf16"
    out_dtype: str | None = None  # None: the input dtype (bf16 for fp8 inputs)
    layout: str = ""

    family = "gemm"

    def validate(self) -> None:
        if min(self.m, self.n, self.k) < 1:
            raise ValueError(f"GEMM sizes must be positive, got {self.m}x{self.n}x{self.k}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown GEMM dtype {self.dtype!r}; known: {sorted(DTYPES)}")
        if self.layout not in GEMM_LAYOUTS:
            raise ValueError(f"unknown GEMM layout {self.layout!r}; known: {GEMM_LAYOUTS}")
        if self.layout == "rowwise" and not self.dtype.startswith("fp8"):
            raise ValueError("row-wise scales are for fp8 cases")
        if self.layout == "bias" and self.dtype not in ("bf16", "fp16"):
            raise ValueError("bias cases are 16-bit (the fused epilogue's inputs)")

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}x{self.k}" + (f"_{self.layout}" if self.layout else "")

    @property
    def result_dtype(self) -> str:
        if self.out_dtype:
            return self.out_dtype
        return "bf16" if self.dtype == "fp8_e4m3" else self.dtype

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def bytes(self) -> float:
        """Compulsory HBM traffic: read A and B (and the bias) once, write C once."""
        e = ELEMENT_BYTES[self.dtype]
        bias = self.n if self.layout == "bias" else 0
        return float(e * (self.m * self.k + self.n * self.k + bias) + ELEMENT_BYTES[self.result_dtype] * self.m * self.n)

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]

    @classmethod
    def parse(cls, text: str, dtype: str = "bf16") -> GemmCase:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)(?:_(bn|am_bn|rowwise|bias))?", text.strip())
        if not m:
            raise ValueError(f"GEMM case must look like MxNxK (e.g. 4096x4096x4096), optionally with a layout "
                             f"suffix _bn, _am_bn, _bias or (fp8) _rowwise, got {text!r}")
        case = cls(int(m[1]), int(m[2]), int(m[3]), dtype, layout=m[4] or "")
        case.validate()
        return case

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        """{"a": (M, K), "b": (N, K)}, views with the strides `layout` asks for (and "bias" (N,)
        for a bias case)."""
        gen = _generator(device, seed)
        a = _randn((self.k, self.m), self.dtype, device, gen).T if self.layout == "am_bn" else \
            _randn((self.m, self.k), self.dtype, device, gen)
        b = _randn((self.k, self.n), self.dtype, device, gen).T if self.layout in ("bn", "am_bn") else \
            _randn((self.n, self.k), self.dtype, device, gen)
        inputs = {"a": a, "b": b}
        if self.layout == "bias":
            inputs["bias"] = _randn((self.n,), self.dtype, device, gen)
        if self.dtype.startswith("fp8"):  # dequantization scales in [0.5, 1.5): per tensor, or row-wise
            import torch

            rows, cols = ((self.m, 1), (1, self.n)) if self.layout == "rowwise" else ((), ())
            inputs["scale_a"] = torch.rand(rows, device=device, generator=gen) + 0.5
            inputs["scale_b"] = torch.rand(cols, device=device, generator=gen) + 0.5
        return inputs

    def empty_out(self, inputs: dict[str, Any]):
        import torch

        a = inputs["a"]
        return torch.empty(self.m, self.n, device=a.device, dtype=torch_dtype(self.result_dtype))

    def reference(self, inputs: dict[str, Any]):
        import torch

        with _fp32_highest():
            if "scale_a" in inputs:  # C = (scale_a * A) (B^T * scale_b)
                return torch.matmul(inputs["a"].float() * inputs["scale_a"], inputs["b"].float().T * inputs["scale_b"])
            out = torch.matmul(inputs["a"].float(), inputs["b"].float().T)
            return out + inputs["bias"].float() if "bias" in inputs else out


@dataclass(frozen=True)
class AttentionCase:
    """Forward attention, SDPA layout (B, H, S, D) for q and the output, (B, Hkv, S, D) for k
    and v (`hkv` key/value heads, each shared by H / Hkv query heads: GQA; 0 means H); S_q = S_k."""

    b: int
    h: int
    s: int
    d: int
    causal: bool = False
    dtype: str = "bf16"
    hkv: int = 0

    family = "attention"

    def validate(self) -> None:
        if min(self.b, self.h, self.s, self.d) < 1 or self.hkv < 0:
            raise ValueError(f"attention sizes must be positive, got {self.name}")
        if self.h % self.kv_heads:
            raise ValueError(f"{self.name}: the query heads ({self.h}) are not a multiple of the key/value heads")
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"attention benchmarks take bf16 or fp16 inputs, got {self.dtype!r}")

    @property
    def kv_heads(self) -> int:
        return self.hkv or self.h

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.h

    @property
    def name(self) -> str:
        kv = f"_KV{self.hkv}" if self.gqa else ""
        return f"B{self.b}_H{self.h}{kv}_S{self.s}_D{self.d}" + ("_causal" if self.causal else "")

    @property
    def result_dtype(self) -> str:
        return self.dtype

    @property
    def flops(self) -> float:
        """4·B·H·S²·D (two GEMMs), halved when causal."""
        f = 4.0 * self.b * self.h * self.s * self.s * self.d
        return f / 2 if self.causal else f

    @property
    def bytes(self) -> float:
        """Compulsory traffic: read q, k, v once and write the output once."""
        return 2.0 * self.b * (self.h + self.kv_heads) * self.s * self.d * ELEMENT_BYTES[self.dtype]

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]

    @classmethod
    def parse(cls, text: str, dtype: str = "bf16") -> AttentionCase:
        m = re.fullmatch(r"B(\d+)_H(\d+)(?:_KV(\d+))?_S(\d+)_D(\d+)(_causal)?", text.strip())
        if not m:
            raise ValueError(f"attention case must look like B4_H32[_KV8]_S2048_D128[_causal], got {text!r}")
        case = cls(int(m[1]), int(m[2]), int(m[4]), int(m[5]), bool(m[6]), dtype, int(m[3] or 0))
        case.validate()
        return case

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        gen = _generator(device, seed)
        return {n: _randn((self.b, self.h if n == "q" else self.kv_heads, self.s, self.d), self.dtype, device, gen)
                for n in ("q", "k", "v")}

    def empty_out(self, inputs: dict[str, Any]):
        import torch

        return torch.empty_like(inputs["q"])

    def reference(self, inputs: dict[str, Any]):
        """softmax(q·kᵀ/√D [+ causal mask]) · v in float32, a few heads at a time so the S×S
        scores of one chunk stay under about 1 GiB."""
        import torch

        q, k, v = (inputs[n] for n in ("q", "k", "v"))
        scale = 1.0 / math.sqrt(self.d)
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        heads = max(1, (1 << 28) // (self.s * self.s))
        mask = None
        if self.causal:
            mask = torch.ones(self.s, self.s, dtype=torch.bool, device=q.device).tril()
        with _fp32_highest():
            for bi in range(self.b):
                for hs, kvs in self._head_chunks(heads):
                    scores = torch.matmul(q[bi, hs].float(), k[bi, kvs].float().transpose(-1, -2)) * scale
                    if mask is not None:
                        scores.masked_fill_(~mask, float("-inf"))
                    out[bi, hs] = torch.matmul(torch.softmax(scores, dim=-1), v[bi, kvs].float())
        return out

    def _head_chunks(self, heads: int):
        """(query heads, their key/value heads) slices of at most about `heads` query heads, whole
        groups of one key/value head (the key/value slice broadcasts over its group: (g, S, D)
        query rows against (1, S, D) keys) when the heads are grouped."""
        g = self.h // self.kv_heads
        if g == 1:
            for h0 in range(0, self.h, heads):
                yield slice(h0, min(self.h, h0 + heads)), slice(h0, min(self.h, h0 + heads))
            return
        for j in range(self.kv_heads):
            yield slice(j * g, (j + 1) * g), slice(j, j + 1)


class _BackwardOf:
    """What a forward case's backward changes, mixed in before the forward case: an output
    gradient dout shaped like q (drawn after the forward's inputs), nothing preallocated, FLOPs
    2.5x the forward's (the five GEMMs of the FlashAttention backward) and twice its tolerance
    (each gradient goes through two rounded GEMMs more)."""

    @property
    def flops(self) -> float:
        return 2.5 * super().flops

    @property
    def tolerance(self) -> float:
        return 2 * TOLERANCE[self.dtype]

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        inputs = super().make_inputs(device, seed)
        inputs["dout"] = _randn(tuple(inputs["q"].shape), self.dtype, device, _generator(device, seed + 1))
        return inputs

    def empty_out(self, inputs: dict[str, Any]):
        return None


@dataclass(frozen=True)
class AttentionBwdCase(_BackwardOf, AttentionCase):
    """The backward pass of an `AttentionCase`: (dq, dk, dv) for an output gradient dout.

    The result compared is the three gradients flattened and concatenated; the reference is
    float32 autograd through the same masked softmax. FLOPs: the five S×S GEMMs of the
    FlashAttention backward (recomputed QKᵀ, dP = dO·Vᵀ, dV, dK, dQ), 2.5× the forward's.
    Tolerance: twice the forward's, since each gradient goes through two rounded GEMMs more.
    """

    family = "attention_bwd"

    @property
    def bytes(self) -> float:
        """Compulsory traffic: read q, k, v, out, dout once and write dq, dk, dv once."""
        return 4.0 * self.b * (self.h + self.kv_heads) * self.s * self.d * ELEMENT_BYTES[self.dtype]

    def reference(self, inputs: dict[str, Any]):
        """cat(dq, dk, dv) flattened, in float32, a few heads at a time (see AttentionCase)."""
        import torch

        q, k, v, dout = (inputs[n] for n in ("q", "k", "v", "dout"))
        scale = 1.0 / math.sqrt(self.d)
        grads = [torch.empty(t.shape, dtype=torch.float32, device=q.device) for t in (q, k, v)]
        heads = max(1, (1 << 27) // (self.s * self.s))
        mask = torch.ones(self.s, self.s, dtype=torch.bool, device=q.device).tril() if self.causal else None
        with _fp32_highest(), torch.enable_grad():
            for bi in range(self.b):
                for hs, kvs in self._head_chunks(heads):
                    qf = q[bi, hs].float().requires_grad_()
                    kf, vf = (t[bi, kvs].float().requires_grad_() for t in (k, v))
                    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
                    if mask is not None:
                        scores = scores.masked_fill(~mask, float("-inf"))
                    out = torch.matmul(torch.softmax(scores, dim=-1), vf)
                    dq, dk, dv = torch.autograd.grad(out, (qf, kf, vf), dout[bi, hs].float())
                    grads[0][bi, hs], grads[1][bi, kvs], grads[2][bi, kvs] = dq, dk, dv
        return torch.cat([g.flatten() for g in grads])


@dataclass(frozen=True)
class CopyCase:
    """dst ← src for a contiguous 1-D tensor of `numel` elements (the memory roofline)."""

    numel: int
    dtype: str = "bf16"

    family = "copy"

    def validate(self) -> None:
        if self.numel < 1:
            raise ValueError(f"copy size must be positive, got {self.numel}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown copy dtype {self.dtype!r}; known: {sorted(DTYPES)}")

    @property
    def name(self) -> str:
        nbytes = self.numel * ELEMENT_BYTES[self.dtype]
        return f"{nbytes >> 20}MiB" if nbytes % (1 << 20) == 0 else str(self.numel)

    @property
    def result_dtype(self) -> str:
        return self.dtype

    @property
    def flops(self) -> float:
        return 0.0

    @property
    def bytes(self) -> float:
        """Read src once, write dst once."""
        return 2.0 * self.numel * ELEMENT_BYTES[self.dtype]

    @property
    def tolerance(self) -> float:
        return 0.0

    @classmethod
    def parse(cls, text: str, dtype: str = "bf16") -> CopyCase:
        text = text.strip()
        m = re.fullmatch(r"(\d+)MiB", text)
        if m:
            nbytes = int(m[1]) << 20
            if nbytes % ELEMENT_BYTES[dtype]:
                raise ValueError(f"{text} is not a whole number of {dtype} elements")
            case = cls(nbytes // ELEMENT_BYTES[dtype], dtype)
        elif text.isdigit():
            case = cls(int(text), dtype)
        else:
            raise ValueError(f"copy case must look like 256MiB or an element count, got {text!r}")
        case.validate()
        return case

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        gen = _generator(device, seed)
        return {"src": _randn((self.numel,), self.dtype, device, gen)}

    def empty_out(self, inputs: dict[str, Any]):
        import torch

        return torch.empty_like(inputs["src"])

    def reference(self, inputs: dict[str, Any]):
        return inputs["src"].float()


@dataclass(frozen=True)
class DecodeCase:
    """Paged decode, vLLM layout: q (B, Hq, D); k_cache, v_cache (num_pages, page, Hkv, D) with
    num_pages = B·ctx/page; block_table (B, ctx/page) int32 a random permutation of the pages
    (so no sequence reads its pages in address order); seqlens_k (B,) int32, every sequence
    `ctx` keys long. Output (B, Hq, D): softmax(q·kᵀ/√D)·v per (sequence, query head), query
    head h reading key/value head h // (Hq/Hkv)."""

    b: int
    hq: int
    hkv: int
    d: int
    ctx: int
    page: int
    dtype: str = "bf16"

    family = "decode"

    def validate(self) -> None:
        if min(self.b, self.hq, self.hkv, self.d, self.ctx, self.page) < 1:
            raise ValueError(f"decode sizes must be positive, got {self.name}")
        if self.hq % self.hkv:
            raise ValueError(f"decode case {self.name}: query heads ({self.hq}) must be a multiple of "
                             f"key/value heads ({self.hkv})")
        if self.ctx % self.page:
            raise ValueError(f"decode case {self.name}: context {self.ctx} must be a whole number of "
                             f"pages of {self.page}")
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"decode benchmarks take bf16 or fp16 inputs, got {self.dtype!r}")

    @property
    def name(self) -> str:
        return f"B{self.b}_Hq{self.hq}_Hkv{self.hkv}_D{self.d}_ctx{self.ctx}_page{self.page}"

    @property
    def pages_per_seq(self) -> int:
        return self.ctx // self.page

    @property
    def num_pages(self) -> int:
        return self.b * self.pages_per_seq

    @property
    def result_dtype(self) -> str:
        return self.dtype

    @property
    def flops(self) -> float:
        """4·B·Hq·ctx·D: q·kᵀ and p·v, 2·ctx·D each per (sequence, query head)."""
        return 4.0 * self.b * self.hq * self.ctx * self.d

    @property
    def bytes(self) -> float:
        """Compulsory traffic: every sequence's K and V once (2·B·ctx·Hkv·D elements), q read
        and the output written once (B·Hq·D each). The block table (4·B·ctx/page bytes) is left
        out: under 0.1% at the default cases."""
        e = ELEMENT_BYTES[self.dtype]
        return float(e * (2 * self.b * self.ctx * self.hkv * self.d + 2 * self.b * self.hq * self.d))

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]

    @classmethod
    def parse(cls, text: str, dtype: str = "bf16") -> DecodeCase:
        m = re.fullmatch(r"B(\d+)_Hq(\d+)_Hkv(\d+)_D(\d+)_ctx(\d+)_page(\d+)", text.strip())
        if not m:
            raise ValueError(f"decode case must look like B64_Hq32_Hkv8_D128_ctx8192_page16, got {text!r}")
        case = cls(*(int(g) for g in m.groups()), dtype)
        case.validate()
        return case

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        """q and the caches N(0, 1); block_table a seeded random permutation of the pages,
        reshaped (B, ctx/page); seqlens_k all `ctx`."""
        import torch

        gen = _generator(device, seed)
        cache_shape = (self.num_pages, self.page, self.hkv, self.d)
        q = _randn((self.b, self.hq, self.d), self.dtype, device, gen)
        k_cache = _randn(cache_shape, self.dtype, device, gen)
        v_cache = _randn(cache_shape, self.dtype, device, gen)
        perm = torch.randperm(self.num_pages, device=device, generator=gen)
        block_table = perm.to(torch.int32).reshape(self.b, self.pages_per_seq).contiguous()
        seqlens_k = torch.full((self.b,), self.ctx, dtype=torch.int32, device=device)
        return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table, "seqlens_k": seqlens_k}

    def empty_out(self, inputs: dict[str, Any]):
        import torch

        return torch.empty_like(inputs["q"])

    def reference(self, inputs: dict[str, Any]):
        return paged_decode_reference(inputs["q"], inputs["k_cache"], inputs["v_cache"],
                                      inputs["block_table"], inputs["seqlens_k"])


@dataclass(frozen=True)
class VarlenCase:
    """A ragged batch packed without padding, FlashAttention's varlen layout: q (T, Hq, D), k and
    v (T, Hkv, D), T the sum of `lengths`, sequence b's rows cu_seqlens[b] .. cu_seqlens[b + 1]
    (int32, on the device) for queries and keys alike; each sequence attends to its own keys
    only, causal or not, query head h reading key/value head h // (Hq / Hkv)."""

    lengths: tuple[int, ...]
    hq: int
    hkv: int
    d: int
    causal: bool = True
    dtype: str = "bf16"

    family = "attention_varlen"

    def validate(self) -> None:
        if not self.lengths or min(self.lengths) < 1 or min(self.hq, self.hkv, self.d) < 1:
            raise ValueError(f"varlen sizes must be positive, got {self.name}")
        if self.hq % self.hkv:
            raise ValueError(f"varlen case {self.name}: query heads ({self.hq}) must be a multiple of "
                             f"key/value heads ({self.hkv})")
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"varlen benchmarks take bf16 or fp16 inputs, got {self.dtype!r}")

    @property
    def name(self) -> str:
        """L<lengths>_Hq<H>_Hkv<H>_D<D>[_causal]; lengths joined by "-", a run of n equal ones as SxN."""
        runs = [(s, len(list(group))) for s, group in itertools.groupby(self.lengths)]
        lengths = "-".join(f"{s}x{n}" if n > 1 else str(s) for s, n in runs)
        return f"L{lengths}_Hq{self.hq}_Hkv{self.hkv}_D{self.d}" + ("_causal" if self.causal else "")

    @property
    def result_dtype(self) -> str:
        return self.dtype

    @property
    def flops(self) -> float:
        """4·Hq·D·S² per sequence (two GEMMs), halved when causal."""
        f = sum(4.0 * self.hq * self.d * s * s for s in self.lengths)
        return f / 2 if self.causal else f

    @property
    def bytes(self) -> float:
        """Compulsory traffic: q, k, v read and the output written once."""
        return float(ELEMENT_BYTES[self.dtype] * sum(self.lengths) * self.d * 2 * (self.hq + self.hkv))

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]

    @classmethod
    def parse(cls, text: str, dtype: str = "bf16") -> VarlenCase:
        m = re.fullmatch(r"L(\d+(?:x\d+)?(?:-\d+(?:x\d+)?)*)_Hq(\d+)_Hkv(\d+)_D(\d+)(_causal)?", text.strip())
        if not m:
            raise ValueError(f"varlen case must look like L1-17-1000-4096_Hq16_Hkv16_D128[_causal] (a run of n "
                             f"equal lengths as SxN), got {text!r}")
        lengths = []
        for token in m[1].split("-"):
            s, _, n = token.partition("x")
            lengths += [int(s)] * int(n or 1)
        case = cls(tuple(lengths), int(m[2]), int(m[3]), int(m[4]), bool(m[5]), dtype)
        case.validate()
        return case

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        import torch

        gen = _generator(device, seed)
        total = sum(self.lengths)
        q = _randn((total, self.hq, self.d), self.dtype, device, gen)
        k, v = (_randn((total, self.hkv, self.d), self.dtype, device, gen) for _ in range(2))
        cu = torch.tensor([0, *itertools.accumulate(self.lengths)], dtype=torch.int32, device=device)
        return {"q": q, "k": k, "v": v, "cu_seqlens": cu, "max_seqlen": max(self.lengths)}

    def empty_out(self, inputs: dict[str, Any]):
        import torch

        return torch.empty_like(inputs["q"])

    def reference(self, inputs: dict[str, Any]):
        """Per sequence, softmax(q·kᵀ/√D [+ causal mask])·v in float32, (T, Hq, D)."""
        import torch

        q, k, v = (inputs[n] for n in ("q", "k", "v"))
        g, scale = self.hq // self.hkv, 1.0 / math.sqrt(self.d)
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        start = 0
        with _fp32_highest():
            for s in self.lengths:
                rows = slice(start, start + s)
                qs = q[rows].float().transpose(0, 1).reshape(self.hkv, g, s, self.d)
                ks, vs = (t[rows].float().transpose(0, 1)[:, None] for t in (k, v))  # (Hkv, 1, S, D)
                scores = torch.matmul(qs, ks.transpose(-1, -2)) * scale
                if self.causal:
                    keep = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
                    scores = scores.masked_fill(~keep, float("-inf"))
                o = torch.matmul(torch.softmax(scores, dim=-1), vs)  # (Hkv, g, S, D)
                out[rows] = o.reshape(self.hq, s, self.d).transpose(0, 1)
                start += s
        return out


@dataclass(frozen=True)
class VarlenBwdCase(_BackwardOf, VarlenCase):
    """The backward pass of a `VarlenCase`: (dq, dk, dv) for an output gradient dout (T, Hq, D).

    As `AttentionBwdCase`: the result compared is the three gradients flattened and
    concatenated, against float32 autograd per sequence; FLOPs 2.5x the forward's (the five
    GEMMs of the FlashAttention backward); tolerance twice the forward's."""

    family = "attention_varlen_bwd"

    @property
    def bytes(self) -> float:
        """Compulsory traffic: read q, k, v, out, dout once and write dq, dk, dv once."""
        return float(ELEMENT_BYTES[self.dtype] * sum(self.lengths) * self.d * (4 * self.hq + 4 * self.hkv))

    @classmethod
    def parse(cls, text: str, dtype: str = "bf16") -> VarlenBwdCase:
        base = VarlenCase.parse(text, dtype)
        return cls(base.lengths, base.hq, base.hkv, base.d, base.causal, base.dtype)

    def reference(self, inputs: dict[str, Any]):
        """cat(dq, dk, dv) flattened, float32 autograd per sequence and key/value head."""
        import torch

        q, k, v, dout = (inputs[n] for n in ("q", "k", "v", "dout"))
        g, scale = self.hq // self.hkv, 1.0 / math.sqrt(self.d)
        grads = [torch.empty(t.shape, dtype=torch.float32, device=q.device) for t in (q, k, v)]
        start = 0
        with _fp32_highest(), torch.enable_grad():
            for s in self.lengths:
                rows = slice(start, start + s)
                keep = torch.ones(s, s, dtype=torch.bool, device=q.device).tril() if self.causal else None
                for h in range(self.hkv):
                    heads = slice(h * g, (h + 1) * g)
                    qs = q[rows, heads].float().transpose(0, 1).requires_grad_()  # (g, S, D)
                    ks, vs = (t[rows, h].float().requires_grad_() for t in (k, v))  # (S, D)
                    scores = torch.matmul(qs, ks.transpose(-1, -2)) * scale
                    if keep is not None:
                        scores = scores.masked_fill(~keep, float("-inf"))
                    o = torch.matmul(torch.softmax(scores, dim=-1), vs)
                    dq, dk, dv = torch.autograd.grad(o, (qs, ks, vs), dout[rows, heads].float().transpose(0, 1))
                    grads[0][rows, heads], grads[1][rows, h], grads[2][rows, h] = dq.transpose(0, 1), dk, dv
                start += s
        return torch.cat([t.flatten() for t in grads])


def gather_pages(cache, block_table, rows=slice(None)):
    """The contiguous (n, max_pages·page, H, D) keys (or values) of sequences `rows`:
    cache[block_table[b, t // page], t % page] at [b, t]."""
    pages = block_table[rows].long()
    return cache[pages].flatten(1, 2)


def paged_decode_reference(q, k_cache, v_cache, block_table, seqlens_k, scale: float | None = None,
                           chunk_bytes: int = 1 << 28):
    """float32 softmax(q·kᵀ·scale)·v per (sequence, query head) over the first seqlens_k[b]
    keys of each sequence's pages (scale 1/√D by default; a sequence without keys gives 0).

    Gathers the pages of a few sequences at a time, so the float32 K and V of one chunk stay
    under about `chunk_bytes`."""
    import torch

    b, hq, d = q.shape
    hkv, dv = k_cache.shape[2], v_cache.shape[-1]
    g = hq // hkv
    reach = block_table.shape[1] * k_cache.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    per_seq = max(1, reach * hkv * (d + dv) * 4)
    step = max(1, chunk_bytes // per_seq)
    lens = seqlens_k.to(torch.int64)
    out = torch.zeros((b, hq, dv), dtype=torch.float32, device=q.device)
    with _fp32_highest():
        for b0 in range(0, b, step):
            rows = slice(b0, min(b, b0 + step))
            k = gather_pages(k_cache, block_table, rows).float().permute(0, 2, 3, 1)  # (n, Hkv, D, T)
            v = gather_pages(v_cache, block_table, rows).float().transpose(1, 2)  # (n, Hkv, T, Dv)
            qs = q[rows].float().reshape(-1, hkv, g, d)
            scores = torch.matmul(qs, k) * scale  # (n, Hkv, g, T)
            past = torch.arange(reach, device=q.device)[None, :] >= lens[rows, None]
            scores.masked_fill_(past[:, None, None, :], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            probs[lens[rows] == 0] = 0.0  # no key: softmax of all -inf is NaN; the output is 0
            out[rows] = torch.matmul(probs, v).reshape(-1, hq, dv)
    return out


Case = GemmCase | AttentionCase | CopyCase | DecodeCase | VarlenCase


class _fp32_highest:
    """Context: float32 matmuls in full precision (no TF32), restored on exit."""

    def __enter__(self):
        import torch

        self._saved = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc):
        import torch

        torch.set_float32_matmul_precision(self._saved)
