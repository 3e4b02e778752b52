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
        ("x", meta(5, 6), {}, TypeError, "a must be a torch.Tensor"),
    ],
)
def test_bad_arguments_raise_clear_errors(a, b, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        matmul(a, b, **kwargs)


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
    assert rung.supports(a, b, out) is None
    assert "output dtype" in rung.supports(a, b, meta(1, 4, 6, dtype=torch.float64))
    assert "batch" in rung.supports(meta(70000, 4, 5), meta(70000, 5, 6), meta(70000, 4, 6))


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


def test_named_kernel_is_checked_not_replaced(monkeypatch, ladder):
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (8, 0))
    with pytest.raises(ValueError, match="'sm90_tma_wgmma' cannot run this problem: needs compute capability 9.0"):
        dispatch.resolve("sm90_tma_wgmma", *_problem(torch.float16), registry=ladder)
    with pytest.raises(ValueError, match="unknown GEMM kernel 'fastest'"):
        dispatch.resolve("fastest", *_problem(), registry=ladder)
    assert dispatch.resolve("naive", *_problem(), registry=ladder).name == "naive"
