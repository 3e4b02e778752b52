"""SwiGLU gate-up products (`gemm.gated`, `EpilogueSpec.gate`, `ops.linear_swiglu`).

CPU: the weight interleave and its inverse, the torch definition against silu(x Wg^T) * (x Wu^T)
in float64, argument errors before anything runs, the op's schema checks and gradients (through
the fallback), and what the gated builds compile to. GPU: `tests/gemm/test_gated_gpu.py`.
"""

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.gemm import gated  # noqa: E402
from cute_kernels.hopper.epilogue import EpilogueSpec  # noqa: E402

F64 = torch.float64


def _weights(i, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(i, k, generator=g, dtype=F64), torch.randn(i, k, generator=g, dtype=F64)


def test_interleave_alternates_blocks_of_eight_rows_and_splits_back():
    wg, wu = _weights(24, 5)
    w = gated.interleave_gate_up(wg, wu)
    assert w.shape == (48, 5)
    for j in range(3):
        assert torch.equal(w[16 * j:16 * j + 8], wg[8 * j:8 * j + 8])
        assert torch.equal(w[16 * j + 8:16 * j + 16], wu[8 * j:8 * j + 8])
    a, b = gated.split_gate_up(w)
    assert torch.equal(a, wg) and torch.equal(b, wu)


def test_gated_product_is_silu_gate_times_up():
    wg, wu = _weights(40, 12, seed=1)
    x = torch.randn(2, 7, 12, dtype=F64)
    h, p = gated.matmul_swiglu(x, gated.interleave_gate_up(wg, wu), preact=True, alpha=0.5)
    ref = torch.nn.functional.silu(0.5 * x @ wg.t()) * (0.5 * x @ wu.t())
    assert h.shape == (2, 7, 40) and p.shape == (2, 7, 80)
    assert torch.allclose(h, ref, rtol=1e-12, atol=1e-12)
    g, u = gated.gate_up_rows(p)
    assert torch.allclose(g.reshape(2, 7, 40), 0.5 * x @ wg.t()) and torch.allclose(u.reshape(2, 7, 40), 0.5 * x @ wu.t())
    assert gated.last_route().startswith("product, then gated apart")


@pytest.mark.parametrize("call,exc,msg", [
    (lambda: gated.interleave_gate_up(torch.randn(12, 4), torch.randn(12, 4)), ValueError, "multiple of 8"),
    (lambda: gated.interleave_gate_up(torch.randn(8, 4), torch.randn(8, 5)), ValueError, "one shape"),
    (lambda: gated.split_gate_up(torch.randn(24, 4)), ValueError, "multiple of 16"),
    (lambda: gated.matmul_swiglu(torch.randn(3, 4), torch.randn(24, 4)), ValueError, "multiple of 16"),
    (lambda: gated.matmul_swiglu(torch.randn(3, 5), torch.randn(32, 4)), ValueError, "do not compose"),
    (lambda: gated.matmul_swiglu(torch.randn(3, 4), torch.randn(32, 4, dtype=F64)), TypeError, "share a floating"),
    (lambda: gated.matmul_swiglu(torch.randn(3, 4), torch.randn(32, 4), kernel="cublas"), ValueError, "kernel must"),
    (lambda: gated.matmul_swiglu(torch.randn(300, 8, dtype=torch.bfloat16), torch.randn(32, 8, dtype=torch.bfloat16),
                                 kernel="sm90_persistent"), ValueError, "cannot run this problem: inputs on cpu"),
])
def test_bad_arguments_raise_before_anything_runs(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


@pytest.mark.parametrize("kw,msg", [
    (dict(gate="geglu"), "gate must be None or one of"),
    (dict(gate_preact=True), "needs a gate"),
    (dict(gate="swiglu", bias="n"), "takes no beta"),
    (dict(gate="swiglu", activation="silu"), "takes no beta"),
])
def test_gated_spec_takes_no_other_terms(kw, msg):
    with pytest.raises(ValueError, match=msg):
        EpilogueSpec(**kw).validate()
    assert EpilogueSpec(gate="swiglu", gate_preact=True).validate().tag == "swiglu+preact"


def test_op_matches_autograd_of_the_definition_through_the_fallback():
    import warnings

    import cute_kernels.ops as ops
    from cute_kernels.ops.fallback import FallbackWarning

    wg, wu = _weights(16, 6, seed=2)
    x = torch.randn(5, 6, dtype=F64, requires_grad=True)
    w = gated.interleave_gate_up(wg, wu).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        h, p = ops.linear_swiglu(x, w, True, fallback="torch")
        seed = torch.randn_like(h)
        dx, dw = torch.autograd.grad(h, (x, w), seed)
        result = torch.library.opcheck(torch.ops.cute_kernels.linear_swiglu.default,
                                       (x.detach().float().requires_grad_(), w.detach().float().requires_grad_()),
                                       dict(fallback="torch"))
    xr, gr, ur = (t.detach().clone().requires_grad_() for t in (x, wg, wu))
    ref = torch.nn.functional.silu(xr @ gr.t()) * (xr @ ur.t())
    rx, rg, ru = torch.autograd.grad(ref, (xr, gr, ur), seed)
    assert torch.allclose(h, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(dx, rx, rtol=1e-12, atol=1e-12)
    assert torch.allclose(dw, gated.interleave_gate_up(rg, ru), rtol=1e-12, atol=1e-12)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("call,exc,msg", [
    (lambda ops: ops.linear_swiglu(torch.randn(3, 8), torch.randn(24, 8), fallback="torch"), ValueError, "multiple of 16"),
    (lambda ops: ops.linear_swiglu(torch.randn(3, 8), torch.randn(32, 8, dtype=F64), fallback="torch"), TypeError,
     "weight is torch.float64"),
    (lambda ops: ops.linear_swiglu(torch.randn(3, 8), torch.randn(32, 8, device="meta"), fallback="torch"), ValueError,
     "weight is on meta"),
    (lambda ops: ops.linear_swiglu_backward(torch.randn(3, 15), torch.randn(3, 8), torch.randn(32, 8),
                                            torch.randn(3, 32), fallback="torch"), ValueError, "dh must be"),
    (lambda ops: ops.linear_swiglu_backward(torch.randn(3, 16), torch.randn(3, 8), torch.randn(32, 8),
                                            torch.randn(4, 32), fallback="torch"), ValueError, "p must be"),
])
def test_op_arguments_are_checked_before_anything_runs(call, exc, msg):
    import cute_kernels.ops as ops

    with pytest.raises(exc, match=msg):
        call(ops)


def test_op_without_preact_refuses_to_differentiate():
    import warnings

    import cute_kernels.ops as ops

    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(32, 8, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h, p = ops.linear_swiglu(x, w, False, fallback="torch")
    assert p.numel() == 0
    with pytest.raises(RuntimeError, match="need_preact=False"):
        h.sum().backward()


@pytest.mark.compile
@pytest.mark.parametrize("config,subtiles", [("swiglu_preact", 8 + 4), ("swiglu_pingpong_128x128_1x2", 4)])
def test_gated_builds_store_the_half_tile_and_read_nothing_else(config, subtiles):
    # 128x256 cooperative: the product's 8 sub-tiles of 128x32, then the gated half's 4;
    # ping-pong 128x128: the gated half only, 64x64 in 4 sub-tiles of 64x32 (per warpgroup: the
    # SASS holds each warpgroup's unrolled copy once). The gate's sigmoid uses MUFU.RCP, not the
    # IEEE division's slow-path subroutine; nothing is read from global memory in the epilogue.
    from cute_kernels.runtime import compile_variant

    report = compile_variant("gemm.sm90_persistent", config, arch="sm_90a")
    hist = report.histogram
    assert hist["UTMASTG"] == subtiles, hist["UTMASTG"]
    assert hist.get("LDG", 0) == 0 and hist.get("CALL", 0) == 0
    assert hist["MUFU"] > 0 and report.spill_store_bytes == 0


@pytest.mark.parametrize("n", [64, 128, 192, 256])
def test_gate_view_pairs_each_gate_value_with_its_up_value_in_the_same_thread(n):
    # The claim `hopper.epilogue.gate_view` rests on, on the workbench's wgmma accumulator
    # layouts ((T128, V) -> m + 64 * n): value (c, r, 2j) of a thread's 64xN fragment is a gate
    # element, value (c, r, 2j + 1) its up element in the same row, and value (c, r, j) of the
    # 64x(N/2) fragment is where their gated value belongs: output column 8j + i for product
    # columns 16j + i (gate) and 16j + 8 + i (up).
    from cute_kernels.layouts.atoms_sm90 import GATE_UP_OFFSET, c_layout, gate_layouts, gate_selector

    full, half = c_layout(n), c_layout(n // 2)
    select = gate_selector(n)
    gate_tv, up_offset = gate_layouts(n)
    for t in range(128):
        for v in range(select.size()):
            out = half(t, v)
            gate, up = full(t, select(v)), full(t, select(v) + GATE_UP_OFFSET)
            row, col = out % 64, out // 64
            assert gate % 64 == up % 64 == row
            assert gate // 64 == 16 * (col // 8) + col % 8 and up // 64 == gate // 64 + 8
            assert gate_tv(t, v) == gate and gate + up_offset == up
