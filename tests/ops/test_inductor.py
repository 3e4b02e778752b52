"""The operators under Inductor, on CPU (fallback="torch"): no schema argument collides with the
parameters of Inductor's fallback lowering, and `torch.compile(fullgraph=True,
backend="inductor")` lowers every op, forward and backward, without recompiling on a size change.

The GPU run (torch 2.11) lowered `cute_kernels::sdpa` as `FallbackKernel.create(kernel, *args,
**kwargs)` with the schema's defaulted arguments as keywords, so an argument named `kernel` failed
with "got multiple values for argument 'kernel'". The torch build here may pass them positionally
and so not fail on such a schema; the bind test below reproduces that lowering's call exactly."""

from __future__ import annotations

import inspect
import shutil

import pytest

torch = pytest.importorskip("torch")

from torch.fx.operator_schemas import normalize_function  # noqa: E402

from cute_kernels import ops  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning"),
              pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")]

F32 = torch.float32


def randn(*shape, grad=False):
    return torch.randn(*shape, dtype=F32).requires_grad_(grad)


def _overload(name):
    return getattr(torch.ops.cute_kernels, name).default


def _example_args(name):
    """Each op's required (non-defaulted) arguments, as CPU tensors and ints."""
    cu_q, cu_k = torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([0, 4, 11], dtype=torch.int32)
    q, k, v = randn(1, 2, 4, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8)
    return {
        "matmul": (randn(4, 5), randn(5, 3)),
        "linear": (randn(4, 5), randn(3, 5)),
        "linear_backward": (randn(4, 3), randn(4, 5), randn(3, 5), randn(3), None, None, True, True, True),
        "linear_swiglu": (randn(4, 5), randn(32, 5)),
        "linear_swiglu_backward": (randn(4, 16), randn(4, 5), randn(32, 5), randn(4, 32)),
        "scaled_mm": (randn(4, 5), randn(5, 3), torch.ones(()), torch.ones(())),
        "sdpa": (q, k, v),
        "sdpa_backward": (randn(1, 2, 4, 8), q, k, v, randn(1, 2, 4, 8), randn(1, 2, 4)),
        "sdpa_varlen": (randn(8, 4, 8), randn(11, 2, 8), randn(11, 2, 8), cu_q, cu_k, 5, 7),
        "sdpa_varlen_backward": (randn(8, 4, 8), randn(8, 4, 8), randn(11, 2, 8), randn(11, 2, 8), randn(8, 4, 8),
                                 randn(4, 8), cu_q, cu_k, 5, 7),
        "paged_decode": (randn(2, 4, 8), randn(6, 4, 2, 8), randn(6, 4, 2, 8),
                         torch.tensor([[5, 0, 3], [2, 1, 0]], dtype=torch.int32),
                         torch.tensor([10, 3], dtype=torch.int32)),
        "sdpa_masked": (q, k, v, torch.ones(1, 6, dtype=torch.bool), None),
        "sdpa_masked_backward": (randn(1, 4, 2, 8), q, k, v, randn(1, 4, 2, 8), randn(2, 4),
                                 torch.ones(1, 6, dtype=torch.bool), None),
    }[name]


@pytest.mark.parametrize("name", ops.OPS)
def test_no_schema_argument_takes_a_reserved_name(name):
    args = {a.name for a in _overload(name)._schema.arguments}
    assert {"rung", "fallback"} <= args, f"cute_kernels::{name}: {sorted(args)}"
    clash = args & ops.RESERVED_ARGUMENT_NAMES
    assert not clash, f"cute_kernels::{name} has schema arguments {sorted(clash)}, which Inductor's lowering reserves"


def test_reserved_names_cover_inductors_fallback_lowering():
    from torch._inductor.ir import FallbackKernel

    named = {p.name for p in inspect.signature(FallbackKernel.create).parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    assert "kernel" in named and named <= ops.RESERVED_ARGUMENT_NAMES | {"cls"}, named


def _bind_fallback_lowering(op, args):
    """Bind the call Inductor makes for an op it falls back on: positional required arguments,
    the defaulted ones as keywords (what `normalize_function` gives, as in the torch 2.11
    failure). TypeError where an argument name collides."""
    from torch._inductor.ir import FallbackKernel

    normalized = normalize_function(op, args, {})
    assert normalized is not None and normalized.kwargs, f"{op}: expected defaulted arguments as keywords"
    inspect.signature(FallbackKernel.create.__func__).bind(FallbackKernel, op, *normalized.args, **normalized.kwargs)


@pytest.mark.parametrize("name", ops.OPS)
def test_fallback_lowering_call_binds_with_defaults_as_keywords(name):
    _bind_fallback_lowering(_overload(name), _example_args(name))


def test_fallback_lowering_bind_catches_an_argument_named_kernel():
    @torch.library.custom_op("cute_kernels_test::collides", mutates_args=())
    def collides(x: torch.Tensor, kernel: str = "auto") -> torch.Tensor:
        return x.clone()

    with pytest.raises(TypeError, match="multiple values for argument 'kernel'"):
        _bind_fallback_lowering(torch.ops.cute_kernels_test.collides.default, (randn(3),))


def _compiler_available() -> bool:
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def _every_op(x, w, b, q, k, v, a8, b8, vq, vk, vv, cu_q, cu_k, pq, kc, vc, table, seqlens, key_mask, wgu):
    """Every op once, with defaulted arguments passed by keyword (the form that collided)."""
    y = ops.linear(x, w, bias=b, activation="silu", rung="auto", fallback="torch")
    g, _ = ops.linear_swiglu(y, wgu, need_preact=True, rung="auto", fallback="torch")
    z = ops.matmul(y + g[:, :6], w, rung="auto", fallback="torch")
    o, lse = ops.sdpa(q, k, v, causal="bottom_right", scale=None, enable_gqa=True, rung="auto", fallback="torch")
    s = ops.scaled_mm(a8, b8, torch.ones((), dtype=F32), torch.ones((), dtype=F32), out_dtype=F32, rung="auto",
                      fallback="torch")
    vo, _ = ops.sdpa_varlen(vq, vk, vv, cu_q, cu_k, 5, 7, causal="top_left", window_left=2, rung="auto",
                            fallback="torch")
    d = ops.paged_decode(pq, kc, vc, table, seqlens, scale=0.25, rung="auto", fallback="torch")
    mo, _ = ops.sdpa_masked(q, k, v, key_mask, None, causal="bottom_right", rung="auto", fallback="torch")
    return z * 2 + 1, o.sum(-1) + lse + mo.transpose(1, 2).sum(-1), vo, s, d


def _inputs(m, s):
    """Fresh inputs; m (rows of x) and s (key length) are the sizes that change between calls."""
    fp8 = getattr(torch, "float8_e4m3fn", None)
    a8, b8 = randn(3, 4), randn(4, 5)
    if fp8 is not None:
        a8, b8 = a8.to(fp8), b8.to(fp8)
    return dict(x=randn(m, 6, grad=True), w=randn(6, 6, grad=True), b=randn(6, grad=True),
                q=randn(1, 4, 3, 8, grad=True), k=randn(1, 2, s, 8, grad=True), v=randn(1, 2, s, 8, grad=True),
                a8=a8, b8=b8, vq=randn(8, 4, 8, grad=True), vk=randn(11, 2, 8, grad=True),
                vv=randn(11, 2, 8, grad=True),
                cu_q=torch.tensor([0, 3, 8], dtype=torch.int32), cu_k=torch.tensor([0, 4, 11], dtype=torch.int32),
                pq=randn(2, 4, 8), kc=randn(6, 4, 2, 8), vc=randn(6, 4, 2, 8),
                table=torch.tensor([[5, 0, 3], [2, 1, 0]], dtype=torch.int32),
                seqlens=torch.tensor([10, 3], dtype=torch.int32),
                key_mask=torch.arange(s)[None, :] >= 2, wgu=randn(16, 6, grad=True))


@pytest.mark.skipif(not _compiler_available(), reason="Inductor on CPU needs a C++ compiler")
def test_inductor_compiles_every_op_forward_and_backward_without_recompiling(monkeypatch):
    """(Linear's backward is its own op, so the backward graph holds every op.)"""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._inductor import config as inductor_config
    from torch._inductor.ir import FallbackKernel

    lowered = set()
    create = FallbackKernel.create.__func__

    def spy(cls, kernel, *args, **kwargs):
        lowered.add(str(kernel))
        return create(cls, kernel, *args, **kwargs)

    monkeypatch.setattr(FallbackKernel, "create", classmethod(spy))
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_every_op, backend=counter, fullgraph=True)
    frames = []
    # force_disable_caches: a cached graph would skip the lowering this test is about.
    with inductor_config.patch(force_disable_caches=True):
        for m, s in ((9, 7), (13, 10)):
            inp = _inputs(m, s)
            for name, dim in (("x", 0), ("k", 2), ("v", 2), ("key_mask", 1)):
                torch._dynamo.mark_dynamic(inp[name], dim)
            got = compiled(**inp)
            frames.append(counter.frame_count)
            want = _every_op(**inp)
            for a, r in zip(got, want):
                assert a.shape == r.shape and torch.allclose(a, r, rtol=1e-5, atol=1e-5)
            grads = [inp[n] for n in ("x", "w", "b", "q", "k", "v", "vq", "vk", "vv", "wgu")]
            seed = [randn(*t.shape) for t in got[:3]]
            got_grads = torch.autograd.grad(got[:3], grads, seed)
            want_grads = torch.autograd.grad(want[:3], grads, seed)
            for a, r in zip(got_grads, want_grads):
                assert torch.allclose(a, r, rtol=1e-4, atol=1e-5)
    assert frames[0] == 1 and frames == [1, 1], f"recompiled: frame counts {frames}"
    # The backward graph holds sdpa_backward and sdpa_varlen_backward.
    want = {f"cute_kernels.{name}.default" for name in ops.OPS}
    assert want <= lowered, f"not lowered by Inductor's fallback: {sorted(want - lowered)}"
