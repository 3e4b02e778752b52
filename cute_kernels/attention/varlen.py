"""`attention_varlen_forward` / `attention_varlen_backward`: attention over a batch of sequences
packed end to end, and its gradients.

Sequence b holds rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q (Tq, Hq, D) and rows
[cu_seqlens_k[b], cu_seqlens_k[b+1]) of k (Tk, Hkv, D), v (Tk, Hkv, Dv) (FlashAttention's
`flash_attn_varlen_func` layout). Each sequence is attended on its own, exactly as
`attention_forward` would on that sequence alone; the kernels (the varlen launches of
`sm90_flash`, "auto"'s choice on Hopper, and `sm80_flash`) run one CTA per (q tile of
max_seqlen_q, query head, sequence) and read their sequence's offsets from cu_seqlens on the
device; `sm90_flash` launches the sequences longest first and reads them through ragged tensor
maps (`attention.ragged`). The backward is `sm90_flash`'s on Hopper (`sm80_flash`'s elsewhere,
and for `seqused_k` or `deterministic=True`).

Causal alignment is per sequence and named, as in `attention_forward`: "top_left" (row i sees
keys j <= i) or "bottom_right" (j <= i + Sk_b - Sq_b, FlashAttention's varlen convention, where
Sk_b, Sq_b are that sequence's lengths). Rows that see no key give out 0 and lse -inf. A
sliding window (`window_size=(left, right)`, -1 unbounded) is also per sequence: row i of
sequence b sees keys i + base_b - left <= j <= i + base_b + right, base_b = Sk_b - Sq_b unless
the mask is top-left causal (`mask_rule`).

Paged keys (`page_table`, prefill and chunked prefill over a paged KV cache, FlashAttention-4's
layout): `paged_prefill`.

Score features (`features`): softcap and sinks (Hq,) as in `attention_forward`, and
`seqused_k` (B,) int32: sequence b attends to the first seqused_k[b] keys of its cu_seqlens_k
rows (its Sk_b, alignment included), so a padded batch packed as equal-stride sequences needs
no unpadding of its keys.

The offsets are validated on the host before the launch (one small device-to-host copy): a
max_seqlen_q below a real length would leave rows unwritten, so it is refused, never trusted.
seqused_k is checked in the same copy (0 <= seqused_k[b] <= that sequence's cu_seqlens_k length),
and the rungs plan their launch from the values read (`HostOffsets`). The validated offsets are
kept per (cu_seqlens_q, cu_seqlens_k, seqused_k) tensor objects while their contents last
(`runtime.TensorMemo`: a weak reference and the version counter confirm each): a model hands
every layer the same ones, so only the first call reads the device and waits for it. Contents
written behind torch's back (a raw-pointer kernel, a CUDA graph replay into them) are not seen:
pass fresh tensors, or write them with torch ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cute_kernels.runtime import unverified
from cute_kernels.runtime.plan_cache import PlanCache, WarmCache, memo, plain_tensors, tensor_signature
from cute_kernels.runtime.tensor_memo import TensorMemo

from .api import _CAUSAL, AttentionProblem
from .features import check_sinks, check_softcap, sinks_gradient
from .mask_rule import canonical_window

__all__ = ["attention_varlen_forward", "attention_varlen_backward", "check_varlen_inputs", "checked_varlen_inputs",
           "HostOffsets"]

_WHO = "attention_varlen_forward"


def _check_cu(cu, name: str, total: int, max_seqlen: int, max_name: str, who: str = _WHO, values=None) -> list[int]:
    """cu's values, checked (`seqlen_info.check_cu_seqlens`, and no sequence longer than
    max_seqlen); `values`: cu's values already read to the host (`_host_values`)."""
    import torch

    from .seqlen_info import check_cu_seqlens

    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32 or cu.dim() != 1:
        raise ValueError(f"{who}: {name} must be a 1-D int32 tensor, got {cu.dim()}-D {cu.dtype}")
    if not cu.is_contiguous():
        raise ValueError(f"{who}: {name} must be contiguous")
    values = check_cu_seqlens(cu.cpu() if values is None else values, total, what=f"{who}: {name}")
    longest = max(b - a for a, b in zip(values, values[1:]))
    if longest > max_seqlen:
        raise ValueError(f"{who}: {max_name} = {max_seqlen} but {name} holds a sequence of length {longest}")
    return values


def _host_values(*tensors) -> list:
    """The values of each 1-D int32 tensor (None passes through) as a list, read to the host
    in one device-to-host copy (each copy waits for the queue: one wait, not three). A tensor
    passed twice (self-attention's cu_seqlens) is read once. Anything else than a contiguous
    1-D int32 tensor of one common device is left for the checks to name (None here)."""
    import torch

    distinct = []
    for t in tensors:
        if t is not None and all(t is not d for d in distinct):
            distinct.append(t)
    if not distinct or not all(isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.dim() == 1
                               and t.is_contiguous() and t.device == distinct[0].device for t in distinct):
        return [None] * len(tensors)
    flat = (distinct[0] if len(distinct) == 1 else torch.cat(distinct)).tolist()
    read, start = {}, 0
    for t in distinct:
        read[id(t)] = flat[start:start + t.numel()]
        start += t.numel()
    return [None if t is None else read[id(t)] for t in tensors]


def _check_given(given: dict, q, v, who: str) -> None:
    """out and dout (Tq, Hq, Dv) in q's dtype, lse (Hq, Tq) fp32. Their strides are free (an
    autograd output gradient may be expanded): rungs copy what their loads cannot read."""
    import torch

    want = {"out": ((q.shape[0], q.shape[1], v.shape[2]), q.dtype),
            "dout": ((q.shape[0], q.shape[1], v.shape[2]), q.dtype),
            "lse": ((q.shape[1], q.shape[0]), torch.float32)}
    for name, t in given.items():
        shape, dtype = want[name]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{who}: {name} must be a {shape} {dtype} tensor (as attention_varlen_forward returns "
                             f"it), got {tuple(t.shape)} {t.dtype}")


def _check_seqused(seqused_k, cu_k: list[int], device, who: str, values=None) -> list[int]:
    """seqused_k: a (B,) int32 tensor on the inputs' device, each 0 <= used <= its capacity;
    returns its values (`values`: already read to the host)."""
    import torch

    batch = len(cu_k) - 1
    if not isinstance(seqused_k, torch.Tensor):
        raise TypeError(f"{who}: seqused_k must be a torch.Tensor or None, got {type(seqused_k).__name__}")
    if seqused_k.dtype != torch.int32 or tuple(seqused_k.shape) != (batch,):
        raise ValueError(f"{who}: seqused_k must be a ({batch},) int32 tensor (one key count per sequence), got "
                         f"{tuple(seqused_k.shape)} {seqused_k.dtype}")
    if seqused_k.device != device:
        raise ValueError(f"{who}: seqused_k is on {seqused_k.device} but the inputs are on {device}")
    if not seqused_k.is_contiguous():
        raise ValueError(f"{who}: seqused_k must be contiguous")
    values = seqused_k.tolist() if values is None else values
    for b, used in enumerate(values):
        room = cu_k[b + 1] - cu_k[b]
        if not 0 <= used <= room:
            raise ValueError(f"{who}: seqused_k[{b}] = {used} but sequence {b} has {room} key rows in cu_seqlens_k")
    return values


@dataclass(frozen=True)
class HostOffsets:
    """The validated offsets as the host read them (`checked_varlen_inputs`, one copy): a rung
    plans its launch from them (`sm90_flash`'s launch order) without reading the device again."""

    cu_q: tuple[int, ...]
    cu_k: tuple[int, ...]
    seqused_k: tuple[int, ...] | None


def check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, scale,
                        window_size=None, who: str = _WHO, given=None, softcap=None, sinks=None,
                        seqused_k=None) -> AttentionProblem:
    """Validate the packed inputs; return the problem (batch = number of sequences, seqlen_q/k
    = max_seqlen_q/k, the window canonical as in `api.check_inputs`). Raises TypeError/ValueError
    naming the offending argument; `who` names the entry point in the messages. `given`: the
    backward's forward results and output gradient, {name: tensor} of "out", "dout", "lse",
    checked against the shapes the forward returns. Devices are checked last, so every other
    error is reported the same on CPU tensors."""
    return checked_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                 scale=scale, window_size=window_size, who=who, given=given, softcap=softcap,
                                 sinks=sinks, seqused_k=seqused_k)[0]


def checked_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, scale,
                          window_size=None, who: str = _WHO, given=None, softcap=None, sinks=None,
                          seqused_k=None) -> tuple[AttentionProblem, HostOffsets]:
    """`check_varlen_inputs`, also returning the offsets it read (`HostOffsets`)."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{who}: {name} must be 3-D (total_tokens, heads, head_dim), got shape {tuple(t.shape)}")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{who}: {name} must have a contiguous head dim (stride 1), got strides {t.stride()}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise TypeError(f"{who}: q, k, v must share a floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    (tq, hq, d), (tk, hk, dk), (tv, hv, dv) = q.shape, k.shape, v.shape
    if dk != d:
        raise ValueError(f"{who}: q head dim {d} differs from k head dim {dk}")
    if (tv, hv) != (tk, hk):
        raise ValueError(f"{who}: k {tuple(k.shape)} and v {tuple(v.shape)} differ in tokens or heads")
    if hk == 0 or hq % hk:
        raise ValueError(f"{who}: query heads ({hq}) must be a multiple of key/value heads ({hk})")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{who}: {name} must be a non-negative int, got {n!r}")
    if causal not in _CAUSAL:
        raise ValueError(f"{who}: causal must be one of {_CAUSAL}, got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    elif not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError(f"{who}: scale must be a real number or None, got {type(scale).__name__}")
    causal, left, right = canonical_window(window_size, causal, who)
    softcap = check_softcap(softcap, who)
    check_sinks(sinks, hq, q, who)
    given = given or {}
    _check_given(given, q, v, who)
    devices = {t.device for t in (q, k, v, cu_seqlens_q, cu_seqlens_k, *given.values()) if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"{who}: inputs are on different devices {sorted(map(str, devices))}")
    offsets = _OFFSETS.get((cu_seqlens_q, cu_seqlens_k, seqused_k), (tq, tk, max_seqlen_q, max_seqlen_k, q.device),
                           lambda: _checked_offsets(cu_seqlens_q, cu_seqlens_k, seqused_k, tq, tk, max_seqlen_q,
                                                    max_seqlen_k, q.device, who))
    _require_cuda(q, who)
    problem = AttentionProblem(len(offsets.cu_q) - 1, hq, hk, max_seqlen_q, max_seqlen_k, d, dv, q.dtype, causal,
                               float(scale), left, right, softcap, sinks is not None, seqused_k is not None)
    return problem, offsets


def _require_cuda(q, who: str) -> None:
    """ValueError unless q is on a CUDA device (the host-path tests stand in for it on CPU)."""
    if q.device.type != "cuda":
        raise ValueError(f"{who}: tensors are on '{q.device}'; the cute_kernels attention kernels run on CUDA "
                         "devices only")


# The offsets validated per (cu_seqlens_q, cu_seqlens_k, seqused_k) objects while their contents
# last: a model's layers (and its backward) hand the same ones, read to the host once.
_OFFSETS = TensorMemo("attention.varlen.offsets", 8)


def _checked_offsets(cu_seqlens_q, cu_seqlens_k, seqused_k, tq: int, tk: int, max_seqlen_q: int, max_seqlen_k: int,
                     device, who: str) -> HostOffsets:
    """The offsets read to the host (one copy) and checked against the packed tensors' rows and
    the max_seqlen bounds; raises ValueError/TypeError naming the first violation."""
    host_q, host_k, host_used = _host_values(cu_seqlens_q, cu_seqlens_k, seqused_k)
    cu_q = _check_cu(cu_seqlens_q, "cu_seqlens_q", tq, max_seqlen_q, "max_seqlen_q", who, host_q)
    cu_k = _check_cu(cu_seqlens_k, "cu_seqlens_k", tk, max_seqlen_k, "max_seqlen_k", who, host_k)
    if len(cu_q) != len(cu_k):
        raise ValueError(f"{who}: cu_seqlens_q has {len(cu_q) - 1} sequences but cu_seqlens_k has {len(cu_k) - 1}")
    used = None if seqused_k is None else _check_seqused(seqused_k, cu_k, device, who, host_used)
    return HostOffsets(tuple(cu_q), tuple(cu_k), None if used is None else tuple(used))


def attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                             causal: str | None = None, scale=None, window_size=None, kernel: str = "auto",
                             out=None, lse=None, softcap=None, sinks=None, seqused_k=None, page_table=None):
    """(out (Tq, Hq, Dv) in q's dtype, lse (Hq, Tq) fp32 natural log): per sequence b,
    attention_forward of its rows (module docstring), GQA when Hq > Hkv (query head h reads
    key/value head h // (Hq / Hkv)). window_size: None or (left, right), -1 unbounded (module
    docstring). softcap, sinks (Hq,), seqused_k (B,) int32: `features` (the module docstring).
    page_table (B, max_pages) int32: k and v are a paged cache (num_pages, page_size, Hkv, D)
    and cu_seqlens_k is None (`paged_prefill`: FlashAttention-4's varlen paged layout).
    kernel: "auto" or a rung with a varlen launch. Forward only (`attention_varlen_backward` is
    the gradient; `cute_kernels.ops.sdpa_varlen` is the differentiable op).
    out, lse: optional preallocated contiguous results, overwritten entirely."""
    import torch

    from .api import _result
    from .dispatch import resolve
    from .registry import KERNELS

    if page_table is not None:
        from .paged_prefill import check_page_table, packed_keys

        if cu_seqlens_k is not None:
            raise ValueError(f"{_WHO}: with page_table the key lengths come from seqused_k (or the whole table); "
                             "pass cu_seqlens_k=None")
        if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1:
            raise ValueError(f"{_WHO}: cu_seqlens_q must be a 1-D int32 tensor")
        lengths = check_page_table(page_table, k, v, cu_seqlens_q.shape[0] - 1, seqused_k, _WHO)
        if not isinstance(max_seqlen_k, int) or isinstance(max_seqlen_k, bool) or max_seqlen_k < 0:
            raise ValueError(f"{_WHO}: max_seqlen_k must be a non-negative int, got {max_seqlen_k!r}")
        if lengths and max(lengths) > max_seqlen_k:
            b = lengths.index(max(lengths))
            raise ValueError(f"{_WHO}: max_seqlen_k = {max_seqlen_k} but sequence {b} uses {lengths[b]} keys of the "
                             "paged cache (seqused_k, or its whole page_table row)")
        k, v, cu_seqlens_k = packed_keys(k, v, page_table, lengths)
        seqused_k = None

    problem, offsets = checked_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                             causal=causal, scale=scale, window_size=window_size, softcap=softcap,
                                             sinks=sinks, seqused_k=seqused_k)
    out = _result(out, "out", (q.shape[0], q.shape[1], v.shape[2]), q.dtype, q.device, False)
    lse = _result(lse, "lse", (q.shape[1], q.shape[0]), torch.float32, q.device, False)
    if lse.numel() == 0:
        return out, lse
    if max_seqlen_k == 0:
        out.zero_()
        if sinks is None:
            lse.fill_(-math.inf)
        else:
            lse.copy_(sinks.to(torch.float32)[:, None].expand(lse.shape))
        return out, lse
    # The rung checks strides and sizes on the (1, H, T, D) views the kernel runs on; "auto"
    # picks among the rungs that have a varlen launch.
    views = [t.permute(1, 0, 2).unsqueeze(0) for t in (q, k, v)]
    with_varlen = {name: KERNELS[name] for name in KERNELS if hasattr(KERNELS[name], "varlen")}
    if kernel != "auto" and kernel in KERNELS and kernel not in with_varlen:
        raise ValueError(f"attention kernel {kernel!r} has no varlen launch; varlen kernels: {list(with_varlen)}")
    rung = resolve(kernel, *views, problem, registry=with_varlen)
    # The features reach only rungs that declared them (`supports`), so others see the old call.
    extra = {name: t for name, t in (("sinks", sinks), ("seqused_k", seqused_k)) if t is not None}
    return rung.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, out, lse, problem, offsets=offsets, **extra)


def attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                              max_seqlen_k: int, *, causal: str | None = None, scale=None, window_size=None,
                              kernel: str = "auto", deterministic: bool | None = None, softcap=None, sinks=None,
                              seqused_k=None, page_table=None):
    """(dq (Tq, Hq, D), dk (Tk, Hkv, D), dv (Tk, Hkv, Dv)), shaped and typed as q, k, v: the
    gradients of `attention_varlen_forward`'s out for the output gradient `dout` (Tq, Hq, Dv),
    given that forward's `out` and `lse` (Hq, Tq) and the same cu_seqlens, max_seqlen,
    causal/scale/window_size/kernel arguments. With GQA, dk and dv sum over the query heads
    sharing each key/value head. Every argument is checked, and the rung's backward is asked
    whether it takes the problem, before any launch: NotImplementedError names the reason when
    no rung has a varlen backward (`varlen_backward`) for it. With sinks: (dq, dk, dv, dsinks),
    dsinks shaped and typed as sinks (`features.sinks_gradient`).

    deterministic: True asks for bitwise-reproducible gradients (passed to rungs whose
    `varlen_backward` takes the option); None follows `torch.are_deterministic_algorithms_enabled()`."""
    import torch

    who = "attention_varlen_backward"
    if page_table is not None:
        raise NotImplementedError(f"{who}: page_table: the paged-KV backward is not implemented; gather the keys "
                                  "(`attention.paged_prefill.packed_keys`, differentiable) and pass them packed")
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    tensors = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    sig = None
    if sinks is None and seqused_k is None and unverified.enabled("varlen_backward_plan"):
        sig = _backward_signature(tensors, max_seqlen_q, max_seqlen_k, causal, scale, window_size, kernel,
                                  deterministic, softcap)
        plan = None if sig is None else _BACKWARD_PLANS.get(sig)
        if plan is not None:
            return plan(*tensors)
    problem, offsets = checked_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                             causal=causal, scale=scale, window_size=window_size, who=who,
                                             given={"out": out, "dout": dout, "lse": lse}, softcap=softcap,
                                             sinks=sinks, seqused_k=seqused_k)
    if q.shape[0] * q.shape[1] == 0 or max_seqlen_k == 0:
        # No query row or no key: out does not depend on q, k, v.
        grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v))
    else:
        rung = _backward_rung(kernel, q, k, v, problem, who)
        options = {"deterministic": True} if deterministic and _accepts(rung.varlen_backward, "deterministic") else {}
        if _accepts(rung.varlen_backward, "offsets"):
            options["offsets"] = offsets
        if seqused_k is not None:
            options["seqused_k"] = seqused_k
        grads = tuple(rung.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, problem, **options))
        replay = None if sig is None else _backward_replay(rung, problem, bool(options.get("deterministic")),
                                                           tensors[:6], (max_seqlen_q, max_seqlen_k), who)
        if replay is not None:
            _BACKWARD_PLANS.put(sig, replay)
    if sinks is not None:
        grads = (*grads, sinks_gradient(dout, out, lse, sinks, packed=True))
    return grads


# signature -> replay of warm `attention_varlen_backward` calls (the unverified path
# `varlen_backward_plan`).
_BACKWARD_PLANS = PlanCache("attention.varlen_backward")


def _backward_signature(tensors, *options):
    """The plan key of an `attention_varlen_backward` call, or None: each tensor's
    `tensor_signature` (cu_seqlens' shapes fix the number of sequences) and every other argument
    by class and value. What the offsets hold is not in it: a replay gets them checked from
    `_OFFSETS`, which reads them again when their contents change."""
    if not plain_tensors(*tensors):
        return None
    try:
        key = (*map(tensor_signature, tensors), *((o.__class__, o) for o in options))
        hash(key)
    except (TypeError, RuntimeError):
        return None
    return key


def _backward_replay(rung, problem, deterministic: bool, tensors: tuple, max_seqlens: tuple, who: str):
    """What a warm `attention_varlen_backward` call runs, or None where the rung keeps no replay
    (`varlen_backward_plan`): the offsets checked (`_OFFSETS`, as `checked_varlen_inputs` keeps
    them), then the rung's replay. The signature it is stored under fixes every layout and which
    tensors require grad."""
    plan_for = getattr(rung, "varlen_backward_plan", None)
    fast = None if plan_for is None else plan_for(*(t.detach() for t in tensors), problem,
                                                  deterministic=deterministic)
    if fast is None:
        return None
    detach = any(t.requires_grad for t in tensors)
    rows = (tensors[1].shape[0], tensors[2].shape[0], *max_seqlens, tensors[1].device)
    max_k = max_seqlens[1]

    def replay(dout, q, k, v, out, lse, cu_q, cu_k):
        offsets = _OFFSETS.get((cu_q, cu_k, None), rows, lambda: _checked_offsets(cu_q, cu_k, None, *rows, who))
        if detach:
            dout, q, k, v, out, lse = (t.detach() for t in (dout, q, k, v, out, lse))
        return fast(dout, q, k, v, out, lse, cu_q, cu_k, max_k, offsets)

    return replay


def _accepts(fn, name: str) -> bool:
    """Whether `fn` (a rung's bound method) has a parameter `name`; remembered per function."""
    key = (getattr(fn, "__func__", fn), name)
    known = _ACCEPTS.get(key)
    if known is None:
        import inspect

        known = _ACCEPTS[key] = name in inspect.signature(fn).parameters
    return known


_ACCEPTS: dict = {}


def _varlen_backward_reason(rung, problem) -> str | None:
    """Why `rung`'s varlen backward does not take `problem`, or None: its own
    `supports_varlen_backward` where it has one, else its `supports_backward`."""
    check = getattr(rung, "supports_varlen_backward", None) or getattr(rung, "supports_backward", None)
    return None if check is None else check(problem)


# (kernel, problem, device, capability function, q/k/v strides and 16-byte alignment) -> the
# rung: what `_varlen_backward_rung` decides on, so a model's layers and steps ask it once.
# A plan cache: `dispatch.clear_cache` (a rung added or reloaded) forgets it.
_BACKWARD_RUNGS = WarmCache("attention.varlen.backward_rungs", 64, kind="plan")


def _backward_rung(kernel: str, q, k, v, problem, who: str):
    """`_varlen_backward_rung` for the (T, H, D) tensors, remembered (`_BACKWARD_RUNGS`)."""
    from .dispatch import device_capability

    key = (kernel, problem, q.device, device_capability,
           *((t.stride(), t.data_ptr() % 16) for t in (q, k, v)))
    return memo(_BACKWARD_RUNGS, key, lambda: _varlen_backward_rung(
        kernel, [t.permute(1, 0, 2).unsqueeze(0) for t in (q, k, v)], problem, who))


def _varlen_backward_rung(kernel: str, views, problem, who: str):
    """The rung whose `varlen_backward` runs: the named one, or for "auto" the highest rung
    with a varlen backward that takes the problem (its `supports` and `supports_varlen_backward`
    or `supports_backward`).
    NotImplementedError where no rung has one for it; ValueError for an unknown name or a
    rung whose forward does not take the problem (`dispatch.resolve`)."""
    from .dispatch import resolve
    from .registry import KERNELS

    with_bwd = {name: KERNELS[name] for name in KERNELS if hasattr(KERNELS[name], "varlen_backward")}
    if kernel != "auto" and kernel in KERNELS and kernel not in with_bwd:
        raise NotImplementedError(f"{who}: attention kernel {kernel!r} has no varlen backward (varlen_backward); "
                                  f"kernels with one: {list(with_bwd)}")
    if not with_bwd:
        raise NotImplementedError(f"{who}: no attention kernel has a varlen backward (a rung's varlen_backward) yet")
    reasons = {name: _varlen_backward_reason(rung, problem) for name, rung in with_bwd.items()}
    able = {name: rung for name, rung in with_bwd.items() if reasons[name] is None}
    if kernel in reasons and reasons[kernel] is not None:
        raise NotImplementedError(f"{who}: the {kernel} backward does not take this problem: {reasons[kernel]}")
    if kernel == "auto" and not able:
        detail = "; ".join(f"{name}: {why}" for name, why in reasons.items())
        raise NotImplementedError(f"{who}: no varlen backward takes this problem ({problem.describe()}): {detail}")
    return resolve(kernel, *views, problem, registry=able if kernel == "auto" or kernel in able else KERNELS)
