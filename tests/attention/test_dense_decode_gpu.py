"""Decode from the dense entry on the GPU: `scaled_dot_product_attention` / `attention_forward`
with 1 to 8 queries over a long cache route to the `decode` rung (`dense_decode`; checked
through `dispatch.explain`), and out and lse match a float64 reference on fresh N(0, 1) inputs
with NaN-poisoned results: GQA/MQA, both causal alignments, Sk not a multiple of the page,
caches that are views (a (B, S, H, D) cache transposed, a static cache's prefix), soft cap and
sinks; gradients still flow (the backward runs on a flash rung)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("needs an sm_80+ GPU")


def reference(q, k, v, causal, softcap=None, sinks=None):
    from cute_kernels.ops.attention_reference import masked_attention

    out, lse = masked_attention(q.double(), k.double(), v.double(), None, 0.0, causal, None, True, None, softcap,
                                None if sinks is None else sinks.double())
    return out, lse


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _cache(layout, b, hkv, sk, d, dtype):
    """(k, v) (B, Hkv, Sk, D) in the given memory layout."""
    if layout == "bhsd":
        return (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    if layout == "bshd":  # (B, S, H, D) storage, used transposed
        return (torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(2))
    # a static cache of 8192 + 37 slots, its first sk used
    return (torch.randn(b, hkv, 8192 + 37, d, device="cuda", dtype=dtype)[:, :, :sk] for _ in range(2))


# b, hq, hkv, sq, sk, d, causal, layout, softcap, sinks, dtype
CASES = [
    (4, 32, 8, 1, 8192, 128, None, "bhsd", None, False, torch.bfloat16),
    (3, 8, 8, 1, 4097, 64, None, "bshd", None, False, torch.float16),
    (2, 16, 2, 4, 1000, 128, "bottom_right", "static", None, False, torch.bfloat16),
    (1, 8, 1, 8, 513, 128, "bottom_right", "bhsd", 30.0, True, torch.bfloat16),
    (2, 12, 4, 3, 2049, 256, "top_left", "bshd", None, True, torch.bfloat16),
    (64, 32, 8, 1, 777, 128, None, "static", 50.0, True, torch.float16),
    (2, 4, 4, 2, 3000, 96, None, "bhsd", None, False, torch.bfloat16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}xd{c[5]}-{c[6]}-{c[7]}"
                                                      f"-cap{c[8]}{'-sinks' if c[9] else ''}")
def test_few_queries_route_to_decode_and_match_float64(case):
    from cute_kernels.attention import KERNELS, attention_forward, dispatch
    from cute_kernels.attention.api import check_inputs

    b, hq, hkv, sq, sk, d, causal, layout, softcap, with_sinks, dtype = case
    torch.manual_seed(sk + sq + d)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    k, v = _cache(layout, b, hkv, sk, d, dtype)
    sinks = torch.randn(hq, device="cuda") * 2 if with_sinks else None
    problem = check_inputs(q, k, v, causal=causal, scale=None, enable_gqa=hq != hkv, softcap=softcap, sinks=sinks)
    assert dispatch.resolve("auto", q, k, v, problem) is KERNELS["decode"]
    assert "decode: chosen (" in dispatch.explain(q, k, v, problem)
    out = torch.full_like(q, math.nan)
    lse = torch.full((b, hq, sq), math.nan, device="cuda")
    attention_forward(q, k, v, causal=causal, enable_gqa=hq != hkv, out=out, lse=lse, softcap=softcap, sinks=sinks)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(q, k, v, causal, softcap, sinks)
    assert not out.isnan().any() and not lse.isnan().any()
    assert rel_err(out, ref_out) < TOL[dtype]
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty) and (out[empty] == 0).all()
    torch.testing.assert_close(lse[~empty].double(), ref_lse[~empty].double(), atol=2e-3, rtol=1e-3)


def test_sdpa_entry_routes_and_differentiates():
    """The public SDPA entry (what the transformers backend calls): the forward on the decode
    rung, the backward on a flash rung from the decode forward's lse."""
    from cute_kernels.attention import scaled_dot_product_attention
    from cute_kernels.ops.attention_reference import masked_attention

    torch.manual_seed(1)
    q = torch.randn(2, 16, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 4, 2000, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = scaled_dot_product_attention(q, k, v, enable_gqa=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = masked_attention(*leaves, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref, leaves, g.double())
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    for a, r in zip(grads, ref_grads):
        assert rel_err(a, r) < 3e-2
    with torch.no_grad():
        again = scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(again, out.detach())


def test_more_queries_or_short_caches_stay_on_the_flash_rungs():
    from cute_kernels.attention import KERNELS, dispatch
    from cute_kernels.attention.api import check_inputs

    q = torch.randn(1, 8, 9, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 8192, 128, device="cuda", dtype=torch.bfloat16)
    p = check_inputs(q, k, k, causal=None, scale=None, enable_gqa=False)
    assert dispatch.resolve("auto", q, k, k, p) is not KERNELS["decode"]
    assert "decode: 9 queries per head" in dispatch.explain(q, k, k, p)
    q1 = q[:, :, :1]
    p = check_inputs(q1, k[:, :, :100], k[:, :, :100], causal=None, scale=None, enable_gqa=False)
    assert dispatch.resolve("auto", q1, k[:, :, :100], k[:, :, :100], p) is not KERNELS["decode"]


@pytest.mark.parametrize("sq,causal", [(1, False), (4, True)])
def test_a_decode_loop_replays_one_family_plan_and_matches_float64(sq, causal):
    """A decode loop as transformers runs it (`nn.functional.scaled_dot_product_attention`
    under no_grad, a contiguous cache grown by torch.cat each step): every step after the
    first replays the eager entry's family plan (`ops.eager_attention`), and each step's out
    matches float64 on the same tensors, the family's first step and a fresh non-family call."""
    from cute_kernels.nn import functional as cf
    from cute_kernels.ops import eager_attention
    from cute_kernels.runtime import tvm_ffi_available

    torch.manual_seed(7 + sq)
    b, hq, hkv, d = 3, 16, 4, 128
    k, v = (torch.randn(b, hkv, 530, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    entry = eager_attention.sdpa
    entry.family_plans.clear()
    ops_before = entry.plans.copy()
    with torch.no_grad():
        for step in range(6):
            q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            if sq > 1:
                q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
            out = cf.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            ref, _ = reference(q, k, v, "top_left" if causal else None)
            assert not out.isnan().any() and rel_err(out, ref) < TOL[torch.bfloat16]
            grow = (torch.randn(b, hkv, 5, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            k, v = (torch.cat([t, n], dim=2) for t, n in zip((k, v), grow))
    if tvm_ffi_available():
        assert len(entry.family_plans) == 1
        assert isinstance(next(iter(entry.family_plans.values())), eager_attention.SdpaPlan)
        assert len(entry.plans) == len(ops_before)  # no per-key plan was made for the steps
