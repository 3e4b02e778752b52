"""sm90_flash backward with sliding windows on an H100/H200: dQ, dK, dV against a float64
reference built from `mask.dense_mask(..., window_left=, window_right=)` on fresh N(0, 1)
inputs, with the allocator poisoned (NaN) so that an unwritten element fails.

Covered: both bounds, a left bound alone (no upper test), a right bound alone (no lower test),
causal (both alignments) with a left bound, the one-key diagonal window (0, 0), Sq != Sk,
GQA, D = 64 / 128, rows whose window holds no key (out 0, lse -inf), and key blocks that no
row sees (the dK/dV CTA walks an empty Q range and writes zeros)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention.api import check_inputs  # noqa: E402
from cute_kernels.attention.mask import dense_mask  # noqa: E402
from cute_kernels.attention.problem_checks import mask_flags  # noqa: E402

from .test_sm90_flash_bwd_gpu import TOL, poison_allocator, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


def _sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from cute_kernels.attention import sm90_flash_bwd

    return sm90_flash_bwd


def reference64(q, k, v, dout, keep, scale):
    """float64 (out, lse, dq, dk, dv) of softmax(q k^T scale masked by `keep`) v: rows with no
    allowed key give out 0, lse -inf and no gradient. The gradients are the closed forms
    dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = scale dS K, dK = scale dS^T Q, with GQA's
    K/V heads repeated and their gradients summed over each group."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64, do64 = (t.double() for t in (q, k, v, dout))
    kr, vr = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    s = (q64 @ kr.transpose(-1, -2)) * scale
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # empty rows: exp(-inf - -inf) = nan -> 0
    out = p @ vr
    dv = p.transpose(-1, -2) @ do64
    ds = p * (do64 @ vr.transpose(-1, -2) - (do64 * out).sum(-1, keepdim=True))
    dq = scale * ds @ kr
    dk = scale * ds.transpose(-1, -2) @ q64
    b, hkv, sk, d = k.shape
    dk = dk.view(b, hkv, group, sk, d).sum(2)
    dv = dv.view(b, hkv, group, sk, d).sum(2)
    return out, lse, dq, dk, dv


CASES = [
    # b, hq, hkv, sq, sk, d, causal, window_size, dtype
    (1, 2, 2, 300, 300, 128, None, (64, 32), torch.bfloat16),           # both bounds
    (2, 2, 2, 256, 256, 128, None, (100, -1), torch.bfloat16),          # left bound alone
    (1, 2, 2, 130, 400, 64, None, (-1, 10), torch.float16),             # right bound alone, Sq < Sk
    (1, 2, 2, 200, 333, 64, "bottom_right", (50, -1), torch.float16),   # causal + left
    (1, 4, 2, 257, 190, 128, "top_left", (30, 0), torch.bfloat16),      # GQA, rows with no key
    (1, 2, 2, 64, 513, 128, None, (0, 0), torch.bfloat16),              # one key per row
    (1, 2, 2, 100, 400, 64, None, (10, -1), torch.float16),             # key blocks no row sees
    (1, 4, 1, 333, 333, 64, "top_left", (700, -1), torch.bfloat16),     # MQA, window wider than Sk
]


def _ids(c):
    return f"{c[1]}/{c[2]}x{c[3]}x{c[4]}xd{c[5]}-{c[6]}-w{c[7][0]}_{c[7][1]}-{str(c[8])[6:]}"


@pytest.mark.parametrize("schedule", [{}, {"dq_tma_reduce": True, "early_dv": True, "defer_dkv_wait": True,
                                           "prep_kernel": True}, {"deterministic": True},
                                      {"dq_writer": True, "early_dv": True, "defer_dkv_wait": True},
                                      {"dq_writer": True, "deterministic": True},
                                      {"dq_writer": True, "unmasked_interior": True}],
                         ids=["default", "all_options", "deterministic", "dq_writer", "dq_writer_deterministic",
                              "unmasked_interior"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_window_gradients_match_float64(case, schedule):
    _check_window(case, schedule)


# Head dims 192 and 256 (the consumer warpgroups split the
# head dim), with both bounds, GQA and rows that see no key.
SPLIT_CASES = [
    (1, 2, 2, 300, 300, 256, None, (64, 32), torch.bfloat16),
    (1, 4, 2, 257, 190, 192, "top_left", (30, 0), torch.float16),
    (1, 2, 2, 100, 400, 256, None, (10, -1), torch.float16),
]


@pytest.mark.parametrize("schedule", [{}, {"defer_dkv_wait": True}], ids=["default", "defer"])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=_ids)
def test_head_split_window_gradients_match_float64(case, schedule):

    _check_window(case, schedule)


def _check_window(case, schedule):
    bwd = _sm90()
    b, hq, hkv, sq, sk, d, causal, window, dtype = case
    torch.manual_seed(sq + 3 * sk + d)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    dout = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    problem = check_inputs(q, k, v, causal=causal, scale=None, enable_gqa=hq != hkv, window_size=window)
    assert bwd.supports_backward(problem) is None
    keep = dense_mask(sq, sk, causal=problem.causal is not None, align=problem.causal or "top_left",
                      window_left=problem.window_left, window_right=problem.window_right, device="cuda")
    out, lse, *ref = reference64(q, k, v, dout, keep, problem.scale)
    config = None
    if schedule:
        upper, local = mask_flags(problem)
        base = bwd.bwd_config_for(d, str(dtype)[6:], upper, dkv_fp32=hq != hkv, local=local, wide_q=False,
                                  dq_writer=False)  # the schedules name the writer
        config = bwd.FlashSm90BwdConfig(**{**base.__dict__, **schedule})
    poison_allocator()
    grads = bwd.backward(dout, q, k, v, out.to(dtype), lse.float(), problem, config=config)
    torch.cuda.synchronize()
    floor = 1e-3 * dout.float().norm()  # a one-key window makes dQ vanish identically
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        assert got.shape == want.shape and got.dtype == dtype, name
        assert not got.isnan().any(), f"{name} has unwritten (NaN) elements"
        err = rel_err(got, want.float(), floor)
        assert err < TOL[dtype], f"{name}: relative error {err:.3g}"
    # Keys that no row may see get exactly zero gradients.
    unseen = ~keep.any(0)
    if unseen.any():
        assert (grads[1][:, :, unseen] == 0).all() and (grads[2][:, :, unseen] == 0).all()


def test_window_flags_select_the_masked_kernel():
    bwd = _sm90()
    q = torch.randn(1, 2, 70, 64, device="cuda", dtype=torch.float16)
    problem = check_inputs(q, q, q, causal=None, scale=None, enable_gqa=False, window_size=(5, -1))
    wrong = bwd.bwd_config_for(64, "float16", False)
    with pytest.raises(ValueError, match="does not match the problem"):
        bwd.backward(q, q, q, q, q, torch.zeros(1, 2, 70, device="cuda"), problem, config=wrong)
