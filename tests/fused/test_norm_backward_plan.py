"""The norm backward's launch plan (`fused.norm_api._backward_plan`) on CPU, with the compiled
kernel replaced by a stand-in that writes what the kernel writes (dx and per-CTA partial rows
of dweight and dbias): the plan's summation of the partials, its dtypes, and that its results
never share storage (the `cute_kernels::norm_backward` op refuses outputs that alias)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.fused import norm_api, reference  # noqa: E402

F32 = torch.float32


@pytest.fixture
def kernel(monkeypatch):
    """The compiled backward replaced: it splits the rows over `grid` CTAs as the kernel does
    and writes each CTA's partial sums of dy * xhat (dweight) and dy (dbias)."""

    def compile_stand_in(kernel_obj, args, key):
        def fn(s, weight, dy, rstd, mean, dsum, dx, pw, pb, grid):
            xhat = (s.double() - (0 if mean is None else mean.double()[:, None])) * rstd.double()[:, None]
            ref = reference.norm_backward(dy, s, weight, rstd, mean, kind="layer" if mean is not None else "rms",
                                          has_bias=pb is not None)
            dx.copy_(ref[0])
            rows_per = -(-s.shape[0] // pw.shape[0]) if pw is not None else 1
            for p, term in ((pw, dy.double() * xhat), (pb, dy.double())):
                if p is None:
                    continue
                p.zero_()
                for i in range(p.shape[0]):
                    p[i] = term[i * rows_per:(i + 1) * rows_per].sum(0).to(F32)
        return fn

    monkeypatch.setattr(norm_api, "compile_tvm_ffi", compile_stand_in)
    monkeypatch.setattr(norm_api, "sm_count", lambda device=None: 4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kind,has_bias", [("layer", True), ("layer", False), ("rms", False)])
def test_backward_plan_sums_partials_into_separate_gradients(kernel, dtype, kind, has_bias):
    torch.manual_seed(0)
    rows, n = 37, 64
    s, dy = torch.randn(rows, n).to(dtype), torch.randn(rows, n).to(dtype)
    weight = torch.randn(n).to(dtype)
    mean = s.float().mean(-1) if kind == "layer" else None
    var = s.float().var(-1, unbiased=False) if kind == "layer" else s.float().pow(2).mean(-1)
    rstd = torch.rsqrt(var + 1e-5)
    plan = norm_api._backward_plan(dy, s, weight, rstd, mean, None, kind, 0.0, has_bias, True)
    dx, dw, db = plan(dy, s, weight, rstd, mean, None)
    want = reference.norm_backward(dy, s, weight, rstd, mean, kind=kind, has_bias=has_bias)
    assert dx.dtype == dtype and dw.dtype == dtype and dw.shape == (n,)
    assert torch.allclose(dw.float(), want[1].float(), rtol=2e-2, atol=2e-2)
    storages = {dx.untyped_storage().data_ptr(), dw.untyped_storage().data_ptr()}
    if has_bias:
        assert db.dtype == dtype and torch.allclose(db.float(), want[2].float(), rtol=2e-2, atol=2e-2)
        storages.add(db.untyped_storage().data_ptr())
    else:
        assert db is None
    assert len(storages) == 2 + has_bias  # no two results share storage
