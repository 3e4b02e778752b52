"""Shared pieces of the `gemm.gemv` GPU tests: operands with chosen majors, padded leading
dimensions, shifted bases and broadcast batches; the float64 reference; the check."""

from __future__ import annotations

import pytest
import torch

ACTS = (None, "relu", "gelu_tanh", "silu")


def rung():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from cute_kernels.gemm.gemv import RUNG

    return RUNG


def matrix(l: int, rows: int, cols: int, dtype, *, unit: str = "cols", pad: int = 0, offset: int = 0,
           broadcast: bool = False, fill=None) -> torch.Tensor:
    """A (l, rows, cols) view of fresh N(0, 1) storage: unit stride along `unit` ("cols" or
    "rows"), the leading dimension padded by `pad` elements, the base `offset` elements into
    the storage (so 2-byte offsets misalign it), one batch expanded with stride 0 when
    `broadcast`. `fill` replaces the values (NaN poison for outputs)."""
    lb = 1 if broadcast else l
    ld = (cols if unit == "cols" else rows) + pad
    other = rows if unit == "cols" else cols
    batch = other * ld
    storage = torch.randn(offset + lb * batch, device="cuda").to(dtype)
    if fill is not None:
        storage.fill_(fill)
    stride = (batch, ld, 1) if unit == "cols" else (batch, 1, ld)
    t = storage.as_strided((lb, rows, cols), stride, offset)
    return t.expand(l, rows, cols) if broadcast else t


def operands(l, m, n, k, dtype=torch.bfloat16, *, a_unit="cols", b_unit="rows", pad_a=0, pad_b=0, off_a=0, off_b=0,
             bcast_a=False, bcast_b=False):
    """matmul's rung views a (L, M, K) and b (L, K, N). b_unit "rows" is b = w.t() of an (N, K)
    weight (nn.Linear: unit stride along K); "cols" a row-major (K, N) b."""
    a = matrix(l, m, k, dtype, unit=a_unit, pad=pad_a, offset=off_a, broadcast=bcast_a)
    b = matrix(l, k, n, dtype, unit=b_unit, pad=pad_b, offset=off_b, broadcast=bcast_b)
    return a, b


def poisoned_out(l, m, n, dtype, *, unit="cols", pad=0):
    return matrix(l, m, n, dtype, unit=unit, pad=pad, fill=float("nan"))


def reference(a, b, *, alpha=1.0, beta=0.0, c=None, bias=None, bias_dim="n", activation=None) -> torch.Tensor:
    ref = alpha * (a.double() @ b.double())
    if beta:
        ref = ref + beta * c.double()
    if bias is not None:
        ref = ref + (bias.double().view(1, 1, -1) if bias_dim == "n" else bias.double().view(1, -1, 1))
    if activation == "relu":
        ref = torch.relu(ref)
    elif activation == "gelu_tanh":
        ref = torch.nn.functional.gelu(ref, approximate="tanh")
    elif activation == "silu":
        ref = torch.nn.functional.silu(ref)
    return ref


def tolerance(out_dtype, activation=None) -> float:
    if out_dtype == torch.float32:
        return 2e-3 if activation in ("gelu_tanh", "silu") else 1e-4
    return 1e-2 if out_dtype == torch.bfloat16 else 4e-3


def check(out, ref, what: str = "", activation=None) -> None:
    """Every element written (the NaN poison gone) and the relative Frobenius error in bounds."""
    assert torch.isfinite(out).all(), f"{what}: {int((~torch.isfinite(out)).sum())} outputs unwritten or non-finite"
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < tolerance(out.dtype, activation), f"{what}: relative error {err:.3g}"


def run(l, m, n, k, *, dtype=torch.bfloat16, out_dtype=None, out_unit="cols", out_pad=0, alpha=1.0, beta=0.0,
        c_unit="cols", bias_dim=None, bias_dtype=torch.float32, activation=None, config=None, **layout):
    """One call of the rung on fresh operands (`operands` keywords in `layout`) against float64."""
    r = rung()
    out_dtype = out_dtype or dtype
    a, b = operands(l, m, n, k, dtype, **layout)
    out = poisoned_out(l, m, n, out_dtype, unit=out_unit, pad=out_pad)
    c = matrix(l, m, n, out_dtype, unit=c_unit) if beta else None
    bias = torch.randn(n if bias_dim == "n" else m, device="cuda").to(bias_dtype) if bias_dim else None
    why = r.supports(a, b, out)
    assert why is None, why
    what = f"L={l} M={m} N={n} K={k} {layout} out {out_dtype} {out_unit} config {(config or r.config_for(a, b, out)).tag}"
    r(a, b, out, alpha=alpha, beta=beta, c=c, bias=bias, bias_dim=bias_dim or "n", activation=activation,
      config=config)
    torch.cuda.synchronize()
    check(out, reference(a, b, alpha=alpha, beta=beta, c=c, bias=bias, bias_dim=bias_dim or "n",
                         activation=activation), what, activation)
    return out
