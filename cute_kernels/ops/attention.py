"""Attention operators: `cute_kernels::sdpa` (forward, with autograd), `cute_kernels::sdpa_backward`,
`cute_kernels::sdpa_varlen` (with autograd), `cute_kernels::sdpa_varlen_backward`,
`cute_kernels::paged_decode`.

Each calls a public entry point of `cute_kernels.attention` (`_ENTRIES`); an entry point that
does not exist yet makes the op raise NotImplementedError naming the missing kernel (or, with
fallback="torch", compute by definition in `attention_reference`). Never wrong data: the
entry points' conventions are those stated in `attention_reference`, and the GPU tests compare.

Sliding windows: the dense and varlen ops take `window_left: int = -1, window_right: int = -1`
(a schema takes ints, not an optional pair), FlashAttention's `window_size` split in two: -1 is
an unbounded side, and (-1, -1) is no window. The entry points receive
`window_size=(window_left, window_right)`, or None for (-1, -1).

Score features (`cute_kernels.attention.features`): every dense and varlen op also takes
`softcap: Optional[float] = None` and `sinks: Optional[Tensor] = None` (Hq,), and the varlen ops
`seqused_k: Optional[Tensor] = None` (B,) int32, as the last schema arguments. They reach the
entry points as keywords only when given (so entries without them see the old call). `sdpa` and
`sdpa_varlen` differentiate into sinks too: dsinks = -sum_rows exp(sink - lse) rowsum(dO * O)
(`features.sinks_gradient`), computed in the autograd formula from the forward's out and lse;
the backward ops return (dq, dk, dv) as before.
"""

import importlib
from typing import Optional

import torch
from torch import Tensor

from cute_kernels.attention.features import check_sinks, check_softcap, sinks_gradient
from cute_kernels.attention.mask_rule import canonical_window
from cute_kernels.runtime import eager
from cute_kernels.runtime.eager import detached

from . import attention_reference as reference
from .fallback import UNSUPPORTED, check_fallback, device_guard, note_fallback, on_cuda, raise_unsupported

__all__ = ["sdpa", "sdpa_backward", "sdpa_varlen", "sdpa_varlen_backward", "paged_decode", "CAUSAL"]

CAUSAL = (None, "top_left", "bottom_right")

# op -> (entry point in cute_kernels.attention, the kernel it stands for). Expected signatures
# (each op's `rung` argument is the entry's `kernel`; tensors are handed down detached):
#   attention_forward(q, k, v, *, causal, scale, enable_gqa, window_size, kernel) -> (out, lse)
#   attention_backward(grad_out, q, k, v, out, lse, *, causal, scale, enable_gqa, window_size, kernel)
#                      -> (dq, dk, dv)
#   attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
#                            causal, scale, window_size, kernel) -> (out (Tq, Hq, Dv), lse (Hq, Tq))
#   attention_varlen_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
#                             max_seqlen_k, *, causal, scale, window_size, kernel) -> (dq, dk, dv)
#   paged_decode(q, k_cache, v_cache, block_table, seqlens_k, *, scale, kernel) -> out (B, Hq, Dv)
_ENTRIES = {
    "sdpa": ("attention_forward", "the attention forward"),
    "sdpa_backward": ("attention_backward", "the attention backward (a FlashAttention-2 style dQ/dK/dV kernel)"),
    "sdpa_varlen": ("attention_varlen_forward", "the variable-length (packed sequences) attention forward"),
    "sdpa_varlen_backward": ("attention_varlen_backward", "the variable-length (packed sequences) attention backward"),
    "paged_decode": ("paged_decode", "the paged-KV decode kernel (the 'decode' rung)"),
}
_found: dict = {}


def _entry(op: str):
    """The kernel layer's entry point for `op`; NotImplementedError naming the kernel if absent."""
    fn = _found.get(op)
    if fn is None:
        name, what = _ENTRIES[op]
        fn = getattr(importlib.import_module("cute_kernels.attention"), name, None)
        if fn is None:
            raise NotImplementedError(
                f"cute_kernels.{op}: {what} is not written yet (cute_kernels.attention.{name} does not exist)"
            )
        _found[op] = fn
    return fn


def _check_causal(op: str, causal) -> None:
    if causal not in CAUSAL:
        raise ValueError(f"cute_kernels.{op}: causal must be one of {CAUSAL}, got {causal!r}")


def _window(op: str, causal, window_left: int, window_right: int):
    """The entry points' `window_size` for the schema's two ints: None for (-1, -1), else the
    pair, checked (`mask_rule.canonical_window`) so that the fake and every path raise alike."""
    if window_left == -1 and window_right == -1:
        return None
    window = (window_left, window_right)
    canonical_window(window, causal, f"cute_kernels.{op}")
    return window


def _features(op: str, q, softcap, sinks, seqused_k=None, packed: bool = False) -> dict:
    """The feature keywords an entry point receives: only those given, checked (so the fake and
    every path raise alike). packed: q is (Tq, Hq, D) (varlen), else (..., Hq, Sq, D)."""
    given = {}
    if softcap is not None:
        given["softcap"] = check_softcap(softcap, f"cute_kernels.{op}")
    if sinks is not None:
        heads = q.shape[1] if packed else q.shape[-3]
        given["sinks"] = check_sinks(sinks, heads, q, f"cute_kernels.{op}")
    if seqused_k is not None:
        given["seqused_k"] = seqused_k
    return given


# ---- sdpa (forward) ----------------------------------------------------------------------------

@torch.library.custom_op("cute_kernels::sdpa", mutates_args=())
def sdpa(q: Tensor, k: Tensor, v: Tensor, causal: Optional[str] = None, scale: Optional[float] = None,
         enable_gqa: bool = False, window_left: int = -1, window_right: int = -1, rung: str = "auto",
         fallback: str = "none", softcap: Optional[float] = None,
         sinks: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(out, lse): attention of q (B, Hq, Sq, D) over k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv) (or
    all without B); out (B, Hq, Sq, Dv) in q's dtype, stored (B, Sq, Hq, Dv) (`_new_out`), lse
    (B, Hq, Sq) fp32 contiguous (not differentiable).
    causal: None, "top_left" or "bottom_right"; scale default 1/sqrt(D); window_left/right: a
    sliding window, -1 unbounded (module docstring); rung: an attention rung
    (`cute_kernels.attention.KERNELS`) or "auto"; softcap, sinks (Hq,): the score features
    (module docstring; lse includes the sinks)."""
    if softcap is None and sinks is None:  # the form the eager entry keys (`ops.eager_attention`)
        return eager.inside("sdpa", _sdpa, (q, k, v, causal, scale, enable_gqa, window_left, window_right, rung,
                                            fallback))
    return _sdpa(q, k, v, causal, scale, enable_gqa, window_left, window_right, rung, fallback, softcap, sinks)


def _sdpa(q, k, v, causal, scale, enable_gqa, window_left, window_right, rung, fallback, softcap=None, sinks=None):
    """`sdpa`'s checked path (`runtime.eager.inside` replays a recorded call instead)."""
    check_fallback("sdpa", fallback)
    _check_causal("sdpa", causal)
    window = _window("sdpa", causal, window_left, window_right)
    features = _features("sdpa", q, softcap, sinks)
    if fallback == "torch" and not on_cuda(q, k, v):
        note_fallback("sdpa", f"inputs on {q.device}")
        return _stored_as_kernels(*reference.forward(q, k, v, causal, scale, enable_gqa, window, softcap, sinks))
    if sinks is not None:
        features["sinks"] = sinks.detach()
    try:
        with device_guard(q):
            return _entry("sdpa")(*detached(q, k, v), causal=causal, scale=scale, enable_gqa=enable_gqa,
                                  window_size=window, kernel=rung, **features)
    except UNSUPPORTED as err:
        if fallback != "torch":
            raise_unsupported("sdpa", err)
        note_fallback("sdpa", str(err))
        return _stored_as_kernels(*reference.forward(q, k, v, causal, scale, enable_gqa, window, softcap, sinks))


def _new_out(shape, dtype, device) -> Tensor:
    """An empty `sdpa` output of `shape` (4-D or 3-D) stored as the kernels store theirs
    (`attention.api.new_out`), so that the op's every path and its fake agree on strides (a
    compiled graph indexes the output by the fake's)."""
    from cute_kernels.attention.api import new_out

    return new_out(tuple(shape), dtype, device)


def _stored_as_kernels(out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    return _new_out(out.shape, out.dtype, out.device).copy_(out), lse


def _check_ranks(op: str, *tensors) -> None:
    ranks = {t.dim() for t in tensors}
    if len(ranks) != 1 or not ranks <= {3, 4}:
        raise ValueError(f"cute_kernels.{op}: query, key and value must all be 4-D (B, H, S, D) or all 3-D, "
                         f"got {[t.dim() for t in tensors]}")


@sdpa.register_fake
def _sdpa_fake(q, k, v, causal=None, scale=None, enable_gqa=False, window_left=-1, window_right=-1, rung="auto",
               fallback="none", softcap=None, sinks=None):
    _check_causal("sdpa", causal)
    _window("sdpa", causal, window_left, window_right)
    _check_ranks("sdpa", q, k, v)
    _features("sdpa", q, softcap, sinks)
    out = _new_out((*q.shape[:-1], v.shape[-1]), q.dtype, q.device)
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32)


_SDPA_OPTIONS = ("causal", "scale", "enable_gqa", "window_left", "window_right", "rung", "fallback", "softcap")


def _sdpa_setup(ctx, inputs, output):
    q, k, v, *options, sinks = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # None, not a zeros fill, for lse's gradient
    ctx.save_for_backward(q, k, v, out, lse, sinks)
    ctx.options = dict(zip(_SDPA_OPTIONS, options))


def _sdpa_grad(ctx, grad_out, grad_lse):
    if grad_out is None:
        return (None,) * (4 + len(_SDPA_OPTIONS))
    q, k, v, out, lse, sinks = ctx.saved_tensors
    dq, dk, dv = sdpa_backward(grad_out, q, k, v, out, lse, **ctx.options, sinks=sinks)
    dsinks = sinks_gradient(grad_out, out, lse, sinks) if sinks is not None and ctx.needs_input_grad[-1] else None
    return dq, dk, dv, *([None] * len(_SDPA_OPTIONS)), dsinks


sdpa.register_autograd(_sdpa_grad, setup_context=_sdpa_setup)


# ---- sdpa_backward -------------------------------------------------------------------------------

@torch.library.custom_op("cute_kernels::sdpa_backward", mutates_args=())
def sdpa_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  causal: Optional[str] = None, scale: Optional[float] = None, enable_gqa: bool = False,
                  window_left: int = -1, window_right: int = -1, rung: str = "auto",
                  fallback: str = "none", softcap: Optional[float] = None,
                  sinks: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of `sdpa`'s out given its (out, lse); shaped and typed as q, k, v, stored
    (B, S, H, D) as `sdpa`'s out is (`_new_out`).
    `rung` is the forward's (the backward of that rung runs); softcap and sinks as the forward
    took them (the sinks' own gradient is `features.sinks_gradient`, see the module docstring).
    Raises NotImplementedError naming the missing kernel when no attention backward exists for
    the input."""
    if softcap is None and sinks is None:  # the eager entry's form
        return eager.inside("sdpa_backward", _sdpa_backward, (grad_out, q, k, v, out, lse, causal, scale, enable_gqa,
                                                              window_left, window_right, rung, fallback))
    return _sdpa_backward(grad_out, q, k, v, out, lse, causal, scale, enable_gqa, window_left, window_right, rung,
                          fallback, softcap, sinks)


def _sdpa_backward(grad_out, q, k, v, out, lse, causal, scale, enable_gqa, window_left, window_right, rung, fallback,
                   softcap=None, sinks=None):
    """`sdpa_backward`'s checked path (`runtime.eager.inside` replays a recorded call instead)."""
    check_fallback("sdpa_backward", fallback)
    _check_causal("sdpa_backward", causal)
    window = _window("sdpa_backward", causal, window_left, window_right)
    features = _features("sdpa_backward", q, softcap, sinks)
    if fallback == "torch" and not on_cuda(grad_out, q, k, v):
        note_fallback("sdpa_backward", f"inputs on {q.device}")
        return _grads_stored(reference.backward(grad_out, q, k, v, causal, scale, enable_gqa, window, softcap, sinks))
    if sinks is not None:
        features["sinks"] = sinks.detach()
    try:
        with device_guard(q):
            grads = _entry("sdpa_backward")(*detached(grad_out, q, k, v, out, lse), causal=causal, scale=scale,
                                            enable_gqa=enable_gqa, window_size=window, kernel=rung, **features)
    except UNSUPPORTED as err:
        if fallback != "torch":
            raise_unsupported("sdpa_backward", err)
        note_fallback("sdpa_backward", str(err))
        return _grads_stored(reference.backward(grad_out, q, k, v, causal, scale, enable_gqa, window, softcap, sinks))
    return _grads_stored(grads[:3])


def _grads_stored(grads) -> tuple:
    """(dq, dk, dv) stored (B, S, H, D) as the kernels store theirs (`attention.api.
    stored_like_out`; a copy only for a path that returned another layout), so that the op's
    every path and its fake agree on strides."""
    from cute_kernels.attention.api import stored_like_out

    return tuple(stored_like_out(g) for g in grads)


@sdpa_backward.register_fake
def _sdpa_backward_fake(grad_out, q, k, v, out, lse, causal=None, scale=None, enable_gqa=False, window_left=-1,
                        window_right=-1, rung="auto", fallback="none", softcap=None, sinks=None):
    _check_causal("sdpa_backward", causal)
    _window("sdpa_backward", causal, window_left, window_right)
    _features("sdpa_backward", q, softcap, sinks)
    return tuple(_new_out(t.shape, t.dtype, t.device) for t in (q, k, v))


# ---- sdpa_varlen ---------------------------------------------------------------------------------

# The tags of ops that read device values on the host (the varlen offsets, checked before the
# launch; a padding mask's plan, `attention_masked`). A CUDA graph capture cannot make that read,
# so torch.compile's CUDA graphs leave these ops out (a graph partition around them, or no graph
# where partitions are off) instead of failing mid-capture. Torch builds without the tag get none.
HOST_READ_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("cute_kernels::sdpa_varlen", mutates_args=(), tags=HOST_READ_TAGS)
def sdpa_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                max_seqlen_k: int, causal: Optional[str] = None, scale: Optional[float] = None,
                window_left: int = -1, window_right: int = -1, rung: str = "auto",
                fallback: str = "none", softcap: Optional[float] = None, sinks: Optional[Tensor] = None,
                seqused_k: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(out (Tq, Hq, Dv), lse (Hq, Tq) fp32) for sequences packed along dim 0 of q (Tq, Hq, D),
    k (Tk, Hkv, D), v (Tk, Hkv, Dv), delimited by int32 cu_seqlens_q/k (B + 1,) (see
    `attention_reference.varlen_forward`); Hq a multiple of Hkv. softcap, sinks (Hq,) and
    seqused_k (B,) int32: the module docstring. Differentiable in q, k, v and sinks through
    `sdpa_varlen_backward` (lse is not differentiable)."""
    op = "sdpa_varlen"
    check_fallback(op, fallback)
    _check_causal(op, causal)
    window = _window(op, causal, window_left, window_right)
    features = _features(op, q, softcap, sinks, seqused_k, packed=True)
    if fallback == "torch" and not on_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k):
        note_fallback(op, f"inputs on {q.device}")
        return reference.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, window, softcap, sinks,
                                        seqused_k)
    if sinks is not None:
        features["sinks"] = sinks.detach()
    try:
        with device_guard(q):
            return _entry(op)(*detached(q, k, v, cu_seqlens_q, cu_seqlens_k), max_seqlen_q, max_seqlen_k,
                              causal=causal, scale=scale, window_size=window, kernel=rung, **features)
    except UNSUPPORTED as err:
        if fallback != "torch":
            raise_unsupported(op, err)
        note_fallback(op, str(err))
        return reference.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, window, softcap, sinks,
                                        seqused_k)


def _check_packed(op: str, q, k, v) -> None:
    if not (q.dim() == k.dim() == v.dim() == 3):
        raise ValueError(f"cute_kernels.{op}: q, k, v must be 3-D (total_tokens, heads, head_dim), got "
                         f"{q.dim()}-D, {k.dim()}-D, {v.dim()}-D")


@sdpa_varlen.register_fake
def _sdpa_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=None, scale=None,
                      window_left=-1, window_right=-1, rung="auto", fallback="none", softcap=None, sinks=None,
                      seqused_k=None):
    _check_causal("sdpa_varlen", causal)
    _window("sdpa_varlen", causal, window_left, window_right)
    _check_packed("sdpa_varlen", q, k, v)
    _features("sdpa_varlen", q, softcap, sinks, seqused_k, packed=True)
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


_VARLEN_OPTIONS = ("causal", "scale", "window_left", "window_right", "rung", "fallback", "softcap")


def _sdpa_varlen_setup(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *options, sinks, seqused_k = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # None, not a zeros fill, for lse's gradient
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks, seqused_k)
    ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
    ctx.options = dict(zip(_VARLEN_OPTIONS, options))


def _sdpa_varlen_grad(ctx, grad_out, grad_lse):
    if grad_out is None:
        return (None,) * (9 + len(_VARLEN_OPTIONS))
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks, seqused_k = ctx.saved_tensors
    dq, dk, dv = sdpa_varlen_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens,
                                      **ctx.options, sinks=sinks, seqused_k=seqused_k)
    dsinks = None
    if sinks is not None and ctx.needs_input_grad[-2]:
        dsinks = sinks_gradient(grad_out, out, lse, sinks, packed=True)
    return dq, dk, dv, *([None] * (4 + len(_VARLEN_OPTIONS))), dsinks, None


# ---- sdpa_varlen_backward ------------------------------------------------------------------------

@torch.library.custom_op("cute_kernels::sdpa_varlen_backward", mutates_args=(), tags=HOST_READ_TAGS)
def sdpa_varlen_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                         cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                         causal: Optional[str] = None, scale: Optional[float] = None, window_left: int = -1,
                         window_right: int = -1, rung: str = "auto", fallback: str = "none",
                         softcap: Optional[float] = None, sinks: Optional[Tensor] = None,
                         seqused_k: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of `sdpa_varlen`'s out given its (out (Tq, Hq, Dv), lse (Hq, Tq)); contiguous,
    shaped and typed as q, k, v (see `attention_reference.varlen_backward`); the features as the
    forward took them. Raises NotImplementedError naming the missing kernel when no varlen
    backward exists for the input."""
    op = "sdpa_varlen_backward"
    check_fallback(op, fallback)
    _check_causal(op, causal)
    window = _window(op, causal, window_left, window_right)
    features = _features(op, q, softcap, sinks, seqused_k, packed=True)
    ref_args = (causal, scale, window, softcap, sinks, seqused_k)
    if fallback == "torch" and not on_cuda(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k):
        note_fallback(op, f"inputs on {q.device}")
        return reference.varlen_backward(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, *ref_args)
    if sinks is not None:
        features["sinks"] = sinks.detach()
    try:
        with device_guard(q):
            grads = _entry(op)(*detached(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k), max_seqlen_q,
                               max_seqlen_k, causal=causal, scale=scale, window_size=window, kernel=rung, **features)
    except UNSUPPORTED as err:
        if fallback != "torch":
            raise_unsupported(op, err)
        note_fallback(op, str(err))
        return reference.varlen_backward(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, *ref_args)
    return tuple(g.contiguous() for g in grads[:3])


@sdpa_varlen_backward.register_fake
def _sdpa_varlen_backward_fake(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal=None, scale=None, window_left=-1, window_right=-1, rung="auto",
                               fallback="none", softcap=None, sinks=None, seqused_k=None):
    _check_causal("sdpa_varlen_backward", causal)
    _window("sdpa_varlen_backward", causal, window_left, window_right)
    _check_packed("sdpa_varlen_backward", q, k, v)
    _features("sdpa_varlen_backward", q, softcap, sinks, seqused_k, packed=True)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


sdpa_varlen.register_autograd(_sdpa_varlen_grad, setup_context=_sdpa_varlen_setup)


# ---- paged_decode --------------------------------------------------------------------------------

@torch.library.custom_op("cute_kernels::paged_decode", mutates_args=())
def paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seqlens_k: Tensor,
                 scale: Optional[float] = None, rung: str = "auto", fallback: str = "none") -> Tensor:
    """out (B, Hq, Dv): one query token q (B, Hq, D) per sequence over a paged KV cache
    k_cache (pages, page_size, Hkv, D), v_cache (pages, page_size, Hkv, Dv), int32
    block_table (B, max_pages), seqlens_k (B,) (see `attention_reference.paged_decode`)."""
    check_fallback("paged_decode", fallback)
    if fallback == "torch" and not on_cuda(q, k_cache, v_cache, block_table, seqlens_k):
        note_fallback("paged_decode", f"inputs on {q.device}")
        return reference.paged_decode(q, k_cache, v_cache, block_table, seqlens_k, scale)
    try:
        with device_guard(q):
            return _entry("paged_decode")(*detached(q, k_cache, v_cache, block_table, seqlens_k), scale=scale,
                                          kernel=rung)
    except UNSUPPORTED as err:
        if fallback != "torch":
            raise_unsupported("paged_decode", err)
        note_fallback("paged_decode", str(err))
        return reference.paged_decode(q, k_cache, v_cache, block_table, seqlens_k, scale)


@paged_decode.register_fake
def _paged_decode_fake(q, k_cache, v_cache, block_table, seqlens_k, scale=None, rung="auto", fallback="none"):
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(f"cute_kernels.paged_decode: q must be 3-D (B, Hq, D) and the caches 4-D (pages, page_size, "
                         f"Hkv, D), got {q.dim()}-D, {k_cache.dim()}-D, {v_cache.dim()}-D")
    return q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1]))
