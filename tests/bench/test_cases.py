"""cases: names, FLOP/byte counts, parsing, inputs, references and rel_err."""

from __future__ import annotations

import math

import pytest
import torch

from cute_kernels.bench.cases import AttentionCase, CopyCase, GemmCase, rel_err


def test_gemm_counts_and_name():
    c = GemmCase(8192, 28672, 8192, "bf16")
    assert c.name == "8192x28672x8192"
    assert c.flops == 2 * 8192 * 28672 * 8192
    assert c.bytes == 2 * (8192 * 8192 + 28672 * 8192) + 2 * 8192 * 28672
    fp8 = GemmCase(4096, 4096, 4096, "fp8_e4m3")
    assert fp8.result_dtype == "bf16" and fp8.bytes == 2 * 4096 * 4096 + 2 * 4096 * 4096


def test_attention_counts_and_name():
    c = AttentionCase(4, 32, 2048, 128, True)
    assert c.name == "B4_H32_S2048_D128_causal"
    assert c.flops == 4 * 4 * 32 * 2048**2 * 128 / 2
    assert AttentionCase(4, 32, 2048, 128, False).flops == 2 * c.flops
    assert c.bytes == 4 * 4 * 32 * 2048 * 128 * 2


def test_copy_counts_and_name():
    c = CopyCase((256 << 20) // 2, "bf16")
    assert c.name == "256MiB" and c.bytes == 2 * (256 << 20) and c.flops == 0


@pytest.mark.parametrize("case", [GemmCase(64, 32, 16, "fp32"), AttentionCase(2, 3, 17, 8, True),
                                  AttentionCase(2, 8, 17, 8, True, "bf16", 2), CopyCase(1000)])
def test_parse_round_trips(case):
    assert type(case).parse(case.name, case.dtype) == case


@pytest.mark.parametrize("kind, text", [(GemmCase, "4096x4096"), (GemmCase, "0x1x1"), (AttentionCase, "B4_H32_S2048"),
                                        (AttentionCase, "B4_H32_KV5_S64_D8"), (CopyCase, "12KB")])
def test_parse_rejects_with_the_expected_form(kind, text):
    with pytest.raises(ValueError):
        kind.parse(text)


def test_inputs_are_standard_normal_and_seeded():
    c = GemmCase(256, 128, 512, "fp32")
    x = c.make_inputs("cpu", seed=3)
    y = c.make_inputs("cpu", seed=3)
    assert torch.equal(x["a"], y["a"]) and x["a"].shape == (256, 512) and x["b"].shape == (128, 512)
    a = x["a"]
    assert abs(float(a.mean())) < 0.02 and abs(float(a.std()) - 1) < 0.02


def test_rel_err_values():
    ref = torch.randn(64, 64)
    assert rel_err(ref.clone(), ref) == 0.0
    noisy = ref * (1 + 1e-3)
    assert rel_err(noisy, ref) == pytest.approx(1e-3, rel=1e-3)
    bad = ref.clone()
    bad[3, 5] = float("nan")
    assert math.isnan(rel_err(bad, ref))
    bad[3, 5] = float("inf")
    assert math.isnan(rel_err(bad, ref))
    with pytest.raises(ValueError, match="shape"):
        rel_err(ref[:2], ref)


def test_gemm_reference_is_a_times_b_transposed():
    c = GemmCase(40, 24, 56, "bf16")
    x = c.make_inputs("cpu")
    expect = x["a"].double() @ x["b"].double().T
    assert rel_err(c.reference(x), expect) < 1e-6


@pytest.mark.parametrize("causal", [False, True])
def test_attention_reference_matches_sdpa_in_float64(causal):
    c = AttentionCase(2, 3, 33, 16, causal)
    x = c.make_inputs("cpu")
    expect = torch.nn.functional.scaled_dot_product_attention(
        *(x[n].double() for n in ("q", "k", "v")), is_causal=causal)
    assert rel_err(c.reference(x), expect) < 1e-6


def test_attention_bwd_case_reference_matches_autograd_in_float64():
    import torch
    import torch.nn.functional as F

    from cute_kernels.bench.cases import AttentionBwdCase

    for causal in (False, True):
        case = AttentionBwdCase.parse("B2_H3_S37_D16" + ("_causal" if causal else ""))
        assert case.family == "attention_bwd" and case.flops == 2.5 * 4 * 2 * 3 * 37 * 37 * 16 / (2 if causal else 1)
        inputs = case.make_inputs("cpu", seed=3)
        assert set(inputs) == {"q", "k", "v", "dout"} and inputs["dout"].std() > 0.5
        q, k, v = (inputs[n].double().requires_grad_() for n in ("q", "k", "v"))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        want = torch.cat([g.flatten() for g in torch.autograd.grad(out, (q, k, v), inputs["dout"].double())])
        got = case.reference(inputs)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_gemm_layouts_and_fp8_scales_are_in_the_inputs():
    import torch

    c = GemmCase.parse("24x40x56_am_bn")
    t = c.make_inputs("cpu")
    assert c.layout == "am_bn" and t["a"].shape == (24, 56) and t["a"].stride(0) == 1
    assert t["b"].shape == (40, 56) and t["b"].stride(0) == 1
    assert GemmCase.parse("24x40x56_bn").make_inputs("cpu")["b"].stride(0) == 1
    f = GemmCase.parse("24x40x64_rowwise", "fp8_e4m3")
    t = f.make_inputs("cpu")
    assert t["scale_a"].shape == (24, 1) and t["scale_b"].shape == (1, 40) and bool((t["scale_a"] >= 0.5).all())
    ref = f.reference(t)
    manual = (t["a"].double() * t["scale_a"].double()) @ (t["b"].double().T * t["scale_b"].double())
    assert torch.allclose(ref.double(), manual, rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="row-wise scales are for fp8"):
        GemmCase.parse("24x40x56_rowwise")


def test_bias_cases_carry_a_bias_into_the_reference_and_the_peers():
    # "_bias": the forward of a layer with a bias, as nn.Linear runs it (gemm_shapes' biased layers)
    import torch

    from cute_kernels.bench.impls import Unsupported, _prepare_cublas, _prepare_triton_ampere
    from cute_kernels.bench.model_shapes import gemm_shape_cases, uses

    c = GemmCase.parse("24x40x64_bias")
    assert c.name == "24x40x64_bias" and c.bytes == 2 * (24 * 64 + 40 * 64 + 40) + 2 * 24 * 40
    t = c.make_inputs("cpu")
    assert t["bias"].shape == (40,) and t["bias"].dtype == torch.bfloat16
    ref = c.reference(t)
    manual = t["a"].double() @ t["b"].double().T + t["bias"].double()
    assert torch.allclose(ref.double(), manual, rtol=1e-4, atol=1e-3)
    prepared = _prepare_cublas(c, t)
    prepared.fn()
    assert ((prepared.out.double() - manual).norm() / manual.norm()).item() < 1e-2
    with pytest.raises(Unsupported, match="no epilogue"):
        _prepare_triton_ampere(c, t)
    with pytest.raises(ValueError, match="bias cases are 16-bit"):
        GemmCase.parse("24x40x64_bias", "fp32")
    # ViT-B's layers all add a bias; Llama's none: the suite times what each model runs
    names = {case.name for case in gemm_shape_cases("bf16")}
    assert "12608x2304x768_bias" in names and "12608x2304x768" not in names
    assert "8192x2048x2048" in names and "8192x2048x2048_bias" not in names
    assert any("vit_b16.qkv fwd" in u for u in uses(GemmCase.parse("12608x2304x768_bias")))


def test_grouped_heads_name_count_and_match_expanded_references_in_float64():
    """GQA cases: k and v of Hkv heads, each shared by H / Hkv query heads; the references equal
    SDPA's on k and v expanded to H heads (forward) and, for the backward, dk and dv are the
    sums over each group."""
    import torch.nn.functional as F

    from cute_kernels.bench.cases import AttentionBwdCase

    c = AttentionCase(4, 32, 4096, 128, True, "bf16", 8)
    assert c.name == "B4_H32_KV8_S4096_D128_causal" and c.gqa and c.kv_heads == 8
    assert c.bytes == 2 * 4 * (32 + 8) * 4096 * 128 * 2 and c.flops == AttentionCase(4, 32, 4096, 128, True).flops
    assert not AttentionCase(1, 4, 8, 8, False, "bf16", 4).gqa and AttentionCase(1, 4, 8, 8).name == "B1_H4_S8_D8"
    for causal in (False, True):
        case = AttentionBwdCase.parse("B2_H6_KV2_S37_D16" + ("_causal" if causal else ""))
        inputs = case.make_inputs("cpu", seed=5)
        assert inputs["k"].shape == (2, 2, 37, 16) and inputs["q"].shape == inputs["dout"].shape == (2, 6, 37, 16)
        q, k, v = (inputs[n].double().requires_grad_() for n in ("q", "k", "v"))
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=causal)
        want = torch.cat([g.flatten() for g in torch.autograd.grad(out, (q, k, v), inputs["dout"].double())])
        got = case.reference(inputs)
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-5
        fwd = AttentionCase.parse(case.name)
        assert ((fwd.reference(inputs).double() - out.detach()).norm() / out.norm()).item() < 1e-5


def test_sdpa_peers_fold_the_expanded_gradients_of_grouped_cases():
    from cute_kernels.bench.cases import AttentionBwdCase
    from cute_kernels.bench.impls import _expanded, _grouped_grads

    case = AttentionBwdCase.parse("B1_H4_KV2_S5_D8")
    k = torch.randn(1, 2, 5, 8)
    wide = _expanded(case, k)
    assert wide.shape == (1, 4, 5, 8) and torch.equal(wide[:, 1], k[:, 0]) and torch.equal(wide[:, 2], k[:, 1])
    dq, dk, dv = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8)
    flat = _grouped_grads(case)((dq, dk, dv))
    assert flat.numel() == 4 * 40 + 2 * 2 * 40
    assert torch.allclose(flat[160:200], (dk[0, 0] + dk[0, 1]).flatten())



def test_varlen_case_names_counts_and_reference_in_float64():
    import torch.nn.functional as F

    from cute_kernels.bench.cases import VarlenCase

    c = VarlenCase((3, 17, 5, 5), 4, 2, 16, True)
    assert c.name == "L3-17-5x2_Hq4_Hkv2_D16_causal" and VarlenCase.parse(c.name) == c
    assert VarlenCase.parse("L197x32_Hq12_Hkv12_D64").lengths == (197,) * 32
    assert c.flops == sum(4 * 4 * 16 * s * s for s in c.lengths) / 2
    assert c.bytes == 2 * 30 * 16 * 2 * (4 + 2)
    for text in ("L3-17_Hq4_Hkv3_D16", "L0-4_Hq4_Hkv2_D16", "L3x_Hq4_Hkv2_D16"):
        with pytest.raises(ValueError):
            VarlenCase.parse(text)
    inputs = c.make_inputs("cpu", seed=2)
    assert inputs["cu_seqlens"].tolist() == [0, 3, 20, 25, 30] and inputs["max_seqlen"] == 17
    got = c.reference(inputs)
    start, want = 0, []
    for s in c.lengths:
        q, k, v = (inputs[n][start:start + s].double().transpose(0, 1) for n in ("q", "k", "v"))
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 0), v.repeat_interleave(2, 0), is_causal=True)
        want.append(o.transpose(0, 1))
        start += s
    want = torch.cat(want)
    assert got.shape == want.shape and ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_varlen_bwd_case_names_flops_and_reference_gradients_in_float64():
    import torch.nn.functional as F

    from cute_kernels.bench.cases import VarlenBwdCase, VarlenCase

    c = VarlenBwdCase((3, 17, 5), 4, 2, 16, True)
    assert c.name == "L3-17-5_Hq4_Hkv2_D16_causal" and VarlenBwdCase.parse(c.name) == c
    assert c.family == "attention_varlen_bwd" and c.flops == 2.5 * VarlenCase((3, 17, 5), 4, 2, 16, True).flops
    assert c.bytes == 2 * 25 * 16 * (4 * 4 + 4 * 2)
    inputs = c.make_inputs("cpu", seed=3)
    assert inputs["dout"].shape == inputs["q"].shape and c.empty_out(inputs) is None
    got = c.reference(inputs)
    start, want = 0, [[], [], []]
    for s in c.lengths:
        q, k, v = (inputs[n][start:start + s].double().transpose(0, 1).requires_grad_() for n in ("q", "k", "v"))
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 0), v.repeat_interleave(2, 0), is_causal=True)
        grads = torch.autograd.grad(o, (q, k, v), inputs["dout"][start:start + s].double().transpose(0, 1))
        for acc, g in zip(want, grads):
            acc.append(g.transpose(0, 1))
        start += s
    want = torch.cat([torch.cat(w).flatten() for w in want])
    assert got.shape == want.shape and ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_varlen_bwd_suite_lists_the_varlen_batches_and_its_impls():
    from cute_kernels.bench.suites import SUITES

    fwd, bwd = SUITES["attention_varlen"], SUITES["attention_varlen_bwd"]
    assert [c.name for c in bwd.cases] == [c.name for c in fwd.cases]
    assert all(c.family == "attention_varlen_bwd" for c in bwd.cases)
    assert bwd.parse_cases("L3-5_Hq4_Hkv2_D64_causal")[0].lengths == (3, 5)
    assert "fa4" in bwd.impls()
