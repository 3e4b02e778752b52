"""GPU: `integrations.graph_decode` captures a patched model's decode step once per generate and
replays it (unpadded and left-padded prompts): its logits (teacher-forced to the tokens of the
same model with the path off) match, the graph was captured after one eager step, and a replay
after the capture wrote nothing wrong (a second generate on a fresh cache gives the same
logits). Timing belongs to `bench models`."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


class _Forced:
    def __init__(self, tokens, start: int):
        self.tokens, self.start = tokens, start

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.start
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, self.tokens[:, step:step + 1], 0.0)


@pytest.mark.parametrize("name,batch,prompt,padded", [("llama_gqa", 8, 100, False), ("qwen2", 3, 37, False),
                                                       ("llama_gqa", 5, 70, True)])
def test_replayed_decode_matches_the_eager_decode(name, batch, prompt, padded):
    import cute_kernels.nn as cnn
    from cute_kernels.bench import model_specs
    from cute_kernels.integrations import graph_decode

    from ._models import rel

    ours = cnn.patch(model_specs.build(model_specs.spec(name), size="small", dtype=torch.bfloat16, device="cuda"))
    ours.eval()
    gen = torch.Generator(device="cpu").manual_seed(3)
    ids = torch.randint(3, ours.config.vocab_size, (batch, prompt), generator=gen).cuda()
    mask = torch.ones_like(ids)
    if padded:  # left padding of several lengths (one row keeps a single real token)
        for row, pads in enumerate((0, 9, prompt - 1, 33, 64)[:batch]):
            mask[row, :pads] = 0
        ids = ids.masked_fill(mask == 0, 0)
    kw = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True, attention_mask=mask)
    with torch.no_grad():
        graph_decode.arm(ours, on=False)
        want = ours.generate(ids, **kw)
        forced = _Forced(want.sequences[:, prompt:], prompt)
        graph_decode.arm(ours)
        runs = [ours.generate(ids, logits_processor=[forced], **kw) for _ in range(2)]
    for got in runs:
        s = got.past_key_values.shared
        assert type(got.past_key_values).__name__ == "GraphDecodeCache"
        assert s.failure is None and s.graph is not None and s.eager_steps == 1, s.failure
        assert torch.equal(got.sequences, want.sequences)
        err = rel(torch.stack(got.logits).float(), torch.stack(want.logits).float())
        assert err < 2e-2, err
    again = rel(torch.stack(runs[1].logits).float(), torch.stack(runs[0].logits).float())
    assert again < 1e-6, again  # the same kernels on the same data: a replay reads nothing stale
