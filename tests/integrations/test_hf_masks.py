"""`hf_masks`: transformers' mask functions read into patterns, and what the hook returns."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402

from cute_kernels.integrations import hf_masks  # noqa: E402


def test_the_patterns_transformers_composes_are_read_exactly():
    seg = torch.zeros(1, 4, dtype=torch.int64)
    read = hf_masks.read_mask_function
    assert read(mu.causal_mask_function) == hf_masks.MaskPattern(causal=True)
    assert read(mu.bidirectional_mask_function) == hf_masks.MaskPattern(causal=False)
    assert read(mu.sliding_window_causal_mask_function(7)) == hf_masks.MaskPattern(True, window=7)
    chunked = read(mu.chunked_causal_mask_function(16, torch.zeros(1, dtype=torch.int64)))
    assert chunked.causal and chunked.chunk == 16
    packed = read(mu.and_masks(mu.sliding_window_causal_mask_function(5), mu.packed_sequence_mask_function(seg)))
    assert packed.window == 5 and packed.segments is seg


@pytest.mark.parametrize("fn", [
    mu.or_masks(mu.causal_mask_function, mu.blockwise_overlay(torch.zeros(1, 4, dtype=torch.int64))),
    mu.sliding_window_bidirectional_mask_function(3),
    mu.and_masks(mu.causal_mask_function, lambda b, h, q, kv: kv >= 0),
    lambda b, h, q, kv: q >= kv,
])
def test_anything_else_is_unknown(fn):
    assert hf_masks.read_mask_function(fn) is hf_masks.UNKNOWN


def test_the_hook_returns_none_padding_segments_or_a_dense_mask():
    hook = hf_masks.attention_mask
    ones = torch.ones(2, 6, dtype=torch.bool)
    assert hook(2, 6, 6, attention_mask=ones, device="cpu") is None
    padded = ones.clone()
    padded[1, 4:] = False
    assert torch.equal(hook(2, 6, 6, attention_mask=padded, device="cpu"), padded)
    assert torch.equal(hook(2, 1, 4, attention_mask=padded, device="cpu"), padded[:, -4:])
    seg = torch.tensor([[0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 0, 0]])
    fn = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(seg))
    got = hook(2, 6, 6, mask_function=fn, device="cpu")
    assert got.dtype == torch.int32 and torch.equal(got, seg.to(torch.int32))
    trivial = torch.zeros(2, 6, dtype=torch.int64)
    one_each = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(trivial))
    assert hook(2, 6, 6, mask_function=one_each, device="cpu") is None  # traced runs hand segments unasked
    blocks = mu.or_masks(mu.causal_mask_function, mu.blockwise_overlay(torch.zeros(2, 6, dtype=torch.int64)))
    dense = hook(2, 6, 6, mask_function=blocks, attention_mask=padded, device="cpu")
    assert dense.shape == (2, 1, 6, 6) and dense.dtype == torch.bool
