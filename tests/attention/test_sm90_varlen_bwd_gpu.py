"""sm90_flash's packed (varlen) backward on an H100/H200,
against the float32 references per sequence of `test_sm80_window_gpu` (every case there:
empty and one-row sequences, Sq != Sk per sequence, both causal alignments, windows, GQA and
D = 256, which takes the head-split kernel), NaN-poisoned memory; "auto" takes the Hopper
backward; soft cap against sm80's. (A NaN in one sequence staying in
it: `test_sm80_window_gpu.test_varlen_backward_nan_stays_in_its_sequence`, both rungs.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention.api import AttentionProblem  # noqa: E402

from .test_sm80_flash_bwd_gpu import poison_allocator  # noqa: E402
from .test_sm80_window_gpu import (VARLEN_CASES, _cu, check_empty_sequences, check_grads,  # noqa: E402
                                   varlen_reference)

pytestmark = pytest.mark.gpu


def _rungs():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm90_flash needs a Hopper (sm_90) GPU")
    from cute_kernels.attention.registry import KERNELS

    return KERNELS["sm80_flash"], KERNELS["sm90_flash"]


def _problem(lengths_q, lengths_k, hq, hkv, d, causal, window, dtype, softcap=None):
    return AttentionProblem(len(lengths_q), hq, hkv, max(lengths_q), max(lengths_k), d, d, dtype, causal,
                            1.0 / math.sqrt(d), window[0], window[1], softcap=softcap)


@pytest.mark.parametrize("lengths_q, lengths_k, hq, hkv, d, causal, window, dtype", VARLEN_CASES,
                         ids=[f"case{i}" for i in range(len(VARLEN_CASES))])
def test_varlen_backward_per_sequence(lengths_q, lengths_k, hq, hkv, d, causal, window, dtype):
    sm80, sm90 = _rungs()
    torch.manual_seed(sum(lengths_q) + d)
    cu_q, cu_k = _cu(lengths_q), _cu(lengths_k)
    problem = _problem(lengths_q, lengths_k, hq, hkv, d, causal, window, dtype)
    q = torch.randn(sum(lengths_q), hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(sum(lengths_k), hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    out = torch.empty_like(q)
    lse = torch.empty((hq, q.shape[0]), device="cuda", dtype=torch.float32)
    sm80.varlen(q, k, v, cu_q, cu_k, max(lengths_q), out, lse, problem)
    dout = torch.randn_like(out)
    poison_allocator()
    assert sm90.supports_varlen_backward(problem) is None
    grads = sm90.varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(lengths_q), max(lengths_k), problem)
    torch.cuda.synchronize()
    _, _, ref_grads = varlen_reference(q, k, v, dout, lengths_q, lengths_k, causal, window)
    for g, t in zip(grads, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype and g.is_contiguous()
    check_grads(grads, ref_grads, dout, dtype)
    check_empty_sequences(grads, lengths_q, lengths_k)


@pytest.mark.parametrize("case", range(len(VARLEN_CASES)), ids=[f"case{i}" for i in range(len(VARLEN_CASES))])
@pytest.mark.parametrize("options", [dict(unmasked_interior=True), dict(dq_writer=True),
                                     dict(dq_writer=True, unmasked_interior=True)],
                         ids=["unmasked_interior", "dq_writer", "both"])
def test_packed_options_match_the_per_sequence_reference(monkeypatch, case, options):
    """The options on the packed launch: `unmasked_interior` (tiles whose rows and keys all exist
    inside the mask skip it) and `dq_writer` (dQ through the writer warp into every sequence's
    own whole Q blocks, `sm90_flash_bwd.varlen_tile_rows`, gathered back per token)."""
    from dataclasses import replace

    from cute_kernels.attention import sm90_flash_bwd

    if options.get("dq_writer") and VARLEN_CASES[case][4] > 208:
        pytest.skip("the dQ writer's tiles fit beside head_split's buffers up to D = 208")
    real = sm90_flash_bwd._varlen_config
    monkeypatch.setattr(sm90_flash_bwd, "_VARLEN_CONFIGS", {})
    monkeypatch.setattr(sm90_flash_bwd, "_varlen_config", lambda p: replace(real(p), **options))
    test_varlen_backward_per_sequence(*VARLEN_CASES[case])


def test_softcap_matches_the_sm80_varlen_backward():
    sm80, sm90 = _rungs()
    lengths_q, lengths_k = (33, 1, 150), (60, 7, 150)
    torch.manual_seed(11)
    problem = _problem(lengths_q, lengths_k, 4, 2, 128, "bottom_right", (None, None), torch.bfloat16, softcap=20.0)
    cu_q, cu_k = _cu(lengths_q), _cu(lengths_k)
    q = torch.randn(sum(lengths_q), 4, 128, device="cuda", dtype=torch.bfloat16) * 3
    k, v = (torch.randn(sum(lengths_k), 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty_like(q)
    lse = torch.empty(4, q.shape[0], device="cuda")
    sm80.varlen(q, k, v, cu_q, cu_k, 150, out, lse, problem)
    dout = torch.randn_like(out)
    want = sm80.varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, 150, 150, problem)
    got = sm90.varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, 150, 150, problem)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        err = ((g.float() - w.float()).norm() / w.float().norm()).item()
        assert not g.isnan().any() and err < 1e-2, f"{name}: {err:.3g}"


def test_auto_takes_the_hopper_varlen_backward_but_not_for_seqused_k():
    from dataclasses import replace

    from cute_kernels.attention.varlen import _varlen_backward_rung

    _rungs()
    problem = AttentionProblem(2, 4, 2, 90, 90, 128, 128, torch.bfloat16, "bottom_right", 0.1)
    views = [torch.empty(1, h, 180, 128, device="cuda", dtype=torch.bfloat16) for h in (4, 2, 2)]
    assert _varlen_backward_rung("auto", views, problem, "test").name == "sm90_flash"
    assert _varlen_backward_rung("auto", views, replace(problem, seqused_k=True), "test").name == "sm80_flash"


@pytest.mark.parametrize("case", [0, 1, 2], ids=["case0", "case1", "case2"])
def test_warm_calls_replay_the_stored_plan(case):
    """The unverified path `varlen_backward_plan`: `attention_varlen_backward` calls after the
    first replay the plan stored under their signature, on fresh values each call, against the
    per-sequence reference."""
    from cute_kernels.attention import varlen
    from cute_kernels.runtime import unverified

    _rungs()
    lengths_q, lengths_k, hq, hkv, d, causal, _, dtype = VARLEN_CASES[case]
    cu_q, cu_k = _cu(lengths_q), _cu(lengths_k)
    max_q, max_k = max(lengths_q), max(lengths_k)
    with unverified.allowing("varlen_backward_plan"):
        for seed in range(3):
            torch.manual_seed(seed)
            q = torch.randn(sum(lengths_q), hq, d, device="cuda", dtype=dtype)
            k, v = (torch.randn(sum(lengths_k), hkv, d, device="cuda", dtype=dtype) for _ in range(2))
            out, lse = varlen.attention_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                                       kernel="sm90_flash")
            dout = torch.randn_like(out)
            poison_allocator()
            grads = varlen.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal=causal,
                                                     kernel="sm90_flash", deterministic=False)
            torch.cuda.synchronize()
            _, _, ref_grads = varlen_reference(q, k, v, dout, lengths_q, lengths_k, causal, (None, None))
            check_grads(grads, ref_grads, dout, dtype)
            check_empty_sequences(grads, lengths_q, lengths_k)
        assert len(varlen._BACKWARD_PLANS) >= 1
