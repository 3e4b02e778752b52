"""cute_kernels.attention: argument checks before any launch, the rung's `supports` reasons,
the KERNELS registry and dispatch. Everything here runs on CPU (CPU tensors, mocked devices)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import KERNELS, attention_forward, scaled_dot_product_attention  # noqa: E402
from cute_kernels.attention import dispatch  # noqa: E402
from cute_kernels.attention.api import AttentionProblem, check_inputs  # noqa: E402
from cute_kernels.attention.registry import LADDER, AttentionRegistry  # noqa: E402


def qkv(b=2, hq=4, hkv=4, sq=8, sk=8, d=64, dv=None, dtype=torch.bfloat16):
    dv = d if dv is None else dv
    return (torch.randn(b, hq, sq, d, dtype=dtype), torch.randn(b, hkv, sk, d, dtype=dtype),
            torch.randn(b, hkv, sk, dv, dtype=dtype))


# ---- validation ---------------------------------------------------------------------------------

def test_cpu_tensors_are_rejected_naming_cuda():
    with pytest.raises(ValueError, match="on 'cpu'.*CUDA"):
        scaled_dot_product_attention(*qkv())


def test_dropout_is_refused_by_name():
    with pytest.raises(NotImplementedError, match="dropout_p=0.1"):
        scaled_dot_product_attention(*qkv(), dropout_p=0.1)


def test_dense_mask_is_refused_by_name():
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match="arbitrary dense attn_mask"):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))


def test_causal_bias_and_is_causal_together_are_refused():
    from torch.nn.attention.bias import causal_lower_right

    with pytest.raises(ValueError, match="either is_causal=True or a causal attn_mask"):
        scaled_dot_product_attention(*qkv(), attn_mask=causal_lower_right(8, 8), is_causal=True)


@pytest.mark.parametrize("args, kwargs, error, pattern", [
    (qkv(hq=4, hkv=2), {}, ValueError, "enable_gqa=True"),
    (qkv(hq=6, hkv=4), {"enable_gqa": True}, ValueError, r"multiple of the key/value heads \(4\)"),
    ((torch.randn(2, 4, 8, 64), torch.randn(2, 4, 8, 64, dtype=torch.float16), torch.randn(2, 4, 8, 64)), {},
     TypeError, "share a dtype"),
    (qkv()[:2] + (torch.randn(2, 4, 9, 64, dtype=torch.bfloat16),), {}, ValueError,
     "sequence length 8 but value has 9"),
    ((torch.randn(2, 4, 8, 64), torch.randn(2, 4, 8, 32), torch.randn(2, 4, 8, 32)), {}, ValueError,
     "query head dim 64 differs from key head dim 32"),
    ((torch.randn(2, 4, 8, 64), torch.randn(3, 4, 8, 64), torch.randn(3, 4, 8, 64)), {}, ValueError,
     "batch sizes differ"),
    ((torch.randn(8, 64), torch.randn(8, 64), torch.randn(8, 64)), {}, ValueError, "got 2-D"),
    ((torch.randint(0, 3, (2, 4, 8, 64)),) * 3, {}, TypeError, "floating dtype"),
    (qkv(), {"scale": "big"}, TypeError, "scale must be a real number"),
])
def test_bad_inputs_are_named(args, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        scaled_dot_product_attention(*args, **kwargs)


def test_head_dim_stride_must_be_one():
    q, k, v = qkv()
    v_cols = torch.randn(2, 4, 64, 8, dtype=torch.bfloat16).transpose(-1, -2)  # (B, H, S, D), D stride 8
    with pytest.raises(ValueError, match="value has head-dim stride 8; it must be 1"):
        scaled_dot_product_attention(q, k, v_cols)


def test_transposed_bshd_views_pass_validation():
    x = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)  # (B, S, H, D)
    q = x.transpose(1, 2)
    with pytest.raises(ValueError, match="on 'cpu'.*CUDA"):  # only the device stops it
        check_inputs(q, q, q, causal=None, scale=None, enable_gqa=False)


def test_unbatched_inputs_pass_validation():
    q = torch.randn(4, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="on 'cpu'.*CUDA"):
        scaled_dot_product_attention(q, q, q, is_causal=True)


def test_mismatched_ranks_and_unknown_causal():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="same rank"):
        scaled_dot_product_attention(q, k[0], v)
    with pytest.raises(ValueError, match="causal must be one of"):
        attention_forward(q, k, v, causal="diagonal")
    with pytest.raises(TypeError, match="attn_mask must be"):
        scaled_dot_product_attention(q, k, v, attn_mask=3)


# ---- the sm80_flash rung's reasons ---------------------------------------------------------------

def problem_for(q, k, v, causal=None, scale=None):
    b, hq, sq, d = q.shape
    _, hk, sk, dv = v.shape
    return AttentionProblem(b, hq, hk, sq, sk, d, dv, q.dtype, causal, scale if scale is not None else d ** -0.5)


def sm80():
    pytest.importorskip("cutlass")
    return KERNELS["sm80_flash"]


@pytest.mark.parametrize("make, scale, pattern", [
    (lambda: qkv(dtype=torch.float32), None, "dtype torch.float32 not supported"),
    (lambda: qkv(d=8), None, "head dim 8 not supported"),
    (lambda: qkv(d=64, dv=32), None, "value head dim 32 differs"),
    (lambda: qkv(), -1.0, "must be finite and > 0"),
    (lambda: qkv(), float("nan"), "must be finite and > 0"),
])
def test_sm80_flash_reasons(make, scale, pattern):
    q, k, v = make()
    why = sm80().supports(q, k, v, problem_for(q, k, v, scale=scale))
    assert why is not None and pattern in why


def test_sm80_flash_rejects_unaligned_strides_but_not_size_one_modes():
    rung = sm80()
    q, k, v = qkv(sq=9, d=64)
    q_odd = torch.randn(2, 4, 9, 72, dtype=torch.bfloat16)[..., 4:68]  # row starts 8 bytes off
    assert "not 16-byte aligned" in rung.supports(q_odd, k, v, problem_for(q_odd, k, v))
    q_stride = torch.randn(2, 4, 9 * 68, dtype=torch.bfloat16)[..., : 9 * 68].as_strided((2, 4, 9, 64),
                                                                                         (4 * 612, 612, 68, 1))
    assert "multiples of 8 elements" in rung.supports(q_stride, k, v, problem_for(q_stride, k, v))
    one = torch.randn(1, 4, 1, 64, dtype=torch.bfloat16).as_strided((1, 4, 1, 64), (3, 64, 5, 1))
    k1, v1 = torch.randn(1, 4, 8, 64, dtype=torch.bfloat16), torch.randn(1, 4, 8, 64, dtype=torch.bfloat16)
    assert rung.supports(one, k1, v1, problem_for(one, k1, v1)) is None
    assert rung.supports(q, k, v, problem_for(q, k, v, causal="bottom_right")) is None


# ---- registry and dispatch ---------------------------------------------------------------------

def test_registry_lists_present_rungs_in_ladder_order():
    assert [name for name, _ in LADDER] == ["sm80_flash", "sm90_flash", "decode"]
    assert "sm80_flash" in KERNELS
    assert list(KERNELS)[0] == "sm80_flash"
    with pytest.raises(KeyError, match="no attention kernel named 'flash9'"):
        KERNELS["flash9"]
    registry = AttentionRegistry((("x", "cute_kernels.attention.nonexistent:RUNG"),))
    assert list(registry) == [] and "x" not in registry
    with pytest.raises(KeyError, match="does not exist"):
        registry["x"]
    with pytest.raises(ValueError, match="module:attribute"):
        AttentionRegistry((("bad", "no_colon"),))


class FakeRung:
    def __init__(self, name, reason=None, capability=(8, 0)):
        self.name, self.reason, self.min_capability = name, reason, capability
        self.dtypes = (torch.bfloat16,)

    def supports(self, q, k, v, problem):
        return self.reason


def test_dispatch_picks_the_highest_supporting_rung(monkeypatch):
    q, k, v = qkv()
    problem = problem_for(q, k, v)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    low, high = FakeRung("low"), FakeRung("high", reason="too big")
    registry = {"low": low, "high": high, "decode": FakeRung("decode", reason="8 queries per head")}
    assert dispatch.choose(q, k, v, problem, registry=registry) is low
    assert dispatch.explain(q, k, v, problem, registry=registry) == (
        "decode: 8 queries per head; high: too big; low: chosen")
    # the decode rung takes part in "auto": the highest that supports the problem wins
    decode = FakeRung("decode")
    assert dispatch.choose(q, k, v, problem, registry={**registry, "decode": decode}) is decode
    with pytest.raises(ValueError, match="cannot run this problem: too big"):
        dispatch.resolve("high", q, k, v, problem, registry=registry)
    with pytest.raises(ValueError, match="unknown attention kernel 'nope'"):
        dispatch.resolve("nope", q, k, v, problem, registry=registry)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (7, 5))
    with pytest.raises(ValueError, match="low: needs compute capability 8.0, device has 7.5"):
        dispatch.choose(q, k, v, problem, registry=registry)


def test_causal_bias_sizes_must_match():
    from torch.nn.attention.bias import causal_lower_right

    with pytest.raises(ValueError, match=r"built for \(Sq, Sk\) = \(8, 9\)"):
        scaled_dot_product_attention(*qkv(), attn_mask=causal_lower_right(8, 9))


def test_auto_backward_falls_back_to_the_highest_rung_with_one(monkeypatch):
    """On sm_90 auto runs the forward on sm90_flash; where its backward does not serve the
    problem (per-sequence key lengths, which only sm80_flash's backward takes), the backward
    runs on sm80_flash; a named rung never falls back."""
    from dataclasses import replace

    from cute_kernels.attention import api, sm80_flash, sm90_flash

    dispatch.clear_cache()
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)
    q = torch.randn(1, 2, 64, 256, dtype=torch.bfloat16)
    problem = check_inputs(q, q, q, causal=None, scale=None, enable_gqa=False)
    assert dispatch.choose(q, q, q, problem) is sm90_flash.RUNG
    assert sm90_flash.RUNG.supports_backward(problem) is None  # every head dim since 2026-12-06
    problem = replace(problem, seqused_k=True)
    assert sm90_flash.RUNG.supports_backward(problem) is not None
    assert api._backward_rung("auto", q, q, q, problem) is sm80_flash.RUNG
    with pytest.raises(NotImplementedError, match="attention backward"):
        api._backward_rung("sm90_flash", q, q, q, problem)
    q = torch.randn(1, 2, 64, 128, dtype=torch.bfloat16)
    problem = check_inputs(q, q, q, causal=None, scale=None, enable_gqa=False)
    assert api._backward_rung("auto", q, q, q, problem) is sm90_flash.RUNG
    dispatch.clear_cache()


def test_deterministic_reaches_rungs_that_take_it(monkeypatch):
    from cute_kernels.attention import api, sm80_flash, sm90_flash

    assert api._takes_deterministic(sm90_flash.RUNG) and not api._takes_deterministic(sm80_flash.RUNG)
    seen = []

    class Rung:
        name = "fake"

        def backward(self, dout, q, k, v, out, lse, problem, *, deterministic=False):
            seen.append(deterministic)
            return q, k, v

    monkeypatch.setattr(api, "_backward_rung", lambda *args: Rung())
    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    lse = torch.randn(1, 2, 16)
    api.attention_backward(q, q, q, q, q, lse)
    api.attention_backward(q, q, q, q, q, lse, deterministic=True)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    api.attention_backward(q, q, q, q, q, lse)
    assert seen == [False, True, True]


# ---- sliding windows ----------------------------------------------------------------------------

@pytest.mark.parametrize("window, kwargs, error, pattern", [
    ("wide", {}, TypeError, "window_size must be None or a pair of ints"),
    ((4,), {}, TypeError, "pair of ints"),
    ((1, 2, 3), {}, TypeError, "pair of ints"),
    ((1.0, 2), {}, TypeError, "pair of ints"),
    ((True, 1), {}, TypeError, "pair of ints"),
    ((-2, 0), {}, ValueError, r"values must be >= -1 .*\(-2, 0\)"),
    ((0, -5), {}, ValueError, r"values must be >= -1"),
    ((3, 2), {"is_causal": True}, ValueError, r"causal mask bounds the window on the right at 0.*\(3, 2\)"),
])
def test_bad_windows_are_named_before_the_device(window, kwargs, error, pattern):
    """Window errors come before the device check, so they read the same on CPU tensors."""
    with pytest.raises(error, match=pattern):
        scaled_dot_product_attention(*qkv(), window_size=window, **kwargs)
    causal = "top_left" if kwargs else None
    with pytest.raises(error, match=pattern):
        attention_forward(*qkv(), causal=causal, window_size=window)
    from cute_kernels.attention import attention_backward

    q, k, v = qkv()
    with pytest.raises(error, match=pattern):
        attention_backward(q, q, k, v, q, torch.zeros(2, 4, 8), causal=causal, window_size=window)


def test_window_size_is_keyword_only_after_pytorchs_arguments():
    import inspect

    from cute_kernels.attention import attention_backward

    for fn in (scaled_dot_product_attention, attention_forward, attention_backward):
        param = inspect.signature(fn).parameters["window_size"]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is None
    names = list(inspect.signature(scaled_dot_product_attention).parameters)
    assert names[:8] == ["q", "k", "v", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]


@pytest.mark.parametrize("causal, window, want", [
    (None, None, (None, None, None)),
    (None, (-1, -1), (None, None, None)),
    (None, (4, -1), (None, 4, None)),
    (None, (-1, 3), (None, None, 3)),
    (None, (2, 5), (None, 2, 5)),
    (None, (0, 0), ("bottom_right", 0, None)),     # right 0 without causality is bottom-right causality
    (None, (-1, 0), ("bottom_right", None, None)),
    ("top_left", (4, 0), ("top_left", 4, None)),   # causality bounds the right: stored as None
    ("top_left", (4, -1), ("top_left", 4, None)),
    ("bottom_right", (-1, -1), ("bottom_right", None, None)),
    ("bottom_right", (0, 0), ("bottom_right", 0, None)),
])
def test_windows_are_stored_canonically(monkeypatch, causal, window, want):
    from cute_kernels.attention import api

    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)
    q, k, v = qkv()
    p = check_inputs(q, k, v, causal=causal, scale=None, enable_gqa=False, window_size=window)
    assert (p.causal, p.window_left, p.window_right) == want
    assert p.windowed == (want[1] is not None or want[2] is not None)
    if p.windowed:
        assert "window (" in p.describe()


def test_plan_keys_differ_by_window():
    from cute_kernels.attention import api

    q, k, v = qkv()
    keys = {api._plan_signature(q, k, v, None, None, False, "auto", w) for w in (None, (2, 2), (2, -1), (-1, 2))}
    assert len(keys) == 4 and None not in keys


class RecordingRung:
    """A rung on CPU tensors: writes a recognisable out/lse, records each problem it runs, has a
    launch plan (so plans are kept) and a backward that refuses windows until told otherwise."""

    name, dtypes, min_capability = "recording", (torch.bfloat16,), None

    def __init__(self, backward_windows=False):
        self.problems, self.backward_problems, self.backward_windows = [], [], backward_windows

    def supports(self, q, k, v, problem):
        return None

    def __call__(self, q, k, v, out, lse, problem):
        self.problems.append(problem)
        out.fill_(1.0)
        lse.fill_(0.0)

    def launch_plan(self, problem):
        return lambda q, k, v, out, lse: self(q, k, v, out, lse, problem)

    def supports_backward(self, problem):
        if problem.windowed and not self.backward_windows:
            return "sliding windows are not implemented in the recording backward"
        return None

    def backward(self, dout, q, k, v, out, lse, problem):
        self.backward_problems.append(problem)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


@pytest.fixture
def recording(monkeypatch):
    from cute_kernels.attention import api
    from cute_kernels.runtime import plan_cache

    rung = RecordingRung()
    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)
    monkeypatch.setattr(dispatch, "resolve", lambda kernel, q, k, v, problem, **kw: rung)
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(api, "_PLANS", plan_cache.PlanCache("test.attention"))
    monkeypatch.setattr(api, "_BACKWARD_PLANS", plan_cache.PlanCache("test.attention.backward"))
    return rung


def test_a_plan_is_never_replayed_for_another_window(recording):
    q, k, v = qkv()
    for window in (None, None, (3, 1), (3, 1), (-1, 2)):
        attention_forward(q, k, v, window_size=window, kernel="recording")
    windows = [(p.window_left, p.window_right) for p in recording.problems]
    assert windows == [(None, None)] * 2 + [(3, 1)] * 2 + [(None, 2)]
    from cute_kernels.attention import api

    assert len(api._PLANS) == 3


def test_windowed_gradients_are_refused_before_the_forward_launches(recording):
    q, k, v = (t.requires_grad_() for t in qkv())
    with pytest.raises(NotImplementedError, match="sliding windows are not implemented in the recording backward"):
        scaled_dot_product_attention(q, k, v, window_size=(2, 0), kernel="recording")
    assert recording.problems == []
    out = scaled_dot_product_attention(q, k, v, kernel="recording")  # no window: differentiable
    out.sum().backward()
    assert len(recording.backward_problems) == 1


def test_the_window_reaches_the_backward(recording):
    recording.backward_windows = True
    q, k, v = (t.requires_grad_() for t in qkv())
    out = scaled_dot_product_attention(q, k, v, is_causal=True, window_size=(5, 0), kernel="recording")
    out.sum().backward()
    (fwd,), (bwd,) = recording.problems, recording.backward_problems
    assert fwd == bwd and (bwd.causal, bwd.window_left, bwd.window_right) == ("top_left", 5, None)
    assert q.grad is not None and torch.equal(q.grad, torch.zeros_like(q))


def test_a_warm_backward_skips_the_checks_and_replays_the_rung_choice(recording, monkeypatch):
    """attention_backward keeps a plan per signature (runtime.plan_cache): a second call with
    the same tensors' signatures and options runs the recorded rung's backward on the recorded
    problem, without check_inputs or the rung choice; another option or shape is checked."""
    from cute_kernels.attention import api

    q, k, v = qkv()
    out, lse = attention_forward(q, k, v, causal="top_left", kernel="recording")
    dout = torch.randn_like(out)
    api.attention_backward(dout, q, k, v, out, lse, causal="top_left", kernel="recording")
    checked = []
    original = api.check_inputs
    monkeypatch.setattr(api, "check_inputs", lambda *a, **kw: checked.append(1) or original(*a, **kw))
    grads = api.attention_backward(dout, q, k, v, out, lse, causal="top_left", kernel="recording")
    assert checked == [] and len(recording.backward_problems) == 2
    assert recording.backward_problems[0] == recording.backward_problems[1]
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    api.attention_backward(dout, q, k, v, out, lse, causal=None, kernel="recording")  # another option
    api.attention_backward(dout, q, k, v, out, lse, causal="top_left", kernel="recording", deterministic=True)
    assert len(checked) == 2 and len(api._BACKWARD_PLANS) == 3
    with pytest.raises(ValueError, match="dout"):  # the checks still run for a new signature
        api.attention_backward(dout[..., :4, :], q, k, v, out, lse, causal="top_left", kernel="recording")
    # unbatched tensors have their own plan, with 3-D gradients
    for _ in range(2):
        grads = api.attention_backward(dout[0], q[0], k[0], v[0], out[0], lse[0], kernel="recording")
    assert [g.shape for g in grads] == [q[0].shape, k[0].shape, v[0].shape]
