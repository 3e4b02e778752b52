"""RoPE kernel on the GPU against float64: half-split and interleaved pairs, (B, S, H, D) and
(B, H, S, D) layouts, GQA, partial rotary dims, position offsets and position ids, in place and
into new tensors, the gradient (the inverse rotation), out-of-range positions.
(Written in a session without a GPU: not yet run.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.fused import apply_rotary_, reference, rotary, rotary_tables  # noqa: E402

from ._gpu import TOL, assert_close, f64, randn  # noqa: E402

pytestmark = pytest.mark.gpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# b, s, hq, hk, d, rotary dim, dtype, table dtype, interleaved, layout, positions ("offset" | "ids")
CASES = [
    (2, 17, 8, 2, 128, 128, BF16, F32, False, "bshd", "offset"),
    (1, 1, 4, 4, 64, 64, F16, F32, True, "bshd", "offset"),          # one decode token
    (3, 33, 6, 1, 128, 64, BF16, F32, False, "bhsd", "ids"),          # partial rotary, MQA
    (2, 100, 4, 2, 96, 96, F32, F32, True, "bhsd", "ids"),
    (1, 5, 2, 2, 80, 32, BF16, BF16, False, "bshd", "offset"),        # bf16 tables
]


def _tables(positions, rotary_dim, dtype):
    return rotary_tables(positions, rotary_dim, device="cuda", dtype=dtype)


@pytest.mark.parametrize("b, s, hq, hk, d, rot, dtype, tdt, interleaved, layout, positions", CASES)
def test_matches_float64(b, s, hq, hk, d, rot, dtype, tdt, interleaved, layout, positions):
    torch.manual_seed(b * s + d)
    shape_q = (b, s, hq, d) if layout == "bshd" else (b, hq, s, d)
    shape_k = (b, s, hk, d) if layout == "bshd" else (b, hk, s, d)
    q, k = randn(*shape_q, dtype=dtype), randn(*shape_k, dtype=dtype)
    cos, sin = _tables(4096, rot, tdt)
    kw = dict(interleaved=interleaved, layout=layout)
    if positions == "ids":
        gen = torch.Generator(device="cuda").manual_seed(1)
        kw["position_ids"] = torch.randint(0, 4096, (b, s), device="cuda", generator=gen)
    else:
        kw["offset"] = 1000
    rq, rk = reference.apply_rotary_(f64(q).clone(), f64(k).clone(), cos.double(), sin.double(), **kw)
    qo, ko = rotary(q, k, cos, sin, **kw)
    torch.cuda.synchronize()
    assert qo.dtype == dtype and qo.shape == q.shape
    assert_close(qo, rq, dtype, "q'")
    assert_close(ko, rk, dtype, "k'")
    assert torch.equal(qo[..., rot:], q[..., rot:]), "features past the rotary dim are copied unchanged"
    q2, k2 = q.clone(), k.clone()
    apply_rotary_(q2, k2, cos, sin, **kw)
    torch.cuda.synchronize()
    assert torch.equal(q2, qo) and torch.equal(k2, ko), "in place == into new tensors"
    back_q, back_k = rotary(qo, ko, cos, sin, inverse=True, **kw)
    assert_close(back_q, f64(q), dtype, "inverse rotation", factor=2)


def test_views_of_a_fused_qkv_projection_rotate_in_place():
    """q and k as strided views of one (B, S, (Hq + 2 Hk) * D) buffer, as a fused QKV GEMM writes."""
    torch.manual_seed(4)
    b, s, hq, hk, d = 2, 9, 4, 2, 64
    qkv = randn(b, s, (hq + 2 * hk) * d, dtype=BF16)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d:(hq + hk) * d].view(b, s, hk, d)
    v_before = qkv[..., (hq + hk) * d:].clone()
    cos, sin = _tables(64, d, F32)
    rq, rk = reference.apply_rotary_(f64(q).clone(), f64(k).clone(), cos.double(), sin.double(), offset=3)
    apply_rotary_(q, k, cos, sin, offset=3)
    torch.cuda.synchronize()
    assert_close(q, rq, BF16, "q")
    assert_close(k, rk, BF16, "k")
    assert torch.equal(qkv[..., (hq + hk) * d:], v_before), "v untouched"


def test_op_autograd_is_the_inverse_rotation():
    import cute_kernels.ops as ops

    torch.manual_seed(6)
    q = randn(2, 7, 4, 64, dtype=F32).requires_grad_()
    k = randn(2, 7, 2, 64, dtype=F32).requires_grad_()
    cos, sin = _tables(32, 64, F32)
    qo, ko = ops.rotary(q, k, cos, sin, None, 5)
    gq, gk = randn(*qo.shape, dtype=F32), randn(*ko.shape, dtype=F32)
    torch.autograd.backward((qo, ko), (gq, gk))
    qd, kd = f64(q).requires_grad_(), f64(k).requires_grad_()
    c, sn = cos.double()[5:12][None, :, None, :], sin.double()[5:12][None, :, None, :]

    def rot(x):
        a, bb = x[..., :32], x[..., 32:]
        return torch.cat((a * c - bb * sn, bb * c + a * sn), -1)

    torch.autograd.backward((rot(qd), rot(kd)), (f64(gq), f64(gk)))
    assert_close(q.grad, qd.grad, F32, "dq")
    assert_close(k.grad, kd.grad, F32, "dk")


def test_out_of_range_positions_raise_or_give_nan():
    q, k = randn(1, 3, 2, 64, dtype=BF16), randn(1, 3, 2, 64, dtype=BF16)
    cos, sin = _tables(8, 64, F32)
    ids = torch.tensor([[0, 9, 2]], device="cuda")
    with pytest.raises(ValueError, match="position id is outside"):
        rotary(q, k, cos, sin, position_ids=ids)
    qo, _ = rotary(q, k, cos, sin, position_ids=ids, check_positions=False)
    torch.cuda.synchronize()
    assert torch.isnan(qo[0, 1]).all() and not torch.isnan(qo[0, [0, 2]]).any()
    with pytest.raises(ValueError, match="do not fit head dim"):
        rotary(q, k, *_tables(8, 128, F32))
    assert TOL[F32] > 0 and math.isfinite(TOL[BF16])
