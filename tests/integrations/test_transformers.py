"""The "cute_kernels" transformers attention backend on CPU (fallback="torch": our operators
compute by the definition, so the backend's handling of masks, windows, sinks, caches and packed
sequences is what is tested) against the stock models, in float64: tiny models from the bench's
specs, loss, logits and every gradient; generate's tokens with a KV cache; torch.compile; the
documented errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

import cute_kernels.integrations.transformers as hf  # noqa: E402
from cute_kernels import ops  # noqa: E402

from ._models import compare_training, pair, rel  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")
TOL = 1e-9


def _calls() -> dict:
    counts: dict = {}
    for (op, _), n in ops.FALLBACK_COUNTS.items():
        counts[op] = counts.get(op, 0) + n
    return counts


def test_registered_without_the_dsl_or_a_gpu():
    from transformers import AttentionInterface, AttentionMaskInterface

    assert hf.NAME in AttentionInterface._global_mapping and hf.NAME in AttentionMaskInterface._global_mapping
    code = ("import sys, cute_kernels.integrations.transformers as m; "
            "assert not [n for n in sys.modules if n.split('.')[0] == 'cutlass'], 'the DSL was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2"])
def test_unpadded_training_matches_stock(name):
    stock, ours, batch = pair(name)
    ops.FALLBACK_COUNTS.clear()
    compare_training(stock, ours, batch, TOL)
    assert _calls().get("sdpa", 0) > 0  # the dense operator ran (GQA without repeat_kv)


def test_padded_batch_unpads_to_varlen_and_matches_stock():
    stock, ours, batch = pair("llama_gqa_padded")
    mask = batch["attention_mask"]
    mask[1, :4] = 0  # a left-padded row beside the right-padded ones
    batch["labels"] = batch["labels"].masked_fill(mask == 0, -100)
    ops.FALLBACK_COUNTS.clear()
    compare_training(stock, ours, batch, TOL, real=mask.bool())
    assert _calls().get("sdpa_varlen", 0) > 0 and _calls().get("sdpa_varlen_backward", 0) > 0


def test_mistral_sliding_window_matches_stock_and_matters():
    stock, ours, batch = pair("mistral_swa")
    compare_training(stock, ours, batch, TOL)
    # The window changes the answer (so the test above sees it applied).
    wide, _, _ = pair("mistral_swa")
    wide.config.sliding_window = None
    with torch.no_grad():
        assert rel(wide(**batch).logits, stock(**batch).logits) > 1e-3
    padded = dict(batch, attention_mask=torch.ones_like(batch["input_ids"]))
    padded["attention_mask"][0, 9:] = 0
    padded["labels"] = batch["labels"].masked_fill(padded["attention_mask"] == 0, -100)
    compare_training(stock, ours, padded, TOL, real=padded["attention_mask"].bool())


def test_qwen2_mixed_sliding_and_full_layers():
    stock, ours, batch = pair("qwen2", overrides=dict(use_sliding_window=True, sliding_window=4, max_window_layers=1))
    assert stock.config.layer_types == ["full_attention", "sliding_attention"]
    compare_training(stock, ours, batch, TOL)


def test_gpt_oss_sinks_and_alternating_windows_match_stock():
    stock, ours, batch = pair("gpt_oss", dtype=torch.float32)  # its grouped-GEMM experts take no float64
    compare_training(stock, ours, batch, 1e-5)
    padded = dict(batch, attention_mask=torch.ones_like(batch["input_ids"]))
    padded["attention_mask"][1, 8:] = 0
    padded["labels"] = batch["labels"].masked_fill(padded["attention_mask"] == 0, -100)
    compare_training(stock, ours, padded, 1e-5, real=padded["attention_mask"].bool())
    grads = {n: p.grad for n, p in ours.named_parameters() if n.endswith("self_attn.sinks")}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values())


def test_packed_sequences_from_position_ids_match_stock():
    stock, ours, _ = pair("llama_gqa")
    ids = torch.randint(0, 64, (2, 12))
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]])
    batch = dict(input_ids=ids, labels=ids, position_ids=pos, use_cache=False)
    ops.FALLBACK_COUNTS.clear()
    logits = compare_training(stock, ours, batch, TOL)
    assert _calls().get("sdpa_varlen", 0) > 0
    with torch.no_grad():  # the first row's second sequence, on its own
        alone = stock(input_ids=ids[:1, 4:7]).logits
    assert rel(logits[:1, 4:7], alone) < TOL


def test_explicit_cumulative_lengths_match_stock_packing():
    stock, ours, _ = pair("llama_gqa")
    ids = torch.randint(0, 64, (1, 10))
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]])
    cu = torch.tensor([0, 4, 7, 10], dtype=torch.int32)
    with torch.no_grad():
        want = stock(input_ids=ids, position_ids=pos, use_cache=False).logits
        got = ours(input_ids=ids, position_ids=pos, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                   max_length_q=4, max_length_k=4).logits
    assert rel(got, want) < TOL


@pytest.mark.parametrize("name", ["llama_gqa", "mistral_swa"])
def test_generate_with_a_kv_cache_gives_the_stock_tokens(name):
    stock, ours, _ = pair(name)
    stock.eval(), ours.eval()
    ids = torch.randint(0, 64, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :5] = 0  # left padding, as generate expects
    for attention_mask in (None, mask):
        kw = dict(max_new_tokens=7, do_sample=False, pad_token_id=0)
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        want = stock.generate(ids, **kw)
        ops.FALLBACK_COUNTS.clear()
        got = ours.generate(ids, **kw)
        assert torch.equal(got, want)
        # Prefill and six decode steps in each layer: dense without padding; with padding, varlen
        # (and dense for a sliding window once it has slid past the padding).
        calls = _calls()
        assert calls.get("sdpa", 0) + calls.get("sdpa_varlen", 0) == ours.config.num_hidden_layers * 7
        if attention_mask is None:
            assert "sdpa_varlen" not in calls
        else:
            assert calls.get("sdpa_varlen", 0) >= ours.config.num_hidden_layers  # the prefill at least


def test_nn_patch_uses_the_attention_interface():
    stock, ours, batch = pair("llama_gqa", patch=True)
    report = ours.cute_kernels_patch
    assert report.attention == "transformers" and report.linears == 2 * 7 + 1
    assert ours.config._attn_implementation == hf.NAME
    # patch also swaps the RMSNorms, and Hugging Face's computes in float32 even in a float64
    # model (it casts to float32 first) while ours keeps the input's precision: about 1e-7 apart
    assert report.norms and report.norms > 0
    compare_training(stock, ours, batch, 1e-6)


def test_compile_keeps_one_graph_per_mask_and_matches():
    from torch._dynamo.testing import CompileCounterWithBackend

    stock, ours, batch = pair("llama_gqa_padded", dtype=torch.float32)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(ours, backend=counter)
    for attention_mask in (batch["attention_mask"], None):
        kw = dict(batch, attention_mask=attention_mask)
        with torch.no_grad():
            want = stock(**kw).logits
            got = compiled(**kw).logits
        real = attention_mask.bool() if attention_mask is not None else slice(None)
        assert rel(got[real], want[real]) < 1e-5
    # The mask hook runs outside the graph (its one break); the layers stay in one graph.
    explanation = torch._dynamo.explain(ours)(**dict(batch, use_cache=False))
    reasons = [str(r.reason) for r in explanation.break_reasons]
    assert reasons and all("attention_mask" in r and "compiler.disable" in r for r in reasons), reasons
    torch._dynamo.reset()


# ---- refused input ---------------------------------------------------------------------------------

def test_attention_dropout_in_training_is_refused_by_name():
    _, ours, batch = pair("llama_gqa", fallback="none")
    ours.config.attention_dropout = 0.1
    for layer in ours.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(NotImplementedError, match=r"dropout=0.1.*attention_dropout to 0"):
        ours(**batch)
    torch_ours = pair("llama_gqa")[1]  # fallback="torch": PyTorch computes it, dropout included
    torch_ours.config.attention_dropout = 0.1
    for layer in torch_ours.model.layers:
        layer.self_attn.attention_dropout = 0.1
    ops.FALLBACK_COUNTS.clear()
    torch_ours(**batch).loss.backward()
    assert _calls().get("transformers_attention", 0) == torch_ours.config.num_hidden_layers


def test_output_attentions_is_refused():
    _, ours, batch = pair("llama_gqa")
    with pytest.raises(ValueError, match="output_attentions"):
        ours(**batch, output_attentions=True)


def test_a_custom_dense_mask_is_refused_then_computed_with_fallback():
    stock, ours, batch = pair("llama_gqa")
    b, s = batch["input_ids"].shape
    keep = torch.tril(torch.ones(s, s, dtype=torch.bool)) & (torch.rand(s, s) > 0.3)
    keep |= torch.eye(s, dtype=torch.bool)
    dense = keep[None, None].expand(b, 1, s, s)
    strict = pair("llama_gqa", fallback="none")[1]
    with pytest.raises(NotImplementedError, match="dense attention_mask"):
        strict(input_ids=batch["input_ids"], attention_mask=dense)
    with torch.no_grad():
        want = stock(input_ids=batch["input_ids"], attention_mask=dense).logits
        ops.FALLBACK_COUNTS.clear()
        got = ours(input_ids=batch["input_ids"], attention_mask=dense).logits
    assert rel(got, want) < TOL and _calls().get("transformers_attention", 0) > 0


def test_position_bias_and_head_mask_are_refused():
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    module = torch.nn.Module()
    with pytest.raises(NotImplementedError, match="position_bias"):
        hf.attention_forward(module, q, k, v, None, position_bias=torch.zeros(1, 2, 4, 4))
    with pytest.raises(NotImplementedError, match="head_mask"):
        hf.attention_forward(module, q, k, v, None, head_mask=torch.ones(2))
    with pytest.raises(NotImplementedError, match="bidirectional"):
        module.is_causal = False
        hf.attention_forward(module, q, k, v, None, sliding_window=2)


def test_without_fallback_cpu_tensors_are_refused():
    _, ours, batch = pair("llama_gqa", fallback="none")
    with pytest.raises((NotImplementedError, ValueError, TypeError), match="fallback='torch'"):
        ours(**batch)


@pytest.mark.parametrize("name", ["llama_gqa", "mistral_swa", "gpt_oss"])
def test_compile_ahead_predicts_each_attention_configuration_and_its_calls_run(name):
    """nn.ahead with this integration's predictor: at a patched model's first layer call, one
    forward call (and one backward call in training) per distinct attention configuration, q, k
    and v laid out as the projections leave them; the calls run (CPU, torch computing)."""
    import pickle
    import warnings

    from cute_kernels.nn import ahead
    from cute_kernels.runtime import ahead_worker

    _, ours, batch = pair(name, dtype=torch.float32, patch=True)
    x = torch.randn(2, 5, ours.config.hidden_size, requires_grad=True)
    ours.train()
    forwards, backwards = hf._predict(ours, x)
    layers = [m for m in ours.modules() if hasattr(m, "layer_idx") and hasattr(m, "scaling")]
    windows = {getattr(m, "sliding_window", None) for m in layers}
    assert len(forwards) == len(backwards) == len(windows)  # one configuration per window kind here
    q, k, v = forwards[0].args[:3]
    cfg = ours.config
    d = layers[0].head_dim
    assert q.shape == (2, cfg.num_attention_heads, 5, d) and q.stride == (5 * cfg.num_attention_heads * d, d,
                                                                         cfg.num_attention_heads * d, 1)
    assert k.shape == v.shape == (2, cfg.num_key_value_heads, 5, d) and q.requires_grad
    assert all(not c.backward for c in forwards) and all(c.backward and c.grad for c in backwards)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's FallbackWarning
        for call in forwards + backwards:
            ahead_worker.run(pickle.loads(pickle.dumps(call)))
    calls = ahead.predict(ours, x)  # the layers' calls and these, backwards after forwards
    assert sum(c.target == "cute_kernels.integrations.transformers:predicted_call" for c in calls) == 2 * len(windows)
    with torch.no_grad():
        assert hf._predict(ours.eval(), x)[1] == []
    assert hf._predict(torch.nn.Linear(2, 2), x) == ([], [])
