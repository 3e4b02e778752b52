"""cute_kernels.gemm: matmul's argument checks (before any launch), the KERNELS registry and
dispatch. Everything here runs on CPU (meta/CPU tensors, a mocked device)."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.gemm import KERNELS, matmul  # noqa: E402
from cute_kernels.gemm import dispatch  # noqa: E402
from cute_kernels.gemm.api import as_unit_stride  # noqa: E402
from cute_kernels.gemm.registry import LADDER, KernelRegistry  # noqa: E402


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


# ---- validation ------------------------------------------------------------------------------

def test_cpu_tensors_are_rejected_naming_the_device():
    with pytest.raises(ValueError, match="a is on device 'cpu'.*CUDA"):
        matmul(torch.randn(4, 5), torch.randn(5, 6))


def test_meta_tensors_are_rejected_naming_the_device():
    with pytest.raises(ValueError, match="device 'meta'"):
        matmul(meta(4, 5), meta(5, 6))


@pytest.mark.parametrize(
    "a, b, kwargs, error, pattern",
    [
        (meta(4, 5), meta(5, 6, dtype=torch.float16), {}, TypeError, "dtype torch.float32 but b has dtype torch.float16"),
        (meta(4, 5), meta(6, 7), {}, ValueError, "K = 5 but b's K = 6"),
        (meta(5), meta(5, 6), {}, ValueError, "2-D .* or 3-D"),
        (meta(2, 3, 4, 5), meta(5, 6), {}, ValueError, "got 4-D"),
        (meta(2, 4, 5), meta(3, 5, 6), {}, ValueError, "batch sizes differ"),
        (meta(4, 5, dtype=torch.int32), meta(5, 6, dtype=torch.int32), {}, TypeError, "floating-point"),
        (meta(4, 10)[:, ::2], meta(5, 6), {}, ValueError, "a has strides .* must be 1"),
        (meta(4, 5), meta(6, 10).t()[::2], {}, ValueError, "b has strides"),
        (meta(4, 5), meta(5, 6), {"beta": 1.0}, ValueError, "beta=1.0 needs c"),
        (meta(4, 5), meta(5, 6), {"beta": 1.0, "c": meta(4, 7)}, ValueError, "does not broadcast"),
        (meta(4, 5), meta(5, 6), {"beta": 1.0, "c": meta(3, 4, 6)}, ValueError, "does not broadcast"),
        (meta(4, 5), meta(5, 6), {"beta": 1.0, "c": meta(4, 6, dtype=torch.float16)}, TypeError, "c has dtype"),
        (meta(4, 5), meta(5, 6), {"out_dtype": torch.int32}, TypeError, "out_dtype"),
        (meta(4, 5), meta(5, 6), {"alpha": "2"}, TypeError, "alpha must be a real number"),
        (meta(4, 5), meta(5, 6), {"beta": True}, TypeError, "beta must be a real number, got bool"),
        (meta(4, 5), meta(5, 6), {"alpha": 1j}, TypeError, "alpha must be a real number, got complex"),
        ("x", meta(5, 6), {}, TypeError, "a must be a torch.Tensor"),
    ],
)
def test_bad_arguments_raise_clear_errors(a, b, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        matmul(a, b, **kwargs)


@pytest.mark.parametrize("alpha", [2, 0.5, __import__("fractions").Fraction(1, 3), torch.tensor(2.0).numpy()[()]])
def test_real_scalars_of_any_type_pass_validation(alpha):
    # int, float, Fraction, numpy float: all real; validation passes up to the device check.
    with pytest.raises(ValueError, match="device 'meta'"):
        matmul(meta(4, 5), meta(5, 6), alpha=alpha)


def test_c_is_ignored_when_beta_is_zero():
    # c's shape is wrong, but beta == 0 means c is not read: validation passes up to the device.
    with pytest.raises(ValueError, match="device 'meta'"):
        matmul(meta(4, 5), meta(5, 6), c=meta(9, 9))


def test_as_unit_stride_normalizes_extent_one_modes():
    t = torch.empty(64).as_strided((1, 7, 1), (0, 3, 5))  # no unit stride, but mode 2 has extent 1
    v, mode = as_unit_stride(t, "a")
    assert mode == 2 and v.stride()[2] == 1 and v.shape == t.shape
    t = torch.empty(64).as_strided((2, 1, 5), (9, 7, 2))
    v, mode = as_unit_stride(t, "b")
    assert mode == 1 and v.stride()[1] == 1
    col = torch.empty(3, 6, 5).transpose(1, 2)
    assert as_unit_stride(col, "a") == (col, 1)
    with pytest.raises(ValueError, match="x has strides"):
        as_unit_stride(torch.empty(3, 6, 10)[:, :, ::2], "x")


# ---- registry --------------------------------------------------------------------------------

def test_ladder_order_and_names():
    assert [name for name, _ in LADDER] == [
        "naive", "simt_smem", "sm70_mma", "sm80_mma", "sm90_tma_wgmma", "sm90_warp_specialized", "sm90_persistent",
        "gemv",  # a specialist: above the ladder's top, so "auto" asks it first
    ]
    assert KERNELS.ladder == tuple(name for name, _ in LADDER)


def test_kernels_lists_present_rungs_in_ladder_order():
    names = list(KERNELS)
    assert names[0] == "naive"
    positions = [KERNELS.ladder.index(n) for n in names]
    assert positions == sorted(positions)
    for name, target in LADDER:
        module = target.split(":")[0]
        assert (name in KERNELS) == (importlib.util.find_spec(module) is not None)


def test_registry_skips_absent_modules_and_explains_lookups():
    reg = KernelRegistry((
        ("here", "cute_kernels.gemm.dispatch:choose"),
        ("gone", "cute_kernels.gemm.no_such_rung:RUNG"),
        ("nameless", "cute_kernels.gemm.dispatch:NO_SUCH_ATTRIBUTE"),
    ))
    assert list(reg) == ["here", "nameless"] and len(reg) == 2
    assert reg["here"] is dispatch.choose
    with pytest.raises(ImportError, match="does not define NO_SUCH_ATTRIBUTE"):
        reg["nameless"]
    with pytest.raises(KeyError, match="does not exist"):
        reg["gone"]
    with pytest.raises(KeyError, match="no GEMM kernel named 'other'"):
        reg["other"]
    with pytest.raises(ValueError, match="module:attribute"):
        KernelRegistry((("bad", "no_colon"),))


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the CuTe DSL")
def test_naive_rung_interface():
    rung = KERNELS["naive"]
    assert rung.name == "naive"
    assert set(rung.dtypes) == {torch.float32, torch.float16, torch.bfloat16}
    a, b, out = meta(1, 4, 5), meta(1, 5, 6), meta(1, 4, 6)
    # Everything but the device is fine: the device is the reason (never a failure at launch).
    assert rung.supports(a, b, out) == "needs CUDA tensors (a on 'meta', b on 'meta', out on 'meta')"
    assert "b on 'cpu'" in rung.supports(a, torch.randn(1, 5, 6), out)
    assert "output dtype" in rung.supports(a, b, meta(1, 4, 6, dtype=torch.float64))
    assert "b has dtype torch.float16" in rung.supports(a, meta(1, 5, 6, dtype=torch.float16), out)
    assert "batch" in rung.supports(meta(70000, 4, 5), meta(70000, 5, 6), meta(70000, 4, 6))
    assert "blocks along grid y" in rung.supports(meta(1, 16 * 65535 + 1, 5), b, meta(1, 16 * 65535 + 1, 6))


# ---- dispatch --------------------------------------------------------------------------------

class FakeRung:
    def __init__(self, name, dtypes=(torch.float32,), min_capability=None, reason=None):
        self.name, self.dtypes, self.min_capability, self.reason = name, dtypes, min_capability, reason

    def supports(self, a, b, out):
        return self.reason

    def __call__(self, a, b, out, *, alpha, beta, c):  # pragma: no cover - never launched here
        raise AssertionError("dispatch tests never launch")


@pytest.fixture
def ladder():
    return {
        "naive": FakeRung("naive", dtypes=(torch.float32, torch.float16)),
        "simt_smem": FakeRung("simt_smem"),
        "sm90_tma_wgmma": FakeRung("sm90_tma_wgmma", dtypes=(torch.float16,), min_capability=(9, 0)),
    }


def _problem(dtype=torch.float32):
    return meta(1, 64, 32, dtype=dtype), meta(1, 32, 48, dtype=dtype), meta(1, 64, 48, dtype=dtype)


@pytest.mark.parametrize(
    "capability, dtype, expected",
    [
        ((9, 0), torch.float16, "sm90_tma_wgmma"),
        ((8, 0), torch.float16, "naive"),  # the Hopper rung needs 9.0; simt_smem takes fp32 only
        ((9, 0), torch.float32, "simt_smem"),
        ((7, 5), torch.float32, "simt_smem"),
    ],
)
def test_dispatch_picks_the_best_supporting_rung(monkeypatch, ladder, capability, dtype, expected):
    monkeypatch.setattr(dispatch, "device_capability", lambda device: capability)
    assert dispatch.choose(*_problem(dtype), registry=ladder).name == expected


def test_dispatch_skips_a_rung_that_cannot_be_imported(monkeypatch, ladder):
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))

    class Broken(dict):
        def __getitem__(self, name):
            if name == "sm90_tma_wgmma":
                raise ImportError("no module named quack")
            return super().__getitem__(name)

    broken = Broken(ladder)
    assert dispatch.choose(*_problem(torch.float16), registry=broken).name == "naive"
    with pytest.raises(ValueError, match="sm90_tma_wgmma: cannot be imported"):
        dispatch.choose(*_problem(torch.bfloat16), registry=broken)


def test_dispatch_falls_back_when_a_rung_declines(monkeypatch, ladder):
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    ladder["sm90_tma_wgmma"].reason = "K not a multiple of 8"
    assert dispatch.choose(*_problem(torch.float16), registry=ladder).name == "naive"


def test_dispatch_error_lists_every_reason(monkeypatch, ladder):
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (8, 0))
    with pytest.raises(ValueError, match=r"sm90_tma_wgmma: .*not in.*simt_smem: .*not in.*naive: .*not in"):
        dispatch.choose(*_problem(torch.bfloat16), registry=ladder)


@pytest.fixture
def cached_ladder(monkeypatch, ladder):
    """`ladder` as the default registry, so that dispatch caches its static checks."""
    monkeypatch.setattr(dispatch, "KERNELS", ladder)
    monkeypatch.setattr(dispatch, "_CANDIDATES", {})
    asked = []
    monkeypatch.setattr(dispatch, "device_capability", lambda device: asked.append(device) or (9, 0))
    return ladder, asked


def test_cached_dispatch_asks_supports_on_every_call(cached_ladder):
    ladder, asked = cached_ladder
    problem = _problem(torch.float16)
    assert dispatch.choose(*problem, registry=ladder).name == "sm90_tma_wgmma"
    assert dispatch.resolve("auto", *problem, registry=ladder).name == "sm90_tma_wgmma"
    assert len(asked) == 1  # the capability (a static check) was asked once
    ladder["sm90_tma_wgmma"].reason = "K not a multiple of 8"
    assert dispatch.choose(*problem, registry=ladder).name == "naive"
    ladder["naive"].reason = "too big"
    with pytest.raises(ValueError, match=r"sm90_tma_wgmma: K not a multiple of 8; simt_smem: input dtype "
                                         r"torch.float16 not in .*; naive: too big"):
        dispatch.choose(*problem, registry=ladder)
    ladder["sm90_tma_wgmma"].reason = None
    assert dispatch.choose(*problem, registry=ladder).name == "sm90_tma_wgmma"
    # Another dtype is another cache entry: fp32 goes to simt_smem.
    assert dispatch.choose(*_problem(torch.float32), registry=ladder).name == "simt_smem"


def test_cached_named_dispatch_checks_the_problem_each_time(cached_ladder):
    ladder, asked = cached_ladder
    problem = _problem(torch.float32)
    assert dispatch.resolve("naive", *problem, registry=ladder).name == "naive"
    ladder["naive"].reason = "M too large"
    with pytest.raises(ValueError, match="'naive' cannot run this problem: M too large"):
        dispatch.resolve("naive", *problem, registry=ladder)
    for _ in range(2):  # a static reason is cached and raised every time
        with pytest.raises(ValueError, match="'sm90_tma_wgmma' cannot run this problem: input dtype"):
            dispatch.resolve("sm90_tma_wgmma", *problem, registry=ladder)
    with pytest.raises(TypeError, match="rung name"):
        dispatch.resolve(["naive"], *problem, registry=ladder)
    with pytest.raises(ValueError, match="unknown GEMM kernel 'fastest'"):
        dispatch.resolve("fastest", *problem, registry=ladder)


def test_clear_cache_forgets_static_checks(cached_ladder):
    ladder, asked = cached_ladder
    problem = _problem(torch.float16)
    dispatch.choose(*problem, registry=ladder)
    dispatch.clear_cache()
    dispatch.choose(*problem, registry=ladder)
    assert len(asked) == 2


def test_registry_remembers_found_modules(monkeypatch):
    from cute_kernels.runtime import kernel_registry as registry_module

    reg = KernelRegistry((("here", "cute_kernels.gemm.dispatch:choose"), ("gone", "cute_kernels.gemm.nope:RUNG")))
    assert list(reg) == ["here"]
    looked_up = []
    monkeypatch.setattr(registry_module, "_module_exists", lambda module: looked_up.append(module) or False)
    assert list(reg) == ["here"] and "here" in reg and reg["here"] is dispatch.choose
    assert looked_up and set(looked_up) == {"cute_kernels.gemm.nope"}  # an absent module is looked for again


def test_named_kernel_is_checked_not_replaced(monkeypatch, ladder):
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (8, 0))
    with pytest.raises(ValueError, match="'sm90_tma_wgmma' cannot run this problem: needs compute capability 9.0"):
        dispatch.resolve("sm90_tma_wgmma", *_problem(torch.float16), registry=ladder)
    with pytest.raises(ValueError, match="unknown GEMM kernel 'fastest'"):
        dispatch.resolve("fastest", *_problem(), registry=ladder)
    assert dispatch.resolve("naive", *_problem(), registry=ladder).name == "naive"
