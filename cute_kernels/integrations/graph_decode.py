"""Decode steps of transformers' `generate` replayed from a CUDA graph.

Why: a decode step of a small or mid-size model is host-bound. The Llama of the models suite
(4 layers at a 1B-class width, 8 sequences) spends about 4.5 ms of Python per generated token
(transformers' forward, our entries, the launches) on under 1 ms of GPU work, so routing its
kernels to ours changed nothing (1.00x stock tokens/s). A CUDA graph replays the whole step's
launches for the cost of one.

What it takes: a graph replays fixed addresses and fixed sizes, so the KV cache cannot grow
by concatenation (transformers' `DynamicCache`) and the attention cannot read the key count
from the host. `GraphDecodeCache` is a `transformers.Cache` whose layers keep keys and values
in preallocated buffers (B, max_len, Hkv, D) (vLLM's paged layout with one page run per
sequence, so `cute_kernels::paged_decode` reads them through a fixed block table), and whose
current length lives on the device: a decode step writes its token at `pos` (B,) and the
attention reads `pos + 1` keys. The step (write, attend, advance `pos`) is the same eager or
replayed; the first decode step of a `generate` runs eagerly (it records every launch plan),
the second captures the graph, and every later one copies the new tokens in and replays it.

    arm(model)        nn.patch does this for transformers causal LMs: `model.generate`
                      takes this path for the calls it admits (below), else is transformers'
    arm(model, on=False)   every call is transformers' own generate again (nn.patch's
                      decode_graph=False)
    GraphDecodeCache(num_layers, max_len)   the cache (also usable eagerly, e.g. on CPU with
                      fallback="torch")

A `generate` call is admitted when the model is armed (on) and: the model's
attention is ours (`attn_implementation="cute_kernels"`) with only full causal attention
(no sliding window shorter than the longest sequence, no soft-capping, no sinks); the prompt
is `input_ids`, unpadded or left-padded (as generate wants batched prompts; one host check of
the mask per call: each row's padding is dropped from the cache, so the kernel reads a prefix
of keys and a decode step's position is the row's own length); greedy or sampled search with
one beam, no assistant model, no cache passed in; and the longest sequence is known
(`max_new_tokens` or `max_length`). Everything else runs
transformers' own `generate` unchanged. A cache is made per call (its buffers and graph are
freed with it), so a returned `past_key_values` stays valid; continuing from it (a later
call's prefill with seen tokens) runs eagerly on the same buffers, except a left-padded batch's
(its rows are stored without their padding, which the later call's mask still counts): that
raises NotImplementedError.
"""

from __future__ import annotations

import functools
import warnings

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from cute_kernels.runtime.cache import dry_run

__all__ = ["GraphDecodeCache", "arm", "admitted", "decode_path", "PAGE"]

PAGE = 64  # keys per page of the block table (a multiple of 16: the decode kernel's MMA path)


class _Buffers:
    """What one cache's layers share: the padded length, the device-side positions and lengths,
    the step's fixed inputs and its graph."""

    def __init__(self, max_len: int):
        self.max_len = -(-max_len // PAGE) * PAGE
        self.decoding = False  # inside a decode step (eager or being captured)
        self.pos = self.lens = self.table = self.rows = None
        self.ids = self.positions = None
        self.graph = self.logits = None
        self.eager_steps = 0
        self.shift = None  # (B,) int64 pads before each prompt (rows stored without them), or None
        self.prefill_index = None
        self.failure: str | None = None  # why the graph was given up (the step then stays eager)

    def start(self, key_states) -> None:
        """Allocate the per-sequence tensors at the prefill (its batch and device)."""
        b, device = key_states.shape[0], key_states.device
        pages = self.max_len // PAGE
        self.pos = torch.zeros(b, dtype=torch.int64, device=device)
        self.lens = torch.zeros(b, dtype=torch.int32, device=device)
        self.table = torch.arange(b * pages, dtype=torch.int32, device=device).view(b, pages)
        self.rows = torch.arange(b, device=device)


class GraphDecodeLayer(CacheLayerMixin):
    """One layer's keys and values, (B, max_len, Hkv, D) each: a prompt is written at the host's
    `length` (compacted where left-padded), a decode step's token at the device's `pos`."""

    is_compileable = False
    is_sliding = False

    def __init__(self, shared: _Buffers):
        super().__init__()
        self.shared = shared
        self.length = 0  # tokens stored (host): a decode step's driver advances it, not the step

    def lazy_initialization(self, key_states, value_states):
        s = self.shared
        b, h, _, d = key_states.shape
        self.keys = key_states.new_zeros((b, s.max_len, h, d))
        self.values = value_states.new_zeros((b, s.max_len, h, value_states.shape[-1]))
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        s = self.shared
        if not self.is_initialized:
            if s.pos is None:
                s.start(key_states)
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        if s.decoding:
            if n != 1:
                raise RuntimeError(f"graph_decode: a decode step got {n} new tokens, not 1")
            # one token per sequence at its own position (a device tensor: the graph replays it)
            self.keys[s.rows, s.pos] = key_states[:, :, 0]
            self.values[s.rows, s.pos] = value_states[:, :, 0]
            return self.keys, self.values  # `attention_forward` knows these objects (decode_attention)
        start = self.length
        end = start + n
        if end > s.max_len:
            raise ValueError(f"graph_decode: {end} tokens exceed the cache's {s.max_len}")
        if s.shift is not None and start:
            raise NotImplementedError("graph_decode: a left-padded batch's cache keeps each row's tokens "
                                      "without its padding, so it cannot be continued by a later call")
        k, v = key_states.transpose(1, 2), value_states.transpose(1, 2)
        if s.shift is not None:  # left padding: row b's real tokens moved to the front of its pages
            k, v = _compacted(s, k), _compacted(s, v)
        self.keys[:, start:end] = k
        self.values[:, start:end] = v
        self.length = end
        if start == 0:
            return key_states, value_states
        # a continued call outside a decode step (a later generate given this cache): the keys
        # so far, contiguous as transformers' own caches hand them over
        return (self.keys[:, :end].transpose(1, 2).contiguous(),
                self.values[:, :end].transpose(1, 2).contiguous())

    def get_mask_sizes(self, query_length: int):
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.shared.max_len

    def reset(self) -> None:
        raise NotImplementedError("graph_decode: a GraphDecodeCache is made per generate call; make a new one")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("graph_decode: beam search is not admitted (num_beams=1 only)")


class GraphDecodeCache(Cache):
    """A `transformers.Cache` for one generate call (module docstring): `num_layers` layers of
    fixed buffers for up to `max_len` tokens a sequence (rounded up to whole pages)."""

    def __init__(self, num_layers: int, max_len: int):
        self.shared = _Buffers(max_len)
        super().__init__(layers=[GraphDecodeLayer(self.shared) for _ in range(num_layers)])

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def advance(self) -> None:
        """Count the token a decode step stored (its update wrote it at the device-side pos)."""
        for layer in self.layers:
            layer.length += 1


def _compacted(s: _Buffers, t):
    """(B, n, H, D) prompt keys or values with row b moved left by its padding s.shift[b] (what
    follows its last real token is never read: the decode kernel reads lens[b] keys)."""
    n = t.shape[1]
    if s.prefill_index is None or s.prefill_index.shape[1] != n:
        s.prefill_index = (torch.arange(n, device=t.device)[None, :] + s.shift[:, None]).clamp_max(n - 1)
    return t.gather(1, s.prefill_index[:, :, None, None].expand(-1, -1, t.shape[2], t.shape[3]))


# ---- the attention call of a decode step ---------------------------------------------------------

ACTIVE: list = []  # the cache whose decode step is running (at most one)


def decode_attention(query, key, value, scaling, fallback: str):
    """The attention of a decode step over a `GraphDecodeCache` (what `integrations.transformers.
    attention_forward` calls while one runs), or None outside one. q (B, Hq, 1, D); key and
    value must be the layer's own buffers (what its `update` returned): anything else means the
    model changed them between the cache and the attention, which this path cannot follow."""
    if not ACTIVE:
        return None
    cache = ACTIVE[-1]
    for layer in cache.layers:
        if key is layer.keys:
            break
    else:
        raise RuntimeError("graph_decode: the attention did not receive the cache's own key buffer (the model "
                           "transforms keys after the cache update); turn the path off for this model")
    if value is not layer.values or query.shape[2] != 1:
        raise RuntimeError("graph_decode: a decode step's attention must take one query token over the cache's "
                           "own value buffer")
    from cute_kernels.ops import paged_decode

    s = cache.shared
    h = key.shape[2]
    pages = key.view(-1, PAGE, h, key.shape[3])
    vpages = value.view(-1, PAGE, h, value.shape[3])
    # the decode rung is the only one that reads a block table, whichever rung the model's other
    # attention calls were given
    out = paged_decode(query[:, :, 0], pages, vpages, s.table, s.lens, scaling, rung="auto", fallback=fallback)
    return out.unsqueeze(1)  # (B, 1, Hq, Dv), transformers' attention output layout


# ---- the decode step -----------------------------------------------------------------------------

def _step(cache, forward, kwargs: dict):
    """One decode step on the cache's fixed tensors: write each layer's token at pos, attend to
    pos + 1 keys, advance pos. Capturable: no host reads, no size depends on the step."""
    s = cache.shared
    s.lens.copy_(s.pos + 1)
    s.positions.copy_(s.pos[:, None])
    ACTIVE.append(cache)
    s.decoding = True
    try:
        out = forward(input_ids=s.ids, position_ids=s.positions, past_key_values=cache, attention_mask=None,
                      **kwargs)
    finally:
        s.decoding = False
        ACTIVE.pop()
    s.pos.add_(1)
    return out


def _decode(cache, forward, input_ids, kwargs: dict):
    """transformers' decode call `forward(input_ids=(B, 1), ...)` through the cache's step:
    eager the first time (it records the launch plans), captured the second, replayed after."""
    s = cache.shared
    if s.ids is None:
        s.ids = torch.empty_like(input_ids)
        s.positions = torch.empty_like(input_ids)
        s.pos.fill_(cache.get_seq_length())
        if s.shift is not None:
            s.pos.sub_(s.shift)
    s.ids.copy_(input_ids)
    # a dry run (precompile's trace) launches nothing a graph could hold: its steps stay eager,
    # which is where they meet (and compile) the decode kernel
    use_graph = input_ids.is_cuda and s.failure is None and not dry_run()
    if use_graph and s.graph is None and s.eager_steps >= 1:
        _capture(cache, forward, kwargs)
    if s.graph is not None:
        s.graph.replay()
        cache.advance()
        return _output(s.logits, cache)
    out = _step(cache, forward, kwargs)
    s.eager_steps += 1
    cache.advance()
    return out


def _capture(cache, forward, kwargs: dict) -> None:
    s = cache.shared
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = _step(cache, forward, kwargs)
    except Exception as err:  # a launch that cannot be captured: keep the eager step, say why once
        s.failure = f"{type(err).__name__}: {err}"
        warnings.warn(f"graph_decode: the decode step could not be captured ({s.failure}); it runs eagerly",
                      RuntimeWarning, stacklevel=3)
        return
    s.graph, s.logits = graph, out.logits


def _output(logits, cache):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return CausalLMOutputWithPast(logits=logits, past_key_values=cache)


# ---- generate --------------------------------------------------------------------------------------

# transformers' decode-call arguments a step takes (the others it replaces: input_ids, position_ids,
# past_key_values, attention_mask); a call with any other, or asking for attentions or hidden
# states, runs the model's own forward
_STEP_KWARGS = frozenset({"use_cache", "return_dict", "logits_to_keep", "output_attentions", "output_hidden_states"})
_REPLACED = ("input_ids", "position_ids", "past_key_values", "attention_mask")


def admitted(model, args: tuple, kwargs: dict):
    """(max_len, each row's left padding (B,) or None) when `model.generate(*args, **kwargs)` takes
    this path, else None."""
    if not model.__dict__.get("_cute_kernels_graph_decode", False):
        return None
    config = model.config
    if getattr(config, "_attn_implementation", None) != "cute_kernels" or config.is_encoder_decoder:
        return None
    if getattr(config, "model_type", "") == "gpt_oss" or getattr(config, "attn_logit_softcapping", None):
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return None
    input_ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        return None
    if any(kwargs.get(k) is not None for k in ("past_key_values", "assistant_model", "inputs_embeds",
                                                "prefix_allowed_tokens_fn")):
        return None
    gen = kwargs.get("generation_config") or model.generation_config
    if (kwargs.get("num_beams") or gen.num_beams or 1) != 1 or (kwargs.get("num_return_sequences") or 1) != 1:
        return None
    new = kwargs.get("max_new_tokens", gen.max_new_tokens)
    max_len = input_ids.shape[1] + new if new is not None else kwargs.get("max_length", gen.max_length)
    if not max_len or max_len <= input_ids.shape[1]:
        return None
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < max_len:
        return None
    mask = kwargs.get("attention_mask")
    pad = kwargs.get("pad_token_id", gen.pad_token_id)
    if mask is None and pad is not None and bool((input_ids == pad).any()):
        return None  # transformers would infer a mask from the pad token (its rule, not repeated here)
    if mask is not None:
        if mask.shape != input_ids.shape:
            return None
        real = mask.bool()
        # left padding only (each row's real tokens at its end, at least one): stored compacted,
        # since the decode kernel reads a prefix of keys, not a key mask
        if not bool((real == (real.cumsum(1) > 0)).all() and real[:, -1].all()):
            return None
        pads = (~real).sum(1)
        return max_len, pads if bool(pads.any()) else None
    return max_len, None


def generate(model, original, *args, **kwargs):
    """`model.generate` once armed: transformers' generate with a `GraphDecodeCache` and its
    decode steps replayed from a graph where the call is admitted (module docstring)."""
    admit = admitted(model, args, kwargs)
    if admit is None:
        return original(*args, **kwargs)
    max_len, pads = admit
    cache = GraphDecodeCache(model.config.get_text_config().num_hidden_layers, max_len)
    cache.shared.shift = pads
    forward = model.forward

    @functools.wraps(forward)
    def graphed_forward(*fargs, **fkwargs):
        ids = fkwargs.get("input_ids")
        extra = {k: v for k, v in fkwargs.items() if k not in _REPLACED}
        if (fargs or fkwargs.get("past_key_values") is not cache or ids is None or ids.shape[1] != 1
                or cache.get_seq_length() == 0 or not set(extra) <= _STEP_KWARGS
                or extra.get("output_attentions") or extra.get("output_hidden_states")):
            return forward(*fargs, **fkwargs)  # the prefill, or a call the step does not take
        return _decode(cache, forward, ids, extra)

    kwargs["past_key_values"] = cache
    own = model.__dict__.get("forward")  # an instance forward already there (accelerate's hooks)
    model.forward = graphed_forward
    try:
        return original(*args, **kwargs)
    finally:
        if own is None:
            del model.forward  # the class's forward again
        else:
            model.forward = own


def decode_path(cache) -> str:
    """How a generate that returned `cache` ran its decode steps: "graph" (replayed from the
    graph), "graph-eager" (a `GraphDecodeCache` whose step was never captured: no CUDA, a dry
    run, or a capture that failed with a warning), or "eager" (transformers' own cache)."""
    if not isinstance(cache, GraphDecodeCache):
        return "eager"
    return "graph" if cache.shared.graph is not None else "graph-eager"


def arm(model, on: bool = True) -> None:
    """Route `model.generate` through `generate` above (transformers models with `generate`
    only; idempotent), or with on=False leave every call to transformers' own. Each call checks
    whether it is admitted."""
    if not hasattr(type(model), "generate"):
        return
    if "_cute_kernels_graph_decode" not in model.__dict__:  # wrapped once; the flag decides
        original = model.generate
        model.generate = functools.partial(generate, model, original)
    object.__setattr__(model, "_cute_kernels_graph_decode", bool(on))
