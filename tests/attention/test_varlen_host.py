"""The varlen forward's host path on CPU: the offsets are read to the host in one copy and
passed on (`varlen.HostOffsets`); sm90_flash orders the sequences from them (`launch_order`),
keeps the order on the device per batch, and hands the caller's tensors to one TVM-FFI build
per config (no DSL wrapping, no synchronization or host-data upload on a warm call)."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("cutlass") is None:
    pytest.skip("needs the CuTe DSL", allow_module_level=True)

import cute_kernels.runtime as runtime  # noqa: E402
from cute_kernels.attention import sm90_flash, varlen  # noqa: E402
from cute_kernels.attention.api import AttentionProblem  # noqa: E402
from tests.attention.test_call_path import FORBIDDEN, Calls, Compiler  # noqa: E402


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def test_host_values_read_each_distinct_tensor_once_in_one_copy(monkeypatch):
    cu_q, cu_k, used = _i32([0, 3, 3, 10]), _i32([0, 5, 6, 20]), _i32([4, 1, 9])
    copies = Calls(monkeypatch, [(torch.Tensor, "tolist"), (torch.Tensor, "cpu")])
    assert varlen._host_values(cu_q, cu_k, used) == [[0, 3, 3, 10], [0, 5, 6, 20], [4, 1, 9]]
    assert varlen._host_values(cu_q, cu_q, None) == [[0, 3, 3, 10], [0, 3, 3, 10], None]
    assert copies.seen == ["Tensor.tolist", "Tensor.tolist"]
    # what the checks must name is left to them
    assert varlen._host_values(cu_q, cu_k.long(), None) == [None, None, None]
    assert varlen._host_values(cu_q, [0, 1], None) == [None, None, None]
    assert varlen._host_values(_i32([[0, 1]]), cu_k, None) == [None, None, None]


def test_checked_inputs_return_the_offsets_they_read():
    q = torch.randn(10, 4, 64, dtype=torch.bfloat16)
    k = v = torch.randn(20, 2, 64, dtype=torch.bfloat16)
    cu_q, cu_k = _i32([0, 3, 3, 10]), _i32([0, 5, 6, 20])
    with pytest.raises(ValueError, match="seqused_k\\[2\\] = 15 but sequence 2 has 14 key rows"):
        varlen.checked_varlen_inputs(q, k, v, cu_q, cu_k, 7, 14, causal=None, scale=None, seqused_k=_i32([1, 1, 15]))
    with pytest.raises(ValueError, match="max_seqlen_q = 6 but cu_seqlens_q holds a sequence of length 7"):
        varlen.checked_varlen_inputs(q, k, v, cu_q, cu_k, 6, 14, causal=None, scale=None)
    with pytest.raises(ValueError, match="tensors are on 'cpu'"):  # the last check: everything else held
        varlen.checked_varlen_inputs(q, k, v, cu_q, cu_k, 7, 14, causal=None, scale=None, seqused_k=_i32([4, 1, 9]))


def test_launch_order_is_longest_work_first_ties_in_sequence_order():
    offsets = varlen.HostOffsets((0, 2, 6, 8, 12), (0, 2, 6, 8, 12), None)  # lengths 2, 4, 2, 4
    assert sm90_flash.launch_order(offsets) == [1, 3, 0, 2]
    used = varlen.HostOffsets((0, 2, 6, 8, 12), (0, 5, 9, 20, 21), (5, 0, 12, 1))  # work 10, 0, 24, 4
    assert sm90_flash.launch_order(used) == [2, 0, 3, 1]
    assert sm90_flash.launch_order(varlen.HostOffsets((0, 0), (0, 0), None)) == [0]


def test_warm_varlen_calls_hand_the_callers_tensors_to_one_tvm_ffi_build(monkeypatch):
    compiler = Compiler()
    monkeypatch.setattr(sm90_flash, "compile_kernel", compiler)
    monkeypatch.setattr(sm90_flash, "tvm_ffi_available", lambda: True)
    for cache in ("_KERNELS", "_CONFIGS", "_COMPILED", "_ORDERS"):
        monkeypatch.setattr(sm90_flash, cache, runtime.WarmCache(cache))
    monkeypatch.setattr(runtime, "from_torch", lambda *a, **k: pytest.fail("from_torch on the TVM-FFI path"))
    lens_q, lens_k = (3, 0, 7), (5, 1, 14)
    offsets = varlen.HostOffsets((0, 3, 3, 10), (0, 5, 6, 20), None)
    cu_q, cu_k = _i32(offsets.cu_q), _i32(offsets.cu_k)
    q = torch.randn(10, 4, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(20, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(4, 10)
    problem = AttentionProblem(3, 4, 2, max(lens_q), max(lens_k), 64, 64, torch.bfloat16, "bottom_right", 0.125)
    with pytest.raises(TypeError, match="needs offsets"):
        sm90_flash.RUNG.varlen(q, k, v, cu_q, cu_k, 7, out, lse, problem)
    sm90_flash.RUNG.varlen(q, k, v, cu_q, cu_k, 7, out, lse, problem, offsets=offsets)
    calls = Calls(monkeypatch, FORBIDDEN)
    for _ in range(3):
        sm90_flash.RUNG.varlen(q, k, v, cu_q, cu_k, 7, out, lse, problem, offsets=offsets)
    assert calls.seen == []
    (build,) = compiler.builds
    config = sm90_flash._config_for_problem(problem, varlen=True)
    assert build["key"] == ("attention.sm90_flash.varlen", config, False, "tvm_ffi")
    assert build["options"] == runtime.TVM_FFI_OPTION
    orders = set()
    for launch in compiler.launches:
        lq, lk, lv, lo, llse, scale, right, left, group, score_scale, sinks, lcu_q, lcu_k, used, order, mq, br = launch
        assert lq.data_ptr() == q.data_ptr() and lq.shape == (1, 4, 10, 64) and lq.stride()[1:] == (64, 256, 1)
        assert lk.shape == lv.shape == (1, 2, 20, 64) and lo.data_ptr() == out.data_ptr()
        assert llse.shape == (1, 4, 10) and llse.data_ptr() == lse.data_ptr()
        assert (scale, group, sinks, used, mq, br) == (0.125, 2, None, None, 7, 1)
        assert lcu_q is cu_q and lcu_k is cu_k
        assert order.dtype == torch.int32 and order.tolist() == [2, 0, 1]
        orders.add(id(order))
    assert len(compiler.launches) == 4 and len(orders) == 1  # the order is kept per batch


def test_the_tvm_ffi_varlen_builds_compile_for_hopper():
    """Both TVM-FFI varlen builds (with and without seqused_k) compile for sm_90a."""
    import os

    if os.environ.get("CUTE_DSL_ARCH", "sm_90a") != "sm_90a":
        pytest.skip("compiles for sm_90a")
    problem = AttentionProblem(3, 4, 2, 7, 14, 128, 128, torch.bfloat16, "bottom_right", 0.125)
    config = sm90_flash._config_for_problem(problem, varlen=True)
    for used in (False, True):
        assert callable(sm90_flash._compile_varlen_tvm_ffi(config, used))


def test_offsets_are_read_once_per_tensor_objects_while_their_contents_last(monkeypatch):
    monkeypatch.setattr(varlen, "_OFFSETS", runtime.TensorMemo("test", 8))
    q = torch.randn(10, 4, 64, dtype=torch.bfloat16)
    k = v = torch.randn(20, 2, 64, dtype=torch.bfloat16)
    cu_q, cu_k = _i32([0, 3, 3, 10]), _i32([0, 5, 6, 20])
    reads = Calls(monkeypatch, [(torch.Tensor, "tolist"), (torch.Tensor, "cpu")])

    def check(max_q=7):  # on CPU tensors the device check raises last, after the offsets
        with pytest.raises(ValueError, match="tensors are on 'cpu'"):
            varlen.checked_varlen_inputs(q, k, v, cu_q, cu_k, max_q, 14, causal=None, scale=None)

    check(), check()
    assert len(reads.seen) == 1
    check(8)  # another bound: checked again
    assert len(reads.seen) == 2
    cu_q.copy_(_i32([0, 2, 3, 10]))  # written in place: read again, and checked
    check(8)
    assert len(reads.seen) == 3
    cu_q.copy_(_i32([0, 1, 1, 10]))
    with pytest.raises(ValueError, match="max_seqlen_q = 8 but cu_seqlens_q holds a sequence of length 9"):
        varlen.checked_varlen_inputs(q, k, v, cu_q, cu_k, 8, 14, causal=None, scale=None)
    with pytest.raises(ValueError, match="max_seqlen_q = 8"):  # an error is never kept
        varlen.checked_varlen_inputs(q, k, v, cu_q, cu_k, 8, 14, causal=None, scale=None)


def test_the_backward_rung_is_decided_once_per_problem_and_layout(monkeypatch):
    """A model's layers hand the backward the same problem on tensors of the same layouts: the
    rung is chosen once (`varlen._BACKWARD_RUNGS`); other strides or alignment choose again."""
    asked = []
    monkeypatch.setattr(varlen, "_varlen_backward_rung", lambda kernel, views, problem, who: asked.append(
        tuple(t.stride() for t in views)) or kernel)
    varlen._BACKWARD_RUNGS.clear()
    problem = AttentionProblem(3, 4, 2, 7, 14, 128, 128, torch.bfloat16, "bottom_right", 0.125)
    q = torch.randn(12, 4, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(20, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        assert varlen._backward_rung("auto", q, k, v, problem, "t") == "auto"
    assert asked == [((512, 128, 512, 1), (256, 128, 256, 1), (256, 128, 256, 1))]  # (1, H, T, D) views
    wide = torch.randn(12, 4, 256, dtype=torch.bfloat16)[..., :128]
    varlen._backward_rung("auto", wide, k, v, problem, "t")
    varlen._backward_rung("sm80_flash", q, k, v, problem, "t")
    assert len(asked) == 3
    varlen._BACKWARD_RUNGS.clear()
