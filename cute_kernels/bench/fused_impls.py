"""Implementations of the `fused` suite: ours (`cute_kernels`, and `cute_kernels_gemm` for the
linear + cross-entropy with our GEMMs), `eager`, `torch_compile`, `quack` (0.6.5: RMSNorm,
LayerNorm, softmax, cross-entropy) and `liger` (0.8.5: RMSNorm, LayerNorm, softmax,
cross-entropy, RoPE, SwiGLU, fused linear + cross-entropy), all in one process on the case's
shared inputs. An implementation without an op raises `Unsupported` naming it.

How each op is timed (the same for every implementation):
- forwards: the op on the inputs, no autograd (inference);
- backwards (`*_bwd`): the forward runs once at prepare with autograd recording, and the timed
  call is `torch.autograd.grad` of its output (retain_graph): the backward kernels plus the
  autograd engine's dispatch, as the attention_bwd suite does;
- `cross_entropy_fwd_bwd` and `linear_cross_entropy`: loss and gradient together, as a training
  step runs them (our cross-entropy computes the gradient in the forward's launch);
  `linear_cross_entropy`'s step is `loss.backward()` into the leaves' `.grad`, as training makes
  it: a gradient computed in the forward and kept saved by the graph is copied into `.grad` there
  (autograd's AccumulateGrad), which `torch.autograd.grad` would not show;
- `rope`: in place on a copy of q and k made at prepare (Liger rotates in place too).
Implementations that overwrite their inputs (Liger's cross-entropy writes its gradient over the
logits) get their own copy. `linear_cross_entropy` implementations measure their peak memory at
prepare: the most allocated above what was allocated before the call (inputs excluded; outputs
and gradients included), recorded as `peak_mib`.
"""

from __future__ import annotations

import importlib.util
from functools import partial

from cute_kernels.bench.fused_cases import EPS, GEMM_OPS, flat
from cute_kernels.bench.impls import Impl, Prepared, Unsupported, peak_mib

__all__ = ["fused_impls", "FUSED_IMPL_NAMES"]

FUSED_IMPL_NAMES = ("cute_kernels", "cute_kernels_gemm", "eager", "torch_compile", "quack", "liger")


def _needs(module: str):
    def check():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        return None if found else f"{module} is not importable"

    return check


def _grads_call(out, leaves, seed):
    import torch

    outs = out if isinstance(out, tuple) else (out,)
    seeds = seed if isinstance(seed, tuple) else (seed,)

    def fn():
        return torch.autograd.grad(outs, leaves, seeds, retain_graph=True)

    return fn


def _leaf(t):
    return t.detach().clone().requires_grad_()


# ---- the ops, per implementation: each returns (fn, canonical) for the case -----------------------

def _rms(x, w, impl):
    import torch.nn.functional as F

    if impl == "cute_kernels":
        from cute_kernels.nn import fused_functional as ff

        return ff.rms_norm(x, (x.shape[-1],), w, EPS)
    if impl == "quack":
        import quack

        return quack.rmsnorm(x, w, eps=EPS)
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_rms_norm

        return liger_rms_norm(x, w, EPS, 0.0, "llama", False)
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def _ln(x, w, b, impl):
    import torch.nn.functional as F

    if impl == "cute_kernels":
        from cute_kernels.nn import fused_functional as ff

        return ff.layer_norm(x, (x.shape[-1],), w, b, EPS)
    if impl == "quack":
        from quack.rmsnorm import layernorm_fwd

        if x.requires_grad:
            raise Unsupported("quack 0.6.5 has no differentiable layernorm entry point")
        out = layernorm_fwd(x, w, b, eps=EPS)
        return out[0] if isinstance(out, tuple) else out
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_layer_norm

        return liger_layer_norm(x, w, b, EPS)
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def _softmax(x, impl):
    import torch

    if impl == "cute_kernels":
        from cute_kernels.nn import fused_functional as ff

        return ff.softmax(x, -1)
    if impl == "quack":
        import quack

        return quack.softmax(x)
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_softmax

        return liger_softmax(x)
    return torch.softmax(x, -1)


def _ce_rows(x, labels, impl):
    import torch.nn.functional as F

    if impl == "cute_kernels":
        from cute_kernels.fused import cross_entropy_forward

        return cross_entropy_forward(x, labels, check_labels=False)[0]
    if impl == "quack":
        from quack.cross_entropy import cross_entropy_fwd

        return cross_entropy_fwd(x, labels, ignore_index=-100)
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_cross_entropy

        return liger_cross_entropy(x, labels, reduction="none")
    return F.cross_entropy(x.float(), labels, reduction="none")


def _ce_mean(x, labels, impl):
    import torch.nn.functional as F

    if impl == "cute_kernels":
        from cute_kernels.nn import fused_functional as ff

        return ff.cross_entropy(x, labels, check_labels=False)
    if impl == "quack":
        import quack

        return quack.cross_entropy(x, labels, reduction="mean")
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_cross_entropy

        return liger_cross_entropy(x, labels)
    return F.cross_entropy(x.float(), labels)


def _swiglu(g, u, impl):
    import torch.nn.functional as F

    if impl == "cute_kernels":
        from cute_kernels.nn import fused_functional as ff

        return ff.swiglu(g, u)
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_swiglu

        return liger_swiglu(g, u)
    if impl == "quack":
        raise Unsupported("quack has no standalone SwiGLU")
    return F.silu(g) * u


def _rope_inplace(q, k, cos, sin, impl):
    """Rotate q, k (B, S, H, D) in place; returns them."""
    import torch

    if impl == "cute_kernels":
        from cute_kernels.fused import apply_rotary_

        return apply_rotary_(q, k, cos, sin)
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_rope

        # Liger takes (B, H, S, D) and HF's (1, S, D) tables with both halves.
        c = torch.cat((cos, cos), -1)[None].to(q.dtype)
        s = torch.cat((sin, sin), -1)[None].to(q.dtype)
        qo, ko = liger_rope(q.transpose(1, 2), k.transpose(1, 2), c, s)
        return qo.transpose(1, 2), ko.transpose(1, 2)
    if impl == "quack":
        raise Unsupported("quack has no standalone RoPE")
    d = q.shape[-1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    for t in (q, k):
        a, b = t[..., : d // 2].float(), t[..., d // 2:].float()
        t.copy_(torch.cat((a * c - b * s, b * c + a * s), -1))
    return q, k


def _lce(x, w, labels, impl):
    import torch.nn.functional as F

    if impl in ("cute_kernels", "cute_kernels_gemm"):
        from cute_kernels.nn import fused_functional as ff

        return ff.linear_cross_entropy(x, w, labels, gemm="torch" if impl == "cute_kernels" else "cute_kernels",
                                       check_labels=False)
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return liger_fused_linear_cross_entropy(x, w, labels)
    if impl == "quack":
        raise Unsupported("quack 0.6.5's fused linear cross-entropy is not benchmarked here")
    return F.cross_entropy((x @ w.t()).float(), labels)


def _linear_swiglu(x, w, impl):
    """h = silu(x Wg^T) * (x Wu^T) as `impl` computes it from the weight w it multiplies by:
    ours, one gated GEMM over the interleaved weight; cute_kernels_gemm, our GEMM over the
    concatenated [Wg; Wu] then our SwiGLU kernel on its halves; the peers, F.linear (cuBLAS)
    over [Wg; Wu] then their SwiGLU (eager's and torch.compile's: silu(g) * u)."""
    import torch.nn.functional as F

    if impl == "cute_kernels":
        from cute_kernels.nn import fused_functional as ff

        return ff.linear_swiglu(x, w)
    if impl == "quack":
        raise Unsupported("quack 0.6.5's gated GEMM is not benchmarked here")
    if impl == "cute_kernels_gemm":
        from cute_kernels.nn import functional as cf

        g, u = cf.linear(x, w).chunk(2, dim=-1)
    else:
        g, u = F.linear(x, w).chunk(2, dim=-1)
    return _swiglu(g, u, "cute_kernels" if impl == "cute_kernels_gemm" else impl)


_COMPILED: dict = {}


def _compiled(key, fn):
    """torch.compile of fn, once per key (a new shape recompiles inside, as it would for a user)."""
    import torch

    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, dynamic=False)
    return _COMPILED[key]


def _prepare(impl: str, case, inputs) -> Prepared:
    import torch

    op = case.op
    if impl == "cute_kernels_gemm" and op not in GEMM_OPS:
        raise Unsupported("cute_kernels_gemm is the GEMM cases (linear + cross-entropy, linear + SwiGLU) only")
    base = "eager" if impl == "torch_compile" else impl

    def maybe_compiled(fn):
        return _compiled((op, case.dtype), fn) if impl == "torch_compile" else fn

    if op in ("rmsnorm_fwd", "layernorm_fwd"):
        x, w, b = inputs["x"], inputs["w"], inputs.get("b")
        f = maybe_compiled((lambda x, w, b: _rms(x, w, base)) if op == "rmsnorm_fwd" else
                           (lambda x, w, b: _ln(x, w, b, base)))

        def fn():
            with torch.no_grad():
                return f(x, w, b)

        return Prepared(fn)
    if op == "rmsnorm_residual_fwd":
        x, r, w = inputs["x"], inputs["r"], inputs["w"]
        if base == "cute_kernels":
            from cute_kernels.nn import fused_functional as ff

            f = lambda x, r, w: ff.fused_add_rms_norm(x, r, (x.shape[-1],), w, EPS)  # noqa: E731
        elif base == "quack":
            import quack

            f = lambda x, r, w: quack.rmsnorm(x, w, residual=r, eps=EPS, prenorm=True)  # noqa: E731
        elif base == "liger":
            from liger_kernel.transformers.functional import liger_fused_add_rms_norm

            # Liger adds in place into its inputs: give it copies (their values do not matter after).
            x, r = x.clone(), r.clone()
            f = lambda x, r, w: liger_fused_add_rms_norm(x, r, w, EPS, 0.0, "llama", False)  # noqa: E731
        else:
            def f(x, r, w):
                s = x + r
                return torch.nn.functional.rms_norm(s, (s.shape[-1],), w, EPS), s
            f = maybe_compiled(f)

        def fn():
            with torch.no_grad():
                return f(x, r, w)

        def canonical(out):
            y, s = out[0], out[1]
            return flat(y, s)

        return Prepared(fn, canonical=canonical)
    if op in ("rmsnorm_bwd", "layernorm_bwd"):
        x, w = _leaf(inputs["x"]), _leaf(inputs["w"])
        b = _leaf(inputs["b"]) if "b" in inputs else None
        f = maybe_compiled((lambda x, w, b: _rms(x, w, base)) if op == "rmsnorm_bwd" else
                           (lambda x, w, b: _ln(x, w, b, base)))
        with torch.enable_grad():
            y = f(x, w, b)
        leaves = (x, w) if b is None else (x, w, b)
        return Prepared(_grads_call(y, leaves, inputs["dy"]), canonical=lambda g: flat(*g))
    if op in ("softmax_fwd", "softmax_bwd"):
        f = maybe_compiled(lambda x: _softmax(x, base))
        if op == "softmax_fwd":
            x = inputs["x"]

            def fn():
                with torch.no_grad():
                    return f(x)

            return Prepared(fn)
        x = _leaf(inputs["x"])
        with torch.enable_grad():
            y = f(x)
        return Prepared(_grads_call(y, (x,), inputs["dy"]), canonical=lambda g: g[0])
    if op == "cross_entropy_fwd":
        x, labels = inputs["x"], inputs["labels"]
        f = maybe_compiled(lambda x, labels: _ce_rows(x, labels, base))

        def fn():
            with torch.no_grad():
                return f(x, labels)

        return Prepared(fn, canonical=lambda loss: loss.float())
    if op == "cross_entropy_fwd_bwd":
        labels = inputs["labels"]
        x = _leaf(inputs["x"])  # Liger writes its gradient over its input: every impl gets a copy
        if impl == "cute_kernels":
            # The fused mode: loss and gradient from one launch, dloss = 1 / n_valid on the device.
            from cute_kernels.fused import cross_entropy_forward

            xd = x.detach()

            def fused_step():
                scale = (1.0 / (labels != -100).sum().float()).reshape(1)
                rows, _, g = cross_entropy_forward(xd, labels, check_labels=False, dloss=scale)
                return rows.sum() * scale[0], g

            return Prepared(fused_step, canonical=lambda out: flat(out[0], out[1]))
        f = maybe_compiled(lambda x, labels: _ce_mean(x, labels, base))

        def fn():
            loss = f(x, labels)
            (g,) = torch.autograd.grad(loss, x)
            return loss, g

        return Prepared(fn, canonical=lambda out: flat(out[0], out[1]))
    if op.startswith("swiglu"):
        f = maybe_compiled(lambda g, u: _swiglu(g, u, base))
        if op == "swiglu_fwd":
            g, u = inputs["gate"], inputs["up"]

            def fn():
                with torch.no_grad():
                    return f(g, u)

            return Prepared(fn)
        g, u = _leaf(inputs["gate"]), _leaf(inputs["up"])
        with torch.enable_grad():
            out = f(g, u)
        return Prepared(_grads_call(out, (g, u), inputs["dout"]), canonical=lambda gr: flat(*gr))
    if op == "rope":
        q, k = inputs["q"].clone(), inputs["k"].clone()
        q0, k0 = q.clone(), k.clone()
        cos, sin = inputs["cos"], inputs["sin"]
        f = maybe_compiled(lambda q, k, cos, sin: _rope_inplace(q, k, cos, sin, base))
        first = [True]

        def fn():
            if first[0]:  # the correctness call sees the unrotated inputs; timed calls rotate on
                q.copy_(q0), k.copy_(k0)
                first[0] = False
            with torch.no_grad():
                return f(q, k, cos, sin)

        return Prepared(fn, canonical=lambda out: flat(out[0], out[1]))
    if op.startswith("linear_swiglu"):
        from cute_kernels.gemm.gated import split_gate_up

        # the weight each multiplies by (each differentiates its own copy): ours the interleaved one
        key = "w_gate_up" if impl == "cute_kernels" else "w_cat"
        f = maybe_compiled(lambda x, w: _linear_swiglu(x, w, base))
        if op == "linear_swiglu_fwd":
            x, w = inputs["x"], inputs[key]

            def fn():
                with torch.no_grad():
                    return f(x, w)

            return Prepared(fn)
        x, w, dh = _leaf(inputs["x"]), _leaf(inputs[key]), inputs["dh"]

        def step():
            h = f(x, w)
            return (h, *torch.autograd.grad(h, (x, w), dh))

        def canonical(out):
            h, dx, dw = out
            return flat(h, dx, *(split_gate_up(dw) if key == "w_gate_up" else dw.chunk(2)))

        return Prepared(step, canonical=canonical)
    if op == "linear_cross_entropy":
        if impl == "torch_compile":
            raise Unsupported("torch.compile keeps eager's full logits here (timed as eager)")
        x, w, labels = _leaf(inputs["x"]), _leaf(inputs["w"]), inputs["labels"]
        rows = inputs["dw_rows"]

        def fn():  # a training step's backward, into the leaves' .grad (module docstring)
            x.grad = w.grad = None
            loss = _lce(x, w, labels, base)
            loss.backward()
            return loss, x.grad, w.grad

        peak = peak_mib(fn) if x.is_cuda else None
        return Prepared(fn, canonical=lambda out: flat(out[0], out[1], out[2][rows]),
                        extra={} if peak is None else {"peak_mib": round(peak, 1)})
    raise Unsupported(f"unknown fused op {op!r}")


def fused_impls() -> dict[str, Impl]:
    return {
        "cute_kernels": Impl("cute_kernels", "ours", partial(_prepare, "cute_kernels"), _needs("cutlass")),
        "cute_kernels_gemm": Impl("cute_kernels_gemm", "ours", partial(_prepare, "cute_kernels_gemm"),
                                  _needs("cutlass")),
        "eager": Impl("eager", "peer", partial(_prepare, "eager")),
        "torch_compile": Impl("torch_compile", "peer", partial(_prepare, "torch_compile"), _needs("triton")),
        "quack": Impl("quack", "peer", partial(_prepare, "quack"), _needs("quack")),
        "liger": Impl("liger", "peer", partial(_prepare, "liger"), _needs("liger_kernel")),
    }
