"""sm80_flash on the GPU with sliding windows, head dims 192/256 in the backward, and the packed
(varlen) backward: out, lse and dQ, dK, dV against float32 references on fresh N(0, 1) inputs.

The rung is called directly with an `AttentionProblem` (the public window argument is the
API's business): forward outputs are NaN-filled before the launch, and before each backward the
CUDA caching allocator's free memory is filled with NaN, so an element the kernels fail to write
stays NaN. Windows follow `mask`: (left, right), None = unbounded, bottom-right aligned without
causality."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention.api import AttentionProblem  # noqa: E402
from cute_kernels.attention.mask import dense_mask  # noqa: E402

from ._dense_reference import TOL, check_forward, reference, rel_err  # noqa: E402
from .test_sm80_flash_bwd_gpu import poison_allocator  # noqa: E402

pytestmark = pytest.mark.gpu

GRAD_TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _rung():
    from cute_kernels.attention.sm80_flash import RUNG

    return RUNG


def problem_for(b, hq, hkv, sq, sk, d, dtype, causal, window):
    return AttentionProblem(b, hq, hkv, sq, sk, d, d, dtype, causal, 1.0 / math.sqrt(d), window[0], window[1])


def reference_grads(q, k, v, dout, causal=None, window=(None, None)):
    """float32 autograd of softmax(q k^T * scale + mask) v, q (B, Hq, Sq, D); rows with no
    allowed key contribute nothing."""
    hq, hk = q.shape[1], k.shape[1]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    kr, vr = (kf, vf) if hq == hk else (kf.repeat_interleave(hq // hk, 1), vf.repeat_interleave(hq // hk, 1))
    s = (qf @ kr.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    keep = dense_mask(q.shape[2], k.shape[2], causal=causal is not None, align=causal or "top_left",
                      window_left=window[0], window_right=window[1], device=q.device)
    has = keep.any(-1)
    s = torch.where(has[:, None], s.masked_fill(~keep, -math.inf), torch.zeros_like(s))
    p = torch.softmax(s, -1) * has[:, None]
    (p @ vr).backward(dout.float())
    return qf.grad, kf.grad, vf.grad


def check_grads(grads, refs, dout, dtype):
    # Where a gradient vanishes (one key: constant softmax) its rounding noise is measured
    # against the natural scale of the gradients.
    floor = 1e-3 * dout.float().norm()
    for name, got, want in zip(("dq", "dk", "dv"), grads, refs):
        assert got.shape == want.shape and got.dtype == dtype
        assert not got.isnan().any(), f"{name} has unwritten (NaN) elements"
        err = ((got.float() - want).norm() / want.norm().clamp_min(floor)).item()
        assert err < GRAD_TOL[dtype], f"{name}: relative error {err:.3g}"


WINDOW_CASES = [
    # b, hq, hkv, sq, sk, d, causal, (left, right), dtype
    (1, 2, 2, 200, 200, 64, "top_left", (32, None), torch.bfloat16),
    (2, 4, 2, 257, 300, 128, None, (40, 17), torch.float16),         # both sides, Sq != Sk, GQA
    (1, 2, 1, 130, 70, 64, None, (5, 3), torch.bfloat16),            # bottom-right: early rows see nothing
    (1, 2, 2, 300, 100, 128, "top_left", (20, 0), torch.bfloat16),   # rows past Sk + 20 see nothing
    (1, 3, 3, 129, 333, 96, "bottom_right", (100, None), torch.float16),
    (1, 2, 2, 77, 77, 64, None, (None, 0), torch.bfloat16),          # right bound only
    (1, 2, 2, 150, 150, 128, None, (0, 0), torch.bfloat16),          # the diagonal alone
    (1, 4, 2, 190, 190, 256, "top_left", (63, None), torch.bfloat16),
]


@pytest.mark.parametrize("b, hq, hkv, sq, sk, d, causal, window, dtype", WINDOW_CASES,
                         ids=[f"case{i}" for i in range(len(WINDOW_CASES))])
def test_window_forward_and_backward(b, hq, hkv, sq, sk, d, causal, window, dtype):
    torch.manual_seed(sq * 3 + sk + d)
    rung = _rung()
    problem = problem_for(b, hq, hkv, sq, sk, d, dtype, causal, window)
    assert rung.supports_backward(problem) is None
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    out = torch.full((b, hq, sq, d), math.nan, device="cuda", dtype=dtype)
    lse = torch.full((b, hq, sq), math.nan, device="cuda", dtype=torch.float32)
    rung(q, k, v, out, lse, problem)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(q, k, v, causal, window=window)
    check_forward(out, lse, ref_out, ref_lse, dtype)

    dout = torch.randn_like(out)
    poison_allocator()
    grads = rung.backward(dout, q, k, v, out, lse, problem)
    torch.cuda.synchronize()
    check_grads(grads, reference_grads(q, k, v, dout, causal, window), dout, dtype)


BIG_D_CASES = [
    # b, hq, hkv, sq, sk, d, causal, dtype
    (1, 2, 2, 200, 200, 256, None, torch.bfloat16),
    (2, 4, 2, 130, 257, 256, "bottom_right", torch.bfloat16),
    (1, 2, 2, 300, 300, 192, "top_left", torch.float16),
    (1, 2, 1, 77, 65, 160, None, torch.bfloat16),
    (1, 2, 2, 64, 64, 224, "top_left", torch.float16),
]


@pytest.mark.parametrize("b, hq, hkv, sq, sk, d, causal, dtype", BIG_D_CASES,
                         ids=[f"case{i}" for i in range(len(BIG_D_CASES))])
def test_backward_above_head_dim_128(b, hq, hkv, sq, sk, d, causal, dtype):
    torch.manual_seed(sq + sk + d)
    rung = _rung()
    problem = problem_for(b, hq, hkv, sq, sk, d, dtype, causal, (None, None))
    assert rung.supports_backward(problem) is None
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    out = torch.empty(b, hq, sq, d, device="cuda", dtype=dtype)
    lse = torch.empty(b, hq, sq, device="cuda", dtype=torch.float32)
    rung(q, k, v, out, lse, problem)
    dout = torch.randn_like(out)
    poison_allocator()
    grads = rung.backward(dout, q, k, v, out, lse, problem)
    torch.cuda.synchronize()
    check_grads(grads, reference_grads(q, k, v, dout, causal), dout, dtype)


def test_head_dims_the_backward_refuses_say_why():
    rung = _rung()
    for d, match in ((144, "multiples of 32"), (272, "up to 256")):
        problem = problem_for(1, 1, 1, 8, 8, d, torch.bfloat16, None, (None, None))
        assert match in rung.supports_backward(problem)
    with pytest.raises(ValueError, match="multiples of 32"):
        x = torch.randn(1, 1, 8, 144, device="cuda", dtype=torch.bfloat16)
        rung.backward(x, x, x, x, x, x[..., 0].float(), problem_for(1, 1, 1, 8, 8, 144, torch.bfloat16, None,
                                                                     (None, None)))


# ---- varlen -----------------------------------------------------------------------------------


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def varlen_reference(q, k, v, dout, lengths_q, lengths_k, causal, window):
    """Per sequence, the dense float32 references: out (Tq, Hq, D), lse (Hq, Tq), dq, dk, dv."""
    hq = q.shape[1]
    out = torch.zeros(q.shape, device="cuda")
    lse = torch.full((hq, q.shape[0]), -math.inf, device="cuda")
    grads = [torch.zeros(t.shape, device="cuda") for t in (q, k, v)]
    oq = ok = 0
    for sq, sk in zip(lengths_q, lengths_k):
        if sq and sk:
            dense = lambda t, a, n: t[a:a + n].transpose(0, 1).unsqueeze(0)  # noqa: E731
            qb, kb, vb, dob = dense(q, oq, sq), dense(k, ok, sk), dense(v, ok, sk), dense(dout, oq, sq)
            o, l_ = reference(qb, kb, vb, causal, window=window)
            out[oq:oq + sq], lse[:, oq:oq + sq] = o[0].transpose(0, 1), l_[0]
            gq, gk, gv = reference_grads(qb, kb, vb, dob, causal, window)
            grads[0][oq:oq + sq], grads[1][ok:ok + sk], grads[2][ok:ok + sk] = (
                g[0].transpose(0, 1) for g in (gq, gk, gv))
        oq, ok = oq + sq, ok + sk
    return out, lse, grads


VARLEN_CASES = [
    # lengths_q, lengths_k, hq, hkv, d, causal, window, dtype
    ((1, 37, 0, 130, 5), (1, 37, 9, 130, 200), 4, 2, 64, None, (None, None), torch.bfloat16),
    ((17, 1, 129, 64), (17, 300, 129, 3), 4, 2, 128, "bottom_right", (None, None), torch.float16),
    ((17, 100, 129), (33, 100, 0), 2, 2, 128, "top_left", (None, None), torch.bfloat16),
    ((70, 200, 3), (90, 150, 3), 4, 1, 64, None, (20, 7), torch.bfloat16),
    ((130, 65), (130, 200), 2, 2, 128, "top_left", (31, None), torch.float16),
    ((65, 140), (100, 140), 2, 1, 256, "bottom_right", (40, None), torch.bfloat16),
]


@pytest.mark.parametrize("lengths_q, lengths_k, hq, hkv, d, causal, window, dtype", VARLEN_CASES,
                         ids=[f"case{i}" for i in range(len(VARLEN_CASES))])
def test_varlen_forward_and_backward_per_sequence(lengths_q, lengths_k, hq, hkv, d, causal, window, dtype):
    torch.manual_seed(sum(lengths_q) + d)
    rung = _rung()
    cu_q, cu_k = _cu(lengths_q), _cu(lengths_k)
    max_q, max_k = max(lengths_q), max(lengths_k)
    problem = AttentionProblem(len(lengths_q), hq, hkv, max_q, max_k, d, d, dtype, causal, 1.0 / math.sqrt(d),
                               window[0], window[1])
    q = torch.randn(sum(lengths_q), hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(sum(lengths_k), hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    out = torch.full(q.shape, math.nan, device="cuda", dtype=dtype)
    lse = torch.full((hq, q.shape[0]), math.nan, device="cuda", dtype=torch.float32)
    rung.varlen(q, k, v, cu_q, cu_k, max_q, out, lse, problem)
    dout = torch.randn_like(out)
    poison_allocator()
    grads = rung.varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, problem)
    torch.cuda.synchronize()
    ref_out, ref_lse, ref_grads = varlen_reference(q, k, v, dout, lengths_q, lengths_k, causal, window)
    assert not out.isnan().any() and not lse.isnan().any(), "an output element was not written"
    assert rel_err(out, ref_out) < TOL[dtype]
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert (out.transpose(0, 1)[empty] == 0).all()
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=2e-3, rtol=1e-3)
    check_grads(grads, ref_grads, dout, dtype)
    check_empty_sequences(grads, lengths_q, lengths_k)


def check_empty_sequences(grads, lengths_q, lengths_k):
    """Rows of sequences with no key (or keys no query sees) get exact zeros, not leftovers."""
    oq = ok = 0
    for sq, sk in zip(lengths_q, lengths_k):
        if sk == 0:
            assert (grads[0][oq:oq + sq] == 0).all()
        if sq == 0:
            assert (grads[1][ok:ok + sk] == 0).all() and (grads[2][ok:ok + sk] == 0).all()
        oq, ok = oq + sq, ok + sk


@pytest.mark.parametrize("backward_rung", ["sm80_flash", "sm90_flash"])
def test_varlen_backward_nan_stays_in_its_sequence(backward_rung):
    """(sm90_flash's varlen backward runs on Hopper only.)"""
    from cute_kernels.attention.registry import KERNELS

    if backward_rung == "sm90_flash" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm90_flash needs a Hopper (sm_90) GPU")
    lengths = (40, 70, 33)
    torch.manual_seed(5)
    rung = _rung()
    cu = _cu(lengths)
    problem = AttentionProblem(3, 2, 2, 70, 70, 64, 64, torch.bfloat16, "top_left", 0.125)
    q, k, v = (torch.randn(143, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k[40 + 20, 1, 7] = math.nan  # sequence 1, key 20, head 1
    out = torch.empty_like(q)
    lse = torch.empty(2, 143, device="cuda")
    rung.varlen(q, k, v, cu, cu, 70, out, lse, problem)
    dq, dk, dv = KERNELS[backward_rung].varlen_backward(torch.randn_like(q), q, k, v, out, lse, cu, cu, 70, 70,
                                                        problem)
    torch.cuda.synchronize()
    for g in (dq, dk, dv):
        assert not g[:40].isnan().any() and not g[110:].isnan().any()
        assert not g[40:110, 0].isnan().any()
    # Causal: rows from key 20 on see it, so their scores, P and dQ are NaN. (Earlier rows' dQ is
    # NaN too, as in torch's autograd: their masked dS is 0, and 0 * NaN in dS K is NaN.)
    assert dq[60:110, 1].isnan().all() and dk[60:110, 1].isnan().all()


def test_public_sdpa_window_and_its_gradients():
    """The public entry (window_size, -1 = unbounded) through autograd lands on the windowed kernels."""
    from cute_kernels.attention import scaled_dot_product_attention

    torch.manual_seed(11)
    q = torch.randn(2, 4, 150, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 2, 150, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = scaled_dot_product_attention(q, k, v, is_causal=True, window_size=(30, -1), enable_gqa=True,
                                       kernel="sm80_flash")
    ref_out, _ = reference(q, k, v, "top_left", window=(30, None))
    assert rel_err(out, ref_out) < TOL[torch.bfloat16]
    dout = torch.randn_like(out)
    out.backward(dout)
    refs = reference_grads(q, k, v, dout, "top_left", (30, None))
    check_grads((q.grad, k.grad, v.grad), refs, dout, torch.bfloat16)
