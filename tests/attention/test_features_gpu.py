"""Soft cap and sinks on the GPU, forward and backward, on both flash rungs (`sm90_flash` on
Hopper, `sm80_flash` on sm_80+), against a float64 reference on fresh N(0, 1) inputs: every
combination with no mask, both causal alignments, sliding windows (with and without
causality), GQA/MQA, odd lengths and Sq != Sk; forward outputs poisoned with NaN, backward
results allocated from a NaN-filled allocator; NaN/Inf behaviour; rows with no key; the varlen
launch with seqused_k (sm80_flash). The reference is `attention_reference.masked_attention`
in float64, differentiated by autograd (sinks included)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}
GRAD_TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _rung_available(name: str):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    need = (9, 0) if name == "sm90_flash" else (8, 0)
    if torch.cuda.get_device_capability() < need or (name == "sm90_flash" and torch.cuda.get_device_capability()[0] != 9):
        pytest.skip(f"{name} needs compute capability {need}")


def poison_allocator(numel: int = 1 << 26):
    torch.empty(numel, device="cuda").fill_(math.nan)
    torch.cuda.synchronize()


def rel_err(x, ref, floor=1e-30):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(floor)).item()


def reference(q, k, v, dout, *, causal, window, softcap, sinks, scale=None):
    """float64 (out, lse, dq, dk, dv, dsinks) by definition, autograd for the gradients."""
    from cute_kernels.ops.attention_reference import masked_attention

    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s = None if sinks is None else sinks.detach().double().requires_grad_()
    out, lse = masked_attention(*leaves, None, 0.0, causal, scale, True, window, softcap, s)
    grads = torch.autograd.grad(out, [*leaves, *([s] if s is not None else [])], dout.double(), allow_unused=True)
    dq, dk, dv = grads[:3]
    return out.detach(), lse, dq, dk, dv, (grads[3] if s is not None else None)


# b, hq, hkv, sq, sk, d, causal, window, softcap, with_sinks, dtype
CASES = [
    (2, 4, 4, 257, 257, 128, None, None, 30.0, False, torch.bfloat16),
    (1, 4, 2, 300, 513, 128, "top_left", None, 50.0, True, torch.bfloat16),
    (1, 4, 2, 513, 300, 64, "bottom_right", None, 5.0, True, torch.float16),
    (2, 8, 1, 129, 1000, 128, "bottom_right", (256, 0), 20.0, True, torch.bfloat16),
    (1, 2, 2, 1000, 1000, 64, None, (100, 50), 10.0, True, torch.float16),
    (1, 4, 4, 17, 33, 128, None, None, None, True, torch.bfloat16),
    (1, 4, 2, 1024, 1024, 128, "top_left", (127, 0), None, True, torch.float16),
    (1, 2, 2, 77, 77, 256, "top_left", None, 15.0, True, torch.bfloat16),
    (1, 2, 1, 333, 211, 96, None, (-1, 7), 2.0, False, torch.bfloat16),
    (2, 6, 3, 1, 555, 128, None, None, 50.0, True, torch.bfloat16),
    (1, 2, 2, 200, 64, 64, "bottom_right", None, 1.0, True, torch.float16),  # rows with no key: lse = sink
]
RUNGS = ["sm90_flash", "sm80_flash"]


def _case_id(c):
    b, hq, hkv, sq, sk, d, causal, window, softcap, sinks, dtype = c
    return (f"{b}x{hq}/{hkv}x{sq}x{sk}xd{d}-{causal}-w{window}-cap{softcap}{'-sinks' if sinks else ''}-"
            f"{str(dtype)[6:]}")


def _inputs(case):
    b, hq, hkv, sq, sk, d, causal, window, softcap, with_sinks, dtype = case
    torch.manual_seed(sq * 31 + sk * 7 + d + hq)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    # Sinks comparable to the scores (a few units), one per query head.
    sinks = torch.randn(hq, device="cuda", dtype=torch.float32) * 2 if with_sinks else None
    return q, k, v, sinks


@pytest.mark.parametrize("rung", RUNGS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward_matches_float64(rung, case):
    from cute_kernels.attention import attention_forward

    _rung_available(rung)
    b, hq, hkv, sq, sk, d, causal, window, softcap, with_sinks, dtype = case
    q, k, v, sinks = _inputs(case)
    out = torch.full((b, hq, sq, d), math.nan, device="cuda", dtype=dtype)
    lse = torch.full((b, hq, sq), math.nan, device="cuda", dtype=torch.float32)
    attention_forward(q, k, v, causal=causal, enable_gqa=hq != hkv, window_size=window, kernel=rung, out=out,
                      lse=lse, softcap=softcap, sinks=sinks)
    torch.cuda.synchronize()
    ref_out, ref_lse, *_ = reference(q, k, v, torch.zeros_like(q), causal=causal, window=window, softcap=softcap,
                                     sinks=sinks)
    assert not out.isnan().any() and not lse.isnan().any(), "an output element was not written"
    assert rel_err(out, ref_out) < TOL[dtype]
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert (out[empty] == 0).all()
    torch.testing.assert_close(lse[~empty].double(), ref_lse[~empty].double(), atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("rung", RUNGS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_backward_matches_float64(rung, case):
    """dq, dk, dv (and dsinks) through `attention_backward` on the rung's own forward."""
    from cute_kernels.attention import attention_backward, attention_forward

    _rung_available(rung)
    b, hq, hkv, sq, sk, d, causal, window, softcap, with_sinks, dtype = case
    q, k, v, sinks = _inputs(case)
    dout = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    kw = dict(causal=causal, enable_gqa=hq != hkv, window_size=window, softcap=softcap, sinks=sinks)
    out, lse = attention_forward(q, k, v, kernel=rung, **kw)
    poison_allocator()
    # sm80_flash's own backward; for sm90_flash "auto": its own where it takes the head dim
    # (64, 128), else sm80_flash's (every rung writes the same lse).
    grads = attention_backward(dout, q, k, v, out, lse, kernel="auto" if rung == "sm90_flash" else rung, **kw)
    torch.cuda.synchronize()
    *_, dq, dk, dv, dsinks = reference(q, k, v, dout, causal=causal, window=window, softcap=softcap, sinks=sinks)
    floor = 1e-3 * dout.double().norm()
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), grads, (dq, dk, dv, dsinks)):
        assert not got.isnan().any(), f"{name} has unwritten (NaN) elements"
        err = rel_err(got, want, floor)
        assert err < GRAD_TOL[dtype], f"{name}: relative error {err:.3g}"
    assert len(grads) == (4 if with_sinks else 3)


def test_autograd_through_scaled_dot_product_attention():
    from cute_kernels.attention import scaled_dot_product_attention

    _rung_available("sm80_flash")
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 8, 301, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    sinks = torch.randn(8, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, lse = scaled_dot_product_attention(q, k, v, is_causal=True, softcap=30.0, sinks=sinks, return_lse=True)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, sinks), g)
    ref_out, ref_lse, *ref = reference(q, k, v, g, causal="top_left", window=None, softcap=30.0, sinks=sinks)
    assert rel_err(out, ref_out) < TOL[torch.bfloat16]
    torch.testing.assert_close(lse.double(), ref_lse.double(), atol=2e-3, rtol=1e-3)
    for a, r in zip(got, ref):
        assert rel_err(a, r) < GRAD_TOL[torch.bfloat16]
    assert got[3].dtype == torch.bfloat16


@pytest.mark.parametrize("rung", RUNGS)
def test_nan_and_inf_behaviour(rung):
    """A NaN in one query row stays in that row (soft cap and sinks on); a NaN sink poisons only
    its head; a sink of -inf is no sink; a huge sink leaves out ~0 and lse = sink; an inf in q
    is capped (tanh(inf) = 1) and so gives finite output, as the reference does."""
    from cute_kernels.attention import attention_forward

    _rung_available(rung)
    torch.manual_seed(11)
    q, k, v = (torch.randn(1, 4, 150, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sinks = torch.randn(4, device="cuda")
    q[0, 1, 77, 5] = math.nan
    out, lse = attention_forward(q, k, v, kernel=rung, softcap=20.0, sinks=sinks)
    bad = out.isnan().any(-1)
    assert bad[0, 1, 77] and torch.isnan(lse[0, 1, 77])
    bad[0, 1, 77] = False
    assert not bad.any()
    q[0, 1, 77, 5] = 0.0

    s = sinks.clone()
    s[2] = math.nan
    out, lse = attention_forward(q, k, v, kernel=rung, sinks=s)
    assert out[0, 2].isnan().all() and lse[0, 2].isnan().all()
    assert not out[0, [0, 1, 3]].isnan().any()

    base, base_lse = attention_forward(q, k, v, kernel=rung, softcap=20.0)
    s = torch.full((4,), -math.inf, device="cuda")
    out, lse = attention_forward(q, k, v, kernel=rung, softcap=20.0, sinks=s)
    torch.testing.assert_close(out, base)
    torch.testing.assert_close(lse, base_lse)

    s = torch.full((4,), 200.0, device="cuda")
    out, lse = attention_forward(q, k, v, kernel=rung, sinks=s)
    assert out.abs().max() < 1e-30 and torch.allclose(lse, torch.full_like(lse, 200.0))

    q[0, 0, 3, 9] = math.inf  # scores +-inf in that row (one inf term each), capped to +-20
    out, lse = attention_forward(q, k, v, kernel=rung, softcap=20.0)
    ref_out, _, *_ = reference(q, k, v, torch.zeros_like(q), causal=None, window=None, softcap=20.0, sinks=None)
    assert torch.isfinite(out).all() and rel_err(out, ref_out) < TOL[torch.bfloat16]


VARLEN_CASES = [  # key lengths used, capacities (the padded batch), query lengths, causal, window, softcap, sinks
    ([300, 0, 17, 1000], [512, 64, 64, 1024], [300, 5, 17, 700], "bottom_right", None, 30.0, True),
    ([1, 128, 77], [128, 128, 128], [128, 128, 128], None, (32, 32), 5.0, True),
    ([100, 200], [256, 256], [256, 256], "top_left", None, None, True),
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{c[3]}-w{c[4]}-cap{c[5]}")
def test_varlen_with_seqused_k_softcap_and_sinks(case):
    """sm80_flash's packed launch with seqused_k: a padded batch read in place (keys past each
    sequence's seqused_k ignored), forward and backward against the float64 reference on each
    sequence's used keys; unused key rows get zero gradients."""
    from cute_kernels.attention import attention_varlen_backward, attention_varlen_forward

    _rung_available("sm80_flash")
    used, room, lens_q, causal, window, softcap, with_sinks = case
    torch.manual_seed(sum(used))
    hq, hkv, d, dtype = 4, 2, 128, torch.bfloat16
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(room).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    q = torch.randn(int(cu_q[-1]), hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(int(cu_k[-1]), hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    sinks = torch.randn(hq, device="cuda") if with_sinks else None
    dout = torch.randn_like(q)
    kw = dict(causal=causal, window_size=window, softcap=softcap, sinks=sinks, seqused_k=seqused)
    out = torch.full_like(q, math.nan)
    lse = torch.full((hq, q.shape[0]), math.nan, device="cuda")
    attention_varlen_forward(q, k, v, cu_q, cu_k, max(lens_q), max(room), kernel="sm80_flash", out=out, lse=lse,
                             **kw)
    poison_allocator()
    grads = attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(lens_q), max(room),
                                      kernel="sm80_flash", **kw)
    torch.cuda.synchronize()
    assert not out.isnan().any() and not any(g.isnan().any() for g in grads)
    dsinks = torch.zeros(hq, dtype=torch.float64, device="cuda")
    for b in range(len(used)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(int(cu_k[b]), int(cu_k[b]) + used[b])
        if rows.start == rows.stop:
            continue
        qs, ks, vs, gs = (t.transpose(0, 1)[None] for t in (q[rows], k[keys], v[keys], dout[rows]))
        if used[b] == 0:
            assert (out[rows] == 0).all()
            continue
        ref_out, ref_lse, dq, dk, dv, ds = reference(qs, ks, vs, gs, causal=causal, window=window, softcap=softcap,
                                                     sinks=sinks)
        assert rel_err(out[rows].transpose(0, 1)[None], ref_out) < TOL[dtype]
        for got, want in ((grads[0][rows], dq), (grads[1][keys], dk), (grads[2][keys], dv)):
            assert rel_err(got.transpose(0, 1)[None], want, 1e-3 * gs.double().norm()) < GRAD_TOL[dtype]
        if ds is not None:
            dsinks += ds
        pad = slice(int(cu_k[b]) + used[b], int(cu_k[b + 1]))
        assert (grads[1][pad] == 0).all() and (grads[2][pad] == 0).all(), "unused key rows must get zero gradients"
    if with_sinks:
        assert rel_err(grads[3], dsinks) < GRAD_TOL[dtype]
