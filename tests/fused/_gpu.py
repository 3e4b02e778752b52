"""Helpers of the fused kernels' GPU tests: fresh N(0, 1) inputs (optionally with rows further
apart than their width), NaN-poisoned allocations before each call, float64 references, and the
tolerances (relative Frobenius error per output dtype)."""

from __future__ import annotations

import math

import torch

# ||out - ref|| / ||ref|| against a float64 reference of the same (rounded) inputs: the output's
# rounding (2^-9 relative for bf16, 2^-12 fp16) dominates; fp32 leaves room for fp32 accumulation.
TOL = {torch.bfloat16: 8e-3, torch.float16: 1.5e-3, torch.float32: 2e-5}
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def randn(*shape, dtype=torch.float32, row_pad: int = 0, scale: float = 1.0):
    """N(0, 1) * scale on the GPU; with row_pad > 0 the last dim is a slice of a wider buffer
    (row stride = width + row_pad), so the kernel sees non-contiguous rows."""
    width = shape[-1]
    base = torch.randn(*shape[:-1], width + row_pad, device="cuda", dtype=torch.float32) * scale
    return base.to(dtype)[..., :width]


def poison(*shapes_dtypes):
    """Fill and free NaN blocks of the given (shape, dtype)s so that torch's caching allocator
    hands them to the next allocations of those sizes: an element a kernel forgets to write
    reads NaN. Best effort; the tests also check that no output is NaN where the reference is
    finite."""
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for shape, dtype in shapes_dtypes]
    del blocks


def rel_err(out, ref) -> float:
    o, r = out.detach().double(), ref.detach().double()
    if o.shape != r.shape:
        raise AssertionError(f"shape {tuple(o.shape)} != reference {tuple(r.shape)}")
    finite = torch.isfinite(r)
    if not torch.equal(torch.isfinite(o), finite):
        return math.inf
    o, r = o[finite], r[finite]
    denom = float(r.norm())
    return float((o - r).norm()) / denom if denom > 0 else float((o - r).norm())


def assert_close(out, ref, dtype, what: str = "", factor: float = 1.0):
    err = rel_err(out, ref)
    assert err <= TOL[dtype] * factor, f"{what}: rel_err {err:.3g} > {TOL[dtype] * factor:.3g} ({dtype})"


def f64(t):
    return None if t is None else t.detach().double()
