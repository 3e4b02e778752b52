"""sm90_flash with sliding windows on an H100/H200: against the float32 reference
(`_dense_reference.reference(..., window=(left, right))`) on fresh N(0, 1) inputs with
NaN-poisoned outputs, over one- and two-sided windows, causal with a left bound (both
alignments), Sq != Sk, odd lengths, GQA/MQA, D = 64/128/256, rows that see no key, other
kernel configurations, and NaN propagation limited to the rows whose window holds the NaN."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from ._dense_reference import check_forward, randn, reference  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _hopper_only():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm90_flash needs a Hopper (sm_90) GPU")


def _problem(q, k, causal, left, right):
    from cute_kernels.attention.api import AttentionProblem

    b, hq, sq, d = q.shape
    return AttentionProblem(b, hq, k.shape[1], sq, k.shape[2], d, d, q.dtype, causal, 1.0 / math.sqrt(d),
                            window_left=left, window_right=right)


def _run(q, k, v, causal, left, right):
    """out, lse from the rung itself (its supports() must accept the problem first)."""
    from cute_kernels.attention.sm90_flash import RUNG

    problem = _problem(q, k, causal, left, right)
    assert RUNG.supports(q, k, v, problem) is None
    b, hq, sq, d = q.shape
    out = torch.full_like(q, math.nan)
    lse = torch.full((b, hq, sq), math.nan, device="cuda", dtype=torch.float32)
    RUNG(q, k, v, out, lse, problem)
    torch.cuda.synchronize()
    return out, lse


CASES = [
    # b, hq, hkv, sq, sk, d, causal, left, right, dtype
    (1, 2, 2, 1000, 1000, 128, None, 100, 50, torch.bfloat16),         # both bounds
    (2, 4, 2, 777, 1025, 64, None, 256, None, torch.float16),          # left only, GQA, Sq < Sk
    (1, 2, 2, 1000, 300, 128, None, 20, None, torch.bfloat16),         # left only, Sq > Sk
    (1, 2, 2, 1000, 700, 128, None, None, 30, torch.bfloat16),         # right only: the first rows see no key
    (1, 2, 2, 600, 600, 64, "top_left", 127, None, torch.bfloat16),    # causal + left
    (1, 2, 2, 300, 1000, 64, "top_left", 10, 0, torch.float16),       # causal + a narrow left bound, Sq < Sk
    (1, 4, 1, 333, 1111, 256, "bottom_right", 200, None, torch.bfloat16),  # MQA, D = 256
    (1, 2, 2, 1000, 600, 256, "bottom_right", 75, None, torch.bfloat16),   # Sq > Sk: empty rows and a window
    (1, 2, 2, 129, 129, 256, None, 0, 0, torch.bfloat16),              # the diagonal alone
    (1, 2, 2, 1000, 100, 64, None, 5, 5, torch.float16),               # most rows (and Q blocks) see no key
    (2, 2, 2, 17, 17, 128, None, 3, 1, torch.bfloat16),                # one partial tile
    (1, 2, 2, 2048, 2048, 128, None, 512, 0, torch.bfloat16),          # many blocks skipped on both sides
]


@pytest.mark.parametrize("b, hq, hkv, sq, sk, d, causal, left, right, dtype", CASES)
def test_window_matches_float32_reference(b, hq, hkv, sq, sk, d, causal, left, right, dtype):
    torch.manual_seed(sq + 5 * sk + d + (left or 0))
    q, k, v = randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype)
    out, lse = _run(q, k, v, causal, left, right)
    ref_out, ref_lse = reference(q, k, v, causal, window=(left, right))
    check_forward(out, lse, ref_out, ref_lse, dtype)


OPTIONS = {
    "three_consumers": {"consumer_warpgroups": 3, "producer_regs": 32, "consumer_regs": 160, "block_n": 128},
    "lazy_rescale": {"rescale_threshold": 8.0},
    "early_rescale": {"rescale_early": True},
    "exp2_poly": {"exp2_poly": 1},
    "two_consumers": {"consumer_warpgroups": 2, "producer_regs": 24, "consumer_regs": 240},
    "no_pingpong_kv_pairs": {"pingpong": False, "k_lead": False},
    "lpt_three_stages": {"lpt": True, "stages": 3},
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("causal, left, right", [(None, 200, 100), ("bottom_right", 150, None)])
def test_window_under_other_configs(option, causal, left, right):
    import cutlass

    from cute_kernels.attention.sm90_flash import FlashAttentionSm90
    from cute_kernels.attention.sm90_layouts import config_for
    from cute_kernels.attention.problem_checks import launch_scalars, mask_flags, window_scalars
    from cute_kernels.runtime import compile_kernel, current_stream, from_torch

    dtype = torch.bfloat16
    torch.manual_seed(11)
    b, hq, hkv, sq, sk, d = 2, 4, 2, 700, 900, 64
    q, k, v = randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype)
    problem = _problem(q, k, causal, left, right)
    upper, local = mask_flags(problem)
    config = replace(config_for(d, "bfloat16", upper, local), **OPTIONS[option]).validate()
    scale, offset, group = launch_scalars(problem)
    offset_lo, _ = window_scalars(problem)
    out = torch.full_like(q, math.nan)
    lse = torch.full((b, hq, sq), math.nan, device="cuda", dtype=torch.float32)
    tensors = [from_torch(t, assumed_align=16, leading_dim=3) for t in (q, k, v, out)]
    tensors.append(from_torch(lse, assumed_align=4, leading_dim=2))
    args = (*tensors, cutlass.Float32(scale), cutlass.Int32(offset), cutlass.Int32(offset_lo), cutlass.Int32(group))
    stream = current_stream()
    tail = (cutlass.Float32(1.0), None)  # score scale (no soft cap) and sinks (none), as the rung passes
    compile_kernel(FlashAttentionSm90(config), *args, stream, *tail, key=("attention.sm90_flash", config))(
        *args, stream, *tail)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(q, k, v, causal, window=(left, right))
    check_forward(out, lse, ref_out, ref_lse, dtype)


def test_nan_stays_inside_the_windows_that_hold_it():
    """A NaN key poisons exactly the rows whose window contains it (as the dense reference)."""
    torch.manual_seed(4)
    q, k, v = (randn(1, 2, 1000, 128, dtype=torch.bfloat16) for _ in range(3))
    k[0, 0, 500, 7] = math.nan
    out, _ = _run(q, k, v, "top_left", 100, None)
    ref, _ = reference(q, k, v, "top_left", window=(100, None))
    assert torch.equal(out.isnan().any(-1), ref.isnan().any(-1))
    assert out[0, 0, 500:601].isnan().all() and not out[0, 0, :500].isnan().any()
    assert not out[0, 0, 601:].isnan().any() and not out[0, 1].isnan().any()


def test_window_shares_the_compiled_kernel_across_lengths_and_bounds():
    """offset_lo and the upper offset are runtime values: new windows and lengths reuse the kernel."""
    from cute_kernels.runtime import cache

    # one short and one long Q sequence: D = 64 has a tile for each (`sm90_layouts.short_rows`)
    for s in (200, 1100):
        q, k, v = (randn(1, 2, s, 64, dtype=torch.bfloat16) for _ in range(3))
        _run(q, k, v, None, 10, 10)
    compiled = cache.stats["compiled"]
    for s, left, right in ((300, 50, 7), (1025, 300, 0), (64, 1, 200)):
        q2, k2, v2 = (randn(1, 2, s, 64, dtype=torch.bfloat16) for _ in range(3))
        out, lse = _run(q2, k2, v2, None, left, right)
        ref_out, ref_lse = reference(q2, k2, v2, None, window=(left, right))
        check_forward(out, lse, ref_out, ref_lse, torch.bfloat16)
    assert cache.stats["compiled"] == compiled
