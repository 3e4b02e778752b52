"""cute_kernels::sdpa, ::sdpa_backward, ::sdpa_varlen, ::paged_decode on CPU: the reference
against PyTorch's SDPA, fakes, opcheck through fallback="torch", gradients (gradcheck in fp64),
and the missing-kernel errors. The CUDA paths are in test_ops_gpu.py."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch.nn.attention.bias import causal_lower_right  # noqa: E402

from cute_kernels import ops  # noqa: E402
from cute_kernels.ops import attention as attention_ops  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning"),
              pytest.mark.filterwarnings("ignore:Lower right causal bias")]

F64 = torch.float64


def randn(*shape, dtype=F64, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _rel(x, ref):
    return float((x - ref).detach().norm() / ref.detach().norm())


def _torch_sdpa(q, k, v, causal, scale=None):
    """PyTorch's SDPA for our causal names (GQA by repeating heads)."""
    hq = q.shape[-3]
    k, v = (t.repeat_interleave(hq // t.shape[-3], dim=-3) for t in (k, v))
    if causal == "bottom_right":
        mask = causal_lower_right(q.shape[-2], k.shape[-2])
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal == "top_left", scale=scale)


CASES = [  # (q shape, kv heads, Sk)
    ((2, 4, 5, 8), 4, 7),
    ((2, 4, 7, 8), 2, 5),
    ((3, 6, 16), 3, 9),
]


# ---- the reference against PyTorch -----------------------------------------------------------------

@pytest.mark.parametrize("q_shape, hk, sk", CASES)
@pytest.mark.parametrize("causal", ops.CAUSAL)
def test_reference_matches_torch_sdpa(q_shape, hk, sk, causal):
    q = randn(*q_shape)
    k, v = randn(*q_shape[:-3], hk, sk, q_shape[-1]), randn(*q_shape[:-3], hk, sk, q_shape[-1])
    out, lse = ops.sdpa(q, k, v, causal, 0.3, True, fallback="torch")
    ref = _torch_sdpa(q, k, v, causal, scale=0.3)
    if causal == "bottom_right" and q_shape[-2] > sk:
        # Rows that see no key: our convention is out 0 and lse -inf (PyTorch gives NaN).
        empty = q_shape[-2] - sk
        assert torch.all(out[..., :empty, :] == 0) and torch.all(lse[..., :empty] == -math.inf)
        out, ref, lse = out[..., empty:, :], ref[..., empty:, :], lse[..., empty:]
    assert out.dtype == F64 and lse.dtype == torch.float32
    assert _rel(out, ref) < 1e-12
    assert torch.isfinite(lse).all()


def test_reference_lse_is_the_log_normalizer():
    q, k, v = randn(1, 2, 3, 8), randn(1, 2, 4, 8), randn(1, 2, 4, 8)
    _, lse = ops.sdpa(q, k, v, fallback="torch")
    want = torch.logsumexp((q @ k.transpose(-1, -2)) / math.sqrt(8), dim=-1)
    assert torch.allclose(lse.double(), want, rtol=1e-6)


def test_nan_in_one_query_row_stays_in_that_row():
    q, k, v = randn(1, 2, 5, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8)
    q[0, 1, 2, 3] = math.nan
    out, _ = ops.sdpa(q, k, v, fallback="torch")
    assert torch.isnan(out[0, 1, 2]).all()
    out[0, 1, 2] = 0
    assert torch.isfinite(out).all()


# ---- fakes -----------------------------------------------------------------------------------------

def test_sdpa_fakes():
    out, lse = ops.sdpa(meta(2, 8, 33, 64), meta(2, 2, 40, 64), meta(2, 2, 40, 32), enable_gqa=True)
    assert out.shape == (2, 8, 33, 32) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 8, 33) and lse.dtype == torch.float32
    dq, dk, dv = ops.sdpa_backward(meta(2, 8, 33, 32), meta(2, 8, 33, 64), meta(2, 2, 40, 64), meta(2, 2, 40, 32),
                                   out, lse, enable_gqa=True)
    assert (dq.shape, dk.shape, dv.shape) == ((2, 8, 33, 64), (2, 2, 40, 64), (2, 2, 40, 32))
    assert all(g.transpose(1, 2).is_contiguous() for g in (dq, dk, dv))  # stored (B, S, H, D), as out
    with pytest.raises(ValueError, match="causal must be one of"):
        ops.sdpa(meta(1, 1, 4, 16), meta(1, 1, 4, 16), meta(1, 1, 4, 16), "lower")
    with pytest.raises(ValueError, match="must all be 4-D"):
        ops.sdpa(meta(1, 1, 4, 16), meta(1, 4, 16), meta(1, 4, 16))


def test_varlen_and_paged_decode_fakes():
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    out, lse = ops.sdpa_varlen(meta(11, 8, 64), meta(13, 2, 64), meta(13, 2, 64), cu, cu, 7, 9)
    assert out.shape == (11, 8, 64) and lse.shape == (8, 11) and lse.dtype == torch.float32
    out = ops.paged_decode(meta(3, 8, 64), meta(10, 16, 2, 64), meta(10, 16, 2, 64),
                           torch.empty(3, 4, dtype=torch.int32, device="meta"),
                           torch.empty(3, dtype=torch.int32, device="meta"))
    assert out.shape == (3, 8, 64)


# ---- opcheck ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", ops.CAUSAL)
def test_opcheck_sdpa(causal):
    args = (randn(2, 4, 5, 8, grad=True), randn(2, 2, 6, 8, grad=True), randn(2, 2, 6, 8, grad=True))
    torch.library.opcheck(ops.sdpa, args, {"causal": causal, "enable_gqa": True, "fallback": "torch"})


def test_opcheck_sdpa_backward():
    q, k, v = randn(2, 4, 5, 8), randn(2, 2, 6, 8), randn(2, 2, 6, 8)
    out, lse = ops.sdpa(q, k, v, "top_left", None, True, fallback="torch")
    torch.library.opcheck(ops.sdpa_backward, (randn(2, 4, 5, 8), q, k, v, out, lse),
                          {"causal": "top_left", "enable_gqa": True, "fallback": "torch"})


def _varlen_inputs():
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 11], dtype=torch.int32)
    return randn(8, 4, 16), randn(11, 2, 16), randn(11, 2, 16), cu_q, cu_k


def test_opcheck_varlen_and_paged_decode():
    q, k, v, cu_q, cu_k = _varlen_inputs()
    torch.library.opcheck(ops.sdpa_varlen, (q, k, v, cu_q, cu_k, 5, 5), {"causal": "bottom_right", "fallback": "torch"})
    torch.library.opcheck(ops.paged_decode, _paged_inputs()[:5], {"fallback": "torch"})


# ---- varlen and paged decode against the dense reference ---------------------------------------------

def test_varlen_matches_per_sequence_attention():
    q, k, v, cu_q, cu_k = _varlen_inputs()
    out, lse = ops.sdpa_varlen(q, k, v, cu_q, cu_k, 5, 5, "bottom_right", fallback="torch")
    for b in range(3):
        qs, ks, vs = (t.transpose(0, 1) for t in (q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]],
                                                   v[cu_k[b]:cu_k[b + 1]]))
        if qs.shape[1] == 0:
            continue
        ref = _torch_sdpa(qs, ks, vs, "bottom_right")
        assert _rel(out[cu_q[b]:cu_q[b + 1]].transpose(0, 1), ref) < 1e-12


def _paged_inputs():
    k_cache, v_cache = randn(6, 4, 2, 16), randn(6, 4, 2, 16)
    block_table = torch.tensor([[5, 0, 3], [2, 1, 0]], dtype=torch.int32)
    seqlens = torch.tensor([10, 3], dtype=torch.int32)
    return randn(2, 4, 16), k_cache, v_cache, block_table, seqlens, (10, 3)


def test_paged_decode_matches_dense_attention_over_gathered_pages():
    q, k_cache, v_cache, block_table, seqlens, lengths = _paged_inputs()
    out = ops.paged_decode(q, k_cache, v_cache, block_table, seqlens, fallback="torch")
    for b, n in enumerate(lengths):
        ks = k_cache[block_table[b].long()].flatten(0, 1)[:n].transpose(0, 1)
        vs = v_cache[block_table[b].long()].flatten(0, 1)[:n].transpose(0, 1)
        ref = _torch_sdpa(q[b].unsqueeze(1), ks, vs, None)[:, 0]
        assert _rel(out[b], ref) < 1e-12


# ---- gradients --------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", ops.CAUSAL)
def test_sdpa_gradcheck(causal):
    args = (randn(1, 4, 3, 8, grad=True), randn(1, 2, 5, 8, grad=True), randn(1, 2, 5, 8, grad=True))
    assert torch.autograd.gradcheck(lambda q, k, v: ops.sdpa(q, k, v, causal, None, True, fallback="torch")[0], args)


@pytest.mark.parametrize("q_shape, hk, sk", CASES)
def test_sdpa_gradients_match_torch(q_shape, hk, sk):
    q = randn(*q_shape, grad=True)
    k = randn(*q_shape[:-3], hk, sk, q_shape[-1], grad=True)
    v = randn(*q_shape[:-3], hk, sk, q_shape[-1], grad=True)
    out, _ = ops.sdpa(q, k, v, "top_left", None, True, fallback="torch")
    ref = _torch_sdpa(q, k, v, "top_left")
    g = randn(*out.shape)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert got.shape == want.shape and _rel(got, want) < 1e-12


def test_reference_backward_of_a_row_with_no_key_is_zero():
    q, k, v = randn(1, 1, 5, 8), randn(1, 1, 3, 8), randn(1, 1, 3, 8)
    dq, dk, dv = reference.backward(randn(1, 1, 5, 8), q, k, v, "bottom_right")
    assert torch.all(dq[..., :2, :] == 0) and torch.isfinite(dk).all() and torch.isfinite(dv).all()


# ---- missing kernels ------------------------------------------------------------------------------

def test_missing_backward_kernel_is_named(monkeypatch):
    monkeypatch.setitem(attention_ops._ENTRIES, "sdpa_backward", ("no_such_entry", "the attention backward"))
    monkeypatch.setattr(attention_ops, "_found", {})
    q, k, v = randn(1, 2, 3, 16), randn(1, 2, 3, 16), randn(1, 2, 3, 16)
    out, lse = ops.sdpa(q, k, v, fallback="torch")
    with pytest.raises(NotImplementedError, match="the attention backward is not written yet"):
        ops.sdpa_backward(q, q, k, v, out, lse)


@pytest.mark.parametrize("op, args", [
    ("sdpa_varlen", lambda: _varlen_inputs() + (5, 5)),
    ("paged_decode", lambda: _paged_inputs()[:5]),
])
def test_missing_forward_kernels_are_named(monkeypatch, op, args):
    monkeypatch.setitem(attention_ops._ENTRIES, op, ("no_such_entry", "the test kernel"))
    monkeypatch.setattr(attention_ops, "_found", {})
    with pytest.raises(NotImplementedError, match="the test kernel is not written yet"):
        getattr(ops, op)(*args())


def test_cpu_sdpa_without_fallback_names_the_device():
    q = randn(1, 2, 3, 16)
    with pytest.raises(ValueError, match="CUDA devices only"):
        ops.sdpa(q, q, q)


# ---- sliding windows ---------------------------------------------------------------------------------

def _brute_force(q, k, v, causal, window, scale):
    """(out, lse) of one (H, Sq, D) head stack by explicit loops over (i, j), the window rule
    written out here (FlashAttention's convention) independently of `mask_rule`: key j is
    allowed for row i iff j <= i + base + right (right 0 when causal) and j >= i + base - left,
    for the bounds given, base = 0 for top-left causality else Sk - Sq."""
    left, right = (-1, -1) if window is None else window
    sq, sk = q.shape[-2], k.shape[-2]
    base = 0 if causal == "top_left" else sk - sq
    if causal is not None:
        right = 0
    out = torch.zeros(q.shape[0], sq, v.shape[-1], dtype=F64)
    lse = torch.full((q.shape[0], sq), -math.inf, dtype=F64)
    for h in range(q.shape[0]):
        for i in range(sq):
            keys = [j for j in range(sk) if (right < 0 or j <= i + base + right) and (left < 0 or j >= i + base - left)]
            if not keys:
                continue
            s = torch.stack([(q[h, i] * k[h, j]).sum() * scale for j in keys])
            lse[h, i] = torch.logsumexp(s, 0)
            p = torch.exp(s - lse[h, i])
            out[h, i] = (p[:, None] * v[h, keys]).sum(0)
    return out, lse


WINDOWS = [  # (Sq, Sk, causal, window_size)
    (6, 6, None, (2, 1)),
    (5, 8, None, (0, 0)),
    (8, 5, None, (1, 2)),       # Sq > Sk: the first rows see no key
    (6, 9, None, (3, -1)),
    (7, 7, None, (-1, 2)),
    (4, 9, None, (-1, 0)),      # bottom-right causality
    (7, 5, "top_left", (2, -1)),
    (5, 7, "top_left", (0, 0)),
    (6, 4, "bottom_right", (1, 0)),
    (5, 8, "bottom_right", (-1, -1)),
]


@pytest.mark.parametrize("sq, sk, causal, window", WINDOWS)
def test_windowed_reference_matches_brute_force(sq, sk, causal, window):
    q, k, v = randn(1, 3, sq, 8), randn(1, 3, sk, 8), randn(1, 3, sk, 8)
    out, lse = ops.sdpa(q, k, v, causal, 0.4, False, *window, fallback="torch")
    want_out, want_lse = _brute_force(q[0], k[0], v[0], causal, window, 0.4)
    empty = torch.isinf(want_lse)
    assert torch.equal(torch.isinf(lse[0]), empty) and torch.all(lse[0][empty] < 0)
    assert torch.all(out[0][empty] == 0)
    assert _rel(out[0], want_out) < 1e-12
    assert torch.allclose(lse[0][~empty].double(), want_lse[~empty], rtol=1e-6)


@pytest.mark.parametrize("causal, window", [(None, (2, 1)), ("top_left", (1, 0)), (None, (1, 0))])
def test_windowed_sdpa_gradcheck(causal, window):
    args = (randn(1, 2, 5, 8, grad=True), randn(1, 1, 6, 8, grad=True), randn(1, 1, 6, 8, grad=True))
    assert torch.autograd.gradcheck(
        lambda q, k, v: ops.sdpa(q, k, v, causal, None, True, *window, fallback="torch")[0], args)


def test_windowed_reference_backward_matches_autograd_of_brute_force():
    q, k, v = randn(2, 6, 8, grad=True), randn(2, 7, 8, grad=True), randn(2, 7, 8, grad=True)
    g = randn(2, 6, 8)
    got = reference.backward(g, q, k, v, None, 0.5, False, (1, 1))
    want = torch.autograd.grad(_brute_force(q, k, v, None, (1, 1), 0.5)[0], (q, k, v), g)
    for a, r in zip(got, want):
        assert _rel(a, r) < 1e-12


@pytest.mark.parametrize("op, kwargs, error, pattern", [
    ("sdpa", {"window_left": -2}, ValueError, "window_size values must be >= -1"),
    ("sdpa", {"causal": "top_left", "window_right": 1}, ValueError, "bounds the window on the right at 0"),
    ("sdpa_backward", {"window_right": -7}, ValueError, "cute_kernels.sdpa_backward: window_size values"),
])
def test_bad_windows_are_named_by_the_ops(op, kwargs, error, pattern):
    q = randn(1, 2, 3, 8)
    args = (q, q, q) if op == "sdpa" else (q, q, q, q, q, torch.zeros(1, 2, 3))
    for fallback in ("none", "torch"):
        with pytest.raises(error, match=pattern):
            getattr(ops, op)(*args, **kwargs, fallback=fallback)
    metas = tuple(meta(*t.shape, dtype=t.dtype) for t in args)
    with pytest.raises(error, match=pattern):
        getattr(ops, op)(*metas, **kwargs)


def test_windowed_varlen_matches_per_sequence_brute_force():
    q, k, v, cu_q, cu_k = _varlen_inputs()
    out, lse = ops.sdpa_varlen(q, k, v, cu_q, cu_k, 5, 5, None, 0.3, 1, 0, fallback="torch")
    for b in range(3):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        qs, ks, vs = (t.transpose(0, 1) for t in (q[rows], k[keys].repeat_interleave(2, 1),
                                                   v[keys].repeat_interleave(2, 1)))
        if qs.shape[1] == 0:
            continue
        want_out, want_lse = _brute_force(qs, ks, vs, None, (1, 0), 0.3)
        assert _rel(out[rows].transpose(0, 1), want_out) < 1e-12
        assert torch.allclose(lse[:, rows].double(), want_lse, rtol=1e-6)


def test_varlen_is_differentiable_through_sdpa_varlen_backward():
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    args = (randn(5, 2, 8, grad=True), randn(7, 1, 8, grad=True), randn(7, 1, 8, grad=True))
    for causal, window in ((None, (-1, -1)), ("bottom_right", (1, 0)), (None, (1, 2))):
        assert torch.autograd.gradcheck(
            lambda q, k, v: ops.sdpa_varlen(q, k, v, cu_q, cu_k, 3, 4, causal, None, *window, fallback="torch")[0],
            args)


def test_varlen_backward_reference_is_per_sequence_backward():
    q, k, v, cu_q, cu_k = _varlen_inputs()
    g = randn(*q.shape)
    dq, dk, dv = reference.varlen_backward(g, q, k, v, cu_q, cu_k, "top_left", None, (2, 0))
    for b in range(3):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want = reference.backward(*(t.transpose(0, 1) for t in (g[rows], q[rows], k[keys], v[keys])), "top_left",
                                  None, True, (2, 0))
        for got, w, index in ((dq, want[0], rows), (dk, want[1], keys), (dv, want[2], keys)):
            assert torch.equal(got[index], w.transpose(0, 1))


def test_windowed_opchecks():
    args = (randn(2, 4, 5, 8, grad=True), randn(2, 2, 6, 8, grad=True), randn(2, 2, 6, 8, grad=True))
    torch.library.opcheck(ops.sdpa, args, {"window_left": 2, "window_right": 1, "enable_gqa": True,
                                           "fallback": "torch"})
    q, k, v = (t.detach() for t in args)
    out, lse = ops.sdpa(q, k, v, "top_left", None, True, 1, 0, fallback="torch")
    torch.library.opcheck(ops.sdpa_backward, (randn(2, 4, 5, 8), q, k, v, out, lse),
                          {"causal": "top_left", "enable_gqa": True, "window_left": 1, "window_right": 0,
                           "fallback": "torch"})
    q, k, v, cu_q, cu_k = _varlen_inputs()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(ops.sdpa_varlen, (q, k, v, cu_q, cu_k, 5, 5),
                          {"window_left": 1, "window_right": 2, "fallback": "torch"})
    out, lse = ops.sdpa_varlen(q.detach(), k.detach(), v.detach(), cu_q, cu_k, 5, 5, fallback="torch")
    torch.library.opcheck(ops.sdpa_varlen_backward, (randn(*out.shape), q.detach(), k.detach(), v.detach(), out, lse,
                                                     cu_q, cu_k, 5, 5), {"fallback": "torch"})


def test_varlen_backward_fake():
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    dq, dk, dv = ops.sdpa_varlen_backward(meta(11, 8, 32), meta(11, 8, 64), meta(13, 2, 64), meta(13, 2, 32),
                                          meta(11, 8, 32), meta(8, 11, dtype=torch.float32), cu, cu, 7, 9)
    assert (dq.shape, dk.shape, dv.shape) == ((11, 8, 64), (13, 2, 64), (13, 2, 32))
    with pytest.raises(ValueError, match="must be 3-D"):
        ops.sdpa_varlen_backward(meta(1, 11, 8, 32), meta(1, 11, 8, 64), meta(13, 2, 64), meta(13, 2, 32),
                                 meta(11, 8, 32), meta(8, 11, dtype=torch.float32), cu, cu, 7, 9)


def test_missing_varlen_backward_kernel_is_named(monkeypatch):
    monkeypatch.setitem(attention_ops._ENTRIES, "sdpa_varlen_backward", ("no_such_entry", "the varlen backward"))
    monkeypatch.setattr(attention_ops, "_found", {})
    q, k, v, cu_q, cu_k = _varlen_inputs()
    out, lse = ops.sdpa_varlen(q, k, v, cu_q, cu_k, 5, 5, fallback="torch")
    with pytest.raises(NotImplementedError, match="the varlen backward is not written yet"):
        ops.sdpa_varlen_backward(out, q, k, v, out, lse, cu_q, cu_k, 5, 5)
    got = ops.sdpa_varlen_backward(out, q, k, v, out, lse, cu_q, cu_k, 5, 5, fallback="torch")
    want = reference.varlen_backward(out, q, k, v, cu_q, cu_k)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_varlen_ops_read_the_same_offsets_to_the_host_once(monkeypatch):
    """The ops hand the kernel layer the caller's offset tensors themselves (only tensors that
    require grad are detached), so its memo of their host values holds across a model's layers
    and its backward: one device read (a wait for the queue), not one per call. On CPU the entry
    reads and checks the offsets before it refuses the device."""
    from cute_kernels.attention import varlen

    reads = []
    real = varlen._checked_offsets
    monkeypatch.setattr(varlen, "_checked_offsets", lambda *a: reads.append(a[0]) or real(*a))
    varlen._OFFSETS.clear()
    q, k, v, cu_q, cu_k = _varlen_inputs()
    q, k, v = (t.float().requires_grad_() for t in (q, k, v))
    out, lse = q.detach()[:, :, :16], torch.zeros(4, 8)
    for _ in range(3):
        with pytest.raises(ValueError, match="CUDA"):
            ops.sdpa_varlen(q, k, v, cu_q, cu_k, 5, 5)
        with pytest.raises(ValueError, match="CUDA"):
            ops.sdpa_varlen_backward(out, q, k, v, out, lse, cu_q, cu_k, 5, 5)
    assert [r is cu_q for r in reads] == [True]
