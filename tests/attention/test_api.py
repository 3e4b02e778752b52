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
    registry = {"low": low, "high": high, "decode": FakeRung("decode")}
    assert dispatch.choose(q, k, v, problem, registry=registry) is low
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
    problem (D = 96), the backward runs on sm80_flash; a named rung never falls back."""
    from cute_kernels.attention import api, sm80_flash, sm90_flash

    dispatch.clear_cache()
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)
    q = torch.randn(1, 2, 64, 96, dtype=torch.bfloat16)
    problem = check_inputs(q, q, q, causal=None, scale=None, enable_gqa=False)
    assert dispatch.choose(q, q, q, problem) is sm90_flash.RUNG
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
