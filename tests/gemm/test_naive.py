"""The `naive` GEMM rung against torch in float64: shapes that stress predication, every
transpose, batches, alpha/beta, NaN/Inf propagation, low-precision inputs and outputs.
Outputs are NaN-poisoned before each run, so an element the kernel fails to write fails."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _rung():
    from cute_kernels.gemm import KERNELS

    return KERNELS["naive"]


def _operand(batch, rows, cols, dtype, transposed):
    """N(0,1) (batch, rows, cols); stored column-major (rows contiguous) when `transposed`."""
    if transposed:
        return torch.randn(batch, cols, rows, device="cuda").to(dtype).transpose(1, 2)
    return torch.randn(batch, rows, cols, device="cuda").to(dtype)


def _reference(a, b, alpha=1.0, beta=0.0, c=None):
    ref = alpha * torch.matmul(a.double(), b.double())
    if c is not None and beta != 0:
        ref = ref + beta * c.double()
    return ref


def _rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _run(a, b, out_dtype, alpha=1.0, beta=0.0, c=None, out=None):
    if out is None:
        out = torch.full((a.shape[0], a.shape[1], b.shape[2]), float("nan"), device="cuda", dtype=out_dtype)
    else:
        out.fill_(float("nan"))
    _rung()(a, b, out, alpha=alpha, beta=beta, c=c)
    torch.cuda.synchronize()
    return out


SHAPES = [(1, 1, 1), (17, 33, 65), (127, 129, 131), (64, 64, 64), (3, 200, 40), (200, 5, 77), (256, 96, 1)]


@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)], ids=["nn", "tn", "nt", "tt"])
def test_fp32_shapes_and_transposes(m, n, k, ta, tb):
    a = _operand(1, m, k, torch.float32, ta)
    b = _operand(1, k, n, torch.float32, tb)
    out = _run(a, b, torch.float32)
    assert not out.isnan().any()
    assert _rel_err(out, _reference(a, b)) < _TOL[torch.float32]


@pytest.mark.parametrize("dtype, out_dtype", [
    (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
])
def test_low_precision(dtype, out_dtype):
    a = _operand(2, 70, 90, dtype, False)
    b = _operand(2, 90, 50, dtype, True)
    out = _run(a, b, out_dtype)
    ref = _reference(a, b)
    tol = _TOL[out_dtype]
    assert out.dtype == out_dtype
    assert _rel_err(out, ref) < tol


def test_batched_with_alpha_beta_and_column_major_c():
    a = _operand(5, 33, 47, torch.float32, False)
    b = _operand(5, 47, 29, torch.float32, True)
    c = torch.randn(5, 29, 33, device="cuda").transpose(1, 2)  # column-major addend
    out = _run(a, b, torch.float32, alpha=-0.75, beta=1.5, c=c)
    assert _rel_err(out, _reference(a, b, -0.75, 1.5, c)) < 1e-5


def test_column_major_output():
    a = _operand(2, 40, 30, torch.float32, False)
    b = _operand(2, 30, 50, torch.float32, False)
    out = torch.empty(2, 50, 40, device="cuda").transpose(1, 2)
    _run(a, b, torch.float32, out=out)
    assert _rel_err(out, _reference(a, b)) < 1e-5


def test_nan_and_inf_propagate_like_torch():
    a = torch.randn(1, 20, 30, device="cuda")
    b = torch.randn(1, 30, 25, device="cuda")
    a[0, 3, 7] = float("nan")
    b[0, 11, 4] = float("inf")
    b[0, 12, 9] = float("-inf")
    out = _run(a, b, torch.float32)
    ref = _reference(a, b)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.isinf(), ref.isinf())
    assert torch.equal(torch.sign(out[ref.isinf()]), torch.sign(ref[ref.isinf()]))
    finite = ref.isfinite()
    assert _rel_err(out[finite], ref[finite]) < 1e-5


# ---- through the public API ------------------------------------------------------------------

def _poison_allocator(numel):
    # torch's caching allocator hands the freed NaN block to matmul's torch.empty.
    torch.full((numel,), float("nan"), device="cuda")


def test_matmul_2d_and_batched_broadcast():
    from cute_kernels.gemm import matmul

    a = torch.randn(37, 19, device="cuda")
    b = torch.randn(19, 23, device="cuda")
    _poison_allocator(37 * 23)
    out = matmul(a, b, kernel="naive")
    assert out.shape == (37, 23)
    assert _rel_err(out, torch.matmul(a.double(), b.double())) < 1e-5

    bb = torch.randn(4, 19, 23, device="cuda")
    _poison_allocator(4 * 37 * 23)
    out = matmul(a, bb, kernel="naive")
    assert out.shape == (4, 37, 23)
    assert _rel_err(out, torch.matmul(a.double(), bb.double())) < 1e-5

    aa = torch.randn(1, 37, 19, device="cuda").transpose(1, 2).contiguous().transpose(1, 2)
    out = matmul(aa, bb, kernel="naive")
    assert _rel_err(out, torch.matmul(aa.double(), bb.double())) < 1e-5


def test_matmul_alpha_beta_with_broadcast_bias():
    from cute_kernels.gemm import matmul

    a = torch.randn(3, 31, 17, device="cuda")
    b = torch.randn(3, 17, 45, device="cuda")
    bias = torch.randn(45, device="cuda")
    out = matmul(a, b, kernel="naive", alpha=2.0, beta=-1.0, c=bias)
    ref = 2.0 * torch.matmul(a.double(), b.double()) - bias.double()
    assert _rel_err(out, ref) < 1e-5


def test_matmul_beta_zero_ignores_nan_in_c():
    from cute_kernels.gemm import matmul

    a = torch.randn(8, 9, device="cuda")
    b = torch.randn(9, 10, device="cuda")
    c = torch.full((8, 10), float("nan"), device="cuda")
    out = matmul(a, b, kernel="naive", beta=0.0, c=c)
    assert not out.isnan().any()


def test_matmul_rejects_tensors_on_different_devices():
    from cute_kernels.gemm import matmul

    with pytest.raises(ValueError, match="b is on device 'cpu'"):
        matmul(torch.randn(4, 5, device="cuda"), torch.randn(5, 6))


# ---- the launch paths ------------------------------------------------------------------------

@pytest.mark.parametrize("tvm_ffi", [True, False], ids=["tvm_ffi", "dsl_tensors"])
def test_both_launch_paths_with_broadcast_operands(tvm_ffi, monkeypatch):
    from cute_kernels.gemm import naive

    if tvm_ffi and not naive.tvm_ffi_available():
        pytest.skip("apache-tvm-ffi is not installed")
    monkeypatch.setattr(naive, "use_tvm_ffi", lambda: tvm_ffi)
    a = _operand(1, 37, 29, torch.float32, True).expand(3, 37, 29)  # batch stride 0, column-major
    b = _operand(3, 29, 41, torch.float32, False)
    c = torch.randn(41, device="cuda").expand(3, 37, 41)  # zero strides in batch and M
    out = _run(a, b, torch.float32, alpha=0.5, beta=2.0, c=c)
    assert _rel_err(out, _reference(a, b, 0.5, 2.0, c)) < 1e-5
    out = _run(a[:, :20], b[:, :, :33], torch.bfloat16)  # new sizes, another output dtype
    assert _rel_err(out, _reference(a[:, :20], b[:, :, :33])) < _TOL[torch.bfloat16]


def test_runs_on_the_current_stream():
    # A busy side stream fills the operands, then multiplies: a launch on any other stream (the
    # default stream does not wait for a non-blocking side stream) would read them before the fill.
    a, b = torch.zeros(1, 64, 48, device="cuda"), torch.zeros(1, 48, 80, device="cuda")
    out = torch.full((1, 64, 80), float("nan"), device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        a.fill_(1.0)
        b.fill_(0.5)
        _rung()(a, b, out, alpha=1.0, beta=0.0, c=None)
    side.synchronize()
    assert torch.all(out == 24.0)
