"""RMSNorm / LayerNorm kernels on the GPU against float64 references: rows of 1, odd widths
(scalar access), non-contiguous rows, residual fused, mixed weight dtype, Gemma's offset, no
weight, every gradient; NaN/Inf as torch's; the module and autograd path; the prefetching
backward (the default where it fits) against the plain loop, and the dense forward (the
default) against the plain build."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.fused import norm_backward, norm_forward, reference  # noqa: E402

from ._gpu import TOL, assert_close, f64, poison, randn, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# kind, rows, width, dtype, weight dtype (None: no weight), bias, residual, row_pad, offset, out dtype
CASES = [
    ("rms", 1, 4096, BF16, BF16, False, False, 0, 0.0, None),
    ("rms", 257, 4096, BF16, BF16, False, True, 64, 0.0, None),       # non-contiguous rows
    ("rms", 3, 1000, F16, F16, False, True, 0, 0.0, None),
    ("rms", 17, 33, F32, F32, False, False, 0, 0.0, None),             # odd width: scalar access
    ("rms", 5, 8192, BF16, F32, False, False, 0, 0.0, F32),            # Llama: fp32 weight, promoted out
    ("rms", 9, 2048, BF16, BF16, False, True, 0, 1.0, None),           # Gemma: (1 + weight)
    ("rms", 6, 512, BF16, None, False, False, 0, 0.0, None),           # no weight
    ("rms", 4, 16384, BF16, BF16, False, False, 0, 0.0, None),         # the widest forward row
    ("layer", 129, 4096, BF16, BF16, True, True, 0, 0.0, None),
    ("layer", 7, 777, F32, F32, True, False, 0, 0.0, None),
    ("layer", 3, 128, F16, F16, False, False, 8, 0.0, None),           # weight, no bias
    ("layer", 2, 64, BF16, None, False, True, 0, 0.0, None),           # no affine
    ("layer", 33, 8192, BF16, BF16, True, False, 0, 0.0, None),
]


def _inputs(kind, rows, width, dtype, wdt, bias, residual, row_pad, seed):
    torch.manual_seed(seed)
    x = randn(rows, width, dtype=dtype, row_pad=row_pad)
    w = (randn(width, dtype=wdt) * 0.5 + 1.0).to(wdt) if wdt is not None else None
    b = randn(width, dtype=wdt) if bias else None
    r = randn(rows, width, dtype=dtype, row_pad=row_pad) if residual else None
    return x, w, b, r


def _expected(kind, x, w, b, r, eps, offset):
    return reference.norm_forward(f64(x), f64(w), f64(b), f64(r), kind=kind, eps=eps, offset=offset)


@pytest.mark.parametrize("kind, rows, width, dtype, wdt, bias, residual, row_pad, offset, out_dtype", CASES)
def test_forward_and_backward_match_float64(kind, rows, width, dtype, wdt, bias, residual, row_pad, offset,
                                            out_dtype):
    eps = 1e-5
    x, w, b, r = _inputs(kind, rows, width, dtype, wdt, bias, residual, row_pad, seed=rows * 31 + width)
    y_dtype = out_dtype or dtype
    poison(((rows, width), y_dtype), ((rows, width), dtype), ((rows,), F32), ((rows,), F32))
    y, s, rstd, mean = norm_forward(x, w, b, r, kind=kind, eps=eps, offset=offset, out_dtype=out_dtype)
    torch.cuda.synchronize()
    ry, rs, rrstd, rmean = _expected(kind, x, w, b, r, eps, offset)
    assert y.dtype == y_dtype and y.shape == x.shape
    assert_close(y, ry, y_dtype, "y")
    assert torch.allclose(rstd.double(), rrstd, rtol=1e-5, atol=0), "rstd"
    if residual:
        assert s.dtype == r.dtype and rel_err(s, rs) <= TOL[dtype], "s = x + residual"
    else:
        assert s is None
    if kind == "layer":
        assert torch.allclose(mean.double(), rmean, rtol=1e-5, atol=1e-6), "mean"
    else:
        assert mean is None

    # Backward from the kernel's own saved statistics, against float64 from the float64 ones.
    torch.manual_seed(rows + 1)
    dy = randn(rows, width, dtype=dtype, row_pad=row_pad)
    dsum = randn(rows, width, dtype=dtype) if residual else None
    normed = s if residual else x
    poison(((rows, width), dtype))
    dx, dw, db = norm_backward(dy, normed, w, rstd, mean, kind=kind, offset=offset, dsum=dsum, has_bias=bias)
    torch.cuda.synchronize()
    rdx, rdw, rdb = reference.norm_backward(f64(dy), f64(normed), f64(w), rrstd, rmean, kind=kind, offset=offset,
                                            dsum=f64(dsum), has_bias=bias)
    assert dx.dtype == normed.dtype
    assert_close(dx, rdx, dtype, "dx", factor=2)
    if w is not None:
        assert dw.dtype == w.dtype and rel_err(dw, rdw) <= 2 * TOL[w.dtype] + 1e-5, "dweight"
    else:
        assert dw is None
    if bias:
        assert rel_err(db, rdb) <= 2 * TOL[w.dtype] + 1e-5, "dbias"
    else:
        assert db is None


def test_rows_of_any_count_share_one_compiled_kernel():
    from cute_kernels.runtime import cache

    x, w, _, _ = _inputs("rms", 10, 4096, BF16, BF16, False, False, 0, seed=0)
    norm_forward(x, w)
    compiled = cache.stats["compiled"] + cache.stats["disk_loaded"]
    for rows in (1, 2, 129, 1000):
        x, w, _, _ = _inputs("rms", rows, 4096, BF16, BF16, False, False, 0, seed=rows)
        y, _, _, _ = norm_forward(x, w)
        ry, _, _, _ = _expected("rms", x, w, None, None, 1e-6, 0.0)
        assert_close(y, ry, BF16, f"rows={rows}")
    assert cache.stats["compiled"] + cache.stats["disk_loaded"] == compiled


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_nan_and_inf_propagate_as_torch(kind):
    torch.manual_seed(5)
    x = randn(8, 1024, dtype=F32)
    w = randn(1024, dtype=F32)
    b = randn(1024, dtype=F32) if kind == "layer" else None
    x[2, 17] = math.nan
    x[5, 3] = math.inf
    x[6, 0] = -math.inf
    y, _, _, _ = norm_forward(x, w, b, kind=kind, eps=1e-6)
    if kind == "rms":
        want = torch.nn.functional.rms_norm(x, (1024,), w, eps=1e-6)
    else:
        want = torch.nn.functional.layer_norm(x, (1024,), w, b, eps=1e-6)
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    assert torch.equal(torch.isinf(y), torch.isinf(want))
    finite = torch.isfinite(want)
    assert torch.allclose(y[finite], want[finite], rtol=1e-4, atol=1e-5)


def test_bad_input_raises_before_launch():
    x = randn(4, 64, dtype=BF16)
    with pytest.raises(ValueError, match="weight has shape"):
        norm_forward(x, randn(65, dtype=BF16))
    with pytest.raises(ValueError, match="is on device 'cpu'"):
        norm_forward(x, torch.ones(64, dtype=BF16))
    with pytest.raises(TypeError, match="dtype torch.int32"):
        norm_forward(x.int())
    with pytest.raises(ValueError, match="residual has shape"):
        norm_forward(x, residual=randn(4, 63, dtype=BF16))


def test_module_autograd_matches_float64():
    import cute_kernels.nn as cnn

    torch.manual_seed(1)
    for m, ref_cls in ((cnn.RMSNorm(3000, eps=1e-5, device="cuda", dtype=BF16), torch.nn.RMSNorm),
                       (cnn.LayerNorm(3000, device="cuda", dtype=BF16), torch.nn.LayerNorm)):
        with torch.no_grad():
            m.weight.normal_()
            if getattr(m, "bias", None) is not None:
                m.bias.normal_()
        x = randn(2, 5, 3000, dtype=BF16).requires_grad_()
        res = randn(2, 5, 3000, dtype=BF16).requires_grad_()
        y, s = m(x, res)
        gy, gs = randn(2, 5, 3000, dtype=BF16), randn(2, 5, 3000, dtype=BF16)
        torch.autograd.backward((y, s), (gy, gs))
        ref = ref_cls(3000, eps=m.eps, device="cuda", dtype=torch.float64)
        with torch.no_grad():
            ref.weight.copy_(m.weight)
            if getattr(m, "bias", None) is not None:
                ref.bias.copy_(m.bias)
        xd, rd = f64(x).requires_grad_(), f64(res).requires_grad_()
        sd = xd + rd
        yd = ref(sd)
        torch.autograd.backward((yd, sd), (f64(gy), f64(gs)))
        assert_close(y, yd, BF16, "y")
        assert_close(x.grad, xd.grad, BF16, "dx", factor=2)
        assert_close(res.grad, rd.grad, BF16, "dresidual", factor=2)
        assert_close(m.weight.grad, ref.weight.grad, BF16, "dweight", factor=2)


# Many row blocks a CTA (rows well past the grid of about two CTAs an SM), odd counts, each form
# the prefetching backward takes: kind, rows, width, dtype, weight dtype, bias, dsum, row_pad.
PREFETCH_CASES = [
    ("rms", 3001, 4096, BF16, BF16, False, False, 0),
    ("rms", 2049, 4096, BF16, BF16, False, True, 64),
    ("rms", 4099, 2048, BF16, F32, False, False, 0),
    ("rms", 1537, 8192, BF16, BF16, False, True, 0),
    ("layer", 5003, 768, BF16, BF16, True, True, 0),
    ("layer", 2001, 1024, F16, F16, False, False, 8),
    ("rms", 901, 777, F32, F32, False, False, 0),
]


@pytest.mark.parametrize("kind, rows, width, dtype, wdt, bias, residual, row_pad", PREFETCH_CASES)
def test_prefetching_backward_matches_the_plain_loop_and_float64(monkeypatch, kind, rows, width, dtype, wdt, bias,
                                                                 residual, row_pad):
    """`NormConfig.prefetch` (the next row block loaded while this one computes) changes where
    values wait, not what is computed: float64's values, and the plain loop's within a few ulp."""
    from cute_kernels.fused import dispatch
    from cute_kernels.fused.dispatch import norm_backward_prefetch, norm_tiling
    from cute_kernels.fused.host import dtype_name
    from cute_kernels.runtime import plan_cache

    x, w, b, r = _inputs(kind, rows, width, dtype, wdt, bias, residual, row_pad, seed=rows)
    y, s, rstd, mean = norm_forward(x, w, b, r, kind=kind, eps=1e-5)
    normed = s if residual else x
    torch.manual_seed(rows + 2)
    dy = randn(rows, width, dtype=dtype, row_pad=row_pad)
    dsum = randn(rows, width, dtype=dtype) if residual else None
    results = {}
    for on in (False, True):
        # the plain loop where the prefetching one is the default: its admission refused
        monkeypatch.setattr(dispatch, "norm_backward_prefetch", norm_backward_prefetch if on else
                            (lambda *a, **k: False))
        plan_cache.invalidate()  # the plan kept for this signature was made with the other loop
        poison(((rows, width), dtype))
        results[on] = norm_backward(dy, normed, w, rstd, mean, kind=kind, dsum=dsum, has_bias=bias)
    monkeypatch.undo()
    plan_cache.invalidate()
    torch.cuda.synchronize()
    tiling = norm_tiling(width, dtype_name(dtype), dtype_name(wdt), bias=bias, residual=residual, backward=True)
    assert norm_backward_prefetch(tiling, dtype_name(dtype), dtype_name(wdt), bias=bias, residual=residual), \
        "a case the prefetching kernel does not take"
    rdx, rdw, rdb = reference.norm_backward(f64(dy), f64(normed), f64(w), rstd.double(),
                                            None if mean is None else mean.double(), kind=kind, dsum=f64(dsum),
                                            has_bias=bias)
    for on, (dx, dw, db) in results.items():  # both against float64 first: wrong, or only reordered?
        assert_close(dx, rdx, dtype, f"dx (prefetch={on})", factor=2)
        assert rel_err(dw, rdw) <= 2 * TOL[wdt] + 1e-5, f"dweight (prefetch={on})"
        if bias:
            assert rel_err(db, rdb) <= 2 * TOL[wdt] + 1e-5, f"dbias (prefetch={on})"
    # The same values but for the last bits: the two loops compile to different instruction orders
    # (measured on an H100: a few dx elements in millions one output ulp apart in bf16, fp32's
    # last bits), where a stale or misplaced row block would be off by its whole magnitude.
    for name, plain, fetched in zip(("dx", "dw", "db"), results[False], results[True]):
        assert (plain is None) == (fetched is None)
        if plain is not None:
            eps = torch.finfo(plain.dtype).eps
            a, b = plain.double(), fetched.double()
            bound = 4 * eps * (a.abs() + a.pow(2).mean().sqrt())
            apart = (a - b).abs() > bound
            assert not bool(apart.any()), (f"{name}: {int(apart.sum())} of {plain.numel()} elements differ by more "
                                           f"than 4 ulp, up to {(a - b).abs().max().item():.3g}")


@pytest.mark.parametrize("kind, rows, width, dtype, wdt, bias, residual, row_pad, offset, out_dtype", CASES)
def test_dense_forward_computes_what_the_plain_one_does(monkeypatch, kind, rows, width, dtype, wdt, bias, residual,
                                                          row_pad, offset, out_dtype):
    """`NormConfig.dense` (compiled for more CTAs an SM: another register cap, the same code)
    gives the same bits as the plain forward."""
    from cute_kernels.fused import norm_api
    from cute_kernels.runtime import plan_cache

    x, w, b, r = _inputs(kind, rows, width, dtype, wdt, bias, residual, row_pad, seed=rows * 7 + width)
    results = {}
    for on in (False, True):
        monkeypatch.setattr(norm_api, "DENSE_FORWARD", on)
        plan_cache.invalidate()  # a stored plan holds the other build
        poison(((rows, width), out_dtype or dtype), ((rows, width), dtype))
        results[on] = norm_forward(x, w, b, r, kind=kind, eps=1e-5, offset=offset, out_dtype=out_dtype)
    torch.cuda.synchronize()
    for plain, dense in zip(results[False], results[True]):
        assert (plain is None) == (dense is None)
        if plain is not None:
            assert torch.equal(plain, dense)
