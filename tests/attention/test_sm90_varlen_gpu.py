"""sm90_flash's packed (varlen) forward on an H100/H200, against a float64 reference per
sequence, NaN-poisoned outputs: ragged batches with empty and one-row sequences, the issue's
lengths (1, 17, 1000, 4096), Sq != Sk per sequence, both causal alignments, sliding windows,
GQA, seqused_k (a padded batch read in place), soft cap and sinks; "auto" picks it; a NaN in
one sequence's keys or values stays in that sequence (the ragged tensor maps clip every load at
its sequence's end, so no row of a neighbour is read)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}


@pytest.fixture(autouse=True)
def _hopper_only():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm90_flash needs a Hopper (sm_90) GPU")


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def run(lens_q, lens_k, hq, hkv, d, dtype, *, causal=None, window=None, softcap=None, with_sinks=False, used=None,
        kernel="sm90_flash", nan_at=None):
    from cute_kernels.attention import attention_varlen_forward

    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q = torch.randn(int(cu_q[-1]), hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(int(cu_k[-1]), hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    if nan_at is not None:
        v[nan_at] = math.nan
    sinks = torch.randn(hq, device="cuda") * 2 if with_sinks else None
    seqused = None if used is None else torch.tensor(used, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, math.nan)
    lse = torch.full((hq, q.shape[0]), math.nan, device="cuda")
    attention_varlen_forward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, window_size=window,
                             kernel=kernel, out=out, lse=lse, softcap=softcap, sinks=sinks, seqused_k=seqused)
    torch.cuda.synchronize()
    return q, k, v, cu_q, cu_k, out, lse, sinks


def check(q, k, v, cu_q, cu_k, out, lse, sinks, *, causal, window, softcap, used=None, skip=()):
    from cute_kernels.ops.attention_reference import masked_attention

    dtype = q.dtype
    for b in range(len(cu_q) - 1):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        n_k = int(cu_k[b + 1] - cu_k[b]) if used is None else used[b]
        keys = slice(int(cu_k[b]), int(cu_k[b]) + n_k)
        if rows.start == rows.stop or b in skip:
            continue
        qs, ks, vs = (t.transpose(0, 1)[None].double() for t in (q[rows], k[keys], v[keys]))
        ref, ref_lse = masked_attention(qs, ks, vs, None, 0.0, causal, None, True, window, softcap,
                                        None if sinks is None else sinks.double())
        got, got_lse = out[rows].transpose(0, 1)[None], lse[:, rows][None]
        assert not got.isnan().any() and not got_lse.isnan().any(), f"sequence {b}: unwritten or leaked NaN"
        if ref.numel():
            err = ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            assert err < TOL[dtype], f"sequence {b}: relative error {err:.3g}"
        empty = torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(got_lse), empty) and (got[empty] == 0).all()
        torch.testing.assert_close(got_lse[~empty].double(), ref_lse[~empty].double(), atol=2e-3, rtol=1e-3)


CASES = [
    # lens_q, lens_k, hq, hkv, d, dtype, causal, window, softcap, sinks
    ([1, 17, 1000, 4096], [1, 17, 1000, 4096], 16, 16, 128, torch.bfloat16, "bottom_right", None, None, False),
    ([0, 5, 300, 0, 129], [7, 0, 513, 64, 129], 8, 2, 64, torch.float16, None, None, None, False),
    ([200, 1, 64], [100, 300, 64], 4, 1, 128, torch.bfloat16, "top_left", None, 30.0, True),
    ([700, 333], [1200, 333], 8, 4, 256, torch.bfloat16, "bottom_right", (128, 0), None, True),
    ([257, 1000], [257, 999], 4, 4, 96, torch.float16, None, (64, 32), 10.0, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0])}seq-d{c[4]}-{c[6]}-w{c[7]}-cap{c[8]}")
def test_matches_float64_per_sequence(case):
    lens_q, lens_k, hq, hkv, d, dtype, causal, window, softcap, with_sinks = case
    torch.manual_seed(sum(lens_q) + d)
    res = run(lens_q, lens_k, hq, hkv, d, dtype, causal=causal, window=window, softcap=softcap,
              with_sinks=with_sinks)
    check(*res, causal=causal, window=window, softcap=softcap)


def test_seqused_k_reads_a_padded_batch_in_place():
    torch.manual_seed(7)
    used = [300, 0, 17, 1000]
    res = run([300, 5, 17, 700], [512, 64, 64, 1024], 8, 2, 128, torch.bfloat16, causal="bottom_right",
              softcap=30.0, with_sinks=True, used=used)
    check(*res, causal="bottom_right", window=None, softcap=30.0, used=used)


def test_nan_in_one_sequence_stays_there():
    """v rows of sequence 1 are NaN: sequence 1's out is NaN, its neighbours' (whose last blocks
    would read past their ends into sequence 1's rows without the ragged tensor maps) are not."""
    torch.manual_seed(3)
    lens = [100, 50, 77]
    q, k, v, cu_q, cu_k, out, lse, sinks = run(lens, lens, 4, 4, 64, torch.bfloat16, nan_at=slice(100, 150))
    assert out[100:150].isnan().all()
    check(q, k, v, cu_q, cu_k, out, lse, sinks, causal=None, window=None, softcap=None, skip=(1,))


def test_auto_picks_sm90_for_varlen():
    from cute_kernels.attention import KERNELS, dispatch
    from cute_kernels.attention.varlen import check_varlen_inputs

    q = torch.randn(30, 4, 128, device="cuda", dtype=torch.bfloat16)
    cu = _cu([10, 20])
    p = check_varlen_inputs(q, q, q, cu, cu, 20, 20, causal=None, scale=None)
    with_varlen = {n: KERNELS[n] for n in KERNELS if hasattr(KERNELS[n], "varlen")}
    views = [t.permute(1, 0, 2).unsqueeze(0) for t in (q, q, q)]
    assert dispatch.resolve("auto", *views, p, registry=with_varlen) is KERNELS["sm90_flash"]
