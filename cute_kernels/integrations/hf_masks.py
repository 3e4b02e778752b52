"""What transformers' mask hook is asked for, read into what our kernels take.

transformers builds every mask through one hook per attention implementation
(`AttentionMaskInterface`), handing it a *mask function* `f(batch, head, q_idx, kv_idx) -> bool`
composed from its own pieces in `transformers.masking_utils`: the causal or bidirectional base,
and-ed with a sliding window, a chunk, or the segments of packed sequences, or-ed with blocks
that attend bidirectionally (image tokens). `read_mask_function` takes such a composition apart
by the identity of each piece's code (every closure a factory makes shares its code object), so
it knows exactly which pattern is meant, and anything it does not recognize is `UNKNOWN`.

`attention_mask` is our hook. What it returns travels through the model to
`transformers.attention_forward` as `attention_mask`:
- None: no padding (the pattern is the model's causality and `sliding_window`, which the
  attention call receives itself, as FlashAttention's backend does);
- a 2-D bool tensor (B, kv_length): the key-padding mask (True = a real token);
- a 2-D int32 tensor (B, q_length): segment ids of packed sequences (causal within each);
- a 4-D tensor: a pattern our kernels do not take (built by transformers' SDPA hook), which the
  attention call refuses by name, or hands to PyTorch with fallback="torch".

Under torch.compile the hook runs outside the graph (`torch.compiler.disable`): Dynamo cannot
look into the closures of functions made while it traces, and the checks that say "no padding"
or "not packed" read the data. That is one graph break per mask per forward (a mask serves
every layer), where transformers' SDPA hook instead materializes a dense mask under tracing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MaskPattern", "UNKNOWN", "read_mask_function", "attention_mask"]


@dataclass(frozen=True)
class MaskPattern:
    """A recognized mask function: causal or not, a causal sliding window of `window` keys
    (kv_idx > q_idx - window), a chunk size, and the packed-sequence ids (B, S), if any."""

    causal: bool
    window: int | None = None
    chunk: int | None = None
    segments: object = None


UNKNOWN = None


def _pieces():
    """{code object: piece name} for transformers' mask pieces (made once, on first use)."""
    global _PIECES
    if _PIECES is None:
        from transformers import masking_utils as mu

        one = torch.zeros(1, 1, dtype=torch.int64)
        _PIECES = {
            mu.causal_mask_function.__code__: "causal",
            mu.bidirectional_mask_function.__code__: "bidirectional",
            mu.and_masks(mu.causal_mask_function).__code__: "and",
            mu.or_masks(mu.causal_mask_function).__code__: "or",
            mu.sliding_window_overlay(1).__code__: "window",
            mu.sliding_window_bidirectional_overlay(1).__code__: "bidirectional_window",
            mu.chunked_overlay(1, one[0]).__code__: "chunk",
            mu.packed_sequence_mask_function(one).__code__: "segments",
        }
    return _PIECES


_PIECES = None


def _cells(fn) -> dict:
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))


def _terms(fn, pieces, out: list) -> bool:
    """Append the and-ed terms of `fn` to `out`; False when a piece is not recognized."""
    code = getattr(fn, "__code__", None)
    kind = pieces.get(code)
    if kind == "and":
        return all(_terms(f, pieces, out) for f in _cells(fn)["mask_functions"])
    if kind is None or kind == "or":
        return False
    out.append((kind, _cells(fn)))
    return True


def read_mask_function(fn) -> MaskPattern | None:
    """The pattern of a transformers mask function, or `UNKNOWN` (None) when it holds a piece
    this module does not know or a combination our kernels do not take (an `or`, a
    bidirectional window, a window on a bidirectional base)."""
    terms: list = []
    if not _terms(fn, _pieces(), terms):
        return UNKNOWN
    kinds = [k for k, _ in terms]
    bases = [k for k in kinds if k in ("causal", "bidirectional")]
    if len(bases) != 1 or kinds.count("window") > 1 or kinds.count("chunk") > 1 or kinds.count("segments") > 1:
        return UNKNOWN
    if "bidirectional_window" in kinds:
        return UNKNOWN
    causal = bases[0] == "causal"
    window = chunk = segments = None
    for kind, cells in terms:
        if kind == "window":
            window = int(cells["sliding_window"])
        elif kind == "chunk":
            chunk = int(cells["chunk_size"])
        elif kind == "segments":
            segments = cells["packed_sequence_mask"]
    if not causal and (window is not None or chunk is not None or segments is not None):
        return UNKNOWN
    return MaskPattern(causal, window, chunk, segments)


@torch.compiler.disable
def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask=None, local_size=None, config=None, **kwargs):
    """The "cute_kernels" mask hook (module docstring). Takes what transformers' mask creators
    pass (`masking_utils.create_causal_mask` and its siblings)."""
    from transformers import masking_utils as mu

    fn = mu.causal_mask_function if mask_function is None else mask_function
    pattern = read_mask_function(fn)
    if pattern is not None and pattern.chunk is not None and not _within_chunk(pattern.chunk, kv_length, kv_offset):
        pattern = UNKNOWN  # a chunked pattern that actually cuts: our kernels have no chunked mask
    if pattern is UNKNOWN:
        return _dense(batch_size, q_length, kv_length, q_offset, kv_offset, fn, attention_mask, kwargs)
    if pattern.segments is not None:
        segments = pattern.segments
        # Under tracing transformers hands segment ids even for rows that pack one sequence.
        if bool((segments[:, -1] == segments[:, 0]).all()):
            return None
        return segments.to(torch.int32)
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]
    if attention_mask.dtype != torch.bool:
        attention_mask = attention_mask.bool()
    # No padding: say so with None (the dense kernels), as FlashAttention's hook does.
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def _within_chunk(chunk: int, kv_length: int, kv_offset) -> bool:
    try:
        return int(kv_length) + int(kv_offset) <= chunk
    except (TypeError, RuntimeError):  # a traced offset: assume the worst
        return False


def _dense(batch_size, q_length, kv_length, q_offset, kv_offset, fn, attention_mask, kwargs):
    """transformers' own boolean SDPA mask for a pattern our kernels do not take, so the
    attention call can name it (or hand it to PyTorch)."""
    from transformers import masking_utils as mu

    mask = mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                        kv_offset=kv_offset, mask_function=fn, attention_mask=attention_mask,
                        allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                        use_vmap=kwargs.get("use_vmap", False), device=kwargs.get("device") or "cpu")
    if mask is None:  # cannot happen without the skips, but never hand on None for a pattern
        raise RuntimeError("cute_kernels: transformers built no mask for a pattern that needs one")
    return mask
