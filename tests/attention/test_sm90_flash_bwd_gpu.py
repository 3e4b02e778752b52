"""sm90_flash backward on the GPU: dQ, dK, dV against float32 autograd on fresh N(0, 1) inputs.

The forward's out and lse come from the float32 reference (so these tests exercise only the
backward). The backward allocates its results, so each test first fills the CUDA caching
allocator's free memory with NaN (`poison_allocator`): an element it fails to write stays NaN."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention.api import check_inputs  # noqa: E402
from cute_kernels.attention.mask import dense_mask  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from cute_kernels.attention import sm90_flash_bwd

    return sm90_flash_bwd


def poison_allocator(numel: int = 1 << 26):
    torch.empty(numel, device="cuda").fill_(math.nan)
    torch.cuda.synchronize()


def reference(q, k, v, dout, causal=None):
    """float32 (out, lse, dq, dk, dv) of softmax(q k^T / sqrt(D) + mask) v; rows with no key give
    out 0, lse -inf and contribute nothing."""
    hq, hk = q.shape[1], k.shape[1]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    kr, vr = (kf, vf) if hq == hk else (kf.repeat_interleave(hq // hk, 1), vf.repeat_interleave(hq // hk, 1))
    s = (qf @ kr.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal is not None:
        keep = dense_mask(q.shape[2], k.shape[2], causal=True, align=causal, device=q.device)
        has = keep.any(-1)
        masked = s.masked_fill(~keep, -math.inf)
        lse = torch.logsumexp(masked.detach(), -1)
        p = torch.softmax(torch.where(has[:, None], masked, torch.zeros_like(s)), -1) * has[:, None]
    else:
        lse = torch.logsumexp(s.detach(), -1)
        p = torch.softmax(s, -1)
    out = p @ vr
    out.backward(dout.float())
    return out.detach(), lse, qf.grad, kf.grad, vf.grad


def rel_err(x, ref, floor=1e-30):
    return ((x.float() - ref).norm() / ref.norm().clamp_min(floor)).item()


CASES = [
    # b, hq, hkv, sq, sk, d, causal, dtype
    (1, 2, 2, 131, 131, 64, None, torch.float16),
    (2, 2, 2, 256, 256, 128, None, torch.bfloat16),
    (2, 4, 2, 257, 200, 128, "bottom_right", torch.bfloat16),
    (1, 2, 2, 300, 300, 128, "top_left", torch.float16),
    (1, 4, 1, 130, 70, 64, "bottom_right", torch.float16),
    (1, 2, 2, 64, 513, 128, "top_left", torch.bfloat16),
    (1, 3, 3, 17, 1, 64, None, torch.bfloat16),
    # head dim 96 (Phi-3's; 32-byte swizzled operands)
    (1, 4, 2, 257, 300, 96, "bottom_right", torch.bfloat16),
    (2, 2, 2, 128, 128, 96, None, torch.float16),
]


def _run(case, deterministic=False, **schedule):
    bwd = _sm90()
    b, hq, hkv, sq, sk, d, causal, dtype = case
    torch.manual_seed(sq * 7 + sk + d)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    dout = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    out, lse, *ref = reference(q, k, v, dout, causal)
    problem = check_inputs(q, k, v, causal=causal, scale=None, enable_gqa=hq != hkv)
    assert bwd.supports_backward(problem) is None
    poison_allocator()
    config = None
    if schedule:
        config = bwd.bwd_config_for(d, str(dtype).removeprefix("torch."), causal is not None, dkv_fp32=hq != hkv,
                                    wide_q=False, dq_writer=False)  # the schedules name the writer
        config = bwd.FlashSm90BwdConfig(**{**config.__dict__, "deterministic": deterministic, **schedule})
    grads = bwd.backward(dout, q, k, v, out.to(dtype), lse, problem, deterministic=deterministic, config=config)
    torch.cuda.synchronize()
    return dout, grads, ref, dtype


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}xd{c[5]}-{c[6]}-{c[7]}")
def test_gradients_match_float32_autograd(case):
    _check(*_run(case))


def _check(dout, grads, ref, dtype):
    """Each gradient shaped, typed and stored as the forward's out ((B, S, H, D): a model's
    transpose(1, 2).reshape is a view), fully written, and within the tolerance of fp32."""
    floor = 1e-3 * dout.float().norm()  # with one key dQ vanishes: its rounding against the gradients' scale
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        assert got.shape == want.shape and got.dtype == dtype, name
        assert got.transpose(1, 2).is_contiguous(), f"{name} strides {got.stride()}"
        assert not got.isnan().any(), f"{name} has unwritten (NaN) elements"
        err = rel_err(got, want, floor)
        assert err < TOL[dtype], f"{name}: relative error {err:.3g}"


SCHEDULES = [dict(dq_tma_reduce=True), dict(early_dv=True), dict(defer_dkv_wait=True), dict(prep_kernel=False),
             dict(dq_tma_reduce=True, early_dv=True, defer_dkv_wait=True, prep_kernel=True),
             dict(stages=3, early_dv=True, defer_dkv_wait=True, prep_kernel=True),
             dict(dq_writer=True), dict(dq_writer=True, early_dv=True, defer_dkv_wait=True),
             dict(unmasked_interior=True), dict(unmasked_interior=True, dq_writer=True, deterministic=True)]
SCHEDULE_CASES = [(1, 4, 2, 200, 333, 128, "bottom_right", torch.bfloat16),
                  (2, 2, 2, 131, 131, 64, None, torch.float16),
                  (1, 2, 2, 300, 300, 128, "top_left", torch.float16),
                  (1, 2, 1, 150, 190, 96, "bottom_right", torch.bfloat16)]


@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=lambda c: f"{c[3]}x{c[4]}xd{c[5]}-{c[6]}")
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "+".join(sorted(k if v is True else f"{k}{v}"
                                                                                 for k, v in s.items())))
def test_every_schedule_option_is_correct(schedule, case):
    dout, grads, ref, dtype = _run(case, **schedule)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        assert not got.isnan().any(), name
        assert rel_err(got, want) < TOL[dtype], name


def test_deterministic_default_config_is_correct():
    dout, grads, ref, dtype = _run((1, 2, 2, 100, 140, 64, "top_left", torch.float16), deterministic=True)
    for got, want in zip(grads, ref):
        assert rel_err(got, want) < TOL[dtype]


def test_nan_in_dout_reaches_only_its_rows_of_dq():
    bwd = _sm90()
    torch.manual_seed(5)
    q, k, v, dout = (torch.randn(1, 2, 150, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse, *_ = reference(q, k, v, dout)
    dout[0, 1, 77, 5] = math.nan
    problem = check_inputs(q, k, v, causal=None, scale=None, enable_gqa=False)
    dq, dk, dv = bwd.backward(dout, q, k, v, out.to(q.dtype), lse, problem)
    torch.cuda.synchronize()
    assert dq[0, 1, 77].isnan().all()
    bad = dq.isnan().any(-1)
    bad[0, 1, 77] = False
    assert not bad.any(), "NaN leaked into other rows of dq"
    assert dk[0, 1].isnan().all() and dv[0, 1].isnan().any()
    assert not (dk[0, 0].isnan().any() or dv[0, 0].isnan().any() or dq[0, 0].isnan().any())


GQA_CASES = [(2, 4, 2, 257, 200, 128, "bottom_right", torch.bfloat16),
             (1, 4, 1, 130, 70, 64, "bottom_right", torch.float16),
             (1, 8, 2, 300, 513, 64, None, torch.float16),
             (2, 6, 2, 64, 64, 128, "top_left", torch.bfloat16)]


@pytest.mark.parametrize("case", GQA_CASES, ids=lambda c: f"{c[1]}/{c[2]}x{c[3]}x{c[4]}xd{c[5]}-{c[6]}")
@pytest.mark.parametrize("schedule", [{}, dict(dq_tma_reduce=True, early_dv=True, defer_dkv_wait=True),
                                      dict(dq_writer=True)],
                         ids=["plain", "tma_early_defer", "dq_writer"])
def test_gqa_loop_sums_the_group_in_the_kernel(case, schedule):
    """`gqa_loop`: a CTA per key/value head walks its query heads; dK, dV come out summed, in
    the inputs' dtype, as the per-query-head path's fp32 sums do."""
    dout, grads, ref, dtype = _run(case, gqa_loop=True, dkv_fp32=False, **schedule)
    _, per_head, _, _ = _run(case, **schedule)
    for name, got, want, other in zip(("dq", "dk", "dv"), grads, ref, per_head):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert not got.isnan().any(), f"{name} has unwritten (NaN) elements"
        assert rel_err(got, want) < TOL[dtype], name
        assert rel_err(got, other.float()) < TOL[dtype] / 3, f"{name} differs from the per-query-head path"


@pytest.mark.parametrize("causal", ["top_left", None])
def test_default_backward_sums_the_group_in_the_kernel_where_the_grid_fills_the_gpu(causal):
    """The default config of a GQA problem whose per-kv-head grid fills the SMs is `gqa_loop`
    (`gqa_loop_fills`); its gradients, through the public path, match fp32 autograd, and a
    problem too small to fill the GPU keeps the per-query-head buffers."""
    bwd = _sm90()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    b, hq, hkv, s, d = 2, 8, 2, -(-sms // 4) * 128, 128  # 2 x 2 x ceil(sms / 4) key blocks >= sms
    case = (b, hq, hkv, s, s, d, causal, torch.bfloat16)
    q = torch.empty(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    problem = check_inputs(q, k, k, causal=causal, scale=None, enable_gqa=True)
    assert bwd.gqa_loop_fills(problem, sms) and bwd._launch_for(problem, None).config.gqa_loop
    small = check_inputs(q[:1, :, :256], k[:1, :, :256], k[:1, :, :256], causal=causal, scale=None, enable_gqa=True)
    assert not bwd._launch_for(small, None).config.gqa_loop and bwd._launch_for(small, None).config.dkv_fp32
    dout, grads, ref, dtype = _run(case)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        assert got.shape == want.shape and not got.isnan().any(), name
        assert rel_err(got, want) < TOL[dtype], name


# Other head dims. Above 128 both consumer warpgroups
# take the same 64 keys and split the head dim; P^T and dS^T go through shared memory (one
# buffer each at 256). Up to 128 the default layout, with 16-byte rows at 80 and 112. Odd
# lengths, both causal alignments, GQA, one key, rows that see no key.
SPLIT_CASES = [
    (1, 4, 2, 197, 197, 80, None, torch.bfloat16),
    (2, 2, 2, 300, 257, 112, "bottom_right", torch.float16),
    (1, 8, 2, 130, 70, 32, "top_left", torch.bfloat16),
    (1, 2, 1, 257, 300, 160, "bottom_right", torch.bfloat16),
    (1, 2, 2, 131, 131, 192, None, torch.bfloat16),
    (2, 4, 2, 257, 200, 192, "bottom_right", torch.float16),
    (1, 2, 2, 300, 300, 256, "top_left", torch.bfloat16),
    (1, 4, 1, 130, 70, 256, "bottom_right", torch.float16),
    (1, 2, 2, 64, 513, 256, "top_left", torch.bfloat16),
    (1, 3, 3, 17, 1, 256, None, torch.bfloat16),
    (2, 2, 2, 200, 333, 128, "bottom_right", torch.bfloat16),  # the split layout where the default one runs
]
SPLIT_SCHEDULES = [{}, dict(defer_dkv_wait=True), dict(ds_buffers=1), dict(stages=1), dict(dq_writer=True)]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: f"{c[1]}/{c[2]}x{c[3]}x{c[4]}xd{c[5]}-{c[6]}-{c[7]}")
@pytest.mark.parametrize("schedule", SPLIT_SCHEDULES, ids=lambda s: "+".join(f"{k}{v}" for k, v in s.items())
                         or "default")
def test_head_split_gradients_match_float32_autograd(case, schedule):

    d = case[5]
    if d < 128 and schedule.get("ds_buffers") == 1:
        pytest.skip("one dS^T buffer is a head_split option")
    if d > 208 and schedule.get("dq_writer"):
        pytest.skip("the dQ writer's tiles fit beside head_split's buffers up to D = 208")
    schedule = {"head_split": True, "block_n": 64, **schedule} if d == 128 else schedule
    _check(*_run(case, **schedule))


@pytest.mark.parametrize("case", [(1, 4, 2, 250, 333, 144, "bottom_right", torch.bfloat16),
                                  (2, 2, 2, 256, 257, 176, None, torch.float16),
                                  (1, 2, 1, 190, 300, 208, "top_left", torch.bfloat16)],
                         ids=lambda c: f"{c[1]}/{c[2]}x{c[3]}x{c[4]}xd{c[5]}-{c[6]}")
def test_default_takes_the_dq_writer_where_it_fits_beside_head_split(case):
    """Above D = 128 the default takes the writer warp wherever its tiles fit beside
    head_split's buffers (up to D = 208; SPLIT_CASES run 160 and 192) and Sq pads little,
    plain and deterministic."""
    b, hq, hkv, sq, sk, d, causal, dtype = case
    problem = check_inputs(*(torch.empty(b, h, s, d, device="cuda", dtype=dtype) for h, s in
                             ((hq, sq), (hkv, sk), (hkv, sk))), causal=causal, scale=None, enable_gqa=hq != hkv)
    assert _sm90()._launch_for(problem, None).config.dq_writer
    _check(*_run(case))
    dout, grads, ref, dtype = _run(case, deterministic=True)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        assert not got.isnan().any() and rel_err(got, want, 1e-3 * dout.float().norm()) < TOL[dtype], name


WRITER_CASES = [c for c in SPLIT_CASES if c[5] < 128] + [(2, 4, 2, 130, 200, 16, None, torch.float16),
                                                         (1, 4, 4, 257, 257, 48, "top_left", torch.bfloat16)]


@pytest.mark.parametrize("case", WRITER_CASES, ids=lambda c: f"{c[1]}/{c[2]}x{c[3]}x{c[4]}xd{c[5]}-{c[6]}")
@pytest.mark.parametrize("block_m", [64, 128], ids=["q64", "q128"])
def test_dq_writer_at_every_whole_head_dim(case, block_m):
    """The dQ writer warp at every head dim without head_split (16-64 with 64 or 128 Q rows,
    80-128 with 64), plain and deterministic."""
    if block_m == 128 and case[5] > 64:
        pytest.skip("128 Q rows take head dims up to 64")
    _check(*_run(case, dq_writer=True, block_m=block_m))
    dout, grads, ref, dtype = _run(case, deterministic=True, dq_writer=True, block_m=block_m)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        assert not got.isnan().any() and rel_err(got, want, 1e-3 * dout.float().norm()) < TOL[dtype], name


@pytest.mark.parametrize("case", [(2, 4, 2, 257, 200, 192, "bottom_right", torch.bfloat16),
                                  (1, 8, 2, 300, 513, 256, None, torch.float16)],
                         ids=lambda c: f"{c[1]}/{c[2]}xd{c[5]}-{c[6]}")
def test_head_split_gqa_loop_matches_the_per_query_head_path(case):

    dout, grads, ref, dtype = _run(case, gqa_loop=True, dkv_fp32=False)
    _, per_head, _, _ = _run(case)
    for name, got, want, other in zip(("dq", "dk", "dv"), grads, ref, per_head):
        assert not got.isnan().any(), f"{name} has unwritten (NaN) elements"
        assert rel_err(got, want) < TOL[dtype], name
        assert rel_err(got, other.float()) < TOL[dtype] / 3, f"{name} differs from the per-query-head path"


def test_head_dim_256_backward_runs_on_sm90():
    """Through the public entry: "auto" hands D = 256 to sm90_flash, within fp32 autograd's
    tolerance."""
    _sm90()
    from cute_kernels.attention.api import _backward_rung, attention_backward, attention_forward

    torch.manual_seed(3)
    q, k, v, dout = (torch.randn(1, 2, 190, 256, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    problem = check_inputs(q, k, v, causal="bottom_right", scale=None, enable_gqa=False)
    assert _backward_rung("auto", q, k, v, problem).name == "sm90_flash"
    out, lse = attention_forward(q, k, v, causal="bottom_right")
    grads = attention_backward(dout, q, k, v, out, lse, causal="bottom_right")
    _, _, *ref = reference(q, k, v, dout, "bottom_right")
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        assert not got.isnan().any() and rel_err(got, want) < TOL[torch.bfloat16], name


# deterministic=True on Hopper: each Q block's dQ
# additions in key-block order under a counter; bitwise the same on every run.
DETERMINISTIC_CASES = [(2, 4, 2, 257, 200, 128, "bottom_right", torch.bfloat16),
                       (1, 2, 2, 300, 1000, 64, None, torch.float16),
                       (2, 8, 2, 513, 513, 64, "top_left", torch.bfloat16)]


@pytest.mark.parametrize("case", DETERMINISTIC_CASES, ids=lambda c: f"{c[1]}/{c[2]}x{c[3]}x{c[4]}xd{c[5]}-{c[6]}")
@pytest.mark.parametrize("schedule", [{}, dict(gqa_loop=True, dkv_fp32=False), dict(defer_dkv_wait=True),
                                      dict(dq_writer=True), dict(dq_writer=True, gqa_loop=True, dkv_fp32=False)],
                         ids=["default", "gqa_loop", "defer", "dq_writer", "dq_writer_gqa_loop"])
def test_deterministic_hopper_backward_repeats_bitwise_and_matches_float32(case, schedule):
    """(With `dq_writer` the writer warp keeps the order and the accumulator is whole tiles.)"""

    if schedule.get("gqa_loop") and case[1] == case[2]:
        pytest.skip("gqa_loop needs GQA")
    runs = [_run(case, deterministic=True, **schedule) for _ in range(3)]
    dout, grads, ref, dtype = runs[0]
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        assert not got.isnan().any(), name
        assert rel_err(got, want, 1e-3 * dout.float().norm()) < TOL[dtype], name
    for _, again, _, _ in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), grads, again):
            assert torch.equal(a, b), f"{name} differs between runs"


def test_deterministic_algorithms_reach_the_hopper_kernel_through_the_public_entry():
    """torch.use_deterministic_algorithms(True) through `attention_backward` ("auto"):
    sm90_flash's deterministic kernel (not sm80's) computes it, repeatably."""
    _sm90()
    from cute_kernels.attention import sm90_flash_bwd
    from cute_kernels.attention.api import attention_backward, attention_forward

    torch.manual_seed(9)
    q, k, v, dout = (torch.randn(2, 4, 333, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    seen = []
    real = sm90_flash_bwd._launch_for

    def spy(problem, config, deterministic=False):
        launch = real(problem, config, deterministic)
        seen.append(launch.config.deterministic)
        return launch

    previous = torch.are_deterministic_algorithms_enabled()
    try:
        sm90_flash_bwd._launch_for = spy
        torch.use_deterministic_algorithms(True, warn_only=True)
        out, lse = attention_forward(q, k, v, causal="top_left")
        first = attention_backward(dout, q, k, v, out, lse, causal="top_left")
        second = attention_backward(dout, q, k, v, out, lse, causal="top_left")
    finally:
        sm90_flash_bwd._launch_for = real
        torch.use_deterministic_algorithms(previous)
    assert seen and all(seen)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# 128 Q rows a step at head dims up to 64 (`block_m=128`, the default there):
# odd lengths past one and two blocks, both causal alignments, rows with no key, GQA (fp32
# buffers and the loop), one key, the deterministic order and the deferred wait.
WIDE_Q_CASES = [(1, 2, 2, 131, 131, 64, None, torch.float16),
                (2, 4, 2, 257, 200, 64, "bottom_right", torch.bfloat16),
                (1, 4, 1, 130, 70, 64, "top_left", torch.float16),
                (1, 2, 2, 64, 513, 32, "top_left", torch.bfloat16),
                (1, 3, 3, 17, 1, 64, None, torch.bfloat16),
                (2, 8, 2, 300, 300, 48, "bottom_right", torch.bfloat16)]


@pytest.mark.parametrize("case", WIDE_Q_CASES, ids=lambda c: f"{c[1]}/{c[2]}x{c[3]}x{c[4]}xd{c[5]}-{c[6]}")
@pytest.mark.parametrize("schedule", [{}, dict(gqa_loop=True, dkv_fp32=False), dict(defer_dkv_wait=True),
                                      dict(dq_writer=True), dict(dq_writer=True, gqa_loop=True, dkv_fp32=False)],
                         ids=["default", "gqa_loop", "defer", "dq_writer", "dq_writer_gqa_loop"])
def test_wide_q_gradients_match_float32_autograd(case, schedule):

    if schedule.get("gqa_loop") and case[1] == case[2]:
        pytest.skip("gqa_loop needs GQA")
    _check(*_run(case, block_m=128, **schedule))


def test_wide_q_deterministic_repeats_bitwise_and_is_the_default_up_to_d64():
    bwd = _sm90()

    case = (2, 8, 2, 513, 513, 64, "top_left", torch.bfloat16)
    runs = [_run(case, deterministic=True, block_m=128) for _ in range(2)]
    problem = check_inputs(*(torch.empty(2, 8, 513, 64, device="cuda", dtype=torch.bfloat16)
                             for _ in range(3)), causal="top_left", scale=None, enable_gqa=False)
    assert bwd._launch_for(problem, None).config.block_m == 128
    dout, grads, ref, dtype = runs[0]
    for name, got, want, again in zip(("dq", "dk", "dv"), grads, ref, runs[1][1]):
        assert rel_err(got, want, 1e-3 * dout.float().norm()) < TOL[dtype], name
        assert torch.equal(got, again), f"{name} differs between runs"
