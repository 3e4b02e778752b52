"""`matmul`: torch.matmul semantics on the GEMM ladder.

`matmul` checks its arguments (types, ranks, dtypes, shapes, strides, devices) and raises a
clear error before anything launches, normalizes the operands to the 3-D views every rung takes
(a: (L, M, K), b: (L, K, N), out: (L, M, N), each with one of its last two strides equal to 1;
a 2-D operand or a batch of 1 broadcasts against the other's batch with stride 0), picks the
rung (`dispatch`), and runs it.
"""

from __future__ import annotations

import numbers

from cute_kernels.runtime.plan_cache import PlanCache, plain_tensors, tensor_signature

from .dispatch import resolve

__all__ = ["matmul", "as_unit_stride", "plan_for"]

# torch, imported on the first call (importing this package must not import torch: the CLI and
# compile-only processes never need it) and then read from this global, not re-imported.
_torch = None


def _load_torch():
    global _torch
    import torch

    _torch = torch
    return torch


def as_unit_stride(t, what: str):
    """`t` (3-D) with one of its last two strides equal to 1, and which one (2: row-major, 1: col).

    The stride of a mode of extent 1 is arbitrary, so such a mode is given stride 1 when that
    makes the view unit-stride. Raises ValueError naming `what` when neither of the last two
    modes can have unit stride.
    """
    stride = t.stride()
    if stride[2] == 1:
        return t, 2
    if stride[1] == 1:
        return t, 1
    shape, stride = list(t.shape), list(stride)
    for mode in (2, 1):
        if shape[mode] == 1:
            stride[mode] = 1
            return t.as_strided(shape, stride), mode
    raise ValueError(
        f"matmul: {what} has strides {tuple(t.stride())} for shape {tuple(t.shape)}; one of its last "
        "two strides must be 1 (row- or column-major). Call .contiguous() on it first."
    )


def _check_operand(t, what: str, torch) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"matmul: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() not in (2, 3):
        raise ValueError(f"matmul: {what} must be 2-D (M, K) or 3-D (batch, M, K), got {t.dim()}-D shape {tuple(t.shape)}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"matmul: {what} has dtype {t.dtype}; the GEMM kernels take floating-point inputs")


def _check_real(name: str, v) -> None:
    # The common float/int cases skip the (slow) abstract-base-class check; bool is its own type.
    if type(v) is not float and type(v) is not int and (not isinstance(v, numbers.Real) or isinstance(v, bool)):
        raise TypeError(f"matmul: {name} must be a real number, got {type(v).__name__}")


def _check_cuda(t, what: str, device) -> None:
    if t.device.type != "cuda":
        raise ValueError(
            f"matmul: {what} is on device '{t.device}'; cute_kernels GEMMs run on CUDA devices only "
            "(move it with .cuda())"
        )
    if t.device != device:
        raise ValueError(f"matmul: {what} is on {t.device} but a is on {device}; all tensors must share one device")


def _batch(a, b) -> int:
    la = a.shape[0] if a.dim() == 3 else 1
    lb = b.shape[0] if b.dim() == 3 else 1
    if la != lb and la != 1 and lb != 1:
        raise ValueError(f"matmul: batch sizes differ and neither is 1: a {tuple(a.shape)}, b {tuple(b.shape)}")
    return max(la, lb)


def _as_3d(t, batch: int):
    t3 = t if t.dim() == 3 else t.unsqueeze(0)
    return t3.expand(batch, t3.shape[1], t3.shape[2]) if t3.shape[0] != batch else t3


def matmul(a, b, *, kernel: str = "auto", out_dtype=None, alpha: float = 1.0, beta: float = 0.0, c=None):
    """`alpha * (a @ b) + beta * c` with torch.matmul's shape semantics for 2-D and 3-D operands.

    a: (M, K) or (L, M, K); b: (K, N) or (L, K, N), same floating dtype, same CUDA device. A 2-D
    operand (or a batch of 1) broadcasts over the other's batch. The result is (M, N) when both
    are 2-D, else (L, M, N); its dtype is `out_dtype` (default: the input dtype). Products are
    accumulated in fp32 (fp64 inputs aside, which no rung takes yet).

    c: needed when beta != 0, ignored when beta == 0 (as in torch.addmm: NaN in c does not leak
    through beta = 0); broadcastable to the result's shape, dtype `out_dtype`.
    kernel: "auto" (the best rung of the ladder that supports the problem on this device) or a
    rung name from `cute_kernels.gemm.KERNELS`.

    Every check happens before any launch; errors name the offending argument. A call whose
    signature (`runtime.plan_cache`: the tensors' sizes, strides, dtypes, device, pointer mod
    16, requires_grad; kernel, out_dtype, whether beta is 0) was checked before skips the
    checks and the dispatch: a plain product (beta == 0) whose rung launched directly hands the
    caller's own tensors to a build that forms the kernel's views itself
    (`Sm90Rung.caller_order_launch`); else it replays the rung's direct launch
    (`Sm90Rung.plan_for`), or calls the same rung on the same 3-D views.
    """
    sig = _plan_signature(a, b, kernel, out_dtype, alpha, beta, c)
    if sig is not None:
        try:
            plan = _PLANS.get(sig)
        except TypeError:  # an unhashable option: the checked path reports it
            plan = sig = None
        if plan is not None:
            return plan(a, b, alpha, beta, c)
    torch = _torch or _load_torch()
    _check_operand(a, "a", torch)
    _check_operand(b, "b", torch)
    in_dtype = a.dtype
    if in_dtype != b.dtype:
        raise TypeError(f"matmul: a has dtype {in_dtype} but b has dtype {b.dtype}; they must match")
    a_shape, b_shape = a.shape, b.shape
    if a_shape[-1] != b_shape[-2]:
        raise ValueError(
            f"matmul: shapes {tuple(a_shape)} and {tuple(b_shape)} do not compose: a's K = {a_shape[-1]} "
            f"but b's K = {b_shape[-2]}"
        )
    batch = _batch(a, b)
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batched = len(a_shape) == 3 or len(b_shape) == 3
    out_shape = (batch, m, n) if batched else (m, n)
    if out_dtype is None:
        out_dtype = in_dtype
    elif not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f"matmul: out_dtype must be a floating torch.dtype, got {out_dtype!r}")
    _check_real("alpha", alpha)
    _check_real("beta", beta)
    use_c = beta != 0
    if use_c:
        if c is None:
            raise ValueError(f"matmul: beta={beta} needs c (the addend); pass c or use beta=0")
        if not isinstance(c, torch.Tensor):
            raise TypeError(f"matmul: c must be a torch.Tensor, got {type(c).__name__}")
        if c.dtype != out_dtype:
            raise TypeError(f"matmul: c has dtype {c.dtype} but the output dtype is {out_dtype}")
        try:
            torch.broadcast_shapes(c.shape, out_shape)
        except RuntimeError:
            raise ValueError(f"matmul: c of shape {tuple(c.shape)} does not broadcast to the output shape {out_shape}") from None
        if c.dim() > len(out_shape) or torch.broadcast_shapes(c.shape, out_shape) != torch.Size(out_shape):
            raise ValueError(f"matmul: c of shape {tuple(c.shape)} does not broadcast to the output shape {out_shape}")

    a3, _ = as_unit_stride(_as_3d(a, batch), "a")
    b3, _ = as_unit_stride(_as_3d(b, batch), "b")
    c3 = None
    if use_c:
        c_full = c.expand(out_shape)
        c3, _ = as_unit_stride(c_full if batched else c_full.unsqueeze(0), "c")

    device = a.device
    # The fast test first (is_cuda is cheaper than building device objects); the checks that
    # name the problem run only when it fails.
    if not (a.is_cuda and b.is_cuda and b.device == device):
        _check_cuda(a, "a", device)
        _check_cuda(b, "b", device)
    if use_c:
        _check_cuda(c, "c", device)

    out3 = torch.empty((batch, m, n), dtype=out_dtype, device=device)
    if m == 0 or n == 0 or batch == 0:
        return out3 if batched else out3[0]
    if k == 0:
        # An empty sum: alpha * 0 + beta * c, as torch.addmm gives.
        out3.zero_()
        if use_c:
            out3.copy_((beta * c3.to(torch.float32)).to(out_dtype))
        return out3 if batched else out3[0]

    rung = resolve(kernel, a3, b3, out3)
    rung(a3, b3, out3, alpha=float(alpha), beta=float(beta), c=c3)
    if sig is not None:
        _keep_plan(sig, rung, (a, b, c if use_c else None), (a3, b3, out3, c3), alpha, beta, batched)
    return out3 if batched else out3[0]


# ---- launch plans (runtime.plan_cache) -----------------------------------------------------

_PLANS = PlanCache("gemm.matmul")
_PLAN_SCALARS = (float, int)


def _plan_signature(a, b, kernel, out_dtype, alpha, beta, c):
    """The plan key of a `matmul` call, or None when it cannot have a plan (alpha or beta not
    a Python float/int, a non-tensor operand). Not hashed here: the lookup may still raise
    TypeError for an unhashable option."""
    if alpha.__class__ not in _PLAN_SCALARS or beta.__class__ not in _PLAN_SCALARS:
        return None
    plain = _PLAIN or _plain_classes()
    if a.__class__ not in plain or b.__class__ not in plain:  # FakeTensor, other subclasses, non-tensors
        return None
    use_c = beta != 0
    try:
        # tensor_signature of a and b, flattened: one tuple to build and hash on every warm call
        return (a.__class__, a.shape, a.stride(), a.dtype, a.device, a.data_ptr() & 15, a.requires_grad,
                b.__class__, b.shape, b.stride(), b.dtype, b.device, b.data_ptr() & 15, b.requires_grad,
                kernel, out_dtype, alpha.__class__, beta.__class__, use_c, tensor_signature(c) if use_c else None)
    except (TypeError, RuntimeError):  # c not a plain tensor; a tensor without storage
        return None


def plan_for(a, b, *, kernel: str = "auto", out_dtype=None, alpha=1.0, beta=0.0, c=None):
    """The stored plan of a `matmul` call with these arguments, or None: `plan(a, b, alpha,
    beta, c) -> out`, for tensors with the recorded call's signature (a caller-order plan hands
    them to its build as they are, so they must be shaped as the recorded ones)."""
    sig = _plan_signature(a, b, kernel, out_dtype, alpha, beta, c)
    try:
        return None if sig is None else _PLANS.get(sig)
    except TypeError:
        return None


_PLAIN: tuple = ()


def _plain_classes() -> tuple:
    global _PLAIN
    torch = _torch or _load_torch()
    _PLAIN = (torch.Tensor, torch.nn.Parameter)
    return _PLAIN


def _keep_plan(sig, rung, given: tuple, views: tuple, alpha, beta, batched: bool) -> None:
    """Store under `sig` the replay of the checked call just made (plain tensors on a plan
    device only; the 3-D views the rung saw must start where the caller's tensors do, as views
    do). Two kinds: when the rung kept a plan of its direct launch (`plan_for`), the result's
    allocation and that launch; else the result's allocation and the rung's own call on the
    same 3-D views, formed with `as_strided` (what is skipped is this function's checks and
    the dispatch, both decided by the signature)."""
    a, b, c = given
    a3, b3, out3, c3 = views
    if not plain_tensors(a, b, c):
        return
    pairs = ((a3, a), (b3, b)) + (((c3, c),) if c is not None else ())
    if any(view.data_ptr() != t.data_ptr() for view, t in pairs):
        return
    empty = _torch.empty
    dtype, device = out3.dtype, out3.device
    plan_for = getattr(rung, "plan_for", None)
    launch = plan_for(a3, b3, out3, alpha=float(alpha), beta=float(beta), c=c3) if plan_for is not None else None
    if launch is not None:
        shape = tuple(out3.shape) if batched else tuple(out3.shape[1:])
        # The rung's plan detaches by its own signature (of the 3-D views); the caller's tensors
        # may require grad where the views did not (views made under no_grad), so detach here.
        da, db, dc = a.requires_grad, b.requires_grad, c is not None and c.requires_grad
        caller_order = getattr(rung, "caller_order_launch", None)
        direct = None
        if caller_order is not None and c is None:
            direct = caller_order(launch, a, b, out3 if batched else out3[0])
        if direct is not None:
            _PLANS.put(sig, _caller_order_plan(sig, direct, launch, shape, dtype, device, da, db))
            return

        def plan(a, b, alpha, beta, c):
            out = empty(shape, dtype=dtype, device=device)
            if da:
                a = a.detach()
            if db:
                b = b.detach()
            if dc:
                c = c.detach()
            launch(a, b, out, alpha, beta, c, None, None, None)
            return out
    else:
        shape = tuple(out3.shape)
        sa, ta, sb, tb = tuple(a3.shape), a3.stride(), tuple(b3.shape), b3.stride()
        sc, tc = (tuple(c3.shape), c3.stride()) if c is not None else (None, None)

        def plan(a, b, alpha, beta, c):
            out = empty(shape, dtype=dtype, device=device)
            rung(a.as_strided(sa, ta), b.as_strided(sb, tb), out, alpha=float(alpha), beta=float(beta),
                 c=None if sc is None else c.as_strided(sc, tc))
            return out if batched else out[0]

    _PLANS.put(sig, plan)


def _caller_order_plan(sig, direct, launch, shape, dtype, device, da, db):
    """The warm call of a plain product whose rung compiled a launch taking the caller's own
    tensors (`Sm90Rung.caller_order_launch`): allocate the result, call `direct(a, b, out,
    alpha, beta)`. Should that call ever refuse the tensors, the signature's plan becomes the
    rung-plan replay (`launch` on the 3-D views) and the call is made that way."""
    empty = _torch.empty

    def plan(a, b, alpha, beta, c):
        out = empty(shape, dtype=dtype, device=device)
        if da:
            a = a.detach()
        if db:
            b = b.detach()
        try:
            direct(a, b, out, float(alpha), 0.0)
        except Exception:  # noqa: BLE001 - the replay below raises whatever is really wrong
            _PLANS.put(sig, replay)
            return replay(a, b, alpha, beta, c)
        return out

    def replay(a, b, alpha, beta, c):
        out = empty(shape, dtype=dtype, device=device)
        launch(a.detach() if da else a, b.detach() if db else b, out, alpha, beta, None, None, None, None)
        return out

    return plan
