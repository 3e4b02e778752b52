"""Launch plans (`cute_kernels.runtime.plan_cache`) on CPU: a warm call of a signature seen
before skips the checks and hands the compiled function exactly what the checked call did;
anything outside the signature's promise (alignment, strides, dtypes, options, tensor
subclasses, the DSL-tensor fallback, split/padded paths) takes the checked path, and errors
stay the checked path's errors.

The compiler is replaced by a recorder whose compiled function records its arguments, the CUDA
checks by stand-ins, and "cpu" is added to `PLAN_DEVICES` for these tests only (by default CPU
tensors never get plans, so the other CPU tests always run the checked path).
"""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("cutlass") is None:
    pytest.skip("needs the CuTe DSL", allow_module_level=True)

from cute_kernels.runtime import plan_cache  # noqa: E402
from cute_kernels.runtime.plan_cache import PlanCache, plain_tensors, tensor_signature  # noqa: E402


class Compiler:
    """Stands in for `compile_kernel`: its compiled function records each launch's arguments."""

    def __init__(self):
        self.builds, self.launches, self.jit_fns = [], [], []

    def __call__(self, jit_fn, *args, key, options=None):
        self.builds.append(key)
        self.jit_fns.append(jit_fn)
        return lambda *launch_args: self.launches.append(launch_args)


def _desc(x):
    """A launch argument as comparable values (a tensor by its view of memory, not identity)."""
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), x.stride(), x.dtype, x.data_ptr(), x.requires_grad)
    return (type(x).__name__, x)


def _same_launch(first, second):
    assert [_desc(x) for x in first] == [_desc(x) for x in second]


@pytest.fixture
def plans(monkeypatch):
    """Plans for CPU tensors, every cache empty before and after the test."""
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    plan_cache.invalidate()
    yield
    plan_cache.invalidate()


# ---- the cache itself ------------------------------------------------------------------------

def test_cache_is_bounded_and_invalidate_clears_every_cache():
    one, two = PlanCache("one", max_entries=3), PlanCache("two")
    for i in range(3):
        one.put(i, str(i))
    two.put("x", "plan")
    assert len(one) == 3
    one.put(3, "3")  # full: starts afresh
    assert dict(one) == {3: "3"}
    plan_cache.invalidate()
    assert len(one) == 0 and len(two) == 0
    with pytest.raises(ValueError, match="max_entries"):
        PlanCache("bad", max_entries=0)


def test_cache_activity_names_the_caches_that_stored_since():
    """A warm step stores nothing: `cache_activity` against a snapshot taken before it lists the
    caches whose calls took the checked path (stored) in between, with how many values."""
    from cute_kernels.runtime.plan_cache import WarmCache, cache_activity

    plans, builds = PlanCache("activity.plans"), WarmCache("activity.builds")
    before = cache_activity()
    plans.put("sig", "plan")
    builds["cfg"] = "kernel"  # item assignment counts as put does
    builds["cfg"] = "kernel again"
    assert plans.get("sig") == "plan" and plans.get("other") is None  # lookups store nothing
    assert cache_activity(before) == {"activity.builds": 2, "activity.plans": 1}
    assert cache_activity(cache_activity()) == {}


def test_tensor_signature_sees_alignment_strides_and_grad():
    t = torch.randn(64, 64)
    sig = tensor_signature(t)
    assert sig == (torch.Tensor, t.shape, (64, 1), torch.float32, t.device, t.data_ptr() % 16, False)
    assert tensor_signature(t[:, 1:])[5] == (t.data_ptr() + 4) % 16  # a 4-byte offset view
    assert tensor_signature(t.t())[2] == (1, 64)
    assert tensor_signature(torch.nn.Parameter(t))[6] is True

    class Sub(torch.Tensor):
        pass

    for other in (3.0, None, t.as_subclass(Sub)):
        with pytest.raises(TypeError, match="not a plain tensor"):
            tensor_signature(other)


def test_plain_tensors_only_on_plan_devices(monkeypatch):
    class Sub(torch.Tensor):
        pass

    t = torch.randn(4)
    assert not plain_tensors(t)  # cpu is not a plan device by default
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cpu"}))
    assert plain_tensors(t, None, torch.nn.Parameter(t))
    assert not plain_tensors(t, t.as_subclass(Sub))
    assert not plain_tensors(torch.empty(4, device="meta"))


# ---- GEMM ------------------------------------------------------------------------------------

@pytest.fixture
def gemm(plans, monkeypatch):
    from cute_kernels.gemm import api, dispatch, epilogue_api, sm90_rung

    compiler = Compiler()
    monkeypatch.setattr(sm90_rung, "_cuda_reason", lambda a, b, out: None)
    monkeypatch.setattr(epilogue_api, "_device_reason", lambda a, b: None)
    monkeypatch.setattr(sm90_rung, "compile_kernel", compiler)
    monkeypatch.setattr(sm90_rung, "tvm_ffi_available", lambda: True)
    monkeypatch.setattr(sm90_rung, "max_active_clusters", lambda n: 132 // n)
    monkeypatch.setattr(sm90_rung, "_compiled", {})
    monkeypatch.setattr(sm90_rung, "_dummies", {})
    monkeypatch.setattr(api, "_check_cuda", lambda t, what, device: None)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "_CANDIDATES", {})
    # the gemv specialist (a side of at most 16) keeps its own plans, tested in
    # tests/gemm/test_gemv.py; here the sm90 rungs take every problem
    from cute_kernels.gemm.gemv import RUNG as gemv

    monkeypatch.setattr(type(gemv), "supports", lambda self, a, b, out: "not under test here")
    return compiler


def _checks_counted(monkeypatch):
    """Count the checked paths' entry points (a plan hit calls none of them)."""
    from cute_kernels.gemm import api, sm90_rung

    seen = []
    for owner, name in ((api, "resolve"), (sm90_rung.Sm90Rung, "supports"), (sm90_rung, "_check_epilogue")):
        original = getattr(owner, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            seen.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return seen


def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


MATMUL_CASES = {
    "2-D, b = w.T": lambda: ((_bf16(256, 384), _bf16(512, 384).T), {}),
    "2-D row-major b, int alpha": lambda: ((_bf16(256, 384), _bf16(384, 512)), dict(alpha=2)),
    "batched a, broadcast b": lambda: ((_bf16(3, 256, 128), _bf16(256, 128).T), dict(alpha=0.5)),
    "column-major a": lambda: ((_bf16(128, 256).T, _bf16(128, 256)), {}),
    "beta and c (broadcast row)": lambda: ((_bf16(256, 128), _bf16(128, 256)),
                                           dict(beta=0.5, c=_bf16(256), out_dtype=torch.bfloat16)),
    "fp32 out": lambda: ((_bf16(256, 128), _bf16(128, 256)), dict(out_dtype=torch.float32)),
    # M <= 128 runs swap-AB (sm90_skinny): the plan hands the operands over swapped
    "skinny swap-AB, b = w.T": lambda: ((_bf16(64, 384), _bf16(512, 384).T), {}),
    "skinny swap-AB, beta and c": lambda: ((_bf16(16, 256), _bf16(256, 512)),
                                            dict(beta=0.5, c=_bf16(16, 512), alpha=2.0)),
}


@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_matmul_plan_replays_the_checked_launch(gemm, monkeypatch, case):
    from cute_kernels.gemm import api, sm90_rung

    (a, b), kwargs = MATMUL_CASES[case]()
    first = api.matmul(a, b, **kwargs)
    assert len(gemm.launches) == 1 and len(api._PLANS) == 1
    seen = _checks_counted(monkeypatch)
    again = api.matmul(a, b, **kwargs)
    assert seen == [], f"a warm call ran the checks: {seen}"
    # the result is a fresh tensor like the checked call's: the launches differ only in where C is
    assert (again.shape, again.stride(), again.dtype) == (first.shape, first.stride(), first.dtype)
    assert len(gemm.launches) == 2
    l0, l1 = gemm.launches
    if "c" not in kwargs and case != "batched a, broadcast b":
        _same_kernel_operands(gemm, l0, l1, a, b, again, alpha=float(kwargs.get("alpha", 1.0)))
        return
    assert len(gemm.builds) == 1  # a broadcast operand or an epilogue: the rung's plan replays
    assert _desc(l1[2])[:4] == _desc(l0[2])[:4] and l1[2].data_ptr() == again.data_ptr()
    no_c = "c" not in kwargs
    rest = [i for i in range(len(l0)) if i != 2 and not (i == 3 and no_c)]
    _same_launch([l0[i] for i in rest], [l1[i] for i in rest])
    if no_c:
        assert l0[3] is l0[2] and l1[3] is l1[2]  # no c: C stands in (never read, beta == 0)
    assert len(sm90_rung._PLANS) == 1
    swapped = case.startswith("skinny")
    assert l1[0].data_ptr() == (b if swapped else a).data_ptr()
    assert l1[1].data_ptr() == (a if swapped else b).data_ptr()


def _same_kernel_operands(gemm, l0, l1, a, b, out, alpha):
    """The warm launch `l1` went to a caller-order build that takes (a, b, out, alpha, beta)
    as they are, and the views it forms are the kernel operands of the checked launch `l0`
    (extents, strides, storage; the stride of an extent-1 batch is never dereferenced)."""
    from cute_kernels.gemm.sm90_rung import CallerOrderLaunch

    assert len(gemm.builds) == 2 and isinstance(gemm.jit_fns[1], CallerOrderLaunch)
    assert gemm.builds[1][1] == "caller_order" and gemm.builds[1][2] == gemm.builds[0][1]  # same config
    assert l1[0] is a and l1[1] is b and l1[2] is out and l1[3:] == (alpha, 0.0)
    assert l0[7:] == (alpha, 0.0) and l0[3] is l0[2]  # the checked launch: same scalars, no c
    views = gemm.jit_fns[1].views(a, b, out)
    for view, operand in zip(views, l0[:3]):
        assert view.shape == operand.shape and view.stride()[:2] == operand.stride()[:2]
        assert view.shape[2] == 1 or view.stride(2) == operand.stride(2)
    assert [v.data_ptr() for v in views[:2]] == [t.data_ptr() for t in l0[:2]]
    assert views[2].data_ptr() == out.data_ptr()


def test_matmul_signature_changes_take_the_checked_path(gemm, monkeypatch):
    from cute_kernels.gemm import api

    a, b = _bf16(256, 384), _bf16(512, 384).T
    api.matmul(a, b)
    seen = _checks_counted(monkeypatch)
    base = _bf16(257 * 384)
    shifted = base[1:1 + 256 * 384].view(256, 384)  # same shape and strides, pointer 2 bytes off 16
    api.matmul(shifted, b)
    assert seen.count("resolve") == 1  # not TMA-aligned: checked (and padded), no plan
    api.matmul(a.to(torch.float16), b.to(torch.float16))
    api.matmul(a, b, out_dtype=torch.float32)
    api.matmul(a, b.contiguous())
    assert seen.count("resolve") == 4
    # each new signature that launched directly has its own plan now
    seen.clear()
    api.matmul(a.to(torch.float16), b.to(torch.float16))
    api.matmul(a, b.contiguous())
    assert seen == []


def test_matmul_errors_are_the_checked_paths_after_a_plan(gemm):
    from cute_kernels.gemm import api

    a, b = _bf16(256, 384), _bf16(512, 384).T
    api.matmul(a, b)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        api.matmul(a, b, alpha="2")
    with pytest.raises(TypeError, match="alpha must be a real number"):
        api.matmul(a, b, alpha=True)
    with pytest.raises(ValueError, match="needs c"):
        api.matmul(a, b, beta=1.0)
    with pytest.raises(TypeError, match="out_dtype must be a floating"):
        api.matmul(a, b, out_dtype=torch.int32)
    with pytest.raises((TypeError, ValueError)):
        api.matmul(a, b, kernel=["auto"])  # unhashable: reported by the checked path
    with pytest.raises(ValueError, match="unknown GEMM kernel"):
        api.matmul(a, b, kernel="nope")


def test_parameters_are_detached_in_a_plan(gemm):
    from cute_kernels.gemm import api

    x = _bf16(256, 384)
    w = torch.nn.Parameter(_bf16(512, 384))
    api.matmul(x, w.T)
    api.matmul(x, w.T)
    for launch in gemm.launches:
        assert not launch[1].requires_grad and launch[1].data_ptr() == w.data_ptr()
    l0, l1 = gemm.launches
    assert l1[0] is x and not l1[1].requires_grad and _desc(l1[1])[:5] == _desc(w.T)[:5]
    view = gemm.jit_fns[1].views(*l1[:3])[1]  # the caller-order build's B: the checked launch's
    assert (view.shape, view.stride()[:2], view.data_ptr()) == (l0[1].shape, l0[1].stride()[:2], l0[1].data_ptr())
    with torch.no_grad():  # views made under no_grad do not require grad; the caller's w does
        api.matmul(x, w.T)
        api.matmul(x, w.T)
    assert not gemm.launches[-1][1].requires_grad


@pytest.mark.parametrize("problem", ["split", "padded", "dsl", "naive"])
def test_other_paths_replay_the_rungs_own_call(gemm, monkeypatch, problem):
    """Split-K or swapped (long K at small M x N) and padded (K * 2 bytes not a multiple of 16)
    calls replay the rung's recorded run (`sm90_skinny.split_k_plan`, `Sm90Rung._staged`);
    DSL-tensor (no TVM-FFI) and other rungs' launches have no rung plan: matmul's plan skips
    only its own checks and the dispatch, and the rung decides again. Either way: the same
    launches."""
    from cute_kernels.gemm import api, naive, sm90_rung

    kernel = "auto"
    if problem == "split":
        a, b = _bf16(256, 8192), _bf16(256, 8192).T
    elif problem == "padded":
        a, b = _bf16(64, 250), _bf16(250, 96)
    else:
        a, b = _bf16(256, 384), _bf16(512, 384).T
    launches = gemm.launches
    if problem == "dsl":
        monkeypatch.setattr(sm90_rung, "tvm_ffi_available", lambda: False)
        monkeypatch.setattr(sm90_rung, "_stream", lambda: "stream")
    elif problem == "naive":
        compiler = Compiler()
        monkeypatch.setattr(naive, "compile_kernel", compiler)
        monkeypatch.setattr(naive, "use_tvm_ffi", lambda: True)
        monkeypatch.setattr(naive.RUNG, "_compiled", {})
        monkeypatch.setattr(naive, "_cuda_reason", lambda a, b, out: None)
        a, b, kernel, launches = a.float(), b.float(), "naive", compiler.launches
    first = api.matmul(a, b, kernel=kernel)
    count = len(launches)
    seen = _checks_counted(monkeypatch)
    again = api.matmul(a, b, kernel=kernel)
    rung_plans = 1 if problem in ("split", "padded") else 0
    assert "resolve" not in seen and len(api._PLANS) == 1 and len(sm90_rung._PLANS) == rung_plans
    assert (again.shape, again.stride(), again.dtype) == (first.shape, first.stride(), first.dtype)
    assert len(launches) == 2 * count
    for l0, l1 in zip(launches[:count], launches[count:]):
        assert [_desc(x)[:4] if isinstance(x, torch.Tensor) else type(x) for x in l0] == \
            [_desc(x)[:4] if isinstance(x, torch.Tensor) else type(x) for x in l1]


def test_tensor_subclasses_and_default_cpu_get_no_plan(gemm, monkeypatch):
    from cute_kernels.gemm import api

    class Sub(torch.Tensor):
        pass

    a, b = _bf16(256, 384), _bf16(512, 384).T
    api.matmul(a.as_subclass(Sub), b)
    assert len(api._PLANS) == 0
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda"}))
    api.matmul(a, b)
    assert len(api._PLANS) == 0


def test_rung_plan_with_fused_epilogue_and_scales(gemm, monkeypatch):
    from cute_kernels.gemm.sm90_persistent import rung

    x, w = _bf16(1, 256, 512), _bf16(1, 256, 512)
    bias, c = _bf16(256), _bf16(1, 256, 256)
    out = torch.empty(1, 256, 256, dtype=torch.float32)
    kwargs = dict(alpha=2.0, beta=0.5, c=c, bias=bias, activation="gelu_tanh")
    rung(x, w.transpose(1, 2), out, **kwargs)
    seen = _checks_counted(monkeypatch)
    rung(x, w.transpose(1, 2), out, **kwargs)
    assert seen == []
    _same_launch(*gemm.launches)
    # fp8 with 0-d scales (reshaped to (1,) views, as the checked path passes them)
    a8, b8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).transpose(1, 2)
    sa, sb = torch.rand(()) + 0.5, torch.rand(1) + 0.5
    out8 = torch.empty(1, 256, 256, dtype=torch.bfloat16)
    rung(a8, b8, out8, scale_a=sa, scale_b=sb)
    seen.clear()
    rung(a8, b8, out8, scale_a=sa, scale_b=sb)
    assert seen == []
    _same_launch(gemm.launches[-2], gemm.launches[-1])
    assert gemm.launches[-1][5].shape == (1,)
    # an invalid option after a plan exists is still reported
    with pytest.raises(ValueError, match="activation must be None"):
        rung(x, w.transpose(1, 2), out, activation="tanh")


def test_dispatch_clear_cache_forgets_plans(gemm):
    from cute_kernels.gemm import api, dispatch, sm90_rung

    api.matmul(_bf16(256, 384), _bf16(512, 384).T)
    assert len(api._PLANS) == len(sm90_rung._PLANS) == 1
    dispatch.clear_cache()
    assert len(api._PLANS) == len(sm90_rung._PLANS) == 0


# ---- attention -------------------------------------------------------------------------------

@pytest.fixture(params=["sm80_flash", "sm90_flash"])
def attention(plans, monkeypatch, request):
    from cute_kernels.attention import api, dispatch, sm80_flash, sm90_flash

    module = {"sm80_flash": sm80_flash, "sm90_flash": sm90_flash}[request.param]
    compiler = Compiler()
    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(module, "compile_kernel", compiler)
    monkeypatch.setattr(module, "tvm_ffi_available", lambda: True)
    for cache in ("_KERNELS", "_CONFIGS", "_COMPILED"):
        monkeypatch.setattr(module, cache, {})
    kernel = "auto" if request.param == "sm90_flash" else "sm80_flash"  # auto: sm90_flash on a 9.0 device
    return compiler, kernel


def _qkv(b=1, h=8, s=256, d=64, **kw):
    return tuple(torch.randn(b, h, s, d, **kw).to(torch.bfloat16) for _ in range(3))


def test_sdpa_plan_replays_the_checked_launch(attention, monkeypatch):
    from cute_kernels.attention import api, dispatch
    from cute_kernels.attention import scaled_dot_product_attention as sdpa

    compiler, kernel = attention
    q, k, v = _qkv()
    first = sdpa(q, k, v, is_causal=True, scale=0.2, kernel=kernel)
    seen = []
    monkeypatch.setattr(api, "check_inputs", lambda *a, **kw: seen.append("check_inputs"))
    monkeypatch.setattr(dispatch, "resolve", lambda *a, **kw: seen.append("resolve"))
    again = sdpa(q, k, v, is_causal=True, scale=0.2, kernel=kernel)
    assert seen == []
    assert (again.shape, again.stride(), again.dtype) == (first.shape, first.stride(), first.dtype)
    l0, l1 = compiler.launches
    assert l1[3].data_ptr() == again.data_ptr()
    _same_launch(l0[:3] + l0[5:], l1[:3] + l1[5:])
    assert [_desc(x)[:4] for x in l0[3:5]] == [_desc(x)[:4] for x in l1[3:5]]
    # attention_forward shares the plan and returns lse too
    out, lse = api.attention_forward(q, k, v, causal="top_left", scale=0.2, kernel=kernel)
    assert seen == [] and lse.shape == (1, 8, 256) and lse.dtype == torch.float32


def test_sdpa_options_and_grad_take_the_checked_path(attention, monkeypatch):
    from cute_kernels.attention import api
    from cute_kernels.attention import scaled_dot_product_attention as sdpa

    compiler, kernel = attention
    q, k, v = _qkv()
    sdpa(q, k, v, kernel=kernel)
    checked = []
    original = api.check_inputs
    monkeypatch.setattr(api, "check_inputs", lambda *a, **kw: checked.append(1) or original(*a, **kw))
    sdpa(q, k, v, is_causal=True, kernel=kernel)
    sdpa(q, k, v, scale=0.5, kernel=kernel)
    sdpa(q[..., 1:, :], k, v, kernel=kernel)  # another shape
    assert len(checked) == 3
    with pytest.raises(NotImplementedError, match="dropout"):
        sdpa(q, k, v, dropout_p=0.5, kernel=kernel)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        sdpa(q, k, v, is_causal=1, kernel=kernel)
    # unbatched inputs have their own plan, with 3-D results
    q3, k3, v3 = q[0], k[0], v[0]
    o1 = sdpa(q3, k3, v3, kernel=kernel)
    o2 = sdpa(q3, k3, v3, kernel=kernel)
    assert o1.shape == o2.shape == (8, 256, 64)
    _same_launch(compiler.launches[-2][:3], compiler.launches[-1][:3])


def test_attention_forward_plan_detaches_inputs_that_require_grad(attention):
    from cute_kernels.attention import api

    compiler, kernel = attention
    q, k, v = (t.requires_grad_() for t in _qkv())
    api.attention_forward(q, k, v, kernel=kernel)
    api.attention_forward(q, k, v, kernel=kernel)
    assert len(api._PLANS) == 1
    for launch in compiler.launches:
        assert not any(t.requires_grad for t in launch[:3])
    _same_launch(compiler.launches[0][:3], compiler.launches[1][:3])


def test_attention_dsl_fallback_gets_no_plan(attention, monkeypatch):
    import cute_kernels.runtime as runtime
    from cute_kernels.attention import api, sm80_flash, sm90_flash
    from cute_kernels.attention import scaled_dot_product_attention as sdpa

    _, kernel = attention
    for module in (sm80_flash, sm90_flash):
        monkeypatch.setattr(module, "tvm_ffi_available", lambda: False)
    monkeypatch.setattr(runtime, "from_torch", lambda t, **kw: t)
    monkeypatch.setattr(runtime, "current_stream", lambda: "stream")
    q, k, v = _qkv()
    sdpa(q, k, v, kernel=kernel)
    assert len(api._PLANS) == 0


# ---- on the GPU: plans against the checked path and torch, and what a warm call costs --------

def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


def _rel(x, ref) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.gpu
def test_gpu_plans_compute_what_the_checked_path_does():
    from cute_kernels.attention import api as attention_api
    from cute_kernels.attention import scaled_dot_product_attention as sdpa
    from cute_kernels.gemm import api

    _hopper()
    plan_cache.invalidate()
    a = torch.randn(3, 256, 384, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ w.double().T
    checked = api.matmul(a, w.T, alpha=2)
    assert len(api._PLANS) == 1
    planned = api.matmul(a, w.T, alpha=2)
    assert torch.equal(checked, planned) and _rel(planned, 2 * ref) < 1e-2
    # on a side stream, the input rewritten there behind a long sleep: a plan launching on any
    # other stream would read the old values
    side, a2, new = torch.cuda.Stream(), a.clone(), torch.randn_like(a)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        a2.copy_(new)
        out = api.matmul(a2, w.T, alpha=2)
    side.synchronize()
    assert _rel(out, 2 * (new.double() @ w.double().T)) < 1e-2
    q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    checked = sdpa(q, k, v, is_causal=True)
    planned = sdpa(q, k, v, is_causal=True)
    assert len(attention_api._PLANS) == 1 and torch.equal(checked, planned)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert _rel(planned, ref) < 1e-2


@pytest.mark.gpu
def test_gpu_warm_attention_call_never_waits_for_the_gpu(enqueue_only):
    """A warm `scaled_dot_product_attention` (B1 H8 S256 D64 bf16) enqueues without waiting for
    the GPU (no host sync: capturable, and the host runs ahead) and computes what torch's SDPA
    does. Its host time against SDPA's is a figure of the `overhead` bench, not a test."""
    from cute_kernels.attention import scaled_dot_product_attention as sdpa

    _hopper()
    q, k, v = (torch.randn(1, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    us = enqueue_only(lambda: sdpa(q, k, v))  # a wait for the device raises there
    print(f"\nwarm attention host time: {us:.1f} us")
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    out = sdpa(q, k, v)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_warm_caches_memo_bounds_and_kinds():
    from cute_kernels.runtime.plan_cache import WarmCache, memo, warm_caches

    builds = []

    def build(x):
        builds.append(x)
        return x * 2

    cache = WarmCache("test.memo", 2)
    assert memo(cache, "a", build, 1) == 2 and memo(cache, "a", build, 5) == 2 and builds == [1]
    assert memo(cache, "b", build, 0) == 0 and memo(cache, "b", build, 9) == 0  # a falsy value is a value
    memo(cache, "c", build, 3)  # full: starts afresh
    assert dict(cache) == {"c": 6}
    plain = {}
    assert memo(plain, "k", build, 4) == 8 and plain == {"k": 8}  # tests stand plain dicts in
    plans = PlanCache("test.plans")
    plans.put("sig", "plan")
    plan_cache.invalidate()  # plans go, builds stay
    assert len(plans) == 0 and dict(cache) == {"c": 6}
    names = [c.name for c in warm_caches()]
    assert "test.memo" in names and names == sorted(names)
    with pytest.raises(ValueError, match="kind"):
        WarmCache("bad", kind="other")
