"""The attention forward's per-call host path, on CPU: a warm call of
`scaled_dot_product_attention` never synchronizes, never builds a tensor from host data, never
asks the device for its properties, never rebuilds a kernel object or derives a layout, never
wraps a tensor as a DSL tensor on the TVM-FFI path, and hands the caller's torch tensors
themselves to the compiled function.

The compiler is replaced by a recorder whose compiled function records its arguments, the CUDA
device check and the capability query by stand-ins, so CPU tensors run the whole Python path
(validation, dispatch, allocation, the rung). Torch entry points that would wait for the GPU,
upload host data or query the device are wrapped with recorders while the warm calls run.
"""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("cutlass") is None:
    pytest.skip("needs the CuTe DSL", allow_module_level=True)

import cute_kernels.runtime as runtime  # noqa: E402
from cute_kernels.attention import api, dispatch, sm80_flash, sm90_flash  # noqa: E402
from cute_kernels.attention.api import attention_forward, scaled_dot_product_attention  # noqa: E402

# What a warm call must never do: each of these waits for the GPU, uploads host data with a
# blocking copy, or queries the device.
FORBIDDEN = [
    (torch, "tensor"), (torch, "as_tensor"), (torch, "from_numpy"),
    (torch.cuda, "synchronize"), (torch.cuda, "get_device_capability"), (torch.cuda, "get_device_properties"),
    (torch.cuda, "current_stream"),
    (torch.Tensor, "item"), (torch.Tensor, "tolist"), (torch.Tensor, "cpu"), (torch.Tensor, "numpy"),
    (torch.Tensor, "__bool__"), (torch.Tensor, "__float__"), (torch.Tensor, "__int__"),
    (torch.Tensor, "contiguous"), (torch.Tensor, "clone"), (torch.Tensor, "copy_"),
    (torch.cuda.Stream, "synchronize"), (torch.cuda.Event, "synchronize"),
]

# (rung module, kernel argument, kernel class name, trailing launch arguments after the scalars
# (scale, upper offset, lower offset, group): sm80's five varlen slots, then both rungs' score
# features (the soft cap's score scale, sinks; sm80's seqused_k))
RUNGS = {
    "sm80_flash": (sm80_flash, "sm80_flash", "FlashAttentionSm80", (None, None, None, None, None, 1.0, None, None)),
    # score scale, sinks, then the six varlen parameters the one build also takes (absent)
    "sm90_flash": (sm90_flash, "sm90_flash", "FlashAttentionSm90", (1.0, None, None, None, None, None, None, None)),
}


class Compiler:
    """Stands in for `compile_kernel`: records each build; its function records each launch."""

    def __init__(self):
        self.builds, self.launches = [], []

    def __call__(self, jit_fn, *args, key, options=None):
        self.builds.append(dict(kernel=jit_fn, args=args, key=key, options=options))
        return lambda *launch_args: self.launches.append(launch_args)


class Calls:
    """Wraps callables with counters (still calling through) while the test runs."""

    def __init__(self, monkeypatch, targets):
        self.seen: list[str] = []
        for owner, attr in targets:
            original = getattr(owner, attr)
            name = f"{getattr(owner, '__name__', owner)}.{attr}"
            monkeypatch.setattr(owner, attr, self._wrap(name, original))

    def _wrap(self, name, original):
        def recorded(*args, **kwargs):
            self.seen.append(name)
            return original(*args, **kwargs)

        return recorded


def _counting_class(monkeypatch, module, name: str, counts: dict):
    """Replace module.<name> by a subclass counting its constructions in counts[name]."""
    base = getattr(module, name)

    def __init__(self, *args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        base.__init__(self, *args, **kwargs)

    monkeypatch.setattr(module, name, type(name, (base,), {"__init__": __init__}))


@pytest.fixture(params=sorted(RUNGS))
def rung(request, monkeypatch):
    """One flash rung on CPU tensors: no device checks, a recording compiler, TVM-FFI builds,
    fresh per-process caches, and counters on kernel-object, layout and config construction."""
    module, kernel, cls, tail = RUNGS[request.param]
    compiler = Compiler()
    counts: dict = {}
    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(module, "compile_kernel", compiler)
    monkeypatch.setattr(module, "tvm_ffi_available", lambda: True)
    for cache in ("_KERNELS", "_CONFIGS", "_COMPILED"):
        monkeypatch.setattr(module, cache, {})
    _counting_class(monkeypatch, module, cls, counts)
    if module is sm80_flash:
        _counting_class(monkeypatch, module, "FlashSm80Layouts", counts)
    original_config_for = module.config_for

    def config_for(*args, **kwargs):
        counts["config_for"] = counts.get("config_for", 0) + 1
        return original_config_for(*args, **kwargs)

    monkeypatch.setattr(module, "config_for", config_for)

    def no_dsl_tensors(*args, **kwargs):
        raise AssertionError("from_torch called on the TVM-FFI path")

    monkeypatch.setattr(runtime, "from_torch", no_dsl_tensors)
    monkeypatch.setattr(runtime, "current_stream", lambda: pytest.fail("current_stream on the TVM-FFI path"))
    return dict(module=module, kernel=kernel, cls=cls, tail=tail, compiler=compiler, counts=counts)


def _config(module, sq=256):
    """The config a dense non-causal D = 64 bf16 problem of `sq` query rows gets from `module`
    (sm90_flash's short Q sequences take 128-row tiles, `sm90_layouts.short_rows`)."""
    from cute_kernels.attention.sm90_layouts import short_rows

    short = {"short": True} if module is sm90_flash and short_rows(sq, 64) else {}
    return module.config_for(64, "bfloat16", False, **short)


def _qkv(b=1, hq=8, hkv=8, sq=256, sk=256, d=64, dtype=torch.bfloat16):
    q = torch.randn(b, hq, sq, d, dtype=dtype)
    k = torch.randn(b, hkv, sk, d, dtype=dtype)
    v = torch.randn(b, hkv, sk, d, dtype=dtype)
    return q, k, v


def test_warm_calls_hand_the_callers_tensors_to_one_build(rung, monkeypatch):
    compiler, counts = rung["compiler"], rung["counts"]
    q, k, v = _qkv()
    first = scaled_dot_product_attention(q, k, v, kernel=rung["kernel"])
    assert len(compiler.builds) == 1 and counts[rung["cls"]] == 1
    build = compiler.builds[0]
    assert build["options"] == runtime.TVM_FFI_OPTION
    config = _config(rung["module"])
    assert build["key"] == (f"attention.{rung['module'].__name__.rsplit('.', 1)[1]}", "tvm_ffi", config)
    assert build["kernel"].config == config
    before = dict(counts)

    calls = Calls(monkeypatch, FORBIDDEN)
    outs = [scaled_dot_product_attention(q, k, v, kernel=rung["kernel"]) for _ in range(50)]
    assert calls.seen == []
    assert len(compiler.builds) == 1, "a warm call rebuilt"
    assert counts == before, f"a warm call constructed {set(counts.items()) - set(before.items())}"
    assert len(compiler.launches) == 51
    for out, launch in zip([first, *outs], compiler.launches):
        lq, lk, lv, lo, llse, scale, offset, offset_lo, group, *tail = launch
        assert lq is q and lk is k and lv is v and lo is out
        assert llse.shape == (1, 8, 256) and llse.dtype == torch.float32 and llse.is_contiguous()
        assert type(scale) is float and scale == pytest.approx(1 / 8)
        assert (offset, offset_lo, group, tuple(tail)) == (0, 0, 1, rung["tail"])


def test_scalars_follow_the_problem_and_new_sizes_reuse_the_build(rung):
    compiler = rung["compiler"]
    # Bottom-right causal, GQA 8:2, unbatched, an explicit scale, and new sizes each call (all of
    # them short Q sequences, one tile class of sm90_flash: `sm90_layouts.short_rows`).
    from torch.nn.attention.bias import causal_lower_right

    for sq, sk in ((4, 6), (100, 200), (64, 64)):
        q, k, v = _qkv(hq=8, hkv=2, sq=sq, sk=sk)
        q3, k3, v3 = q[0], k[0], v[0]
        out = scaled_dot_product_attention(q3, k3, v3, attn_mask=causal_lower_right(sq, sk), scale=0.3,
                                           enable_gqa=True, kernel=rung["kernel"])
        assert out.shape == (8, sq, 64)
        lq, lk, lv, lo, llse, scale, offset, offset_lo, group, *_ = compiler.launches[-1]
        assert lq.shape == (1, 8, sq, 64) and lq.data_ptr() == q3.data_ptr() and lk.data_ptr() == k3.data_ptr()
        assert lo.data_ptr() == out.data_ptr() and llse.shape == (1, 8, sq)
        assert (scale, offset, offset_lo, group) == (0.3, sk - sq, 0, 4)
    assert len(compiler.builds) == 1, "new sizes must not recompile (sizes are runtime values)"
    assert compiler.builds[0]["key"][2].causal
    # Each static combination is its own build, keyed by its config.
    for dtype, d, causal in ((torch.float16, 64, True), (torch.bfloat16, 128, False), (torch.bfloat16, 128, False)):
        scaled_dot_product_attention(*_qkv(d=d, dtype=dtype), is_causal=causal, kernel=rung["kernel"])
    keys = [b["key"][2] for b in compiler.builds]
    assert len(keys) == 3 and len(set(keys)) == 3
    assert [(c.dtype, c.head_dim, c.causal) for c in keys[1:]] == [("float16", 64, True), ("bfloat16", 128, False)]


@pytest.mark.parametrize("causal, window, upper, lower", [
    # (is_causal, window_size, j <= i + upper, j >= i + lower) for Sq = 100, Sk = 160
    (False, (30, 10), 60 + 10, 60 - 30),   # a window without causality is aligned bottom-right
    (True, (30, 0), 0, -30),               # top-left causal with a left bound
    (False, (-1, 5), 65, None),            # only a right bound
    (False, (7, -1), None, 53),            # only a left bound
])
def test_window_bounds_reach_the_launch_as_offsets(rung, causal, window, upper, lower):
    """window_size becomes the launch's runtime offsets (upper, lower) and the config's
    `causal` (upper bound tested) and `local` (lower bound tested) flags; windows of other
    widths reuse the build."""
    compiler = rung["compiler"]
    q, k, v = _qkv(sq=100, sk=160)
    scaled_dot_product_attention(q, k, v, is_causal=causal, window_size=window, kernel=rung["kernel"])
    *_, offset, offset_lo, group = compiler.launches[-1][5:9]
    config = compiler.builds[-1]["key"][-1]
    assert (config.causal, config.local) == (upper is not None, lower is not None)
    if upper is not None:
        assert offset == upper
    if lower is not None:
        assert offset_lo == lower
    builds = len(compiler.builds)
    wider = tuple(w if w < 0 else w + 3 for w in window) if not causal else (window[0] + 3, 0)
    scaled_dot_product_attention(q, k, v, is_causal=causal, window_size=wider, kernel=rung["kernel"])
    assert len(compiler.builds) == builds, "another window width must not recompile"


def test_tensors_requiring_grad_are_passed_as_detached_aliases(rung):
    compiler = rung["compiler"]
    q, k, v = (t.requires_grad_() for t in _qkv())
    out, lse = attention_forward(q, k, v, kernel=rung["kernel"])
    lq, lk, lv, lo, llse, *_ = compiler.launches[-1]
    for passed, given in ((lq, q), (lk, k), (lv, v)):
        assert not passed.requires_grad and passed.data_ptr() == given.data_ptr()
        assert passed.stride() == given.stride()
    assert lo is out and llse is lse


def test_warm_calls_skip_the_checks_and_build_nothing(rung, monkeypatch):
    """A warm call replays its plan: no input checks, no dispatch, no kernel-object build, no
    compile-cache lookup; only the launch (stubbed) and the results. (What that costs in time
    is the `overhead` benchmark's business, not a test's.)"""
    from cute_kernels.runtime import plan_cache

    compiler, counts = rung["compiler"], rung["counts"]
    # plans are kept for CUDA tensors only; CPU tensors stand in here
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    plan_cache.invalidate()
    q, k, v = _qkv()
    for _ in range(3):
        scaled_dot_product_attention(q, k, v, kernel=rung["kernel"])
    builds, objects, launches = len(compiler.builds), dict(counts), len(compiler.launches)
    checked = []
    real_check = api.check_inputs
    monkeypatch.setattr(api, "check_inputs", lambda *a, **kw: checked.append(1) or real_check(*a, **kw))
    try:
        for _ in range(40):
            scaled_dot_product_attention(q, k, v, kernel=rung["kernel"])
    finally:
        plan_cache.invalidate()  # CPU plans must not outlive this test
    assert checked == [] and len(compiler.builds) == builds and dict(counts) == objects
    assert len(compiler.launches) == launches + 40


def test_dsl_tensor_fallback_builds_the_kernel_once(rung, monkeypatch):
    """Without TVM-FFI the rung wraps each tensor (from_torch) and goes through the compile cache
    each call, keyed by the config alone; the kernel object is still built once."""
    module, compiler, counts = rung["module"], rung["compiler"], rung["counts"]
    monkeypatch.setattr(module, "tvm_ffi_available", lambda: False)
    wrapped = []
    monkeypatch.setattr(runtime, "from_torch", lambda t, **kw: wrapped.append((t, kw)) or t)
    monkeypatch.setattr(runtime, "current_stream", lambda: "stream")
    q, k, v = _qkv()
    for _ in range(3):
        scaled_dot_product_attention(q, k, v, kernel=rung["kernel"])
    assert counts[rung["cls"]] == 1
    name = module.__name__.rsplit(".", 1)[1]
    assert [b["key"] for b in compiler.builds] == [(f"attention.{name}", _config(module))] * 3
    assert all(b["options"] is None for b in compiler.builds)
    assert [t for t, _ in wrapped[:3]] == [q, k, v] and len(wrapped) == 15
    assert "stream" in compiler.launches[-1]


def test_dispatch_caches_static_checks_per_device(monkeypatch):
    """`kernel="auto"` asks the device its capability once per (dtype, device), not per call."""
    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)
    for module in (sm80_flash, sm90_flash):  # auto on a 9.0 device picks sm90_flash
        monkeypatch.setattr(module, "compile_kernel", Compiler())
        monkeypatch.setattr(module, "tvm_ffi_available", lambda: True)
        monkeypatch.setattr(module, "_COMPILED", {})
    asked = []
    monkeypatch.setattr(dispatch, "device_capability", lambda device: asked.append(device) or (9, 0))
    q, k, v = _qkv()
    for _ in range(5):
        scaled_dot_product_attention(q, k, v)
    assert 1 <= len(asked) <= 3  # once per rung with a min_capability, at the first call only
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (7, 5))
    with pytest.raises(ValueError, match="needs compute capability 8.0, device has 7.5"):
        scaled_dot_product_attention(q, k, v)


@pytest.mark.compile
def test_sm80_flash_tvm_ffi_build_takes_torch_tensors(monkeypatch, tmp_path):
    """The real TVM-FFI build of the sm80_flash forward: its signature is the rung's launch
    (5 tensors, 4 scalars, the 5 varlen slots as None, the 3 feature slots, no stream argument), and it checks the
    torch tensors it is given itself (a CPU tensor is refused by device, not by arity)."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sm80_flash, "_COMPILED", {})
    config = sm80_flash.config_for(64, "bfloat16", True)
    fn = sm80_flash._compile_tvm_ffi(config)
    assert sm80_flash._COMPILED[config] is fn
    q, k, v = _qkv(sq=128, sk=128)
    out, lse = torch.empty_like(q), torch.empty(1, 8, 128)
    with pytest.raises(TypeError, match="Expects 17 parameters"):
        fn(q, k, v, out, lse, 0.125, 0, 0, 1)
    with pytest.raises(ValueError, match="device_type=cuda"):
        fn(q, k, v, out, lse, 0.125, 0, 0, 1, None, None, None, None, None, 1.0, None, None)


@pytest.mark.compile
@pytest.mark.parametrize("features", [{}, {"softcap": 30.0, "sinks": True}], ids=["plain", "softcap_sinks"])
def test_sm90_flash_launch_plan_matches_its_real_tvm_ffi_build(monkeypatch, tmp_path, features):
    """The dense launch the sm90_flash rung hands out (`launch_plan`) against the real TVM-FFI
    build for sm_90a: called with CPU tensors, the build refuses them by device, not by arity
    (a launch missing the build's varlen parameters raised 'Expects 17 parameters' on the GPU)."""
    pytest.importorskip("tvm_ffi")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sm90_flash, "_COMPILED", {})
    monkeypatch.setattr(sm90_flash, "tvm_ffi_available", lambda: True)
    monkeypatch.setattr(api, "_device_reason", lambda q, k, v: None)  # CPU tensors: the build checks devices
    q, k, v = _qkv(sq=128, sk=128)
    problem = api.check_inputs(q, k, v, causal="top_left", scale=None, enable_gqa=False,
                               softcap=features.get("softcap"),
                               sinks=torch.zeros(8) if features.get("sinks") else None)
    launch = sm90_flash.RUNG.launch_plan(problem)
    out, lse = torch.empty_like(q), torch.empty(1, 8, 128)
    sinks = torch.zeros(8) if features.get("sinks") else None
    with pytest.raises(ValueError, match="device_type=cuda"):
        launch(q, k, v, out, lse, sinks)
