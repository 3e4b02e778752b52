"""The eager entry and the op body's replay (`runtime.eager.inside`) under random call sequences
(hypothesis), on CPU: a plan runs only for a call whose key matches the call it was recorded
from (shape, strides, dtype, alignment, requires_grad, whether autograd records), whichever of
the two recorded it, and every result, forward and gradient, is the op's.

The plan here remembers what it was recorded from and checks each call it runs against that:
a key that held too little would let a plan run a call unlike its own, and fail there."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cute_kernels.runtime import eager, plan_cache  # noqa: E402
from cute_kernels.runtime.eager import EagerOp  # noqa: E402
from eager_toys import ScaledMatmulPlan  # noqa: E402


def _facts(t):
    return (tuple(t.shape), t.stride(), t.dtype, t.data_ptr() & 15, t.requires_grad)


class Recorder:
    """op(x, w, scale) = scale * x @ w, an entry for it, and the op's body as `inside` runs it."""

    def __init__(self, name: str):
        self.name = name
        self.bodies = self.runs = 0
        self.entry = EagerOp(name, self.op, self.build)

    def op(self, x, w, scale):
        # what the custom op does: the body inside (autograd, if any, is the entry's or the op's)
        return eager.inside(self.name, self.body, (x, w, scale))

    def body(self, x, w, scale):
        self.bodies += 1
        return scale * (x @ w)

    def build(self, result, x, w, scale):
        return RecordedPlan(self, x, w, scale)


class RecordedPlan(ScaledMatmulPlan):
    __slots__ = ("owner", "facts", "scale")

    def __init__(self, owner, x, w, scale):
        self.owner, self.facts, self.scale = owner, (_facts(x), _facts(w)), scale

    def run(self, x, w, scale):
        assert (_facts(x), _facts(w)) == self.facts and scale == self.scale, "a plan ran a call unlike its own"
        assert not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)), "run recorded autograd"
        self.owner.runs += 1
        return scale * (x.detach() @ w.detach())

    def backward(self, ctx, g):
        return self.grads(ctx, g)

    def backward_op(self, ctx, g):
        return self.grads(ctx, g)


def _operand(shape, transposed: bool, offset: int, dtype, grad: bool):
    """A (rows, cols) tensor: contiguous or a transposed view, starting `offset` elements into its
    storage (so the pointer's alignment mod 16 varies)."""
    rows, cols = shape
    n = rows * cols + offset
    base = torch.randn(n, dtype=dtype)
    t = base[offset:].view(cols, rows).t() if transposed else base[offset:].view(rows, cols)
    return t.detach().requires_grad_(grad)


CALL = st.fixed_dictionaries({
    "m": st.sampled_from([1, 3, 4]),
    "k": st.sampled_from([2, 5]),
    "x_t": st.booleans(),
    "w_t": st.booleans(),
    "x_off": st.sampled_from([0, 1, 2]),
    "dtype": st.sampled_from([torch.float64, torch.float32]),
    "x_grad": st.booleans(),
    "w_grad": st.booleans(),
    "grad_mode": st.booleans(),
    "scale": st.sampled_from([1.0, 2.0]),
    "via": st.sampled_from(["entry", "body", "entry_no_grad_call"]),
})
# One field changed at a time, so that every part of the key meets a call equal in all the others.
FLIPS = {"m": lambda c: {1: 3, 3: 4, 4: 1}[c], "x_t": lambda c: not c, "w_t": lambda c: not c,
         "x_off": lambda c: (c + 1) % 3, "dtype": lambda c: torch.float32 if c is torch.float64 else torch.float64,
         "x_grad": lambda c: not c, "w_grad": lambda c: not c, "grad_mode": lambda c: not c,
         "scale": lambda c: 3.0 - c, "via": lambda c: {"entry": "body", "body": "entry_no_grad_call",
                                                      "entry_no_grad_call": "entry"}[c]}


@st.composite
def sequences(draw):
    """Calls in random order, each with near twins: the same call with one field changed."""
    calls = []
    for base in draw(st.lists(CALL, min_size=1, max_size=3)):
        calls.append(base)
        for field in draw(st.lists(st.sampled_from(sorted(FLIPS)), min_size=2, max_size=6)):
            calls.append({**base, field: FLIPS[field](base[field])})
    return draw(st.permutations(calls))


def _call(rec, c):
    x = _operand((c["m"], c["k"]), c["x_t"], c["x_off"], c["dtype"], c["x_grad"])
    w = _operand((c["k"], 3), c["w_t"], 0, c["dtype"], c["w_grad"])
    want = c["scale"] * (x.detach() @ w.detach())
    grad_on = c["grad_mode"] and c["via"] != "entry_no_grad_call"
    wants_grad = grad_on and (x.requires_grad or w.requires_grad)
    records = wants_grad and c["via"] == "entry"
    if c["via"] == "body":
        # as a custom op runs its body: inside an autograd.Function's forward (grad mode off)
        # when the call records autograd, else in the caller's grad mode
        with torch.set_grad_enabled(grad_on and not wants_grad):
            out = rec.op(x, w, c["scale"])
    else:
        with torch.set_grad_enabled(grad_on):
            out = rec.entry(x, w, c["scale"])
    assert torch.equal(out.detach(), want)
    assert (out.grad_fn is not None) == records
    if records:
        g = torch.randn_like(want)
        leaves = [t for t in (x, w) if t.requires_grad]
        got = torch.autograd.grad(out, leaves, g)
        ref = torch.autograd.grad(c["scale"] * (x @ w), leaves, g)
        # the plan's gradient and autograd's sum in different orders: float32 tolerances, not
        # allclose's default atol of 1e-8 (an element near zero then failed on rounding alone)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=sequences())
def test_random_call_sequences_replay_only_their_own_calls(calls, monkeypatch):
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    plan_cache.invalidate()
    rec = Recorder("sequence_toy")
    try:
        for c in calls * 2:  # every call again, now with whatever plans the first pass left
            _call(rec, c)
        assert rec.runs > 0  # plans did run
    finally:
        plan_cache.invalidate()
        eager._ENTRIES.pop("sequence_toy", None)
