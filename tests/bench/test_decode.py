"""The `decode` suite: paged-decode cases (names, inputs, reference, counts), its impls and CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from cute_kernels.bench.cases import DecodeCase, paged_decode_reference, rel_err
from cute_kernels.bench.ceilings import pct_ceiling
from cute_kernels.bench.impls import Unsupported, decode_impls
from cute_kernels.bench.suites import SUITES, select_impls
from cute_kernels.cli import main

TINY = DecodeCase(3, 4, 2, 16, 48, 8)


def test_name_and_parse_round_trip():
    c = DecodeCase(64, 32, 8, 128, 8192, 16)
    assert c.name == "B64_Hq32_Hkv8_D128_ctx8192_page16"
    assert DecodeCase.parse(c.name) == c
    assert DecodeCase.parse("B2_Hq4_Hkv2_D16_ctx64_page16", "fp16") == DecodeCase(2, 4, 2, 16, 64, 16, "fp16")
    assert (c.pages_per_seq, c.num_pages) == (512, 64 * 512)


@pytest.mark.parametrize("text, message", [
    ("B64_H32_S8192_D128", "must look like"),
    ("B64_Hq32_Hkv8_D128_ctx8192", "must look like"),
    ("B64_Hq30_Hkv8_D128_ctx8192_page16", "multiple of key/value heads"),
    ("B64_Hq32_Hkv8_D128_ctx8200_page16", "whole number of pages"),
    ("B0_Hq32_Hkv8_D128_ctx8192_page16", "positive"),
])
def test_parse_rejects_bad_names(text, message):
    with pytest.raises(ValueError, match=message):
        DecodeCase.parse(text)


def test_rejects_non_16_bit_dtype():
    with pytest.raises(ValueError, match="bf16 or fp16"):
        DecodeCase.parse("B2_Hq4_Hkv2_D16_ctx64_page16", "fp32")


def test_flops_and_bytes():
    c = DecodeCase(64, 32, 8, 128, 8192, 256)
    assert c.flops == 4 * 64 * 32 * 8192 * 128
    kv = 2 * 64 * 8192 * 8 * 128 * 2  # K and V, bf16
    q_and_out = 2 * 64 * 32 * 128 * 2
    assert c.bytes == kv + q_and_out
    # memory-bound: % of ceiling is the share of the measured HBM bandwidth, even with a math ceiling
    ms = 1.0
    gbps = c.bytes / ms / 1e6
    assert pct_ceiling({"hbm_gbps": 4000.0, "bf16": 800.0}, "bf16", c.flops, c.bytes, ms) == pytest.approx(
        100 * gbps / 4000.0)


def test_inputs_shapes_and_shuffled_block_table():
    inputs = TINY.make_inputs("cpu", seed=3)
    assert inputs["q"].shape == (3, 4, 16) and inputs["q"].dtype == torch.bfloat16
    for name in ("k_cache", "v_cache"):
        assert inputs[name].shape == (TINY.num_pages, 8, 2, 16) and inputs[name].dtype == torch.bfloat16
    table = inputs["block_table"]
    assert table.shape == (3, 6) and table.dtype == torch.int32 and table.is_contiguous()
    assert sorted(table.flatten().tolist()) == list(range(TINY.num_pages))  # a permutation of the pages
    assert table.flatten().tolist() != list(range(TINY.num_pages))  # shuffled, not in address order
    assert inputs["seqlens_k"].dtype == torch.int32 and inputs["seqlens_k"].tolist() == [48, 48, 48]
    k = inputs["k_cache"].float()
    assert abs(float(k.mean())) < 0.1 and 0.9 < float(k.std()) < 1.1  # N(0, 1), not zeros or integers
    again = TINY.make_inputs("cpu", seed=3)
    assert all(torch.equal(inputs[n], again[n]) for n in inputs)
    assert not torch.equal(TINY.make_inputs("cpu", seed=4)["block_table"], table)


def _dense(q, k_cache, v_cache, block_table, seqlens_k):
    """One (sequence, head) at a time in float64, keys walked one by one through the table."""
    b, hq, d = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(b, hq, v_cache.shape[-1], dtype=torch.float64)
    for s in range(b):
        n = int(seqlens_k[s])
        if n == 0:
            continue
        rows = [(int(block_table[s, t // page]), t % page) for t in range(n)]
        for h in range(hq):
            kv = h // (hq // hkv)
            keys = torch.stack([k_cache[p, o, kv] for p, o in rows]).double()
            vals = torch.stack([v_cache[p, o, kv] for p, o in rows]).double()
            w = torch.softmax(keys @ q[s, h].double() / math.sqrt(d), dim=0)
            out[s, h] = w @ vals
    return out


def test_reference_matches_a_dense_computation():
    inputs = TINY.make_inputs("cpu", seed=0)
    ref = TINY.reference(inputs)
    assert ref.dtype == torch.float32 and ref.shape == (3, 4, 16)
    assert rel_err(ref, _dense(**inputs)) < 1e-6


def test_reference_chunks_and_ragged_lengths():
    inputs = TINY.make_inputs("cpu", seed=1)
    inputs["seqlens_k"] = torch.tensor([48, 13, 0], dtype=torch.int32)
    dense = _dense(**inputs)
    for chunk in (1, 1 << 28):  # one sequence per chunk, and all at once
        ref = paged_decode_reference(**inputs, chunk_bytes=chunk)
        assert rel_err(ref, dense) < 1e-6
    assert torch.equal(ref[2], torch.zeros(4, 16))  # a sequence without keys gives 0
    assert ref[1].abs().sum() > 0


def test_reference_propagates_nan():
    inputs = TINY.make_inputs("cpu", seed=2)
    page = int(inputs["block_table"][1, 0])
    inputs["k_cache"][page, 0, 0, 0] = float("nan")  # a key of sequence 1, kv head 0 (query heads 0, 1)
    ref = TINY.reference(inputs)
    assert torch.isnan(ref[1, :2]).all()
    assert torch.isfinite(ref[0]).all() and torch.isfinite(ref[1, 2:]).all() and torch.isfinite(ref[2]).all()
    inputs["k_cache"][page, 0, 0, 0] = float("inf")
    assert torch.isnan(TINY.reference(inputs)[1, :2]).any()


def test_suite_registration():
    suite = SUITES["decode"]
    assert suite.family == "decode"
    assert [c.name for c in suite.cases] == [f"B64_Hq{hq}_Hkv8_D128_ctx8192_page{p}"
                                             for hq in (8, 32, 64) for p in (16, 256)]
    # K + V of one case: 2 GiB of bf16; inputs stay a few GB
    assert all(c.bytes < 2.1 * 2**30 and c.dtype == "bf16" for c in suite.cases)
    impls = suite.impls()
    assert [(n, i.kind) for n, i in impls.items()] == [("decode", "ours"), ("fa4_paged", "peer"),
                                                       ("sdpa_gathered", "peer")]
    assert list(select_impls(impls, None, suite.default)) == ["decode", "fa4_paged", "sdpa_gathered"]
    assert suite.parse_cases("B2_Hq4_Hkv2_D16_ctx64_page16")[0] == DecodeCase(2, 4, 2, 16, 64, 16)


def test_sdpa_gathered_matches_reference_and_needs_equal_lengths():
    inputs = TINY.make_inputs("cpu", seed=5)
    prepared = decode_impls()["sdpa_gathered"].prepare(TINY, inputs)
    out = prepared.result(prepared.fn())
    assert out.shape == (3, 4, 16) and rel_err(out, TINY.reference(inputs)) < TINY.tolerance
    inputs["seqlens_k"] = torch.tensor([48, 40, 48], dtype=torch.int32)
    with pytest.raises(Unsupported, match="same length"):
        decode_impls()["sdpa_gathered"].prepare(TINY, inputs)


def test_list_shows_cases_and_impls(capsys):
    assert main(["bench", "decode", "--list"]) == 0
    out = capsys.readouterr().out
    assert "decode: bf16 paged decode" in out
    assert "B64_Hq32_Hkv8_D128_ctx8192_page16:bf16" in out and "B64_Hq64_Hkv8_D128_ctx8192_page256:bf16" in out
    for name in ("decode", "fa4_paged", "sdpa_gathered"):
        assert f"  {name} " in out


def test_cpu_run_writes_result_and_plot(tmp_path, capsys):
    argv = ["bench", "decode", "--device", "cpu", "--impl", "decode,sdpa_gathered", "--rounds", "1",
            "--cases", "B2_Hq4_Hkv2_D16_ctx64_page16", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    (json_path,) = tmp_path.glob("*-decode-cpu.json")
    assert json_path.name[:4].isdigit() and json_path.with_suffix(".png").stat().st_size > 1000
    data = json.loads(json_path.read_text())
    assert data["suite"] == "decode"
    (rec,) = data["records"]
    assert rec["impl"] == "sdpa_gathered" and rec["ok"] and rec["rel_err"] < 1e-2 and rec["gbps"] > 0
    assert rec["bytes"] == DecodeCase(2, 4, 2, 16, 64, 16).bytes
    # ours runs on CUDA only: declined with its own reason, not failed
    assert any(s["impl"] == "decode" and "CUDA" in s["reason"] for s in data["skipped"])


def test_plot_bars_are_bandwidth_against_hbm():
    from cute_kernels.bench.plot import _figure
    from cute_kernels.bench.records import BenchResult, Record

    c = DecodeCase(2, 4, 2, 16, 64, 16)
    rec = Record(case=c.name, impl="decode", dtype="bf16", tflops=c.flops / 0.01 / 1e9, ms=0.01, rel_err=1e-3,
                 ok=True, kind="ours", tolerance=c.tolerance, flops=c.flops, bytes=c.bytes)
    rec.gbps = c.bytes / 0.01 / 1e6
    result = BenchResult(date="2026-11-30", timestamp="2026-11-30T00:00:00Z", device="cpu", versions={},
                         suite="decode", records=[rec], ceilings={"hbm_gbps": 4000.0})
    fig = _figure(result)
    bars, roof = fig.axes
    assert bars.get_ylabel() == "GB/s"
    assert [p.get_height() for p in bars.patches] == [pytest.approx(rec.gbps)]
    assert any(line.get_label() == "HBM ceiling" for line in roof.get_lines())


@pytest.mark.gpu
def test_tiny_decode_suite_on_device():
    from cute_kernels.bench.runner import RunSettings, run_suite
    from cute_kernels.bench.timing import make_gpu_timer

    suite = SUITES["decode"]
    cases = suite.parse_cases("B4_Hq8_Hkv2_D128_ctx1024_page16,B4_Hq8_Hkv2_D128_ctx1024_page256")
    impls = select_impls(suite.impls(), "decode,sdpa_gathered", suite.default)  # fa4_paged JIT: in gpu_check
    result = run_suite("decode", cases, impls, timer=make_gpu_timer(2.0, 5.0), settings=RunSettings(rounds=2),
                       ceilings={"hbm_gbps": 4000.0}, log=lambda s: None)
    recs = {(r.case, r.impl): r for r in result.records}
    assert len(recs) == 4, (result.records, result.skipped)
    assert all(r.ok and r.ms > 0 and r.rel_err < 1e-2 and r.pct_ceiling > 0 for r in recs.values())
