"""How the `naive` and `simt_smem` rungs launch, on CPU: what they compile (the TVM-FFI build from
fake tensors, and its key), what they pass at launch (the torch tensors themselves), when they
recompile (never for new sizes or broadcast strides, always for a new unit-stride mode or dtype),
and the DSL-tensor fallback's key. The compiler is replaced by a recorder, except in the
`compile`-marked tests, which build the real TVM-FFI functions for sm_90a and call them."""

from __future__ import annotations

import importlib.util
import time

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("cutlass") is None:
    pytest.skip("needs the CuTe DSL", allow_module_level=True)

from cute_kernels.gemm import naive, simt_smem  # noqa: E402
from cute_kernels.runtime import TVM_FFI_OPTION  # noqa: E402

RUNGS = {"naive": naive, "simt_smem": simt_smem}


class Recorder:
    """Stands in for `compile_kernel`: records each compile, returns a function recording launches."""

    def __init__(self):
        self.compiles, self.launches = [], []

    def __call__(self, jit_fn, *args, key, options=None):
        self.compiles.append({"kernel": jit_fn, "args": args, "key": key, "options": options})
        return lambda *launch_args: self.launches.append(launch_args)


@pytest.fixture(params=sorted(RUNGS))
def tvm_rung(request, monkeypatch):
    module = RUNGS[request.param]
    recorder = Recorder()
    monkeypatch.setattr(module, "compile_kernel", recorder)
    monkeypatch.setattr(module, "use_tvm_ffi", lambda: True)
    monkeypatch.setattr(module.RUNG, "_compiled", {})
    return module, recorder


def _views(l, m, n, k, *, a_col=False, b_col=False, out_col=False):
    """fp32 (a, b, out) 3-D CPU views, each row- or column-major."""
    a = torch.randn(l, k, m).transpose(1, 2) if a_col else torch.randn(l, m, k)
    b = torch.randn(l, n, k).transpose(1, 2) if b_col else torch.randn(l, k, n)
    out = torch.empty(l, n, m).transpose(1, 2) if out_col else torch.empty(l, m, n)
    return a, b, out


def _unit_mode(fake) -> int:
    units = [i for i, s in enumerate(fake.stride) if isinstance(s, int) and s == 1]
    assert len(units) == 1, fake.stride
    return units[0]


def test_the_tvm_ffi_build_is_fixed_by_dtypes_and_unit_strides_only(tvm_rung):
    module, rec = tvm_rung
    a, b, out = _views(1, 8, 12, 16, b_col=True)
    assert module.RUNG(a, b, out, alpha=2, beta=0.0) is out
    assert len(rec.compiles) == 1
    build = rec.compiles[0]
    assert build["options"] == TVM_FFI_OPTION and "tvm_ffi" in build["key"]
    fakes, scalars, stream = build["args"][:4], build["args"][4:6], build["args"][6]
    assert [_unit_mode(f) for f in fakes] == [2, 1, 2, 2]
    # Every size and every stride other than the unit one is a runtime value.
    assert all(not isinstance(x, int) for f in fakes for x in f.shape)
    assert all(not isinstance(s, int) for f in fakes for s in f.stride if s != 1)
    assert stream.use_tvm_ffi_env_stream  # launches on torch's current stream, no stream argument
    assert len(scalars) == 2
    # The launch takes the torch tensors themselves (c is `out` when beta == 0) and float scalars.
    (launch,) = rec.launches
    assert launch[0] is a and launch[1] is b and launch[2] is out and launch[3] is out
    assert launch[4:] == (2.0, 0.0) and all(type(x) is float for x in launch[4:])


def test_new_sizes_and_broadcast_strides_reuse_the_build(tvm_rung):
    module, rec = tvm_rung
    module.RUNG(*_views(1, 8, 12, 16), alpha=1.0, beta=0.0)
    module.RUNG(*_views(3, 40, 20, 8), alpha=1.0, beta=0.0)
    a, b, out = _views(1, 8, 12, 16)
    module.RUNG(a.expand(5, 8, 16), b.expand(5, 16, 12), torch.empty(5, 8, 12), alpha=1.0, beta=0.0)
    assert len(rec.compiles) == 1 and len(rec.launches) == 3
    assert rec.launches[2][0].stride()[0] == 0  # the zero stride travels as a runtime value


def test_unit_stride_modes_dtypes_and_c_each_get_their_own_build(tvm_rung):
    module, rec = tvm_rung
    a, b, out = _views(1, 8, 12, 16)
    module.RUNG(a, b, out, alpha=1.0, beta=0.0)
    module.RUNG(*_views(1, 8, 12, 16, a_col=True), alpha=1.0, beta=0.0)
    module.RUNG(*_views(1, 8, 12, 16, out_col=True), alpha=1.0, beta=0.0)
    module.RUNG(a, b, out.to(torch.bfloat16), alpha=1.0, beta=0.0)
    c = torch.randn(1, 12, 8).transpose(1, 2)
    module.RUNG(a, b, out, alpha=1.0, beta=0.5, c=c)
    module.RUNG(a, b, out, alpha=1.0, beta=0.0, c=c)  # beta == 0: c is not read, no new build
    assert len(rec.compiles) == 5
    assert len({repr(comp["key"]) for comp in rec.compiles}) == 5
    assert [_unit_mode(f) for f in rec.compiles[1]["args"][:4]] == [1, 2, 2, 2]
    assert [_unit_mode(f) for f in rec.compiles[2]["args"][:4]] == [2, 2, 1, 1]
    assert [_unit_mode(f) for f in rec.compiles[4]["args"][:4]] == [2, 2, 2, 1]
    assert rec.launches[4][3] is c and rec.launches[5][3] is out


def test_assumed_alignment_of_the_build(tvm_rung):
    module, rec = tvm_rung
    a, b, out = _views(1, 8, 12, 16)
    module.RUNG(a, b, out.to(torch.float16), alpha=1.0, beta=0.0)
    aligns = [f._assumed_align for f in rec.compiles[0]["args"][:4]]
    # simt_smem loads A and B as 16-byte vectors (its `supports` checks the pointers); the
    # naive rung reads scalars. Output and c are written and read as scalars by both.
    expected_ab = 16 if module is simt_smem else 4
    assert aligns == [expected_ab, expected_ab, 2, 2]


def test_naive_build_of_half_inputs(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(naive, "compile_kernel", rec)
    monkeypatch.setattr(naive, "use_tvm_ffi", lambda: True)
    monkeypatch.setattr(naive.RUNG, "_compiled", {})
    a, b, out = (t.to(torch.bfloat16) for t in _views(2, 8, 12, 16))
    naive.RUNG(a, b, out, alpha=1.0, beta=0.0)
    fakes = rec.compiles[0]["args"][:4]
    assert [f._assumed_align for f in fakes] == [2, 2, 2, 2]
    assert [str(f.element_type) for f in fakes] == ["BFloat16"] * 4


@pytest.mark.parametrize("name", sorted(RUNGS))
def test_fallback_key_keeps_zero_strides(name, monkeypatch):
    """Without TVM-FFI, DSL tensors from `from_torch` fix a broadcast operand's zero strides in
    the build: they must be part of its key."""
    module = RUNGS[name]
    rec = Recorder()
    monkeypatch.setattr(module, "compile_kernel", rec)
    monkeypatch.setattr(module, "use_tvm_ffi", lambda: False)
    monkeypatch.setattr(module, "current_stream", lambda: None)
    a, b, out = _views(1, 8, 12, 16)
    module.RUNG(a, b, out, alpha=1.0, beta=0.0)
    module.RUNG(a.expand(3, 8, 16), b.expand(3, 16, 12), torch.empty(3, 8, 12), alpha=1.0, beta=0.0)
    keys = [comp["key"] for comp in rec.compiles]
    assert len(keys) == 2 and keys[0] != keys[1]
    assert (2, (True, False, False)) in keys[1] and (2, (True, False, False)) not in keys[0]
    assert rec.compiles[0]["options"] is None


# ---- the real TVM-FFI builds (compile only: called with CPU tensors, they stop at the device) --

needs_tvm_ffi = pytest.mark.skipif(importlib.util.find_spec("tvm_ffi") is None, reason="needs apache-tvm-ffi")


@pytest.fixture
def sm90a(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))


@pytest.mark.compile
@needs_tvm_ffi
@pytest.mark.parametrize("name, key", [
    ("naive", (torch.float16, torch.float32, torch.float32, True, 2, 1, 2, 1)),
    ("simt_smem", (torch.bfloat16, torch.float32, False, 1, 2, 2, 2)),
])
def test_tvm_ffi_build_takes_torch_tensors_and_no_stream(name, key, sm90a, monkeypatch):
    rung = RUNGS[name].RUNG
    monkeypatch.setattr(rung, "_compiled", {})
    fn = rung._compile_tvm_ffi(key)
    assert rung._compiled[key] is fn
    a, b, out, c = torch.randn(1, 8, 8), torch.randn(1, 8, 8), torch.empty(1, 8, 8), torch.empty(1, 8, 8)
    with pytest.raises(TypeError, match="Expects 6 parameters"):
        fn(a, b, out, c, 1.0)
    # Six arguments (no stream) get as far as checking the first tensor's device.
    with pytest.raises(ValueError, match=r"argument #0.*expected device_type=cuda"):
        fn(a, b, out, c, 1.0, 0.0)


# ---- on the GPU: what a warm call costs the host ------------------------------------------------

def _median_host_us(fn, calls: int = 201) -> float:
    """Median wall time of `fn()` (enqueue only: no synchronization inside the timed region)."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return sorted(times)[calls // 2] * 1e6


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["naive", "simt_smem", "auto"])
def test_warm_matmul_call_is_right_and_reports_its_host_time(kernel):
    """The warm call of each kernel computes the product; its host time (issue 8's target is
    torch.matmul's, ~18 us on the H200 host) is printed, and measured by the `overhead` bench."""
    from cute_kernels.gemm import matmul

    a, b = torch.randn(128, 128, device="cuda"), torch.randn(128, 128, device="cuda")
    expected = torch.matmul(a.double(), b.double())
    out = matmul(a, b, kernel=kernel)  # compiles (or loads) once
    assert ((out.double() - expected).norm() / expected.norm()).item() < 1e-5
    ours = _median_host_us(lambda: matmul(a, b, kernel=kernel))
    theirs = _median_host_us(lambda: torch.matmul(a, b))
    print(f"\nwarm matmul(kernel={kernel!r}) host time: {ours:.1f} us (torch.matmul: {theirs:.1f} us)")
    out = matmul(a, b, kernel=kernel)
    assert ((out.double() - expected).norm() / expected.norm()).item() < 1e-5
