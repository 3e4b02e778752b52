"""`cute_kernels::sdpa_masked` on CPU (fallback="torch"): padded and packed batches against
PyTorch's SDPA given the equivalent dense mask, in float64, forward and backward; the plan cache;
bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cute_kernels import ops
from cute_kernels.ops import attention_masked as am

pytestmark = pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")
F64 = torch.float64


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _qkv(b, hq, hk, sq, sk, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=F64).requires_grad_()  # noqa: E731
    return make(b, hq, sq, d), make(b, hk, sk, d), make(b, hk, sk, d)


def _dense_keep(key_mask, sq, sk, causal, left):
    """(B, 1, Sq, Sk) keep-mask of the module docstring's semantics, and the real query rows."""
    b, used = key_mask.shape
    real_k = torch.zeros(b, sk, dtype=torch.bool)
    real_k[:, :used] = key_mask
    if not causal:
        return real_k[:, None, None, :].expand(b, 1, sq, sk), torch.ones(b, sq, dtype=torch.bool)
    # A query's position among the real keys: queries are the last sq real tokens of each row.
    pos_k = real_k.cumsum(-1) - 1
    q_rows = key_mask if sq == used else (torch.ones(b, 1, dtype=torch.bool) if sq == 1 else key_mask[:, -sq:])
    n_real = real_k.sum(-1, keepdim=True)
    pos_q = (q_rows.cumsum(-1) - 1) + (n_real - q_rows.sum(-1, keepdim=True))
    keep = real_k[:, None, :] & (pos_k[:, None, :] <= pos_q[:, :, None])
    if left >= 0:
        keep &= pos_k[:, None, :] >= pos_q[:, :, None] - left
    return keep[:, None], q_rows


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("left", [-1, 2])
def test_padded_batch_matches_dense_sdpa(causal, heads, left):
    if left >= 0 and not causal:
        pytest.skip("windows come with causality here")
    b, s = 3, 9
    q, k, v = _qkv(b, *heads, s, s)
    key_mask = torch.ones(b, s, dtype=torch.bool)
    key_mask[0, 6:] = False  # right padding
    key_mask[1, :3] = False  # left padding
    keep, rows = _dense_keep(key_mask, s, s, causal, left)
    out, _ = ops.sdpa_masked(q, k, v, key_mask, None, "bottom_right" if causal else None, None, left, -1,
                             fallback="torch")
    kr, vr = (t.repeat_interleave(heads[0] // heads[1], 1) for t in (k, v))
    want = F.scaled_dot_product_attention(q, kr, vr, attn_mask=keep).transpose(1, 2)
    assert _rel(out[rows], want[rows]) < 1e-12
    assert torch.all(out[~rows] == 0) if causal else True
    seed = torch.randn_like(out).masked_fill(~rows[..., None, None], 0)
    got = torch.autograd.grad(out, (q, k, v), seed)
    ref = torch.autograd.grad(want, (q, k, v), seed)
    for g, r in zip(got, ref):
        assert _rel(g, r) < 1e-12


def test_decode_and_continued_prefill_align_bottom_right():
    b, sk = 2, 10
    key_mask = torch.ones(b, sk, dtype=torch.bool)
    key_mask[1, :4] = False
    for sq in (1, 3):
        q, k, v = _qkv(b, 2, 2, sq, sk, seed=sq)
        keep, rows = _dense_keep(key_mask, sq, sk, True, -1)
        out, _ = ops.sdpa_masked(q, k, v, key_mask, None, "bottom_right", fallback="torch")
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2)
        assert _rel(out[rows], want[rows]) < 1e-12


def test_static_cache_prefix_and_no_padding_take_the_dense_operator():
    q, k, v = _qkv(2, 2, 2, 4, 12)
    key_mask = torch.ones(2, 7, dtype=torch.bool)  # the cache's valid prefix: 7 of 12 slots
    ops.FALLBACK_COUNTS.clear()
    out, _ = ops.sdpa_masked(q, k, v, key_mask, None, "bottom_right", fallback="torch")
    want = F.scaled_dot_product_attention(q, k[:, :, :7], v[:, :, :7],
                                          attn_mask=torch.ones(4, 7, dtype=torch.bool).tril(3)).transpose(1, 2)
    assert _rel(out, want) < 1e-12
    assert {op for op, _ in ops.FALLBACK_COUNTS} == {"sdpa"}


def test_packed_segments_match_per_sequence_attention():
    b, s = 2, 8
    q, k, v = _qkv(b, 2, 1, s, s)
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 0, 0, 0, 1, 1, 1]], dtype=torch.int32)
    out, _ = ops.sdpa_masked(q, k, v, None, segments, "bottom_right", fallback="torch")
    same = segments[:, :, None] == segments[:, None, :]
    keep = (same & torch.ones(s, s, dtype=torch.bool).tril())[:, None]
    want = F.scaled_dot_product_attention(q, k.expand(b, 2, s, 8), v.expand(b, 2, s, 8), attn_mask=keep)
    assert _rel(out, want.transpose(1, 2)) < 1e-12
    seed = torch.randn_like(out)
    for g, r in zip(torch.autograd.grad(out, (q, k, v), seed),
                    torch.autograd.grad(want.transpose(1, 2), (q, k, v), seed)):
        assert _rel(g, r) < 1e-12


def test_softcap_and_sinks_on_a_padded_batch_with_their_gradients():
    b, s, hq = 2, 7, 4
    q, k, v = _qkv(b, hq, 2, s, s, seed=3)
    sinks = torch.randn(hq, dtype=F64).requires_grad_()
    key_mask = torch.ones(b, s, dtype=torch.bool)
    key_mask[1, :2] = False
    keep, rows = _dense_keep(key_mask, s, s, True, -1)
    out, _ = ops.sdpa_masked(q, k, v, key_mask, None, "bottom_right", None, softcap=5.0, sinks=sinks,
                             fallback="torch")
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = 5.0 * torch.tanh((q @ kr.transpose(-1, -2)) / 8 ** 0.5 / 5.0)
    scores = torch.cat([scores.masked_fill(~keep, float("-inf")), sinks.view(1, hq, 1, 1).expand(b, hq, s, 1)], -1)
    want = (torch.softmax(scores, -1)[..., :-1] @ vr).transpose(1, 2)
    assert _rel(out[rows], want[rows]) < 1e-12
    seed = torch.randn_like(out).masked_fill(~rows[..., None, None], 0)
    got = torch.autograd.grad(out, (q, k, v, sinks), seed)
    ref = torch.autograd.grad(want, (q, k, v, sinks), seed)
    for g, r, tol in zip(got, ref, (1e-11, 1e-11, 1e-11, 1e-6)):  # dsinks reads the fp32 lse the ops return
        assert _rel(g, r) < tol


def test_the_plan_is_computed_once_per_mask():
    key_mask = torch.ones(2, 6, dtype=torch.bool)
    key_mask[0, 2:] = False
    key_mask[1, :1] = False
    first = am.plan_for(key_mask, None, 6, 6, "bottom_right")
    assert am.plan_for(key_mask, None, 6, 6, "bottom_right") is first and not first.dense
    key_mask[1, :1] = True  # changed in place (now right padding only): the version counter says so
    second = am.plan_for(key_mask, None, 6, 6, "bottom_right")
    assert second.dense and torch.equal(second.real_q, key_mask)
    key_mask[0, 2:] = True
    third = am.plan_for(key_mask, None, 6, 6, "bottom_right")
    assert third.dense and third.real_q is None


@pytest.mark.parametrize("left", [-1, 2])
@pytest.mark.parametrize("features", [False, True])
def test_a_right_padded_causal_batch_runs_the_dense_operator(left, features):
    """Right padding only, Sq == Sk: the dense kernel on the whole batch (no unpadding), padded
    query rows zeroed; values and gradients as the unpadded definition, whatever gradient the
    padded rows' outputs are handed."""
    b, s, hq = 3, 9, 4
    q, k, v = _qkv(b, hq, 2, s, s, seed=7)
    key_mask = torch.ones(b, s, dtype=torch.bool)
    key_mask[0, 5:] = False
    key_mask[2, 8:] = False
    sinks = torch.randn(hq, dtype=F64).requires_grad_() if features else None
    kw = dict(softcap=5.0, sinks=sinks) if features else {}
    ops.FALLBACK_COUNTS.clear()
    out, lse = ops.sdpa_masked(q, k, v, key_mask, None, "bottom_right", None, left, -1, fallback="torch", **kw)
    assert {op for op, _ in ops.FALLBACK_COUNTS} == {"sdpa"}  # the dense operator alone, no varlen
    keep, rows = _dense_keep(key_mask, s, s, True, left)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ kr.transpose(-1, -2)) / 8 ** 0.5
    if features:
        scores = 5.0 * torch.tanh(scores / 5.0)
    scores = scores.masked_fill(~keep, float("-inf"))
    if features:
        scores = torch.cat([scores, sinks.view(1, hq, 1, 1).expand(b, hq, s, 1)], -1)
    want = (torch.softmax(scores, -1)[..., :s] @ vr).transpose(1, 2)
    assert _rel(out[rows], want[rows]) < 1e-12
    assert torch.all(out[~rows] == 0) and torch.all(torch.isneginf(lse.view(hq, b, s)[:, ~rows]))
    assert torch.isfinite(lse.view(hq, b, s)[:, rows]).all()
    wrt = (q, k, v) + ((sinks,) if features else ())
    seed = torch.randn_like(out)  # the padded rows' share of it must reach nothing
    got = torch.autograd.grad(out, wrt, seed)
    ref = torch.autograd.grad(want, wrt, seed.masked_fill(~rows[..., None, None], 0))
    for g, r in zip(got, ref):
        assert torch.isfinite(g).all() and _rel(g, r) < (1e-6 if g.dim() == 1 else 1e-11)


def test_bad_input_is_refused():
    q, k, v = _qkv(1, 2, 2, 4, 4)
    with pytest.raises(ValueError, match="not both"):
        ops.sdpa_masked(q, k, v, torch.ones(1, 4, dtype=torch.bool), torch.zeros(1, 4, dtype=torch.int32),
                        fallback="torch")
    with pytest.raises(TypeError, match="must be bool"):
        ops.sdpa_masked(q, k, v, torch.ones(1, 4, dtype=torch.int64), None, fallback="torch")
    with pytest.raises(ValueError, match="covers 6 keys"):
        ops.sdpa_masked(q, k, v, torch.ones(1, 6, dtype=torch.bool), None, fallback="torch")
    with pytest.raises(ValueError, match="causal must be one of"):
        ops.sdpa_masked(q, k, v, None, None, "diagonal", fallback="torch")


@pytest.mark.parametrize("name", ["sdpa_masked", "sdpa_masked_backward", "sdpa_varlen", "sdpa_varlen_backward"])
def test_ops_that_read_the_device_on_the_host_stay_out_of_cuda_graphs(name):
    """The masked and varlen ops read offsets (or a mask's plan) on the host, which a CUDA graph
    capture cannot do: they carry torch's cudagraph_unsafe tag, so Inductor keeps them out of its
    CUDA graphs instead of failing mid-capture. The dense op, which reads nothing, does not."""
    if not hasattr(torch.Tag, "cudagraph_unsafe"):
        pytest.skip("this torch has no cudagraph_unsafe tag")
    op = getattr(torch.ops.cute_kernels, name).default
    assert torch.Tag.cudagraph_unsafe in op.tags
    assert torch.Tag.cudagraph_unsafe not in torch.ops.cute_kernels.sdpa.default.tags
    inductor_utils = pytest.importorskip("torch._inductor.utils")
    if not hasattr(inductor_utils, "get_first_incompatible_cudagraph_node"):
        pytest.skip("this torch's Inductor has no cudagraph compatibility check")
    graph = torch.fx.Graph()
    node = graph.call_function(op, tuple(graph.placeholder(f"a{i}") for i in range(3)))
    graph.output(node)
    assert inductor_utils.get_first_incompatible_cudagraph_node(torch.fx.GraphModule({}, graph)) is node
