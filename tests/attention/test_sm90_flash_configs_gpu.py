"""sm90_flash configurations other than `config_for`'s choices, on an H100/H200: the producer's
older load order (K and V of a block together), the longest-first grid without causality,
three slots of K/V, two or three consumer warpgroups (128- or 192-row tiles, a two- or
three-way ping-pong ring), the O rescale options (a threshold: conditional; early: under the
next S GEMM) and exponentials from a polynomial on the FMA units, each against the float32
reference on fresh N(0, 1) inputs with NaN-poisoned outputs; the rescale options also on scores
whose row max keeps growing along the keys, so that rows do move past a threshold."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from ._dense_reference import TOL, randn, reference, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _hopper_only():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm90_flash needs a Hopper (sm_90) GPU")


OPTIONS = {
    "kv_pairs": {"k_lead": False},
    "lpt": {"lpt": True},
    "three_stages": {"stages": 3},
    "three_consumers": {"consumer_warpgroups": 3, "producer_regs": 32, "consumer_regs": 160, "block_n": 80},
    "two_consumers": {"consumer_warpgroups": 2, "producer_regs": 24, "consumer_regs": 240, "block_n": 128},
    "lazy_rescale": {"rescale_threshold": 8.0},
    "early_rescale": {"rescale_early": True},
    "exp2_poly": {"exp2_poly": 2},
}
CASES = [
    # b, hq, hkv, sq, sk, d, causal
    (2, 3, 3, 300, 300, 64, None),
    (1, 4, 2, 517, 517, 64, "top_left"),           # GQA, a partial last tile
    (2, 4, 1, 200, 450, 64, "bottom_right"),       # MQA, Sq < Sk
    (1, 2, 2, 450, 130, 64, "bottom_right"),       # rows that see no key
]


def _run(config, q, k, v, causal):
    import cutlass

    from cute_kernels.attention.sm90_flash import FlashAttentionSm90
    from cute_kernels.runtime import compile_kernel, current_stream, from_torch

    b, hq, sq, d = q.shape
    out = torch.full_like(q, math.nan)
    lse = torch.full((b, hq, sq), math.nan, device="cuda", dtype=torch.float32)
    tensors = [from_torch(t, assumed_align=16, leading_dim=3) for t in (q, k, v, out)]
    tensors.append(from_torch(lse, assumed_align=4, leading_dim=2))
    offset = k.shape[2] - sq if causal == "bottom_right" else 0
    args = (*tensors, cutlass.Float32(1.0 / math.sqrt(d)), cutlass.Int32(offset), cutlass.Int32(0),
            cutlass.Int32(hq // k.shape[1]))
    stream = current_stream()
    tail = (cutlass.Float32(1.0), None)  # score scale (no soft cap) and sinks (none), as the rung passes
    compiled = compile_kernel(FlashAttentionSm90(config), *args, stream, *tail, key=("attention.sm90_flash", config))
    compiled(*args, stream, *tail)
    torch.cuda.synchronize()
    return out, lse


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("b, hq, hkv, sq, sk, d, causal", CASES)
def test_option_matches_float32_reference(option, b, hq, hkv, sq, sk, d, causal):
    from cute_kernels.attention.sm90_layouts import config_for

    dtype = torch.bfloat16
    config = replace(config_for(d, "bfloat16", causal is not None), **OPTIONS[option]).validate()
    torch.manual_seed(sq + 3 * sk + hq)
    q, k, v = randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype), randn(b, hkv, sk, d, dtype=dtype)
    out, lse = _run(config, q, k, v, causal)
    ref_out, ref_lse = reference(q, k, v, causal)
    assert not out.isnan().any() and not lse.isnan().any(), "an output element was not written"
    assert rel_err(out, ref_out) < TOL[dtype]
    masked_rows = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), masked_rows)
    assert (out[masked_rows] == 0).all()
    torch.testing.assert_close(lse[~masked_rows], ref_lse[~masked_rows], atol=2e-3, rtol=1e-3)


RESCALES = {
    "lazy8": {"rescale_threshold": 8.0},
    "lazy1": {"rescale_threshold": 1.0},
    "early": {"rescale_early": True},
    "early_lazy8": {"rescale_early": True, "rescale_threshold": 8.0},
    "poly_lazy8": {"exp2_poly": 3, "rescale_threshold": 8.0},
}


@pytest.mark.parametrize("rescale", list(RESCALES))
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [None, "top_left"])
def test_rescale_options_when_the_max_keeps_growing(rescale, d, causal):
    """Keys scaled up along the sequence (x1 .. x6): later blocks keep raising the row max (well
    past a threshold), so O is rescaled mid-sequence: by the kept max that moved (lazy), and by
    the previous block's factors under the next S GEMM (early)."""
    from cute_kernels.attention.sm90_layouts import config_for

    dtype = torch.bfloat16
    config = replace(config_for(d, "bfloat16", causal is not None), **RESCALES[rescale]).validate()
    torch.manual_seed(d + len(rescale))
    b, h, s = 1, 2, 1500
    q, v = randn(b, h, s, d, dtype=dtype), randn(b, h, s, d, dtype=dtype)
    ramp = torch.linspace(1.0, 6.0, s, device="cuda")[None, None, :, None]
    k = (randn(b, h, s, d, dtype=dtype).float() * ramp).to(dtype)
    out, lse = _run(config, q, k, v, causal)
    ref_out, ref_lse = reference(q, k, v, causal)
    assert not out.isnan().any() and not lse.isnan().any(), "an output element was not written"
    assert rel_err(out, ref_out) < TOL[dtype]
    torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("poly", [1, 3])
def test_polynomial_exp2_keeps_nan_inf_and_masked_rows(poly):
    """exp2_poly's exponentials: -inf scores give exactly 0 (rows that see no key stay 0 / -inf),
    NaN and inf inputs poison exactly the rows they reach, as the reference."""
    from cute_kernels.attention.sm90_layouts import config_for

    torch.manual_seed(5 + poly)
    config = replace(config_for(64, "bfloat16", True), exp2_poly=poly).validate()
    q, k, v = randn(1, 2, 700, 64, dtype=torch.bfloat16), randn(1, 2, 300, 64, dtype=torch.bfloat16), \
        randn(1, 2, 300, 64, dtype=torch.bfloat16)
    q[0, 0, 500, 3] = math.nan
    q[0, 0, 520, 1] = math.inf
    k[0, 1, 140, 0] = math.nan
    out, lse = _run(config, q, k, v, "bottom_right")  # rows below 400 see no key
    ref, ref_lse = reference(q, k, v, "bottom_right")
    assert torch.equal(out.isnan().any(-1), ref.isnan().any(-1))
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)) and (out[:, :, :400] == 0).all()
    finite = ~ref.isnan().any(-1)
    assert rel_err(out[finite], ref[finite]) < TOL[torch.bfloat16]
