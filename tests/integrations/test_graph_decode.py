"""`integrations.graph_decode` on CPU (fallback="torch", float64): the cache and the decode step
that a CUDA graph replays on the GPU run eagerly here, so what is tested is the step itself (the
fixed buffers, the device-side positions, the paged attention over them) against stock
generate's tokens and logits; which calls are admitted; a returned cache continues correctly.
The capture and replay are tested on the GPU (tests/integrations/test_models_gpu.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels import ops  # noqa: E402
from cute_kernels.integrations import graph_decode  # noqa: E402

from ._models import pair, rel  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")


def _calls(op: str) -> int:
    return sum(n for (name, _), n in ops.FALLBACK_COUNTS.items() if name == op)


def _models(name="llama_gqa"):
    stock, ours, _ = pair(name, patch=True)
    return stock.eval(), ours.eval()


def _generate_both(stock, ours, ids, seed=0, **kw):
    """Stock's and our generate of `ids` from the same seed (our fallback counts cleared between):
    the same tokens, and logits within 1e-6 (patch's RMSNorm keeps float64 where Hugging Face's
    computes in float32: about 1e-7 apart); returns ours."""
    kw.update(output_logits=True, return_dict_in_generate=True)
    torch.manual_seed(seed)
    want = stock.generate(ids, **kw)
    ops.FALLBACK_COUNTS.clear()
    torch.manual_seed(seed)
    got = ours.generate(ids, **kw)
    assert torch.equal(got.sequences, want.sequences)
    assert max(rel(a, b) for a, b in zip(got.logits, want.logits)) < 1e-6
    return got


@pytest.mark.parametrize("sample", [False, True])
def test_generate_through_the_fixed_cache_gives_the_stock_tokens(sample):
    stock, ours = _models()
    ids = torch.randint(1, 64, (3, 9))  # no pad token (0): transformers would infer padding
    kw = dict(max_new_tokens=70, do_sample=sample, pad_token_id=0)
    if sample:
        kw.update(top_k=5, temperature=0.7)
    got = _generate_both(stock, ours, ids, 1, **kw)
    # 69 decode steps in each layer through the paged kernel (9 + 70 tokens: two pages of 64)
    assert _calls("paged_decode") == ours.config.num_hidden_layers * 69
    cache = got.past_key_values
    assert type(cache).__name__ == "GraphDecodeCache" and cache.get_seq_length() == 9 + 69
    assert cache.shared.max_len == 128 and cache.shared.eager_steps == 69  # no CUDA: never captured
    assert int(cache.shared.pos[0]) == 9 + 69


def test_a_returned_cache_continues_on_its_buffers():
    stock, ours = _models()
    ids = torch.randint(1, 64, (2, 6))
    first = ours.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    more = torch.randint(0, 64, (2, 3))
    seq = torch.cat([first.sequences, more], 1)
    # a later call given the cache is transformers' own generate on the same buffers
    got = ours.generate(seq, past_key_values=first.past_key_values, max_new_tokens=4, do_sample=False,
                        pad_token_id=0)
    want = stock.generate(seq, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("sample", [False, True])
def test_left_padded_prompts_are_stored_without_their_padding(sample):
    stock, ours = _models()
    ids = torch.randint(1, 64, (4, 11))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :10] = 0  # one real token
    ids = ids.masked_fill(mask == 0, 0)
    kw = dict(max_new_tokens=60, do_sample=sample, pad_token_id=0, attention_mask=mask)
    if sample:
        kw.update(top_k=5)
    got = _generate_both(stock, ours, ids, 2, **kw)
    assert _calls("paged_decode") == ours.config.num_hidden_layers * 59
    s = got.past_key_values.shared
    assert s.pos.tolist() == [11 + 59, 8 + 59, 1 + 59, 11 + 59]
    with pytest.raises(NotImplementedError, match="left-padded"):
        ours.generate(got.sequences, past_key_values=got.past_key_values, max_new_tokens=2, pad_token_id=0,
                      attention_mask=torch.ones_like(got.sequences))


def test_calls_it_does_not_take_run_transformers_generate():
    stock, ours = _models()
    ids = torch.randint(1, 64, (2, 6))
    mask = torch.ones_like(ids)
    mask[1, 3] = 0  # a hole, not left padding
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert graph_decode.admitted(ours, (ids,), kw) is not None
    assert graph_decode.admitted(ours, (ids,), {**kw, "attention_mask": mask}) is None
    with_pad = ids.clone()
    with_pad[0, 0] = 0
    assert graph_decode.admitted(ours, (with_pad,), kw) is None  # transformers would infer a mask
    assert graph_decode.admitted(ours, (ids,), {**kw, "num_beams": 2}) is None
    assert graph_decode.admitted(ours, (ids.float(),), kw) is None
    cnn.patch(ours, fallback="torch", decode_graph=False)  # a later patch's option applies
    assert graph_decode.admitted(ours, (ids,), kw) is None
    ops.FALLBACK_COUNTS.clear()
    plain = ours.generate(ids, **kw)  # transformers' own generate: its cache, no paged decode
    assert torch.equal(plain, stock.generate(ids, **kw)) and _calls("paged_decode") == 0
    cnn.patch(ours, fallback="torch")
    assert graph_decode.admitted(ours, (ids,), kw) is not None
    _, window = _models("mistral_swa")
    assert graph_decode.admitted(window, (ids,), {**kw, "max_new_tokens": 4096}) is None
    ops.FALLBACK_COUNTS.clear()
    got = ours.generate(ids, attention_mask=mask, **kw)
    assert torch.equal(got, stock.generate(ids, attention_mask=mask, **kw))
    assert _calls("paged_decode") == 0
    assert "forward" not in ours.__dict__  # the class's forward again after each call


def test_attention_that_did_not_receive_the_cache_buffers_raises():
    stock, ours = _models()
    cache = graph_decode.GraphDecodeCache(2, 16)
    k = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    cache.update(k, k, 0)
    graph_decode.ACTIVE.append(cache)
    try:
        with pytest.raises(RuntimeError, match="own key buffer"):
            graph_decode.decode_attention(torch.randn(1, 4, 1, 8), torch.randn(1, 16, 2, 8), k, None,
                                          "torch")
    finally:
        graph_decode.ACTIVE.pop()
    assert graph_decode.decode_attention(k, k, k, None, "torch") is None  # outside a step


@pytest.mark.parametrize("seed", range(8))
def test_random_batches_paddings_and_lengths_give_the_stock_tokens(seed):
    """Random batch sizes, prompt lengths, left paddings (whole rows but one real token
    included) and generation lengths that cross page boundaries, greedy, against stock."""
    gen = torch.Generator().manual_seed(seed)
    stock, ours = _models("qwen2" if seed % 2 else "llama_gqa")
    b = int(torch.randint(1, 6, (1,), generator=gen))
    s = int(torch.randint(1, 40, (1,), generator=gen))
    new = int(torch.randint(2, 90, (1,), generator=gen))
    ids = torch.randint(1, 64, (b, s), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(b):
        pads = int(torch.randint(0, s, (1,), generator=gen)) if seed % 3 else 0
        mask[row, :pads] = 0
    ids = ids.masked_fill(mask == 0, 0)
    got = _generate_both(stock, ours, ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                         attention_mask=mask)
    assert type(got.past_key_values).__name__ == "GraphDecodeCache"
