"""The eager direct path of `linear` (`cute_kernels.ops.eager_gemm`), on CPU.

1. Values: with the kernel layer's plans replaced by stand-ins that compute with PyTorch (fused
   epilogue or not), a warm `cute_kernels.nn.Linear` / `nn.functional.linear` call skips the op
   and computes F.linear's forward and gradients (every activation, with and without bias,
   2-D and 3-D inputs), its output takes in-place ops, and the backward's GEMMs go to the
   kernel layer with the right `kernel=` (through their plans on a warm backward).
2. Structure: with the real sm90 rungs (compiler replaced by a recorder, CUDA checks stubbed),
   a warm call launches exactly the operands the checked call launched, enters no
   torch.library op and allocates nothing but its output (a `sys.setprofile` count).
3. torch.compile: the nn entries trace to the op with fullgraph=True and do not recompile for
   a new batch size.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.ops import eager_gemm  # noqa: E402
from cute_kernels.ops import gemm as gemm_ops  # noqa: E402
from cute_kernels.runtime import plan_cache  # noqa: E402

F64 = torch.float64
ACT = {None: lambda y: y, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu,
       "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}


def _rel(x, ref):
    return float((x - ref).detach().norm() / ref.detach().norm())


@pytest.fixture
def cpu_plans(monkeypatch):
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    plan_cache.invalidate()
    yield
    plan_cache.invalidate()


def _detached(*tensors):
    for t in tensors:
        assert t is None or not t.requires_grad, "a tensor requiring grad reached a kernel"


class StandIns:
    """The kernel layer on CPU: `_gemm` (the op body's GEMM) and `linear_kernel_plan` (what the
    eager plan replays), computing with PyTorch and recording what they were handed."""

    def __init__(self, fused: bool):
        self.fused = fused
        self.gemms, self.launches, self.replayed, self.op_calls = [], [], [], 0

    def gemm(self, a, b, *, kernel="auto", out_dtype=None):
        _detached(a, b)
        self.gemms.append(kernel)
        return torch.matmul(a, b)

    def kernel_plan(self, x2, w_t, bias, activation, rung, callers=None):
        def fused_launch(a, b, out, alpha, beta, c, bias_, sa, sb):
            _detached(a, b, out, bias_)
            assert (alpha, beta, c, sa, sb) == (1.0, 0.0, None, None, None)
            self.launches.append(("fused", rung, tuple(out.shape)))
            y = a.reshape(-1, a.shape[-1]) @ b.T
            out.copy_(ACT[activation](y if bias_ is None else y + bias_).view(out.shape))

        def plan(a, b, alpha, beta, c):
            _detached(a, b)
            assert a.dim() == 2 and b.shape == w_t.shape and b.stride() == w_t.stride()
            self.launches.append(("plain", rung, tuple(a.shape)))
            return a @ b

        return ("fused", fused_launch) if self.fused else ("plain", plan)

    def gemm_plan_for(self, a0, b0, *, kernel="auto"):
        """`gemm.api.plan_for`: the backward's GEMMs have plans too (after one checked call)."""
        def plan(a, b, alpha, beta, c):
            _detached(a, b)
            assert (a.shape, a.stride(), b.shape, b.stride()) == (a0.shape, a0.stride(), b0.shape, b0.stride())
            self.replayed.append(kernel)
            return a @ b

        return plan


@pytest.fixture(params=[True, False], ids=["fused", "unfused"])
def kernels(request, cpu_plans, monkeypatch):
    s = StandIns(request.param)
    monkeypatch.setattr(gemm_ops, "_gemm", lambda: s.gemm)
    monkeypatch.setattr(gemm_ops, "linear_kernel_plan", s.kernel_plan)
    from cute_kernels.gemm import api

    monkeypatch.setattr(api, "plan_for", s.gemm_plan_for)
    op = eager_gemm.linear.op

    def counted(*args, **kwargs):
        s.op_calls += 1
        return op(*args, **kwargs)

    monkeypatch.setattr(eager_gemm.linear, "op", counted)
    return s


@pytest.mark.parametrize("activation", list(ACT))
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("shape", [(6, 7), (2, 3, 7)])
def test_warm_linear_skips_the_op_and_matches_torch(kernels, activation, with_bias, shape):
    layer = cnn.Linear(7, 4, bias=with_bias, dtype=F64, activation=activation, kernel="sm90_persistent")
    x = torch.randn(*shape, dtype=F64, requires_grad=True)
    ref = ACT[activation](F.linear(x, layer.weight, layer.bias))
    params = [x, layer.weight] + ([layer.bias] if with_bias else [])
    g = torch.randn(ref.shape, dtype=F64)
    want = torch.autograd.grad(ref, params, g)
    for call in range(3):
        out = layer(x)
        assert out.shape == ref.shape and out.is_contiguous() and _rel(out, ref) < 1e-12
        kernels.gemms.clear(), kernels.replayed.clear()
        got = torch.autograd.grad(out, params, g)
        for a, r in zip(got, want):
            assert _rel(a, r) < 1e-12
        recompute = activation in ("silu", "gelu", "gelu_tanh")
        # call 0's forward entered the op, whose backward formula ran one linear_backward op
        # (recording the plan); without an activation, later backwards replay the GEMMs' plans
        replayed = activation is None and call > 0
        assert kernels.gemms == ([] if replayed else ["sm90_persistent"] * (2 + recompute))
        assert kernels.replayed == (["sm90_persistent"] * 2 if replayed else [])
    assert kernels.op_calls == 1  # only the first call entered the op
    assert len(kernels.launches) == 2 and all(l[1] == "sm90_persistent" for l in kernels.launches)
    assert type(out.grad_fn).__name__ == "CuteKernelsLinearBackward"
    with torch.no_grad():  # another key (no autograd), which the op's body recorded on call 0
        layer(x)           # (an autograd.Function's forward runs without grad mode): replayed
        assert _rel(layer(x), ref) < 1e-12 and layer(x).grad_fn is None
    assert kernels.op_calls == 1


@pytest.mark.parametrize("wants", ["x", "w", "wb"])
def test_warm_backward_computes_only_the_gradients_needed(kernels, wants):
    """A first layer (the input needs no gradient), frozen weights (LoRA's base layer): the
    replayed backward runs the GEMMs asked for, and nothing else."""
    x = torch.randn(3, 4, 8, dtype=F64, requires_grad="x" in wants)
    w = torch.randn(5, 8, dtype=F64, requires_grad="w" in wants)
    b = torch.randn(5, dtype=F64, requires_grad="b" in wants)
    wrt = [t for t in (x, w, b) if t.requires_grad]
    g = torch.randn(3, 4, 5, dtype=F64)
    want = torch.autograd.grad(F.linear(x, w, b), wrt, g)
    for _ in range(3):
        kernels.replayed.clear()
        got = torch.autograd.grad(cnn.functional.linear(x, w, b), wrt, g)
        assert all(_rel(a, r) < 1e-12 for a, r in zip(got, want))
    assert kernels.replayed == ["auto"] * (("x" in wants) + ("w" in wants))


def test_warm_functional_linear_output_takes_in_place_ops(kernels):
    x = torch.randn(2, 5, 8, dtype=F64, requires_grad=True)
    w = torch.randn(3, 8, dtype=F64, requires_grad=True)
    for _ in range(2):
        out = cnn.functional.linear(x, w, activation=None)
        assert not out._is_view()
        out.relu_()  # nn.ReLU(inplace=True) after a Linear
        out.sum().backward()
    assert _rel(x.grad / 2, (F.linear(x, w) > 0).to(F64) @ w) < 1e-12
    assert kernels.op_calls == 1


def test_patched_models_keep_the_direct_path(kernels):
    """patch() runs the forward under route() (a TorchFunctionMode, declared transparent), so
    the swapped Linear layers still replay their plans."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, dtype=F64), torch.nn.ReLU(), torch.nn.Linear(16, 4, dtype=F64))
    x = torch.randn(5, 8, dtype=F64)
    want = model(x)
    cnn.patch(model)
    for _ in range(3):
        assert _rel(model(x), want) < 1e-12
    assert kernels.op_calls == 2  # the first call of each layer


def test_signature_changes_are_checked_again(kernels):
    layer = cnn.Linear(8, 3, dtype=F64)
    x = torch.randn(4, 8, dtype=F64)
    layer(x), layer(x)
    layer(torch.randn(5, 8, dtype=F64))  # another M
    layer(x.t().contiguous().t())  # column-major input
    layer(x.float().to(F64))  # equal signature: replayed
    assert kernels.op_calls == 3
    with pytest.raises(ValueError, match="in_features"):
        layer(torch.randn(4, 9, dtype=F64))  # the op's errors stay the op's


def test_a_copying_reshape_gets_no_plan(kernels):
    w = torch.randn(3, 8, dtype=F64)
    x = torch.randn(4, 8, 2, dtype=F64).transpose(1, 2)  # (4, 2, 8) whose (8, 8) view would copy
    for _ in range(2):
        assert _rel(cnn.functional.linear(x, w), x @ w.T) < 1e-12
    assert kernels.op_calls == 2 and kernels.launches == []


def test_autocast_casts_like_f_linear(kernels):
    layer = cnn.Linear(8, 3)  # fp32 parameters, bf16 compute under autocast
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.linear(x, layer.weight, layer.bias)
        outs = [layer(x) for _ in range(2)]
    for out in outs:
        assert out.dtype == want.dtype == torch.bfloat16
        assert _rel(out.float(), want.float()) < 1e-2
    assert kernels.op_calls == 1


@pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")
def test_the_op_path_casts_under_autocast_too(monkeypatch):
    """Without plans (the default on CPU) the op's own autocast kernel applies the rule."""
    layer = cnn.Linear(8, 3, fallback="torch")
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
        assert gemm_ops.linear(x, layer.weight, layer.bias, fallback="torch").dtype == torch.bfloat16


# ---- structure, on the real sm90 rungs --------------------------------------------------------

class Compiler:
    def __init__(self):
        self.builds, self.launches, self.jit_fns = [], [], []

    def __call__(self, jit_fn, *args, key, options=None):
        self.builds.append(key)
        self.jit_fns.append(jit_fn)
        return lambda *launch_args: self.launches.append(launch_args)


@pytest.fixture
def sm90(cpu_plans, monkeypatch):
    if importlib.util.find_spec("cutlass") is None:
        pytest.skip("needs the CuTe DSL")
    from cute_kernels.gemm import api, dispatch, epilogue_api, sm90_rung

    compiler = Compiler()
    monkeypatch.setattr(sm90_rung, "_cuda_reason", lambda a, b, out: None)
    monkeypatch.setattr(epilogue_api, "_device_reason", lambda a, b: None)
    monkeypatch.setattr(epilogue_api, "fusing_kernel", lambda a, kernel="auto": "sm90_persistent")
    monkeypatch.setattr(sm90_rung, "compile_kernel", compiler)
    monkeypatch.setattr(sm90_rung, "tvm_ffi_available", lambda: True)
    monkeypatch.setattr(sm90_rung, "max_active_clusters", lambda n: 132 // n)
    monkeypatch.setattr(sm90_rung, "_compiled", {})
    monkeypatch.setattr(sm90_rung, "_dummies", {})
    monkeypatch.setattr(api, "_check_cuda", lambda t, what, device: None)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "_CANDIDATES", {})
    return compiler


def _desc(t):
    if isinstance(t, torch.Tensor):
        return ("T", tuple(t.shape), t.stride(), t.dtype, t.data_ptr(), t.requires_grad)
    return (type(t).__name__, t)


def _profile(fn):
    """(Python functions called, C functions called) during fn(), by qualified name."""
    py, c = [], []

    def tracer(frame, event, arg):
        if event == "call":
            py.append(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_qualname}")
        elif event == "c_call":
            c.append(getattr(arg, "__qualname__", None) or getattr(arg, "__name__", repr(arg)))

    sys.setprofile(tracer)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return py, c


SM90_CASES = {  # input shape, out_features, bias
    "3-D input, bias": ((2, 128, 384), 512, True),
    "3-D input, no bias": ((2, 128, 384), 512, False),
    "2-D input, bias": ((256, 384), 512, True),
    "decode (swap-AB), bias": ((2, 4, 384), 512, True),
}


@pytest.mark.parametrize("case", sorted(SM90_CASES))
def test_warm_linear_hands_the_callers_tensors_to_one_build(sm90, case):
    """The warm call launches a caller-order build (`Sm90Rung.caller_order_launch`) with the
    caller's x, weight, a fresh output and the bias as they are: the views that build forms are
    the kernel operands the checked call launched, and the call makes no torch view, enters no
    torch.library op, runs no check and allocates nothing but the output."""
    from cute_kernels.gemm.sm90_rung import CallerOrderBiasLaunch, CallerOrderLaunch

    shape, n, with_bias = SM90_CASES[case]
    layer = cnn.Linear(shape[-1], n, bias=with_bias, dtype=torch.bfloat16)
    x = torch.randn(*shape).to(torch.bfloat16)
    first = layer(x)
    # the call's key (the parameters require grad) and the no-grad one its op's body recorded
    assert len(sm90.launches) == 1 and len(eager_gemm.linear.plans) == 2
    assert [plan.kind for plan in eager_gemm.linear.plans.values()] == ["direct"] * 2
    got = {}
    py, c = _profile(lambda: got.setdefault("y", layer(x)))
    again = got["y"]
    assert (again.shape, again.stride(), again.dtype) == (first.shape, first.stride(), first.dtype)
    l0, l1 = sm90.launches
    entry = sm90.jit_fns[-1]
    assert isinstance(entry, CallerOrderBiasLaunch if with_bias else CallerOrderLaunch)
    assert l1[0] is x and l1[2] is again and not l1[1].requires_grad and l1[1].data_ptr() == layer.weight.data_ptr()
    if with_bias:
        assert l1[3].data_ptr() == layer.bias.data_ptr() and not l1[3].requires_grad and l1[4:] == (1.0, 0.0)
        assert l0[4].data_ptr() == layer.bias.data_ptr()  # the checked launch read the same bias
    else:
        assert l1[3:] == (1.0, 0.0)
    for view, operand in zip(entry.views(*l1[:3]), l0[:3]):
        assert view.shape == operand.shape and view.stride()[:2] == operand.stride()[:2]
        assert view.shape[2] == 1 or view.stride(2) == operand.stride(2)
    assert [v.data_ptr() for v in entry.views(*l1[:3])[:2]] == [t.data_ptr() for t in l0[:2]]
    assert not [f for f in py if f.startswith(("torch._ops", "torch._library", "cute_kernels.gemm.",
                                                  "cute_kernels.ops.gemm.linear"))], py
    ours = [f for f in py if f.startswith("cute_kernels")]
    assert not [f for f in ours if "check" in f or "supports" in f or "resolve" in f], py
    # Linear.forward, the entry (__call__, _untraced_state, _direct, call_key), EagerFunction.forward,
    # the plan (forward, run) and the op's _linear_setup
    assert len(ours) <= 9, ours
    assert py.count("torch.compiler.is_compiling") == 1, py
    names = [f.rsplit(".", 1)[-1] for f in c]
    assert [f for f in names if f in ("as_strided", "view", "reshape", "t", "permute", "unsqueeze")] == [], c
    creating = [f for f in names if f in ("empty", "empty_like", "zeros", "ones", "full", "clone", "contiguous",
                                          "to", "copy_", "new_empty")]
    assert creating == ["empty"], c  # the output is the only new tensor


def test_a_rung_without_caller_order_replays_its_plan(sm90, monkeypatch):
    from cute_kernels.gemm import sm90_rung

    monkeypatch.setattr(sm90_rung.Sm90Rung, "caller_order_launch", lambda self, *a, **kw: None)
    layer = cnn.Linear(384, 512, dtype=torch.bfloat16)
    x = torch.randn(2, 128, 384).to(torch.bfloat16)
    layer(x), layer(x)
    assert [plan.kind for plan in eager_gemm.linear.plans.values()] == ["fused"] * 2  # (as above)
    l0, l1 = sm90.launches
    assert [_desc(t) for t in l0[:2]] == [_desc(t) for t in l1[:2]]
    assert _desc(l1[2])[:4] == _desc(l0[2])[:4] and [_desc(t) for t in l0[4:]] == [_desc(t) for t in l1[4:]]


@pytest.mark.parametrize("grad", [False, True])
def test_warm_training_call_runs_under_one_autograd_node(sm90, grad):
    layer = cnn.Linear(384, 512, dtype=torch.bfloat16)
    x = torch.randn(256, 384).to(torch.bfloat16).requires_grad_(grad)
    layer(x)
    py, _ = _profile(lambda: layer(x))
    # no op, and not Function.apply's Python wrapper (argument binding, functorch unwrapping)
    assert not [f for f in py if f.startswith(("torch._ops", "torch._library", "torch.autograd.function.Function."))]
    assert "cute_kernels.runtime.eager.EagerFunction.forward" in py  # parameters require grad: a node


@pytest.mark.parametrize("shape", [(2, 128, 384), (256, 384)])
def test_warm_backward_replays_the_checked_gemms_without_an_op(sm90, shape):
    """On the real sm90 rungs: the first backward runs `linear_backward`'s checked body (dX and
    dW, two launches); a warm one launches the same two GEMMs on the same operands (the
    gradient, the weight, the input) without entering a torch.library op."""
    layer = cnn.Linear(384, 512, dtype=torch.bfloat16)
    x = torch.randn(*shape).to(torch.bfloat16).requires_grad_(True)
    g = torch.randn(*shape[:-1], 512).to(torch.bfloat16)
    params = [x, layer.weight, layer.bias]
    ptrs = []
    for call in range(3):
        out = layer(x)
        n0 = len(sm90.launches)
        py, _ = _profile(lambda: torch.autograd.grad(out, params, g))
        launched = sm90.launches[n0:]
        assert len(launched) == 2, launched
        ptrs.append([[t.data_ptr() for t in launch[:2]] for launch in launched])
        if call > 0:
            assert not [f for f in py if f.startswith(("torch._ops", "torch._library"))], py
    wx, wg = layer.weight.data_ptr(), g.data_ptr()
    assert ptrs[0] == ptrs[1] == ptrs[2] == [[wg, wx], [wg, x.data_ptr()]]


# ---- torch.compile ------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")
def test_nn_entries_compile_to_the_op_without_graph_breaks_or_recompiles(cpu_plans, monkeypatch):
    from torch._dynamo.testing import CompileCounterWithBackend

    layer = cnn.Linear(6, 5, activation="silu", fallback="torch")
    w2 = torch.randn(3, 5, requires_grad=True)

    def f(x):
        return cnn.functional.linear(layer(x), w2, fallback="torch").sum(-1)

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    for m in (4, 7):
        x = torch.randn(m, 6, requires_grad=True)
        torch._dynamo.mark_dynamic(x, 0)
        keys = len(eager_gemm.linear.plans)
        got = compiled(x)
        # the graph calls the op, whose body keys a call at most once per linear (`eager.inside`)
        assert len(eager_gemm.linear.plans) <= keys + 2
        want = f(x)
        assert torch.allclose(got, want, atol=1e-5)
        gx, = torch.autograd.grad(got.sum(), x)
        assert torch.allclose(gx, torch.autograd.grad(want.sum(), x)[0], atol=1e-5)
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"


def test_compiled_backward_calls_one_op_per_linear_layer(kernels):
    """The backward graph torch.compile traces holds one `linear_backward` per layer (not a
    `matmul` per GEMM: each op call crosses the dispatcher), whose body replays the backward's
    plan once the first call recorded it; the gradients match F.linear's."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from functorch.compile import make_boxed_func

    graphs = []

    def backend(gm, example_inputs):
        def keep(g, _):
            graphs.append(g)
            return make_boxed_func(g)
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: make_boxed_func(g), bw_compiler=keep)

    l1, l2 = cnn.Linear(8, 16, dtype=F64), cnn.Linear(16, 4, bias=False, dtype=F64, activation="relu")
    ref = [torch.nn.Linear(8, 16, dtype=F64), torch.nn.Linear(16, 4, bias=False, dtype=F64)]
    for a, b in zip((l1, l2), ref):
        b.load_state_dict(a.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: l2(l1(x)), backend=backend, fullgraph=True)
    x = torch.randn(2, 5, 8, dtype=F64, requires_grad=True)
    params = [x, l1.weight, l1.bias, l2.weight]
    g = torch.randn(2, 5, 4, dtype=F64)
    want = torch.autograd.grad(torch.relu(ref[1](ref[0](x))), [x, ref[0].weight, ref[0].bias, ref[1].weight], g)
    for call in range(2):
        kernels.gemms.clear(), kernels.replayed.clear()
        got = torch.autograd.grad(compiled(x), params, g)
        assert all(_rel(a, r) < 1e-12 for a, r in zip(got, want))
        # l2 (relu: its derivative is not replayed) runs its checked body every call; l1 replays
        assert kernels.replayed == ([] if call == 0 else ["auto"] * 2)
    targets = [str(n.target) for n in graphs[-1].graph.nodes if n.op == "call_function"]
    assert targets.count("cute_kernels.linear_backward.default") == 2, targets
    # l1's bias gradient is a sum in the graph (a compiler fuses it into grad's producer), not the op's
    calls = [n for n in graphs[-1].graph.nodes if str(n.target) == "cute_kernels.linear_backward.default"]
    assert [n.args[8] for n in calls] == [False, False] and "aten.sum.dim_IntList" in targets, targets
    assert not [t for t in targets if "matmul" in t or t.startswith("aten.mm")], targets
