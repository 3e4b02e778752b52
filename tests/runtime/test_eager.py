"""The eager direct path (`cute_kernels.runtime.eager`) on CPU, around a toy operator: which
calls take a plan (plain eager calls whose key has one) and which enter the op (the first call
of a key, torch.compile, FX and jit tracing, functorch transforms, dispatch and function modes,
forward AD, keyword arguments, subclasses, FakeTensors), how grad mode routes a plan through
`EagerFunction` (and create_graph through the plan's differentiable backward), and autocast.

"cpu" is added to `plan_cache.PLAN_DEVICES` for these tests (by default only CUDA calls get
plans, so every other CPU test runs the op)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from cute_kernels.runtime import eager, plan_cache  # noqa: E402
from cute_kernels.runtime.eager import USE_OP, EagerOp, autocast_args, call_key  # noqa: E402
from eager_toys import ScaledMatmulPlan  # noqa: E402

F64 = torch.float64


class Toy:
    """op(x, w, scale) = scale * x @ w as a plain function (so transforms and tracers can run it)
    and a plan computing the same, both counting their calls."""

    def __init__(self, replayable=True):
        self.op_calls = self.runs = self.backwards = self.backward_ops = 0
        self.replayable = replayable
        self.entry = EagerOp("toy_matmul", self.op, self.build)

    def op(self, x, w, scale):
        self.op_calls += 1
        return scale * (x @ w)

    def build(self, result, x, w, scale):
        assert torch.equal(result, scale * (x @ w))  # the op's result of the same call
        return ToyPlan(self) if self.replayable else None


class ToyPlan(ScaledMatmulPlan):
    __slots__ = ("toy",)

    def __init__(self, toy):
        self.toy = toy

    def run(self, x, w, scale):
        self.toy.runs += 1
        assert not torch.is_grad_enabled() or not (x.requires_grad or w.requires_grad)
        return scale * (x.detach() @ w.detach())

    def backward(self, ctx, g):
        self.toy.backwards += 1
        return self.grads(ctx, g)

    def backward_op(self, ctx, g):
        self.toy.backward_ops += 1
        return self.grads(ctx, g)


@pytest.fixture
def cpu_plans(monkeypatch):
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    plan_cache.invalidate()
    yield
    plan_cache.invalidate()


def _xw(grad=False):
    return (torch.randn(4, 3, dtype=F64, requires_grad=grad), torch.randn(3, 5, dtype=F64, requires_grad=grad))


def test_a_warm_plain_call_runs_the_plan_and_the_first_the_op(cpu_plans):
    toy = Toy()
    x, w = _xw()
    first = toy.entry(x, w, 2.0)
    assert (toy.op_calls, toy.runs) == (1, 0) and len(toy.entry.plans) == 1
    again = toy.entry(x, w, 2.0)
    assert (toy.op_calls, toy.runs) == (1, 1) and torch.equal(first, again)
    # a new key (a new shape, scale type, dtype) is checked first
    toy.entry(x, w, 2)  # int, not float: another key
    toy.entry(x[:2], w, 2.0)
    toy.entry(x.float(), w.float(), 2.0)
    assert toy.op_calls == 4 and len(toy.entry.plans) == 4


def test_keys_see_strides_alignment_grad_and_refuse_non_plain_arguments(cpu_plans):
    x, w = _xw()
    base = call_key((x, w, 2.0))
    assert base[-1] is False
    assert call_key((x.t().contiguous().t(), w, 2.0)) != base  # strides
    offset = torch.randn(13, dtype=F64)[1:13].view(4, 3)
    assert call_key((offset, w, 2.0)) != base  # pointer mod 16
    assert call_key((x.requires_grad_(), w, 2.0))[-1] is True
    with torch.no_grad():
        assert call_key((x, w, 2.0))[-1] is False  # requires_grad alone does not record autograd

    class Sub(torch.Tensor):
        pass

    for bad in ([1, 2], x.detach().as_subclass(Sub), torch.empty(3, device="meta"), torch.randn(3).to_sparse()):
        assert call_key((bad, w, 2.0)) is None
    assert call_key((x, w, True)) != call_key((x, w, 1))  # bool and int differ by type


def test_unreplayable_keys_store_use_op(cpu_plans):
    toy = Toy(replayable=False)
    x, w = _xw()
    toy.entry(x, w, 2.0)
    toy.entry(x, w, 2.0)
    assert toy.op_calls == 2 and toy.runs == 0
    assert list(toy.entry.plans.values()) == [USE_OP]


class FamilyToy(Toy):
    """The toy with a family: calls whose x has any number of rows (x @ w reads it per call),
    the family key being everything but that count; `family_ok` makes the builder refuse."""

    def __init__(self, family_ok=True):
        super().__init__()
        self.family_ok, self.family_builds = family_ok, 0
        self.entry = EagerOp("toy_family", self.op, self.build, family=(self.family_key, self.family_build))

    def family_key(self, args):
        x, w, scale = args
        return None if x.shape[0] > 100 else (x.shape[1:], x.dtype, w.shape, w.dtype, scale.__class__, scale)

    def family_build(self, result, x, w, scale):
        self.family_builds += 1
        assert torch.equal(result, scale * (x @ w))
        return ToyPlan(self) if self.family_ok else None


def test_a_family_plan_serves_new_keys_of_its_family(cpu_plans):
    toy = FamilyToy()
    w = torch.randn(3, 5, dtype=F64)
    outs = []
    for rows in range(1, 7):  # a new key each call (a decode loop's growing cache)
        x = torch.randn(rows, 3, dtype=F64)
        out = toy.entry(x, w, 2.0)
        assert torch.equal(out, 2.0 * (x @ w))
        outs.append(out)
    assert (toy.op_calls, toy.runs, toy.family_builds) == (1, 5, 1)
    assert len(toy.entry.plans) == 0 and len(toy.entry.family_plans) == 1
    toy.entry(torch.randn(4, 3, dtype=F64), w, 3.0)  # another family: checked first
    toy.entry(torch.randn(200, 3, dtype=F64), w, 2.0)  # no family: the per-key path
    toy.entry(torch.randn(200, 3, dtype=F64), w, 2.0)
    assert (toy.op_calls, toy.runs, toy.family_builds) == (3, 6, 2)
    # a call recording autograd never takes a family plan
    x = torch.randn(2, 3, dtype=F64, requires_grad=True)
    toy.entry(x, w, 2.0).sum().backward()
    assert toy.op_calls == 4 and torch.allclose(x.grad, 2.0 * w.sum(1).expand(2, 3))
    plan_cache.invalidate()
    assert len(toy.entry.family_plans) == 0


def test_a_family_keeps_no_plan_its_op_body_recorded(cpu_plans):
    """The family's first call runs the op, whose body (`eager.inside`) records a per-key plan
    as any first call's does; a family's keys are one-off, so the entry drops it."""
    toy = FamilyToy()
    body = toy.op
    toy.op = lambda *a: eager.inside("toy_family", body, a)  # noqa: E731 - the op with its body
    toy.entry.op = toy.op
    w = torch.randn(3, 5, dtype=F64)
    for rows in range(1, 5):
        x = torch.randn(rows, 3, dtype=F64)
        assert torch.equal(toy.entry(x, w, 2.0), 2.0 * (x @ w))
    assert (toy.op_calls, toy.runs, toy.family_builds) == (1, 3, 1)
    assert len(toy.entry.plans) == 0 and len(toy.entry.family_plans) == 1


def test_a_family_the_builder_refuses_keeps_the_per_key_path(cpu_plans):
    toy = FamilyToy(family_ok=False)
    w = torch.randn(3, 5, dtype=F64)
    for rows in (1, 2, 2, 3):
        toy.entry(torch.randn(rows, 3, dtype=F64), w, 2.0)
    # the family says "use the op", so each key gets its own plan (2 rows: replayed once)
    assert (toy.op_calls, toy.runs, toy.family_builds) == (3, 1, 1)
    assert list(toy.entry.family_plans.values()) == [USE_OP]


def test_the_op_body_replays_the_entrys_plan_inside_the_op(cpu_plans):
    """What a compiled graph calls is the op; `eager.inside` in its body runs the entry's plan
    for a recorded key (one checked body per key, shared with the entry's own calls); calls
    recording autograd, and keyless ones, run the body."""
    toy = Toy()
    bodies = []

    def body(x, w, scale):
        bodies.append(1)
        return toy.op(x, w, scale)

    toy.entry = EagerOp("toy_inside", toy.op, toy.build)
    x, w = _xw()
    inner = lambda *a: eager.inside("toy_inside", body, a)  # noqa: E731 - the op's body
    outs = [inner(x, w, 2.0) for _ in range(3)]
    assert (len(bodies), toy.runs) == (1, 2) and all(torch.equal(o, outs[0]) for o in outs)
    toy.entry(x, w, 2.0)  # the entry finds the plan the body recorded
    assert (len(bodies), toy.op_calls, toy.runs) == (1, 1, 3)
    xg, wg = _xw(grad=True)
    inner(xg, wg, 2.0)  # records autograd: the body
    assert len(bodies) == 2
    assert torch.equal(eager.inside("no_such_entry", body, (x, w, 2.0)), outs[0]) and len(bodies) == 3


def test_default_plan_devices_keep_cpu_calls_on_the_op():
    plan_cache.invalidate()
    toy = Toy()
    x, w = _xw()
    toy.entry(x, w, 2.0)
    toy.entry(x, w, 2.0)
    assert toy.op_calls == 2 and len(toy.entry.plans) == 0


def test_grad_runs_the_plan_under_eager_function(cpu_plans):
    toy = Toy()
    x, w = _xw(grad=True)
    g = torch.randn(4, 5, dtype=F64)
    want = torch.autograd.grad(2.0 * (x @ w), (x, w), g)
    toy.entry(x, w, 2.0)  # the op (with its own autograd)
    out = toy.entry(x, w, 2.0)
    assert toy.runs == 1 and type(out.grad_fn).__name__ == "CuteKernelsToyMatmulBackward"
    got = torch.autograd.grad(out, (x, w), g)
    assert toy.backwards == 1 and all(torch.allclose(a, b) for a, b in zip(got, want))
    # create_graph: the differentiable backward
    out = toy.entry(x, w, 2.0)
    gx, _ = torch.autograd.grad(out, (x, w), g, create_graph=True)
    assert toy.backward_ops == 1 and torch.allclose(gx, want[0])
    # grad mode off: the plain plan, no graph
    with torch.no_grad():
        assert toy.entry(x, w, 2.0).grad_fn is None


def test_invalidate_forgets_eager_plans(cpu_plans):
    toy = Toy()
    x, w = _xw()
    toy.entry(x, w, 2.0)
    plan_cache.invalidate()
    toy.entry(x, w, 2.0)
    assert toy.op_calls == 2


def _warm(toy):
    x, w = _xw()
    toy.entry(x, w, 2.0)
    toy.entry(x, w, 2.0)
    return x, w, (toy.op_calls, toy.runs)


class PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class Dispatching(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_modes_and_forward_ad_take_the_op(cpu_plans):
    import torch.autograd.forward_ad as fwad

    toy = Toy()
    x, w, (ops, runs) = _warm(toy)
    with PassThrough():
        toy.entry(x, w, 2.0)
    with Dispatching():
        toy.entry(x, w, 2.0)
    with fwad.dual_level():
        toy.entry(x, w, 2.0)
    toy.entry(x, w, scale=2.0)  # keywords
    assert toy.op_calls == ops + 4 and toy.runs == runs


def test_transparent_modes_keep_the_plan(cpu_plans, monkeypatch):
    toy = Toy()
    x, w, (ops, runs) = _warm(toy)
    seen = []

    class Routing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(eager, "_TRANSPARENT", {Routing})
    with Routing():
        assert eager.direct_state() == eager.YES_UNDER_MODES
        toy.entry(x, w, 2.0)
        with PassThrough():  # one opaque mode above it: the op
            toy.entry(x, w, 2.0)
    assert toy.op_calls == ops + 1 and toy.runs == runs + 1
    # the mode saw the op's torch calls (matmul, mul: under PassThrough) but none of the plan's
    assert [f.__name__ for f in seen] == ["matmul", "mul"]


def test_functorch_transforms_take_the_op(cpu_plans):
    toy = Toy()
    x, w, (ops, runs) = _warm(toy)
    xs = torch.randn(2, 4, 3, dtype=F64)
    assert torch.allclose(torch.vmap(lambda xi: toy.entry(xi, w, 2.0))(xs), 2.0 * (xs @ w))
    gx = torch.func.grad(lambda xi: toy.entry(xi, w, 2.0).sum())(x)
    assert torch.allclose(gx, 2.0 * torch.ones(4, 5, dtype=F64) @ w.T)
    assert toy.runs == runs and toy.op_calls == ops + 2


def test_tracers_record_the_op(cpu_plans):
    toy = Toy()
    x, w, (ops, runs) = _warm(toy)

    class M(torch.nn.Module):
        def forward(self, x, w):
            return toy.entry(x, w, 2.0)

    gm = torch.fx.symbolic_trace(M())
    assert toy.runs == runs and torch.allclose(gm(x, w), 2.0 * (x @ w))
    traced = torch.jit.trace(lambda x, w: toy.entry(x, w, 2.0), (x, w), check_trace=False)
    assert torch.allclose(traced(x, w), 2.0 * (x @ w))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        assert toy.entry(fx, fw, 2.0).shape == (4, 5)
    assert toy.runs == runs


def test_torch_compile_traces_the_op_without_a_graph_break(cpu_plans):
    from torch._dynamo.testing import CompileCounter

    toy = Toy()
    x, w, (ops, runs) = _warm(toy)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(lambda x, w: toy.entry(x, w, 2.0) + 1, backend=counter, fullgraph=True)
    assert torch.allclose(compiled(x, w), 2.0 * (x @ w) + 1)
    x6 = torch.randn(6, 3, dtype=F64)
    assert torch.allclose(compiled(x6, w), 2.0 * (x6 @ w) + 1)
    assert toy.runs == runs and counter.frame_count >= 1


def test_autocast_casts_floating_tensors_as_torch_does_for_linear():
    x, w = torch.randn(4, 3), torch.randn(3, 5, dtype=F64)
    i = torch.arange(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cx, cw, ci, s = autocast_args((x, w, i, 2.0))
        assert cx.dtype == torch.bfloat16 and torch.equal(cx, x.to(torch.bfloat16))
        assert cw is w and ci is i and s == 2.0  # float64 and integer tensors are left alone
        assert torch.nn.functional.linear(x, x).dtype == cx.dtype  # what torch does for F.linear
    assert autocast_args((x,))[0] is x  # autocast off


def test_autocast_reaches_the_plan(cpu_plans):
    toy = Toy()
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        toy.entry(x, w, 2.0)
        out = toy.entry(x, w, 2.0)
    assert toy.runs == 1 and out.dtype == torch.bfloat16
