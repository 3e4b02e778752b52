"""The sm90 rungs' per-call host path, on CPU: a warm call never synchronizes, never builds a
tensor from host data (a blocking host-to-device copy on a GPU), never asks the device for its
properties, never re-creates placeholder tensors, and (fused path) allocates nothing and copies
nothing; it hands the caller's tensors themselves to the compiled function.

The compiler is replaced by a recorder whose compiled function records its arguments, the
CUDA checks by stand-ins, so CPU tensors run the whole torch-side path (dispatching on sizes,
split-K, the unfused and padded paths). Torch entry points that would wait for the GPU or
upload host data are wrapped with recorders while the warm calls run.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("cutlass") is None:
    pytest.skip("needs the CuTe DSL", allow_module_level=True)

from cute_kernels.gemm import epilogue_api, sm90_rung  # noqa: E402
from cute_kernels.gemm.sm90_persistent import rung as persistent  # noqa: E402
from cute_kernels.gemm.sm90_tma_wgmma import rung as tma_wgmma  # noqa: E402

# What a warm call must never do: each of these waits for the GPU, uploads host data with a
# blocking copy, or queries the device.
FORBIDDEN = [
    (torch, "tensor"), (torch, "as_tensor"), (torch, "from_numpy"),
    (torch.cuda, "synchronize"), (torch.cuda, "get_device_capability"), (torch.cuda, "get_device_properties"),
    (torch.Tensor, "item"), (torch.Tensor, "tolist"), (torch.Tensor, "cpu"), (torch.Tensor, "numpy"),
    (torch.Tensor, "__bool__"), (torch.Tensor, "__float__"), (torch.Tensor, "__int__"),
    (torch.cuda.Stream, "synchronize"), (torch.cuda.Event, "synchronize"),
]
# Device memory initialization and allocation: allowed only where the path needs them.
INITS = [(torch, "zeros"), (torch, "ones"), (torch, "full"), (torch.Tensor, "fill_"), (torch.Tensor, "zero_")]
ALLOCS = [(torch, "empty"), (torch, "empty_like"), (torch, "empty_strided"), (torch.Tensor, "contiguous"),
          (torch.Tensor, "clone"), (torch.Tensor, "copy_")]


class Compiler:
    """Stands in for `compile_kernel`: records each build; its function records each launch."""

    def __init__(self):
        self.builds, self.launches = [], []

    def __call__(self, jit_fn, *args, key, options=None):
        self.builds.append(dict(kernel=jit_fn, args=args, key=key, options=options))
        return lambda *launch_args: self.launches.append(launch_args)


@pytest.fixture
def cpu(monkeypatch):
    """The sm90 rungs on CPU tensors: no CUDA checks, a recording compiler, TVM-FFI builds."""
    compiler = Compiler()
    monkeypatch.setattr(sm90_rung, "_cuda_reason", lambda a, b, out: None)
    monkeypatch.setattr(epilogue_api, "_device_reason", lambda a, b: None)
    monkeypatch.setattr(sm90_rung, "compile_kernel", compiler)
    monkeypatch.setattr(sm90_rung, "tvm_ffi_available", lambda: True)
    monkeypatch.setattr(sm90_rung, "max_active_clusters", lambda n: 132 // n)
    monkeypatch.setattr(sm90_rung, "_compiled", {})
    monkeypatch.setattr(sm90_rung, "_dummies", {})
    return compiler


class Calls:
    """Wraps torch entry points with counters (still calling through) while active."""

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


def _warm(monkeypatch, fn, calls=3, allow_inits=False):
    """Run `fn` once cold, then `calls` times under recorders; returns (forbidden, inits, allocs)."""
    fn()
    with monkeypatch.context() as m:
        forbidden = Calls(m, FORBIDDEN)
        inits = Calls(m, INITS)
        allocs = Calls(m, ALLOCS)
        for _ in range(calls):
            fn()
    assert forbidden.seen == [], f"a warm call synchronizes or uploads host data: {forbidden.seen}"
    if not allow_inits:
        assert inits.seen == [], f"a warm call initializes device memory: {inits.seen}"
    return allocs.seen


def _kmajor_b(l, k, n, dtype=torch.bfloat16):
    """(L, K, N) b with unit stride along K, as w.t() of an nn.Linear (N, K) weight."""
    return torch.randn(l, n, k).to(dtype).transpose(1, 2)


def _ptr(t):
    return t.data_ptr()


def test_fused_warm_call_passes_the_callers_tensors_and_nothing_else(cpu, monkeypatch):
    a = torch.randn(1, 256, 256).to(torch.bfloat16)
    b = _kmajor_b(1, 256, 256)
    out = torch.empty(1, 256, 256, dtype=torch.bfloat16)
    allocs = _warm(monkeypatch, lambda: persistent(a, b, out, alpha=2.0))
    assert allocs == [], f"the fused path allocates or copies per call: {allocs}"
    assert len(cpu.builds) == 1 and len(cpu.launches) == 4
    first, last = cpu.launches[0], cpu.launches[-1]
    A, B, C, Csrc, bias, sa, sb, alpha, beta = last
    assert (_ptr(A), _ptr(B), _ptr(C)) == (_ptr(a), _ptr(b), _ptr(out)) and Csrc is C
    assert (A.shape, B.shape, C.shape) == ((256, 256, 1),) * 3
    # the stand-ins for absent bias and scales are made once per process, not per call
    assert bias is first[4] and sa is first[5] and sb is first[6] and bias.is_floating_point()
    assert (alpha, beta) == (2.0, 0.0) and type(alpha) is float and type(beta) is float


def test_fused_epilogue_operands_reach_the_kernel_uncopied(cpu, monkeypatch):
    x = torch.randn(1, 128, 512).to(torch.bfloat16)
    w = _kmajor_b(1, 512, 256)
    bias = torch.randn(256).to(torch.bfloat16)
    c = torch.randn(1, 128, 256).to(torch.bfloat16)
    out = torch.empty(1, 128, 256, dtype=torch.float32)
    allocs = _warm(monkeypatch, lambda: persistent(x, w, out, beta=0.5, c=c, bias=bias, activation="gelu_tanh"))
    assert allocs == []
    (build,) = cpu.builds
    assert build["options"] == "--enable-tvm-ffi" and build["args"][-1].use_tvm_ffi_env_stream
    _, _, C, Csrc, bias_arg, _, _, alpha, beta = cpu.launches[-1]
    assert bias_arg is bias and _ptr(Csrc) == _ptr(c) and _ptr(C) == _ptr(out) and (alpha, beta) == (1.0, 0.5)


def test_fp8_scales_are_passed_as_device_tensors_never_read(cpu, monkeypatch):
    a = torch.randn(1, 128, 256).to(torch.float8_e4m3fn)
    b = _kmajor_b(1, 256, 128, torch.float8_e4m3fn)
    sa, sb = torch.rand(1) + 0.5, torch.rand(()) + 0.5
    out = torch.empty(1, 128, 128, dtype=torch.bfloat16)
    allocs = _warm(monkeypatch, lambda: persistent(a, b, out, scale_a=sa, scale_b=sb))
    assert allocs == []
    launch = cpu.launches[-1]
    assert _ptr(launch[5]) == _ptr(sa) and _ptr(launch[6]) == _ptr(sb)


def test_matmul_epilogue_allocates_only_its_result(cpu, monkeypatch):
    x = torch.randn(64, 512).to(torch.bfloat16)
    w = torch.randn(1024, 512).to(torch.bfloat16)  # nn.Linear weight (out_features, in_features)
    bias = torch.randn(1024).to(torch.bfloat16)
    allocs = _warm(monkeypatch, lambda: epilogue_api.matmul_epilogue(x, w.t(), bias=bias, activation="gelu_tanh"))
    split = len(cpu.launches[-1]) == 12  # a SplitKLaunch: its workspace is allocated per call too
    assert allocs == ["torch.empty"] * (6 if split else 3), allocs  # one result (and workspace) per call
    A, B, _, _, bias_arg = cpu.launches[-1][:5]
    # M = 64 runs swap-AB (sm90_skinny): the kernel's A is the weight, its B the activations
    assert _ptr(A) == _ptr(w) and _ptr(B) == _ptr(x) and bias_arg is bias


def test_split_k_and_unfused_paths_use_the_caching_allocator_only(cpu, monkeypatch):
    a = torch.randn(1, 256, 8192).to(torch.bfloat16)
    b = _kmajor_b(1, 8192, 256)
    out = torch.empty(1, 256, 256, dtype=torch.bfloat16)
    allocs = _warm(monkeypatch, lambda: persistent(a, b, out))
    launch = cpu.launches[-1]  # a SplitKLaunch: (A, B, C, Csrc, bias, sa, sb, workspace, counters, splits, ...)
    assert len(launch) == 12 and launch[9] > 1, "this problem is meant to split K"
    assert set(allocs) <= {"torch.empty", "Tensor.copy_"}, allocs
    # sm90_tma_wgmma cannot fuse: the product goes through an fp32 temporary
    bias = torch.randn(256)
    allocs = _warm(monkeypatch, lambda: tma_wgmma(a[:, :, :512], b[:, :512], out, bias=bias, activation="silu"))
    assert set(allocs) <= {"torch.empty", "Tensor.copy_"}, allocs


def test_unaligned_k_copies_only_the_operand_tma_cannot_read(cpu, monkeypatch):
    a = torch.randn(1, 64, 250).to(torch.bfloat16)  # K * 2 bytes is not a multiple of 16: no TMA
    b = torch.randn(1, 250, 96).to(torch.bfloat16)  # N-major rows of 96: TMA reads b as it is
    out = torch.empty(1, 64, 96, dtype=torch.bfloat16)
    allocs = _warm(monkeypatch, lambda: persistent(a, b, out))
    # one aligned copy of a per call (its padding is never read: nothing zeroed); b and the
    # result go to the kernel as they are
    assert allocs == ["torch.empty", "Tensor.copy_"] * 3, allocs
    lb = _kmajor_b(1, 250, 96)  # nn.Linear's w.t(): K-major rows of 250, so b is copied too
    allocs = _warm(monkeypatch, lambda: persistent(a, lb, out))
    assert allocs == ["torch.empty", "Tensor.copy_"] * 6, allocs


def test_the_device_capability_is_asked_once_per_device(monkeypatch):
    asked = []

    def capability(device):
        asked.append(device)
        return {"cuda:0": (9, 0), "cuda:1": (8, 0)}[device]

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(sm90_rung, "_device_reasons", {})
    t0 = SimpleNamespace(is_cuda=True, device="cuda:0")
    t1 = SimpleNamespace(is_cuda=True, device="cuda:1")
    for _ in range(3):
        assert sm90_rung._cuda_reason(t0, t0, t0) is None
        assert "sm_90" in sm90_rung._cuda_reason(t1, t1, t1)
    assert asked == ["cuda:0", "cuda:1"]
    cpu_t = SimpleNamespace(is_cuda=False, device="cpu")
    assert "CUDA" in sm90_rung._cuda_reason(cpu_t, t0, t0)
    assert persistent.min_capability == tma_wgmma.min_capability == (9, 0)


def test_dispatch_rules_out_the_sm90_rungs_below_hopper(monkeypatch):
    from cute_kernels.gemm import dispatch

    monkeypatch.setattr(dispatch, "device_capability", lambda device: (8, 0))
    assert "9.0" in dispatch._arch_reason(persistent, "cuda:0")
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    assert dispatch._arch_reason(persistent, "cuda:0") is None


def test_no_tvm_ffi_switch_selects_dsl_tensors_keyed_by_zero_strides(cpu, monkeypatch):
    from cute_kernels.runtime import tvm_ffi_available

    monkeypatch.setenv("CUTE_KERNELS_NO_TVM_FFI", "1")
    tvm_ffi_available.cache_clear()
    try:
        assert tvm_ffi_available() is False
    finally:
        monkeypatch.delenv("CUTE_KERNELS_NO_TVM_FFI")
        tvm_ffi_available.cache_clear()
    monkeypatch.setattr(sm90_rung, "tvm_ffi_available", lambda: False)
    monkeypatch.setattr(sm90_rung, "_stream", lambda: "stream")
    a = torch.randn(1, 128, 256).to(torch.bfloat16)
    b = _kmajor_b(1, 256, 128)
    persistent(a, b, torch.empty(1, 128, 128, dtype=torch.bfloat16))
    persistent(a.expand(3, 128, 256), b.expand(3, 256, 128), torch.empty(3, 128, 128, dtype=torch.bfloat16))
    assert len(cpu.builds) == 2 and cpu.builds[0]["key"] != cpu.builds[1]["key"]
    assert all(build["options"] is None for build in cpu.builds)
    launch = cpu.launches[-1]
    assert launch[-1] == "stream" and not isinstance(launch[0], torch.Tensor)  # DSL tensors + a stream


def test_parameters_that_require_grad_reach_the_kernel_detached(cpu, monkeypatch):
    """nn.Linear's weight and bias require grad; DLPack refuses those, so the launch gets
    detached aliases of the same storage (and a plain tensor is passed as is)."""
    x = torch.randn(1, 128, 256).to(torch.bfloat16)
    w = torch.nn.Parameter(torch.randn(1, 128, 256).to(torch.bfloat16))
    bias = torch.nn.Parameter(torch.randn(128).to(torch.bfloat16))
    out = torch.empty(1, 128, 128, dtype=torch.bfloat16)
    _warm(monkeypatch, lambda: persistent(x, w.transpose(1, 2), out, bias=bias))
    A, B, _, _, bias_arg = cpu.launches[-1][:5]
    # M = 128 runs swap-AB (sm90_skinny): the kernel's A is the weight, its B the activations
    assert not A.requires_grad and not bias_arg.requires_grad
    assert _ptr(A) == _ptr(w) and _ptr(bias_arg) == _ptr(bias) and _ptr(B) == _ptr(x)
