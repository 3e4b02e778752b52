"""Benchmark cases of the `fused` suite: one memory-bound op on one shape.

A `FusedCase` names an op and its sizes; `bytes` is the op's compulsory HBM traffic (every input
read once, every output written once: what a kernel at the bandwidth limit moves), so GB/s and
the percentage of the measured copy bandwidth are comparable across implementations. The fused
linear + cross-entropy is counted in FLOPs (three GEMMs) instead, and its implementations record
their peak memory.

Ops and what a call computes (`bytes` in the same order):

| op | call | bytes |
| --- | --- | --- |
| `rmsnorm_fwd`, `layernorm_fwd` | y = norm(x) * w (+ b) | read x, w (b); write y |
| `rmsnorm_residual_fwd` | y, s = norm(x + r) * w, x + r | read x, r, w; write y, s |
| `rmsnorm_bwd`, `layernorm_bwd` | dx, dw (db) from dy | read x, dy, w, stats; write dx, dw (db) |
| `softmax_fwd` / `softmax_bwd` | y / dx | read x; write y / read y, dy; write dx |
| `cross_entropy_fwd` | per-row loss | read logits, labels; write loss |
| `cross_entropy_fwd_bwd` | loss and dlogits | read logits, labels once; write loss, dlogits |
| `rope` | q, k rotated (in place) | read and write q and k; read the tables' rows |
| `swiglu_fwd` / `swiglu_bwd` | silu(g) * u / dg, du | read g, u; write out / read dout, g, u; write dg, du |
| `linear_cross_entropy` | loss, dx, dW of CE(x W^T) | FLOPs: 3 GEMMs of 2 T V H |
| `linear_swiglu_fwd` | silu(x Wg^T) * (x Wu^T) (a gated MLP's first half, inference) | FLOPs: 2 T (2I) H |
| `linear_swiglu_fwd_bwd` | the same, then dx, dWg, dWu for a given dh (training) | FLOPs: 3 x 2 T (2I) H |

Names: `<op>_<rows>x<width>` (rope: `rope_<B>x<S>x<Hq>x<Hk>x<D>`; linear_cross_entropy:
`linear_cross_entropy_<T>x<H>x<V>`; linear_swiglu: `linear_swiglu_fwd_<T>x<H>x<I>`), e.g.
`rmsnorm_fwd_16384x4096`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cute_kernels.bench.cases import ELEMENT_BYTES, TOLERANCE, _fp32_highest, _generator, _randn, torch_dtype

__all__ = ["FusedCase", "FUSED_OPS", "EPS"]

FUSED_OPS = ("rmsnorm_fwd", "rmsnorm_residual_fwd", "rmsnorm_bwd", "layernorm_fwd", "layernorm_bwd", "softmax_fwd",
             "softmax_bwd", "cross_entropy_fwd", "cross_entropy_fwd_bwd", "rope", "swiglu_fwd", "swiglu_bwd",
             "linear_cross_entropy", "linear_swiglu_fwd", "linear_swiglu_fwd_bwd")
GEMM_OPS = ("linear_cross_entropy", "linear_swiglu_fwd", "linear_swiglu_fwd_bwd")  # counted in FLOPs, dims (H,)
EPS = 1e-6
ROPE_THETA = 10000.0
# Rows of dW compared for linear_cross_entropy (the whole dW is V x H: compared on a fixed sample).
LCE_DW_ROWS = 1024


@dataclass(frozen=True)
class FusedCase:
    """One fused op on one shape. rows x width for the row ops; for rope rows = B * S tokens and
    `dims` = (B, S, Hq, Hk, D); for linear_cross_entropy rows = T, width = V, dims = (H,); for
    linear_swiglu rows = T, width = I (the gated width), dims = (H,)."""

    op: str
    rows: int
    width: int
    dtype: str = "bf16"
    dims: tuple = ()

    family = "fused"

    def validate(self) -> None:
        if self.op not in FUSED_OPS:
            raise ValueError(f"unknown fused op {self.op!r}; known: {', '.join(FUSED_OPS)}")
        if min(self.rows, self.width) < 1:
            raise ValueError(f"fused case sizes must be positive, got {self.name}")
        if self.dtype not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"fused benchmarks take bf16, fp16 or fp32, got {self.dtype!r}")
        if self.op == "rope" and len(self.dims) != 5:
            raise ValueError("a rope case needs dims (B, S, Hq, Hk, D)")
        if self.op in GEMM_OPS and len(self.dims) != 1:
            raise ValueError(f"a {self.op} case needs dims (H,)")
        if self.op.startswith("linear_swiglu") and self.width % 8:
            raise ValueError(f"a linear_swiglu case needs I a multiple of 8, got {self.width}")

    @classmethod
    def rope(cls, b: int, s: int, hq: int, hk: int, d: int, dtype: str = "bf16") -> FusedCase:
        return cls("rope", b * s, d, dtype, (b, s, hq, hk, d))

    @classmethod
    def linear_cross_entropy(cls, tokens: int, hidden: int, vocab: int, dtype: str = "bf16") -> FusedCase:
        return cls("linear_cross_entropy", tokens, vocab, dtype, (hidden,))

    @classmethod
    def linear_swiglu(cls, tokens: int, hidden: int, intermediate: int, *, backward: bool = False,
                      dtype: str = "bf16") -> FusedCase:
        return cls("linear_swiglu_fwd_bwd" if backward else "linear_swiglu_fwd", tokens, intermediate, dtype, (hidden,))

    @property
    def name(self) -> str:
        if self.op == "rope":
            return "rope_" + "x".join(str(d) for d in self.dims)
        if self.op in GEMM_OPS:
            return f"{self.op}_{self.rows}x{self.dims[0]}x{self.width}"
        return f"{self.op}_{self.rows}x{self.width}"

    @property
    def result_dtype(self) -> str:
        return "fp32" if self.op.startswith(("cross_entropy", "linear_cross_entropy")) else self.dtype

    @property
    def flops(self) -> float:
        if self.op == "linear_cross_entropy":
            return 6.0 * self.rows * self.width * self.dims[0]
        if self.op.startswith("linear_swiglu"):
            return (3 if self.op.endswith("bwd") else 1) * 2.0 * self.rows * 2 * self.width * self.dims[0]
        return 0.0

    @property
    def bytes(self) -> float:
        """Compulsory HBM traffic (module docstring)."""
        e = ELEMENT_BYTES[self.dtype]
        m, n = self.rows, self.width
        op = self.op
        if op in ("rmsnorm_fwd", "layernorm_fwd"):
            return float(2 * m * n * e + n * e * (2 if op.startswith("layer") else 1))
        if op == "rmsnorm_residual_fwd":
            return float(4 * m * n * e + n * e)
        if op in ("rmsnorm_bwd", "layernorm_bwd"):
            params = 3 if op.startswith("layer") else 2  # w read, dw (and db) written
            stats = 4 * m * (2 if op.startswith("layer") else 1)
            return float(3 * m * n * e + params * n * e + stats)
        if op == "softmax_fwd":
            return float(2 * m * n * e)
        if op == "softmax_bwd":
            return float(3 * m * n * e)
        if op == "cross_entropy_fwd":
            return float(m * n * e + 8 * m + 4 * m)
        if op == "cross_entropy_fwd_bwd":
            return float(2 * m * n * e + 8 * m + 4 * m)
        if op == "rope":
            b, s, hq, hk, d = self.dims
            return float(2 * b * s * (hq + hk) * d * e + 2 * s * (d // 2) * 4)
        if op == "swiglu_fwd":
            return float(3 * m * n * e)
        if op == "swiglu_bwd":
            return float(5 * m * n * e)
        h = self.dims[0]
        if op == "linear_swiglu_fwd":  # x, W read; h written (the product never leaves the chip)
            return float(e * (m * h + 2 * n * h + m * n))
        if op == "linear_swiglu_fwd_bwd":  # x, W, dh read; h, dx, dW written (each once)
            return float(e * (2 * m * h + 4 * n * h + 2 * m * n))
        # linear_cross_entropy: x, W read; dx, dW written (the logits never leave the chip)
        return float(e * (2 * m * h + 2 * n * h) + 8 * m)

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype] * (2 if self.op.endswith("bwd") or self.op in GEMM_OPS else 1)

    @classmethod
    def parse(cls, text: str, dtype: str = "bf16") -> FusedCase:
        text = text.strip()
        m = re.fullmatch(r"rope_(\d+)x(\d+)x(\d+)x(\d+)x(\d+)", text)
        if m:
            case = cls.rope(*(int(g) for g in m.groups()), dtype=dtype)
        elif (m := re.fullmatch(r"linear_cross_entropy_(\d+)x(\d+)x(\d+)", text)):
            case = cls.linear_cross_entropy(int(m[1]), int(m[2]), int(m[3]), dtype)
        elif (m := re.fullmatch(r"(linear_swiglu_fwd(?:_bwd)?)_(\d+)x(\d+)x(\d+)", text)):
            case = cls.linear_swiglu(int(m[2]), int(m[3]), int(m[4]), backward=m[1].endswith("bwd"), dtype=dtype)
        elif (m := re.fullmatch(r"([a-z_]+)_(\d+)x(\d+)", text)) and m[1] in FUSED_OPS:
            case = cls(m[1], int(m[2]), int(m[3]), dtype)
        else:
            raise ValueError(f"fused case must look like rmsnorm_fwd_16384x4096, rope_8x4096x32x8x128 or "
                             f"linear_cross_entropy_8192x4096x128256 (ops: {', '.join(FUSED_OPS)}), got {text!r}")
        case.validate()
        return case

    # ---- inputs and references ------------------------------------------------------------------

    def make_inputs(self, device: str, seed: int = 0) -> dict[str, Any]:
        import torch

        gen = _generator(device, seed)
        m, n, dt = self.rows, self.width, self.dtype
        op = self.op
        if op == "rope":
            b, s, hq, hk, d = self.dims
            inv = ROPE_THETA ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
            ang = torch.arange(s, dtype=torch.float64, device=device)[:, None] * inv[None, :]
            return {"q": _randn((b, s, hq, d), dt, device, gen), "k": _randn((b, s, hk, d), dt, device, gen),
                    "cos": ang.cos().float(), "sin": ang.sin().float()}
        if op == "linear_cross_entropy":
            h = self.dims[0]
            labels = torch.randint(0, n, (m,), device=device, generator=gen)
            w = (torch.randn(n, h, device=device, generator=gen) * h ** -0.5).to(torch_dtype(dt))
            return {"x": _randn((m, h), dt, device, gen), "w": w, "labels": labels,
                    "dw_rows": torch.randperm(n, device=device, generator=gen)[:LCE_DW_ROWS]}
        if op.startswith("linear_swiglu"):
            from cute_kernels.gemm.gated import interleave_gate_up

            h = self.dims[0]
            wg, wu = ((torch.randn(n, h, device=device, generator=gen) * h ** -0.5).to(torch_dtype(dt)) for _ in "gu")
            inputs = {"x": _randn((m, h), dt, device, gen), "w_gate": wg, "w_up": wu,
                      "w_cat": torch.cat((wg, wu)), "w_gate_up": interleave_gate_up(wg, wu)}
            if op.endswith("bwd"):
                inputs["dh"] = _randn((m, n), dt, device, gen)
            return inputs
        if op.startswith("cross_entropy"):
            labels = torch.randint(0, n, (m,), device=device, generator=gen)
            labels[::17] = -100  # some ignored rows, as padded batches have
            return {"x": (_randn((m, n), dt, device, gen).float() * 2).to(torch_dtype(dt)), "labels": labels}
        if op.startswith("swiglu"):
            inputs = {"gate": _randn((m, n), dt, device, gen), "up": _randn((m, n), dt, device, gen)}
            if op == "swiglu_bwd":
                inputs["dout"] = _randn((m, n), dt, device, gen)
            return inputs
        inputs = {"x": _randn((m, n), dt, device, gen)}
        if op.startswith(("rmsnorm", "layernorm")):
            inputs["w"] = (_randn((n,), dt, device, gen).float() * 0.5 + 1).to(torch_dtype(dt))
        if op.startswith("layernorm"):
            inputs["b"] = _randn((n,), dt, device, gen)
        if op == "rmsnorm_residual_fwd":
            inputs["r"] = _randn((m, n), dt, device, gen)
        if op.endswith("bwd"):
            inputs["dy"] = _randn((m, n), dt, device, gen)
        return inputs

    def empty_out(self, inputs: dict[str, Any]):
        return None

    def reference(self, inputs: dict[str, Any]):
        """float32 torch (TF32 off) of what the op returns, flattened as `canonical` flattens it."""
        import torch
        import torch.nn.functional as F

        op = self.op
        with _fp32_highest(), torch.enable_grad():
            if op == "rope":
                return _rope_reference(inputs)
            if op == "linear_cross_entropy":
                x = inputs["x"].float().requires_grad_()
                w = inputs["w"].float().requires_grad_()
                loss = F.cross_entropy(x @ w.t(), inputs["labels"])
                dx, dw = torch.autograd.grad(loss, (x, w))
                return flat(loss, dx, dw[inputs["dw_rows"]])
            if op.startswith("linear_swiglu"):
                x = inputs["x"].float().requires_grad_()
                wg, wu = (inputs[k].float().requires_grad_() for k in ("w_gate", "w_up"))
                h = F.silu(x @ wg.t()) * (x @ wu.t())
                if op == "linear_swiglu_fwd":
                    return h.detach()
                return flat(h, *torch.autograd.grad(h, (x, wg, wu), inputs["dh"].float()))
            if op.startswith("cross_entropy"):
                x = inputs["x"].float().requires_grad_()
                rows = F.cross_entropy(x, inputs["labels"], reduction="none")
                if op == "cross_entropy_fwd":
                    return rows.detach()
                loss = rows.sum() / (inputs["labels"] != -100).sum()
                return flat(loss, torch.autograd.grad(loss, x)[0])
            if op.startswith("swiglu"):
                g = inputs["gate"].float().requires_grad_()
                u = inputs["up"].float().requires_grad_()
                out = F.silu(g) * u
                if op == "swiglu_fwd":
                    return out.detach()
                return flat(*torch.autograd.grad(out, (g, u), inputs["dout"].float()))
            x = inputs["x"].float().requires_grad_()
            w = inputs.get("w")
            w = None if w is None else w.float().requires_grad_()
            if op.startswith("softmax"):
                y = torch.softmax(x, -1)
                return y.detach() if op == "softmax_fwd" else torch.autograd.grad(y, x, inputs["dy"].float())[0]
            if op == "rmsnorm_residual_fwd":
                s = x + inputs["r"].float()
                return flat(F.rms_norm(s, (self.width,), w, EPS), s)
            if op.startswith("rmsnorm"):
                y = F.rms_norm(x, (self.width,), w, EPS)
            else:
                b = inputs["b"].float().requires_grad_()
                y = F.layer_norm(x, (self.width,), w, b, EPS)
            if op.endswith("fwd"):
                return y.detach()
            leaves = (x, w) if op.startswith("rmsnorm") else (x, w, b)
            return flat(*torch.autograd.grad(y, leaves, inputs["dy"].float()))


def flat(*tensors):
    import torch

    return torch.cat([t.detach().float().reshape(-1) for t in tensors])


def _rope_reference(inputs):
    import torch

    out = []
    for name in ("q", "k"):
        x = inputs[name].float()
        d = x.shape[-1]
        c, s = inputs["cos"][None, :, None, :], inputs["sin"][None, :, None, :]
        a, b = x[..., : d // 2], x[..., d // 2:]
        out.append(torch.cat((a * c - b * s, b * c + a * s), -1))
    return flat(*out)
