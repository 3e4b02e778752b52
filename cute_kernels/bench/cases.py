"""Benchmark cases: a problem shape with its FLOP and byte counts, inputs and reference.

Every case draws fresh N(0, 1) inputs from a seeded generator (never zeros or small integers:
data that toggles few bits lets the clocks run higher) and computes its reference in float32
with TF32 disabled. `rel_err(out, ref)` is the relative Frobenius error
||out - ref|| / ||ref||, or NaN when `out` holds a NaN or Inf.

Case names are the strings records carry and `--cases` parses:
- GEMM C = A·Bᵀ (A: M×K, B: N×K, both K-major): `MxNxK`, e.g. `4096x4096x4096`;
- attention (B, H, S, D): `B4_H32_S2048_D128` or `B4_H32_S2048_D128_causal`;
- copy: `1024MiB` (bytes of the source) or a plain element count.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class GemmCase:
    """C = A·Bᵀ with A (M, K) and B (N, K) both row-major (K-major), output (M, N)."""

    m: int
    n: int
    k: int
    dtype: str = "bf16"
    out_dtype: str | None = None  # None: the input dtype (bf16 for fp8 inputs)

    family = "gemm"

    def validate(self) -> None:
        if min(self.m, self.n, self.k) < 1:
            raise ValueError(f"GEMM sizes must be positive, got {self.m}x{self.n}x{self.k}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown GEMM dtype {self.dtype!r}; known: {sorted(DTYPES)}")

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

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
        """Compulsory HBM traffic: read A and B once, write C once."""
        e = ELEMENT_BYTES[self.dtype]
        return float(e * (self.m * self.k + self.n * self.k) + ELEMENT_BYTES[self.result_dtype] * self.m * self.n)

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]

    @classmethod
    def parse(cls, text: str, dtype: str = "bf16") -> GemmCase:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text.strip())
        if not m:
            raise ValueError(f"GEMM case must look like MxNxK (e.g. 4096x4096x4096), got {text!r}")
        case = cls(int(m[1]), int(m[2]), int(m[3]), dtype)
        case.validate()
        return case

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        gen = _generator(device, seed)
        return {"a": _randn((self.m, self.k), self.dtype, device, gen),
                "b": _randn((self.n, self.k), self.dtype, device, gen)}

    def empty_out(self, inputs: dict[str, Any]):
        import torch

        a = inputs["a"]
        return torch.empty(self.m, self.n, device=a.device, dtype=torch_dtype(self.result_dtype))

    def reference(self, inputs: dict[str, Any]):
        import torch

        with _fp32_highest():
            return torch.matmul(inputs["a"].float(), inputs["b"].float().T)


@dataclass(frozen=True)
class AttentionCase:
    """Forward attention, SDPA layout (B, H, S, D) for q, k, v and the output; S_q = S_k."""

    b: int
    h: int
    s: int
    d: int
    causal: bool = False
    dtype: str = "bf16"

    family = "attention"

    def validate(self) -> None:
        if min(self.b, self.h, self.s, self.d) < 1:
            raise ValueError(f"attention sizes must be positive, got {self.name}")
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"attention benchmarks take bf16 or fp16 inputs, got {self.dtype!r}")

    @property
    def name(self) -> str:
        return f"B{self.b}_H{self.h}_S{self.s}_D{self.d}" + ("_causal" if self.causal else "")

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
        return 4.0 * self.b * self.h * self.s * self.d * ELEMENT_BYTES[self.dtype]

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]

    @classmethod
    def parse(cls, text: str, dtype: str = "bf16") -> AttentionCase:
        m = re.fullmatch(r"B(\d+)_H(\d+)_S(\d+)_D(\d+)(_causal)?", text.strip())
        if not m:
            raise ValueError(f"attention case must look like B4_H32_S2048_D128[_causal], got {text!r}")
        case = cls(int(m[1]), int(m[2]), int(m[3]), int(m[4]), bool(m[5]), dtype)
        case.validate()
        return case

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        gen = _generator(device, seed)
        shape = (self.b, self.h, self.s, self.d)
        return {n: _randn(shape, self.dtype, device, gen) for n in ("q", "k", "v")}

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
                for h0 in range(0, self.h, heads):
                    hs = slice(h0, min(self.h, h0 + heads))
                    scores = torch.matmul(q[bi, hs].float(), k[bi, hs].float().transpose(-1, -2)) * scale
                    if mask is not None:
                        scores.masked_fill_(~mask, float("-inf"))
                    out[bi, hs] = torch.matmul(torch.softmax(scores, dim=-1), v[bi, hs].float())
        return out


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


Case = GemmCase | AttentionCase | CopyCase


class _fp32_highest:
    """Context: float32 matmuls in full precision (no TF32), restored on exit."""

    def __enter__(self):
        import torch

        self._saved = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc):
        import torch

        torch.set_float32_matmul_precision(self._saved)
