"""examples/transformer_block.py: the four versions agree, the FLOP count, no graph breaks in the
patched block, and the results file it writes.

On CPU our ops run with fallback="torch", so these check the plumbing (routing, autograd through
the custom ops, compiling in one graph), not our kernels; the `gpu` test checks those.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

from cute_kernels.bench.records import load_result, validate_result
from cute_kernels.ops import FALLBACK_COUNTS, FallbackWarning

ROOT = Path(__file__).resolve().parents[2]


def _load_example():
    path = ROOT / "examples" / "transformer_block.py"
    spec = importlib.util.spec_from_file_location("transformer_block_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


tb = _load_example()
SMALL = tb.BlockConfig(batch=2, seq=8, hidden=32, heads=4, kv_heads=2, intermediate=48)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One `--tiny --device cpu` run (check, time one round, write): the costly part, shared."""
    out = tmp_path_factory.mktemp("results")
    before = dict(FALLBACK_COUNTS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        errors, result, paths = tb.run(tb.parse_args(["--tiny", "--device", "cpu", "--rounds", "1",
                                                      "--out-dir", str(out)]))
    called = {key[0] for key, n in FALLBACK_COUNTS.items() if n > before.get(key, 0)}
    return errors, result, paths, called


def test_tiny_cpu_run_versions_agree(tiny_run):
    errors, result, _, called = tiny_run
    assert set(errors) == set(tb.VERSIONS)
    names = tb.tensor_names(tb.TransformerBlock(tb.TINY_CONFIG))
    for version, errs in errors.items():
        assert list(errs) == names
        for tensor, err in errs.items():
            # bf16 against fp32: nonzero (it is not comparing fp32 with itself) and within tolerance.
            assert 1e-5 < err <= tb.TOLERANCE["bf16"], (version, tensor, err)
    # ours really went through the cute_kernels ops, forward and backward
    assert {"linear", "matmul", "sdpa", "sdpa_backward", "norm", "rotary", "linear_swiglu", "linear_swiglu_backward"} <= called
    assert all(r.ok and r.ms > 0 for r in result.records)


def test_results_file_validates(tiny_run):
    _, result, paths, _ = tiny_run
    json_path, png_path = paths
    assert json_path.name == f"{result.date}-transformer-cpu.json"
    validate_result(json.loads(json_path.read_text()))
    loaded = load_result(json_path)
    assert loaded.suite == "transformer"
    assert [(r.impl, r.kind) for r in loaded.records] == [("eager", "peer"), ("torch_compile", "peer"),
                                                          ("cute_kernels", "ours"), ("cute_kernels_fused", "ours")]
    flops = tb.block_flops(tb.TINY_CONFIG)["total"]
    for r in loaded.records:
        assert r.case == tb.TINY_CONFIG.name and r.dtype == "bf16"
        assert r.flops == flops
        # stored measured values have 5 significant digits (records._rounded)
        assert math.isclose(r.tflops, flops / (r.ms * 1e9), rel_tol=1e-4)
        assert r.rel_err == max(v for v in r.extra["rel_errs"].values())
    assert loaded.settings["config"]["hidden"] == tb.TINY_CONFIG.hidden
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_flops_hand_computed():
    # head_dim 8; params = 32·(4+2·2)·8 (qkv) + 4·8·32 (o) + 32·2·48 (gate, up) + 48·32 (down)
    #                    = 2048 + 1024 + 3072 + 1536 = 7680
    # linear: 6 · tokens(16) · 7680 = 737280
    # attention fwd: ½ · 4 · B2 · H4 · S²64 · D8 = 8192; fwd+bwd = 3.5 · 8192 = 28672
    flops = tb.block_flops(SMALL)
    assert flops == {"linear": 737280.0, "attention": 28672.0, "total": 765952.0}
    # the issue's config: 6 · 32768 · 218103808 + 3.5 · 2 · 8 · 32 · 4096² · 128
    big = tb.block_flops(tb.ISSUE_CONFIG)
    assert big["linear"] == 6 * 32768 * 218103808
    assert big["attention"] == 3.5 * 2 * 8 * 32 * 4096 ** 2 * 128


@pytest.mark.parametrize("change, word", [
    (dict(hidden=30), "hidden"),
    (dict(kv_heads=3), "kv_heads"),
    (dict(heads=16), "head_dim"),  # 32 / 16 = 2 is even, so make it odd below instead
    (dict(batch=0), "batch"),
])
def test_bad_config_raises(change, word):
    if word == "head_dim":
        change = dict(hidden=12, heads=4, kv_heads=2)  # head_dim 3
    config = tb.BlockConfig(**{**tb.asdict(SMALL), **change})
    with pytest.raises(ValueError, match=word):
        config.validate()


def _patched(config):
    import cute_kernels.nn as cnn

    block = tb.build_block(config, device="cpu", dtype=torch.float32)
    return block, cnn.patch(tb.shared_copy(block), fallback="torch")


def test_patched_block_compiles_to_one_graph_of_our_ops():
    """fullgraph: one forward graph, no break, with our ops and none of PyTorch's linear/SDPA;
    the backward graph AOTAutograd derives uses our sdpa_backward and, per linear layer, one
    linear_backward."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    block, ours = _patched(SMALL)
    x, grad_out = tb.make_inputs(SMALL, device="cpu", dtype=torch.float32)
    explanation = torch._dynamo.explain(ours)(x)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    targets = [n.target for n in explanation.graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.cute_kernels.linear.default) == 4  # qkv, o, gate_up, down
    assert targets.count(torch.ops.cute_kernels.sdpa.default) == 1
    assert torch._C._nn.linear not in targets and torch._C._nn.scaled_dot_product_attention not in targets

    graphs = {}

    def capture(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = [n.target for n in gm.graph.nodes if n.op == "call_function"]
            return make_boxed_func(gm.forward)
        return compiler

    torch._dynamo.reset()
    compiled = torch.compile(ours, backend=aot_autograd(fw_compiler=capture("fw"), bw_compiler=capture("bw")),
                             fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        out, gx, *gparams = tb.forward_backward(compiled, x, grad_out, list(block.parameters()))
        want = tb.forward_backward(block, x, grad_out, list(block.parameters()))
    assert torch.ops.cute_kernels.sdpa_backward.default in graphs["bw"]
    # one op per linear layer (dX and dW in one call; db a sum beside it), none per GEMM
    assert graphs["bw"].count(torch.ops.cute_kernels.linear_backward.default) == 4
    assert torch.ops.cute_kernels.matmul.default not in graphs["bw"]
    for got, ref in zip((out, gx, *gparams), want):
        assert tb.rel_err(got, ref) < 1e-5  # fp32 both sides, PyTorch computes our ops on CPU


def test_nan_propagates_per_sequence_and_fails_the_check():
    block, ours = _patched(SMALL)
    x, _ = tb.make_inputs(SMALL, device="cpu", dtype=torch.float32)
    x = x.detach().clone()
    x[1, 3, 5] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        out = ours(x)
    assert torch.isfinite(out[0]).all()               # the other sequence is untouched
    # That token and every later one attend to it. (Earlier ones may be NaN too: P·V multiplies
    # the masked zero probabilities by its NaN value row, in the reference as in a tiled kernel.)
    assert torch.isnan(out[1, 3:]).any(dim=-1).all()
    assert tb.rel_err(out, torch.zeros_like(out).normal_()) == math.inf


class _DropCausal(torch.overrides.TorchFunctionMode):
    """Under it, SDPA ignores is_causal: a bug a kernel could have."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.nn.functional.scaled_dot_product_attention:
            kwargs["is_causal"] = False
        return func(*args, **kwargs)


class _NonCausal(torch.nn.Module):
    """The block on the same parameters, its attention not causal."""

    def __init__(self, block):
        super().__init__()
        self.block = tb.shared_copy(block)

    def forward(self, x):
        with _DropCausal():
            return self.block(x)


def test_check_catches_a_wrong_version():
    block = tb.build_block(SMALL, device="cpu", dtype=torch.bfloat16, seed=0)
    x, grad_out = tb.make_inputs(SMALL, device="cpu", dtype=torch.bfloat16)
    errors = tb.check_agreement(block, {"eager": block, "wrong": _NonCausal(block)}, x, grad_out, chunk=1)
    assert max(errors["eager"].values()) <= tb.TOLERANCE["bf16"]
    assert errors["wrong"]["out"] > 10 * tb.TOLERANCE["bf16"]
    assert errors["wrong"]["grad_x"] > 10 * tb.TOLERANCE["bf16"]


class _Raises(torch.nn.Module):
    def forward(self, x):
        raise NotImplementedError("no kernel for this")


def test_a_version_that_raises_or_misses_is_recorded_failed_and_untimed():
    from cute_kernels.bench.timing import summarize

    block = tb.build_block(SMALL, device="cpu", dtype=torch.bfloat16)
    x, grad_out = tb.make_inputs(SMALL, device="cpu", dtype=torch.bfloat16)
    failures = {}
    versions = {"eager": block, "torch_compile": _NonCausal(block), "cute_kernels": _Raises()}
    errors = tb.check_agreement(block, versions, x, grad_out, chunk=2, failures=failures)
    assert failures == {"cute_kernels": "NotImplementedError: no kernel for this"}
    assert all(v == math.inf for v in errors["cute_kernels"].values())
    timings = {"eager": summarize([2.0, 3.0, 4.0])}
    result = tb.build_result(SMALL, "bf16", "cpu", errors, timings, settings={}, failures=failures)
    validate_result(result.to_dict())
    eager, non_causal, ours = result.records
    assert eager.ok and eager.ms == 3.0 and eager.tflops == tb.block_flops(SMALL)["total"] / 3e9
    assert not non_causal.ok and non_causal.ms is None and "rel_err" in non_causal.error
    assert not ours.ok and ours.ms is None and ours.rel_err is None and "no kernel" in ours.error
    assert ours.kind == "ours" and eager.kind == "peer"


def test_reference_chunking_is_exact():
    block = tb.build_block(SMALL, device="cpu", dtype=torch.float32)
    x, grad_out = tb.make_inputs(SMALL, device="cpu", dtype=torch.float32)
    whole = tb.reference(block, x, grad_out, chunk=SMALL.batch)
    split = tb.reference(block, x, grad_out, chunk=1)
    for a, b in zip(whole, split):
        assert tb.rel_err(a, b) < 1e-5


@pytest.mark.gpu
def test_small_cuda_config_versions_agree():
    """Our GEMM and attention kernels (fallback="none": nothing falls back) inside the compiled
    block agree with eager and torch.compile against the fp32 reference, forward and backward."""
    argv = ["--device", "cuda", "--batch", "1", "--seq", "256", "--hidden", "512", "--heads", "8",
            "--kv-heads", "2", "--intermediate", "1024", "--check-only"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        errors, _, _ = tb.run(tb.parse_args(argv))
    for version, errs in errors.items():
        for tensor, err in errs.items():
            assert 1e-5 < err <= tb.TOLERANCE["bf16"], (version, tensor, err)
