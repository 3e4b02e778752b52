"""GPU: the suite's models at the "small" size (head dim 64) on our kernels against stock, bf16,
through the bench harness itself (`run_models`): loss, logits and every gradient of a training
step, the inference logits, generate's logits with stock's tokens forced (prefill and decode
kernels), each within the tolerance stock's own distance to float32 sets; torch.compile too.
For the lead to run on the H200: `python3 -m pytest -q -m gpu tests/integrations/test_models_gpu.py`."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.gpu


def _run(name: str, modes: tuple[str, ...]):
    from cute_kernels.bench.models import ModelsSettings, run_models

    lines = []
    result = run_models(ModelsSettings(models=(name,), modes=modes, rounds=1, iters=1, warmup=0, prompts=2,
                                       prompt_len=48, new_tokens=6, device="cuda", size="small"), log=lines.append)
    ours = [r for r in result.records if r.impl == "cute_kernels"]
    assert ours, "\n".join(lines + [str(result.skipped)])
    failed = [(r.case, r.error, r.rel_err) for r in ours if not r.ok]
    assert not failed, "\n".join(lines)
    return {r.case.split("/", 1)[1]: r for r in ours}


@pytest.mark.parametrize("name", ["llama_gqa", "llama_gqa_padded", "mistral_swa", "qwen2"])
def test_language_model_matches_stock_on_our_kernels(name):
    got = _run(name, ("train_eager", "infer_eager", "generate"))
    assert got["train_eager"].rel_err < got["train_eager"].tolerance


def test_gpt_oss_sinks_on_our_kernels():
    _run("gpt_oss", ("train_eager", "infer_eager", "generate"))


@pytest.mark.parametrize("name", ["vit_b16", "eva02_b14"])
def test_timm_model_matches_stock_on_our_kernels(name):
    try:
        import timm  # noqa: F401
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"timm is not importable ({err})")
    _run(name, ("train_eager", "infer_eager"))


def test_compiled_training_and_inference_match_stock():
    _run("llama_gqa", ("train_compiled", "infer_compiled"))


def test_cuda_graph_trees_training_and_inference_match_stock():
    """torch.compile(mode="reduce-overhead") on both sides: our ops inside CUDA graph trees keep
    no tensor in a graph's pool (`runtime.lasting`), and the replayed steps match stock."""
    try:
        import timm  # noqa: F401
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"timm is not importable ({err})")
    _run("vit_b16", ("train_graphs", "infer_graphs"))
    _run("llama_gqa", ("train_graphs",))


def test_padded_batch_under_cuda_graph_trees_matches_stock():
    """A padded batch (a key-padding mask) under torch.compile(mode="reduce-overhead") on both
    sides. The masked attention operator reads its varlen plan from the mask on the host
    (`ops.attention_masked`), which a CUDA graph capture cannot do: its cudagraph_unsafe tag
    keeps it out of the graphs, and the steps must match stock's."""
    _run("llama_gqa_padded", ("infer_graphs", "train_graphs"))
