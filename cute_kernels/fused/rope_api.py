"""Torch entry points of the RoPE kernel: `rotary(q, k, cos, sin, ...)` (new tensors) and
`apply_rotary_` (in place on both).

q and k are (B, S, H, D) (`layout="bshd"`) or (B, H, S, D) (`layout="bhsd"`, taken as a permuted
view: no copy), any strides with the head dim contiguous; k may have fewer heads (GQA) but the
same B, S and D. cos and sin are (P, R/2) tables (R = rotary_dim <= D; fp32 or q's dtype, last
dim contiguous). Positions: `position_ids` (B, S) integers, or `offset + s` (the KV-cache case).
Position ids are checked against P on the device (one sync; `check_positions=False` skips it, as
does CUDA graph capture); unchecked, an out-of-range position gives NaN (never a read out of bounds).
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.plan_cache import PlanCache, plain_tensors, tensor_signature

from .host import check_same_device, check_tensor, compile_tvm_ffi, dtype_name, nograd

__all__ = ["apply_rotary_", "rotary", "LAYOUTS", "rotary_tables"]

LAYOUTS = ("bshd", "bhsd")
_PLANS = PlanCache("fused.rope")
_POSITIONS = (torch.int64, torch.int32)


def rotary_tables(positions: int, rotary_dim: int, base: float = 10000.0, *, device=None, dtype=torch.float32):
    """(cos, sin) of shape (positions, rotary_dim / 2): angle p * base^(-2i / rotary_dim), the
    standard RoPE frequencies (computed in float64, stored in `dtype`)."""
    inv = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    angles = torch.arange(positions, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _bshd(t, layout):
    return t if layout == "bshd" else t.transpose(1, 2)


def _vec(x_tensors, tables, rotary_dim, interleaved) -> int:
    """Pairs per vector every tensor allows (16-byte accesses of x at most; see dispatch.rope_tiling)."""
    half = rotary_dim // 2
    eb = x_tensors[0].element_size()
    vec = 16 // eb
    while vec > 1 and half % vec:
        vec //= 2
    for t in x_tensors:
        per = 2 if interleaved else 1
        while vec > 1 and (any(s % (vec * per) for s in t.stride()[:3])
                           or t.data_ptr() % min(16, vec * per * eb)):
            vec //= 2
        if not interleaved:
            while vec > 1 and (t.data_ptr() + half * eb) % min(16, vec * eb):
                vec //= 2
    for t in tables:
        while vec > 1 and (t.stride(0) % vec or t.data_ptr() % min(16, vec * t.element_size())):
            vec //= 2
    return vec


def _check(op, q, k, cos, sin, position_ids, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"{op}: layout must be one of {LAYOUTS}, got {layout!r}")
    for name, t in (("q", q), ("k", k)):
        check_tensor(op, name, t, ndim=4)
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name}'s head dimension must be contiguous (stride 1), got strides {t.stride()}")
    if k.dtype != q.dtype:
        raise TypeError(f"{op}: q has dtype {q.dtype} but k has {k.dtype}")
    qb, kb = _bshd(q, layout), _bshd(k, layout)
    if qb.shape[0] != kb.shape[0] or qb.shape[1] != kb.shape[1] or qb.shape[3] != kb.shape[3]:
        raise ValueError(f"{op}: q {tuple(q.shape)} and k {tuple(k.shape)} must share batch, sequence and head dim "
                         f"(layout {layout!r})")
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(op, name, t, ndim=2)
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name}'s last dimension must be contiguous")
    if cos.shape != sin.shape or cos.dtype != sin.dtype:
        raise ValueError(f"{op}: cos {tuple(cos.shape)} {cos.dtype} and sin {tuple(sin.shape)} {sin.dtype} differ")
    if cos.dtype not in (torch.float32, q.dtype):
        raise TypeError(f"{op}: the tables must be float32 or q's dtype {q.dtype}, got {cos.dtype}")
    rotary = 2 * cos.shape[1]
    if rotary > qb.shape[3] or cos.shape[1] < 1:
        raise ValueError(f"{op}: tables of {cos.shape[1]} pairs (rotary_dim {rotary}) do not fit head dim "
                         f"{qb.shape[3]}")
    if position_ids is not None:
        check_tensor(op, "position_ids", position_ids, dtypes=_POSITIONS, ndim=2)
        if tuple(position_ids.shape) != (qb.shape[0], qb.shape[1]):
            raise ValueError(f"{op}: position_ids has shape {tuple(position_ids.shape)}, expected (batch, seq) = "
                             f"{(qb.shape[0], qb.shape[1])}")
    check_same_device(op, {"q": q, "k": k, "cos": cos, "sin": sin, "position_ids": position_ids})


def apply_rotary_(q, k, cos, sin, *, position_ids=None, offset: int = 0, interleaved: bool = False,
                  layout: str = "bshd", inverse: bool = False, check_positions: bool = True):
    """Rotate q and k in place (`cute_kernels.fused.rope` for the formula); returns (q, k).
    `inverse` rotates by minus the angle (the gradient of a rotation)."""
    return rotary(q, k, cos, sin, position_ids=position_ids, offset=offset, interleaved=interleaved, layout=layout,
                  inverse=inverse, check_positions=check_positions, inplace=True)


def rotary(q, k, cos, sin, *, position_ids=None, offset: int = 0, interleaved: bool = False, layout: str = "bshd",
           inverse: bool = False, check_positions: bool = True, inplace: bool = False):
    """(q', k'): q and k rotated, into new tensors (laid out like q and k; features past the
    rotary dim copied) or, with `inplace`, into q and k themselves."""
    sig = None
    if plain_tensors(q, k, cos, sin, position_ids):
        try:
            sig = (bool(interleaved), layout, bool(inverse), bool(check_positions), bool(inplace), tensor_signature(q),
                   tensor_signature(k), tensor_signature(cos), tensor_signature(sin),
                   None if position_ids is None else tensor_signature(position_ids))
            plan = _PLANS.get(sig)
        except TypeError:
            plan = sig = None
        if plan is not None:
            return plan(q, k, cos, sin, position_ids, offset)
    op = "cute_kernels.fused.rotary" + ("_ (in place)" if inplace else "")
    _check(op, q, k, cos, sin, position_ids, layout)
    from .dispatch import rope_tiling
    from .rope import Rope, RopeConfig, kernel_args

    rotary_dim = 2 * cos.shape[1]
    head_dim = q.shape[-1]
    make = (lambda t: t) if inplace else (lambda t: torch.empty_like(t))
    qo, ko = make(q), make(k)
    vec = _vec([_bshd(t, layout) for t in (q, k, qo, ko)], [cos, sin], rotary_dim, interleaved)
    tiling = rope_tiling(rotary_dim, dtype_name(q.dtype), dtype_name(cos.dtype), interleaved=interleaved, vec=vec)
    config = RopeConfig(tiling, dtype_name(q.dtype), dtype_name(cos.dtype), rotary_dim, interleaved,
                        None if position_ids is None else str(position_ids.dtype).removeprefix("torch."), inverse)
    fn = compile_tvm_ffi(Rope(config), kernel_args(config), ("fused.rope", config))
    do_check = check_positions and position_ids is not None
    table_rows = cos.shape[0]
    first = (qo, ko)

    def plan(q, k, cos, sin, position_ids, offset):
        nonlocal first
        if do_check and position_ids.numel() and not (position_ids.is_cuda and torch.cuda.is_current_stream_capturing()):
            if bool(((position_ids < 0) | (position_ids >= table_rows)).any()):
                raise ValueError(f"{op}: a position id is outside [0, {table_rows}) (the tables' rows)")
        if first is not None:  # the outputs made while planning (their strides fixed the vector width)
            qo, ko = first
            first = None
        else:
            qo, ko = make(q), make(k)
        if not inplace and rotary_dim < head_dim:
            qo[..., rotary_dim:] = q[..., rotary_dim:]
            ko[..., rotary_dim:] = k[..., rotary_dim:]
        pos = position_ids
        if pos is not None and pos.stride(-1) != 1:
            pos = pos.contiguous()
        qb, kb = _bshd(q, layout), _bshd(k, layout)
        if qb.numel() and kb.numel():
            fn(nograd(qb), nograd(kb), nograd(_bshd(qo, layout)), nograd(_bshd(ko, layout)), nograd(cos), nograd(sin),
               pos, int(offset))
        elif qb.numel() or kb.numel():
            raise ValueError(f"{op}: q or k has no heads; pass both with at least one head")
        return qo, ko

    if sig is not None:
        _PLANS.put(sig, plan)
    return plan(q, k, cos, sin, position_ids, offset)
