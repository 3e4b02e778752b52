"""Soft-capping, sinks and seqused_k (`cute_kernels.attention.features`) on CPU: the reference
against a brute-force float64 definition, gradients (gradcheck through `fallback="torch"` and
through our entry points' autograd with a reference rung standing in for the kernels), the
argument checks (before any launch), the rungs' "not implemented" reasons, and the fakes."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels import ops  # noqa: E402
from cute_kernels.attention import api, features, varlen  # noqa: E402
from cute_kernels.attention.mask_rule import dense_mask  # noqa: E402
from cute_kernels.ops import attention_reference as reference  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")]

F64 = torch.float64


def randn(*shape, dtype=F64, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _rel(x, ref):
    return float((x - ref).detach().norm() / ref.detach().norm())


def brute_force(q, k, v, *, causal=None, window=None, scale=None, softcap=None, sinks=None):
    """(out, lse) straight from the definition, float64, one (batch, head) at a time."""
    hq, sq, d = q.shape[-3:]
    hk, sk = k.shape[-3], k.shape[-2]
    scale = d ** -0.5 if scale is None else scale
    left, right = (None, None) if window is None else (None if window[0] < 0 else window[0],
                                                       None if window[1] < 0 else window[1])
    if causal is None and right == 0:
        causal = "bottom_right"
    if causal is not None:
        right = None
    keep = dense_mask(sq, sk, causal=causal is not None, align=causal or "top_left", window_left=left,
                      window_right=right)
    qb, kb, vb = (t.reshape(-1, *t.shape[-3:]).double() for t in (q, k, v))
    outs, lses = [], []
    for b in range(qb.shape[0]):
        for h in range(hq):
            kh, vh = kb[b, h // (hq // hk)], vb[b, h // (hq // hk)]
            s = scale * (qb[b, h] @ kh.T)
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            s = s.masked_fill(~keep, -math.inf)
            cols = [s] if sinks is None else [s, sinks[h].double().expand(sq, 1)]
            full = torch.cat(cols, dim=1)
            lse = torch.logsumexp(full, dim=1)
            p = torch.exp(s - lse[:, None])
            p = torch.nan_to_num(p, nan=0.0)
            outs.append(p @ vh)
            lses.append(lse)
    out = torch.stack(outs).reshape(*q.shape[:-1], v.shape[-1])
    return out, torch.stack(lses).reshape(q.shape[:-1])


CASES = [  # (q shape, kv heads, Sk, causal, window)
    ((2, 4, 5, 8), 4, 7, None, None),
    ((2, 4, 7, 8), 2, 5, "top_left", None),
    ((1, 6, 6, 16), 3, 9, "bottom_right", (2, 0)),
    ((3, 6, 16), 3, 9, None, (1, 2)),
]


# ---- the reference against the definition --------------------------------------------------------

@pytest.mark.parametrize("q_shape, hk, sk, causal, window", CASES)
@pytest.mark.parametrize("softcap, with_sinks", [(None, True), (2.5, False), (0.7, True)])
def test_reference_matches_the_definition(q_shape, hk, sk, causal, window, softcap, with_sinks):
    q = randn(*q_shape)
    k, v = randn(*q_shape[:-3], hk, sk, q_shape[-1]), randn(*q_shape[:-3], hk, sk, q_shape[-1])
    sinks = randn(q_shape[-3]) * 2 if with_sinks else None
    left, right = window or (-1, -1)
    out, lse = ops.sdpa(q, k, v, causal, 0.4, True, left, right, fallback="torch", softcap=softcap, sinks=sinks)
    want_out, want_lse = brute_force(q, k, v, causal=causal, window=window, scale=0.4, softcap=softcap, sinks=sinks)
    assert _rel(out, want_out) < 1e-12
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.allclose(lse[finite].double(), want_lse[finite], rtol=1e-6)


def test_softcap_bounds_the_scores_and_sinks_take_a_share():
    """|s| <= softcap whatever q.k is; a sink of +large leaves out ~0 and lse ~sink; -inf is no sink."""
    q, k, v = randn(1, 2, 3, 8) * 100, randn(1, 2, 4, 8) * 100, randn(1, 2, 4, 8)
    _, lse = ops.sdpa(q, k, v, fallback="torch", softcap=1.5)
    assert torch.all(lse <= 1.5 + math.log(4) + 1e-6) and torch.all(lse >= -1.5 + math.log(4) - 1e-6)
    out, lse = ops.sdpa(q, k, v, fallback="torch", softcap=1.5, sinks=torch.full((2,), 60.0, dtype=F64))
    assert out.abs().max() < 1e-20 and torch.allclose(lse, torch.full_like(lse, 60.0))
    base, base_lse = ops.sdpa(q, k, v, fallback="torch", softcap=1.5)
    out, lse = ops.sdpa(q, k, v, fallback="torch", softcap=1.5, sinks=torch.full((2,), -math.inf, dtype=F64))
    assert torch.equal(out, base) and torch.equal(lse, base_lse)


def test_rows_without_keys_get_the_sink_as_lse():
    q, k, v = randn(1, 2, 5, 8), randn(1, 2, 2, 8), randn(1, 2, 2, 8)
    sinks = torch.tensor([0.5, -1.0], dtype=F64)
    out, lse = ops.sdpa(q, k, v, "bottom_right", fallback="torch", sinks=sinks)
    assert torch.all(out[0, :, :3] == 0)
    assert torch.allclose(lse[0, :, :3], sinks.float()[:, None].expand(2, 3))


def test_masked_attention_is_forward_with_a_dense_mask():
    q, k, v = randn(2, 4, 5, 8), randn(2, 2, 6, 8), randn(2, 2, 6, 8)
    sinks = randn(4)
    keep = torch.rand(5, 6) > 0.3
    keep[:, 0] = True
    out, lse = reference.masked_attention(q, k, v, keep, 0.0, None, None, True, None, 3.0, sinks)
    bias = torch.zeros(5, 6, dtype=F64).masked_fill(~keep, -math.inf)
    out2, lse2 = reference.masked_attention(q, k, v, bias, 0.0, None, None, True, None, 3.0, sinks)
    assert _rel(out, out2) < 1e-12 and torch.allclose(lse, lse2)
    # the causal variant equals forward's
    out3, lse3 = reference.masked_attention(q, k, v, None, 0.0, "top_left", None, True, None, 3.0, sinks)
    want, want_lse = reference.forward(q, k, v, "top_left", None, True, None, 3.0, sinks)
    assert _rel(out3, want) < 1e-12 and torch.allclose(lse3, want_lse)


# ---- gradients -----------------------------------------------------------------------------------

@pytest.mark.parametrize("causal, window, softcap", [(None, None, 2.0), ("top_left", None, 0.5),
                                                     ("bottom_right", (2, 0), 1.5), (None, (1, 1), None)])
def test_sdpa_gradcheck_with_softcap_and_sinks(causal, window, softcap):
    args = (randn(1, 4, 3, 8, grad=True), randn(1, 2, 5, 8, grad=True), randn(1, 2, 5, 8, grad=True),
            randn(4, grad=True))
    left, right = window or (-1, -1)

    def f(q, k, v, sinks):
        return ops.sdpa(q, k, v, causal, None, True, left, right, fallback="torch", softcap=softcap, sinks=sinks)[0]

    assert torch.autograd.gradcheck(f, args)


def test_sinks_gradient_matches_autograd_of_the_definition():
    q, k, v, sinks = randn(2, 4, 5, 8), randn(2, 2, 6, 8), randn(2, 2, 6, 8), randn(4, grad=True)
    out, lse = brute_force(q, k, v, causal="top_left", softcap=1.7, sinks=sinks)
    g = randn(*out.shape)
    want, = torch.autograd.grad(out, sinks, g)
    got = features.sinks_gradient(g, out.detach(), lse.detach(), sinks.detach())
    assert _rel(got, want) < 1e-12
    # unbatched (Hq, Sq, Dv) against lse (Hq, Sq): the head axis is lse's second to last
    got0 = features.sinks_gradient(g[0], out[0].detach(), lse[0].detach(), sinks.detach())
    ref0 = -(torch.exp(sinks.detach()[:, None] - lse[0].detach()) * (g[0] * out[0].detach()).sum(-1)).sum(-1)
    assert _rel(got0, ref0) < 1e-12
    # packed (Tq, Hq, Dv) against lse (Hq, Tq)
    got_p = features.sinks_gradient(g[0].transpose(0, 1), out[0].detach().transpose(0, 1), lse[0].detach(),
                                    sinks.detach(), packed=True)
    assert _rel(got_p, ref0) < 1e-12


def test_reference_softcap_backward_matches_autograd_of_the_definition():
    q, k, v = randn(2, 4, 5, 8, grad=True), randn(2, 2, 7, 8, grad=True), randn(2, 2, 7, 8, grad=True)
    sinks = randn(4)
    out, _ = brute_force(q, k, v, causal="bottom_right", window=(3, 0), softcap=0.9, sinks=sinks)
    g = randn(*out.shape)
    want = torch.autograd.grad(out, (q, k, v), g)
    got = reference.backward(g, q, k, v, "bottom_right", None, True, (3, 0), 0.9, sinks)
    for a, r in zip(got, want):
        assert _rel(a, r) < 1e-12


def _varlen_inputs():
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 11], dtype=torch.int32)
    return randn(8, 4, 16), randn(11, 2, 16), randn(11, 2, 16), cu_q, cu_k


def test_varlen_reference_with_features_is_per_sequence():
    q, k, v, cu_q, cu_k = _varlen_inputs()
    sinks, used = randn(4), torch.tensor([2, 0, 5], dtype=torch.int32)
    out, lse = ops.sdpa_varlen(q, k, v, cu_q, cu_k, 5, 5, "bottom_right", None, fallback="torch", softcap=1.3,
                               sinks=sinks, seqused_k=used)
    for b, n in enumerate(used.tolist()):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        if rows.start == rows.stop:
            continue
        keys = slice(int(cu_k[b]), int(cu_k[b]) + n)
        qs, ks, vs = (t.transpose(0, 1) for t in (q[rows], k[keys], v[keys]))
        want, want_lse = brute_force(qs, ks, vs, causal="bottom_right", softcap=1.3, sinks=sinks)
        assert _rel(out[rows].transpose(0, 1), want) < 1e-12
        assert torch.allclose(lse[:, rows].double(), want_lse, rtol=1e-6)


def test_varlen_gradcheck_with_features():
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    used = torch.tensor([2, 4], dtype=torch.int32)
    args = (randn(5, 2, 8, grad=True), randn(7, 1, 8, grad=True), randn(7, 1, 8, grad=True), randn(2, grad=True))

    def f(q, k, v, sinks):
        return ops.sdpa_varlen(q, k, v, cu_q, cu_k, 3, 4, "top_left", None, fallback="torch", softcap=1.1,
                               sinks=sinks, seqused_k=used)[0]

    assert torch.autograd.gradcheck(f, args)


def test_opcheck_with_features():
    args = (randn(2, 4, 5, 8, grad=True), randn(2, 2, 6, 8, grad=True), randn(2, 2, 6, 8, grad=True))
    torch.library.opcheck(ops.sdpa, args, {"causal": "top_left", "enable_gqa": True, "fallback": "torch",
                                           "softcap": 2.0, "sinks": randn(4, grad=True)})
    q, k, v, cu_q, cu_k = _varlen_inputs()
    torch.library.opcheck(ops.sdpa_varlen, (q, k, v, cu_q, cu_k, 5, 5),
                          {"fallback": "torch", "softcap": 2.0, "sinks": randn(4),
                           "seqused_k": torch.tensor([1, 2, 5], dtype=torch.int32)})


# ---- our entry points' autograd, a reference rung standing in for the kernels ---------------------

class ReferenceRung:
    """A rung computing by definition, recording what reached it."""

    name = "reference"

    def __init__(self):
        self.seen = []

    def __call__(self, q, k, v, out, lse, problem, sinks=None):
        self.seen.append(("forward", problem.softcap, problem.sinks, sinks is not None))
        window = None
        if problem.windowed:
            window = (-1 if problem.window_left is None else problem.window_left,
                      -1 if problem.window_right is None else problem.window_right)
        o, l = reference.forward(q, k, v, problem.causal, problem.scale, True, window, problem.softcap, sinks)
        out.copy_(o)
        lse.copy_(l)

    def supports_backward(self, problem):
        return None

    def backward(self, dout, q, k, v, out, lse, problem):
        self.seen.append(("backward", problem.softcap, problem.sinks))
        # P from the saved lse (which holds the sink): what a kernel's backward does.
        return reference.backward(dout, q, k, v, problem.causal, problem.scale, True, None, problem.softcap,
                                  _SINKS[0])


_SINKS = [None]


@pytest.fixture
def reference_rung(monkeypatch):
    from cute_kernels.attention import dispatch

    rung = ReferenceRung()
    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)
    monkeypatch.setattr(dispatch, "resolve", lambda kernel, q, k, v, problem, **kw: rung)
    return rung


def test_our_sdpa_differentiates_sinks_and_softcap(reference_rung):
    q, k, v = randn(2, 4, 5, 8, grad=True), randn(2, 2, 7, 8, grad=True), randn(2, 2, 7, 8, grad=True)
    sinks = randn(4, grad=True)
    _SINKS[0] = sinks.detach()
    out, lse = api.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, softcap=1.2, sinks=sinks,
                                                return_lse=True)
    want, want_lse = brute_force(q, k, v, causal="top_left", softcap=1.2, sinks=sinks)
    assert _rel(out, want) < 1e-12 and torch.allclose(lse.double(), want_lse.detach(), rtol=1e-6)
    assert not lse.requires_grad
    g = randn(*out.shape)
    got = torch.autograd.grad(out, (q, k, v, sinks), g)
    ref = torch.autograd.grad(want, (q, k, v, sinks), g)
    for a, r in zip(got, ref):
        assert _rel(a, r) < 1e-6  # lse is fp32
    assert reference_rung.seen == [("forward", 1.2, True, True), ("backward", 1.2, True)]


def test_attention_backward_returns_dsinks_last(reference_rung):
    q, k, v, sinks = randn(1, 2, 4, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8), randn(2)
    _SINKS[0] = sinks
    out, lse = api.attention_forward(q, k, v, sinks=sinks)
    grads = api.attention_backward(randn(*out.shape), q, k, v, out, lse, sinks=sinks)
    assert len(grads) == 4 and grads[3].shape == (2,) and grads[3].dtype == F64
    assert len(api.attention_backward(randn(*out.shape), q, k, v, out, lse)) == 3


def test_no_keys_with_sinks_writes_the_sink_without_a_launch(reference_rung):
    q, k, v, sinks = randn(2, 3, 4, 8), randn(2, 3, 0, 8), randn(2, 3, 0, 8), torch.tensor([1.0, 2.0, -3.0])
    out, lse = api.attention_forward(q, k, v, sinks=sinks)
    assert torch.all(out == 0) and torch.equal(lse, sinks[None, :, None].expand(2, 3, 4))
    assert reference_rung.seen == []


# ---- checks ------------------------------------------------------------------------------------------

def qkv(b=2, hq=4, hkv=4, sq=8, sk=8, d=64, dtype=torch.bfloat16):
    return (torch.randn(b, hq, sq, d, dtype=dtype), torch.randn(b, hkv, sk, d, dtype=dtype),
            torch.randn(b, hkv, sk, d, dtype=dtype))


@pytest.mark.parametrize("kwargs, error, pattern", [
    ({"softcap": 0.0}, ValueError, "softcap must be finite and > 0"),
    ({"softcap": -1.0}, ValueError, "softcap must be finite and > 0"),
    ({"softcap": math.inf}, ValueError, "softcap must be finite and > 0"),
    ({"softcap": math.nan}, ValueError, "softcap must be finite and > 0"),
    ({"softcap": "30"}, TypeError, "softcap must be a positive float"),
    ({"softcap": True}, TypeError, "softcap must be a positive float"),
    ({"sinks": torch.zeros(3)}, ValueError, r"sinks must have shape \(4,\)"),
    ({"sinks": torch.zeros(1, 4)}, ValueError, r"sinks must have shape \(4,\)"),
    ({"sinks": torch.zeros(4, dtype=torch.int32)}, TypeError, "sinks must be float32 or the query's dtype"),
    ({"sinks": torch.zeros(4, dtype=torch.float16)}, TypeError, "sinks must be float32 or the query's dtype"),
    ({"sinks": [0.0] * 4}, TypeError, "sinks must be a torch.Tensor"),
    ({"sinks": torch.zeros(4, device="meta")}, ValueError, "sinks is on meta but the query is on cpu"),
])
def test_bad_features_are_named_before_the_device(kwargs, error, pattern):
    """Feature errors come before the device check, so they read the same on CPU tensors."""
    q, k, v = qkv()
    with pytest.raises(error, match=pattern):
        api.scaled_dot_product_attention(q, k, v, **kwargs)
    with pytest.raises(error, match=pattern):
        api.attention_forward(q, k, v, **kwargs)
    with pytest.raises(error, match=pattern):
        api.attention_backward(q, q, k, v, q, torch.zeros(2, 4, 8), **kwargs)
    if error is ValueError or isinstance(kwargs.get("sinks"), torch.Tensor):  # else the schema's type check
        with pytest.raises(error, match=pattern):
            ops.sdpa(q, k, v, **kwargs)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]
    with pytest.raises(error, match=pattern):
        varlen.attention_varlen_forward(*packed, cu, cu, 8, 8, **kwargs)


def test_features_are_keyword_only():
    import inspect

    for fn in (api.scaled_dot_product_attention, api.attention_forward, api.attention_backward,
               varlen.attention_varlen_forward, varlen.attention_varlen_backward):
        params = inspect.signature(fn).parameters
        for name in ("softcap", "sinks"):
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None, fn
    params = inspect.signature(varlen.attention_varlen_forward).parameters
    assert params["seqused_k"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("cu_q, cu_k, used, pattern", [
    ([0, 5, 3, 8], [0, 4, 6, 8], None, r"cu_seqlens_q decreases at index 2: 5 -> 3"),
    ([0, 3, 5, 7], [0, 4, 6, 8], None, r"cu_seqlens_q\[-1\] = 7 but the packed tensor has 8 rows"),
    ([1, 3, 5, 8], [0, 4, 6, 8], None, r"cu_seqlens_q\[0\] must be 0"),
    ([0, 3, 5, 8], [0, 4, 6, 8], [4, 3, 2], r"seqused_k\[1\] = 3 but sequence 1 has 2 key rows"),
    ([0, 3, 5, 8], [0, 4, 6, 8], [4, -1, 2], r"seqused_k\[1\] = -1"),
    ([0, 3, 5, 8], [0, 4, 6, 8], [4, 1], r"seqused_k must be a \(3,\) int32 tensor"),
])
def test_bad_offsets_and_seqused_are_named(cu_q, cu_k, used, pattern):
    q, k, v = randn(8, 4, 16, dtype=torch.bfloat16), randn(8, 2, 16, dtype=torch.bfloat16), randn(
        8, 2, 16, dtype=torch.bfloat16)
    cu_q, cu_k = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)
    used = None if used is None else torch.tensor(used, dtype=torch.int32)
    with pytest.raises(ValueError, match=pattern):
        varlen.attention_varlen_forward(q, k, v, cu_q, cu_k, 8, 8, seqused_k=used)
    if used is None:  # the reference (fallback="torch") names them too
        with pytest.raises(ValueError, match="cu_seqlens"):
            ops.sdpa_varlen(q.double(), k.double(), v.double(), cu_q, cu_k, 8, 8, fallback="torch")


def test_rungs_decline_features_they_lack(monkeypatch):
    """A rung lists the features its forward takes; "auto" skips one that lacks a feature and
    names the reason when none has it."""
    pytest.importorskip("cutlass")
    from cute_kernels.attention import KERNELS, dispatch

    from dataclasses import replace

    from cute_kernels.attention import KERNELS, dispatch

    q, k, v = qkv(d=64)
    base = api.AttentionProblem(2, 4, 4, 8, 8, 64, 64, torch.bfloat16, None, 0.125)
    with_feature = {"softcap": replace(base, softcap=30.0), "sinks": replace(base, sinks=True),
                    "seqused_k": replace(base, seqused_k=True)}
    for name in ("sm80_flash", "sm90_flash"):
        rung = KERNELS[name]
        assert rung.supports(q, k, v, base) is None
        for feature, problem in with_feature.items():
            why = rung.supports(q, k, v, problem)
            assert (why is None) == (feature in rung.features), (name, feature, why)
            if why is not None:
                assert f"{feature} not implemented" in why
    lacking = [f for f in features.FEATURES if not any(f in KERNELS[n].features for n in ("sm80_flash", "sm90_flash"))]
    if not lacking:
        return
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    dispatch.clear_cache()
    try:
        with pytest.raises(ValueError, match=f"{lacking[0]} not implemented on this rung"):
            dispatch.resolve("auto", q, k, v, with_feature[lacking[0]])
    finally:
        dispatch.clear_cache()


def test_feature_reason_lists_what_is_missing():
    p = api.AttentionProblem(1, 1, 1, 4, 4, 64, 64, torch.bfloat16, None, 0.125, softcap=2.0, sinks=True)
    assert features.feature_reason(p) == "softcap and sinks not implemented on this rung"
    assert features.feature_reason(p, ("softcap",)) == "sinks not implemented on this rung"
    assert features.feature_reason(p, ("softcap", "sinks")) is None
    assert "softcap 2" in p.describe() and "sinks" in p.describe()


# ---- fakes and the functional form ------------------------------------------------------------------

def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_fakes_take_and_check_the_features():
    out, lse = ops.sdpa(meta(2, 8, 33, 64), meta(2, 2, 40, 64), meta(2, 2, 40, 64), enable_gqa=True, softcap=30.0,
                        sinks=meta(8, dtype=torch.float32))
    assert out.shape == (2, 8, 33, 64) and lse.shape == (2, 8, 33)
    with pytest.raises(ValueError, match=r"sinks must have shape \(8,\)"):
        ops.sdpa(meta(2, 8, 33, 64), meta(2, 2, 40, 64), meta(2, 2, 40, 64), enable_gqa=True, sinks=meta(2))
    with pytest.raises(ValueError, match="softcap must be finite and > 0"):
        ops.sdpa_backward(meta(1, 1, 4, 16), meta(1, 1, 4, 16), meta(1, 1, 4, 16), meta(1, 1, 4, 16),
                          meta(1, 1, 4, 16), meta(1, 1, 4, dtype=torch.float32), softcap=-2.0)
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    out, lse = ops.sdpa_varlen(meta(11, 8, 64), meta(13, 2, 64), meta(13, 2, 64), cu, cu, 7, 9, softcap=5.0,
                               sinks=meta(8), seqused_k=torch.empty(2, dtype=torch.int32, device="meta"))
    assert out.shape == (11, 8, 64) and lse.shape == (8, 11)


def test_functional_form_passes_features_and_falls_back_by_definition():
    from cute_kernels.nn import functional as F

    q, k, v, sinks = randn(1, 4, 5, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8), randn(4)
    out, lse = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, softcap=2.0, sinks=sinks,
                                              return_lse=True, fallback="torch")
    want, want_lse = brute_force(q, k, v, causal="top_left", softcap=2.0, sinks=sinks)
    assert _rel(out, want) < 1e-12 and torch.allclose(lse.double(), want_lse, rtol=1e-6)
    keep = torch.ones(5, 6, dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True, softcap=2.0, sinks=sinks,
                                         fallback="torch")
    assert _rel(out, want) < 1e-12
    with pytest.raises(NotImplementedError, match="dense attn_mask"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True, softcap=2.0)
