"""Measured ceilings: the best math rate and HBM bandwidth this device reaches in this run.

- math, per input dtype: a big cuBLAS GEMM, 8192³, C = A·Bᵀ on N(0, 1) data (bf16 and fp16
  through torch.matmul, fp32 with TF32 disabled, fp8 e4m3 through torch._scaled_mm), TFLOP/s;
- memory: a 1 GiB device-to-device copy (`dst.copy_(src)`, 2 GiB of traffic), GB/s.

Each ceiling is the best of `rounds` timer calls (a ceiling is what the device can do, so the
fastest observation is the estimate). Ceilings can instead be read from a record: a result
JSON (its `ceilings` object) or a JSON object of the same keys, `{"bf16": 750.0, "hbm_gbps":
4300.0}`. `pct_ceiling` of a record is its rate over the roofline at its arithmetic intensity:
min(math, intensity · bandwidth).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cute_kernels.bench.timing import Timer

CEILING_SIZE = 8192
COPY_BYTES = 1 << 30
HBM_KEY = "hbm_gbps"


def roofline_tflops(ceilings: dict[str, Any], dtype: str, flops: float, nbytes: float) -> float | None:
    """min(math[dtype], flops/bytes · bandwidth) in TFLOP/s; None when a needed ceiling is absent."""
    math_rate = ceilings.get(dtype)
    bw = ceilings.get(HBM_KEY)
    if flops <= 0 or nbytes <= 0:
        return None
    bound = []
    if isinstance(math_rate, (int, float)) and math_rate > 0:
        bound.append(float(math_rate))
    if isinstance(bw, (int, float)) and bw > 0:
        bound.append(flops / nbytes * bw / 1e3)  # (FLOP/B)·(GB/s) = GFLOP/s -> TFLOP/s
    return min(bound) if bound else None


def pct_ceiling(ceilings: dict[str, Any], dtype: str, flops: float, nbytes: float, ms: float) -> float | None:
    """Percent of the roofline reached; for a case without FLOPs (a copy), percent of bandwidth."""
    if ms is None or ms <= 0:
        return None
    if flops > 0:
        roof = roofline_tflops(ceilings, dtype, flops, nbytes)
        return None if roof is None else 100.0 * (flops / ms / 1e9) / roof
    bw = ceilings.get(HBM_KEY)
    if not isinstance(bw, (int, float)) or bw <= 0:
        return None
    return 100.0 * (nbytes / ms / 1e6) / bw


def load_ceilings(path: str | Path) -> dict[str, Any]:
    """Ceilings from a result file's `ceilings` object or a plain object of ceilings."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a ceilings record must be a JSON object")
    found = data.get("ceilings", data)
    ceilings = {k: v for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not ceilings:
        raise ValueError(f"{path}: no numeric ceilings found (expected keys like 'bf16', '{HBM_KEY}')")
    ceilings["source"] = str(path)
    return ceilings


def measure_ceilings(timer: Timer, dtypes: set[str], *, rounds: int = 3, device: str = "cuda",
                     size: int = CEILING_SIZE, copy_bytes: int = COPY_BYTES) -> dict[str, Any]:
    """Measure the math ceiling of each dtype in `dtypes` and the HBM bandwidth (see module doc)."""
    import torch

    from cute_kernels.bench.cases import torch_dtype

    ceilings: dict[str, Any] = {"source": f"measured in this run: cuBLAS {size}³ GEMM, {copy_bytes >> 20} MiB copy"}
    gen = torch.Generator(device=device).manual_seed(1234)
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        for dtype in sorted(dtypes):
            a = torch.randn(size, size, device=device, generator=gen).to(torch_dtype(dtype))
            b = torch.randn(size, size, device=device, generator=gen).to(torch_dtype(dtype))
            if dtype.startswith("fp8"):
                one = torch.ones((), device=device)
                fn = lambda a=a, b=b, one=one: torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            else:
                fn = lambda a=a, b=b: torch.matmul(a, b.T)
            best = min(timer(fn, f"ceiling_{dtype}") for _ in range(rounds))
            ceilings[dtype] = 2.0 * size**3 / best / 1e9
            del a, b
        src = torch.randn(copy_bytes // 2, device=device, generator=gen).to(torch.bfloat16)
        dst = torch.empty_like(src)
        best = min(timer(lambda s=src, d=dst: d.copy_(s), "ceiling_copy") for _ in range(rounds))
        ceilings[HBM_KEY] = 2.0 * copy_bytes / best / 1e6
        del src, dst
    finally:
        torch.set_float32_matmul_precision(saved)
    return ceilings
