"""The torch entry points' launches without a GPU: each family's TVM-FFI function is compiled for
sm_90a from the fake arguments its host code builds, then called the way the host code calls it
(with CPU tensors, which the function refuses only at the device check), and the arguments are
checked against the compiled signature: the same count, None exactly where the kernel was built
without a tensor, each tensor's rank and dtype. What a GPU run could get wrong only in the
kernel's arithmetic is left to the GPU tests."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.compile

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "int64": torch.int64,
           "int32": torch.int32}
_PARAM = re.compile(r"(\w+): (None|Tensor\(\[([^\]]*)\], (\w+)\)|\w+)")


def _signature(message: str):
    body = re.search(r"`__call__\((.*)\)`", message)
    assert body, message
    return [(m[1], m[2], m[3], m[4]) for m in _PARAM.finditer(body[1])]


@pytest.fixture
def launches(monkeypatch):
    """Compile for real; record every call's arguments and the signature the function reports."""
    import cute_kernels.fused as fused
    from cute_kernels.fused import (cross_entropy_api, host, norm_api, rope_api, softmax_api,  # noqa: F401
                                    swiglu_api)

    calls = []
    real = host.compile_tvm_ffi

    def compile_and_watch(kernel, fake_args, key):
        fn = real(kernel, fake_args, key)

        def watched(*args):
            try:
                fn(*args)
            except ValueError as err:  # the device check: everything before it matched
                assert "expected device_type=cuda" in str(err), str(err)
                calls.append((key[0], args, _signature(str(err))))
                return
            raise AssertionError("a CPU call of a CUDA kernel did not raise")

        return watched

    for module in (norm_api, softmax_api, cross_entropy_api, rope_api, swiglu_api):
        monkeypatch.setattr(module, "compile_tvm_ffi", compile_and_watch)
        monkeypatch.setattr(module, "check_same_device", lambda op, tensors: None)
    monkeypatch.setattr(cross_entropy_api, "check_labels_in_range", lambda *a: None)
    monkeypatch.setattr(norm_api, "sm_count", lambda index: 132)
    return fused, calls


def _check(calls, key):
    found = [c for c in calls if c[0] == key]
    assert found, f"{key} was not launched"
    for _, args, params in found:
        assert len(args) == len(params), (key, len(args), params)
        for arg, (name, kind, shape, dtype) in zip(args, params):
            if kind == "None":
                assert arg is None, f"{key}: {name} was built absent but got {type(arg).__name__}"
            elif kind.startswith("Tensor"):
                assert isinstance(arg, torch.Tensor), f"{key}: {name} needs a tensor, got {arg!r}"
                assert arg.dim() == len(shape.split(",")), f"{key}: {name} rank {arg.dim()} vs [{shape}]"
                assert arg.dtype == _DTYPES[dtype], f"{key}: {name} dtype {arg.dtype} vs {dtype}"
                assert arg.stride(-1) == 1, f"{key}: {name} last stride {arg.stride()}"
            else:
                assert isinstance(arg, (int, float)), f"{key}: {name} scalar got {arg!r}"


def test_norm_launches(launches):
    fused, calls = launches
    x = torch.randn(6, 256).to(torch.bfloat16)
    w = torch.randn(256).float()
    r = torch.randn(6, 256).to(torch.bfloat16)
    # no stats are computed on CPU: build them only for the backward's arguments
    fused.norm_forward(x, w, torch.randn(256).float(), r, kind="layer", out_dtype=torch.float32)
    _check(calls, "fused.norm_fwd")
    rstd, mean = torch.ones(6), torch.zeros(6)
    fused.norm_backward(x, r, w, rstd, mean, kind="layer", dsum=x, has_bias=True)
    _check(calls, "fused.norm_bwd")


def test_softmax_and_cross_entropy_launches(launches):
    fused, calls = launches
    x = torch.randn(3, 4096).to(torch.bfloat16)  # the resident form (the variants compile the streaming one)
    fused.softmax_forward(x)
    fused.softmax_backward(x, x)
    _check(calls, "fused.softmax_fwd")
    _check(calls, "fused.softmax_bwd")
    logits = torch.randn(4, 1000).half()
    labels = torch.tensor([1, 2, -100, 3], dtype=torch.int32)
    fused.cross_entropy_forward(logits, labels, label_smoothing=0.1, z_loss=1e-3, dloss=torch.ones(1),
                                grad_out=logits)
    fused.cross_entropy_backward(logits, labels.long(), torch.zeros(4), torch.ones(4))
    _check(calls, "fused.cross_entropy")


def test_rope_and_swiglu_launches(launches):
    fused, calls = launches
    cos, sin = fused.rotary_tables(64, 64)
    q, k = torch.randn(2, 4, 3, 80).half(), torch.randn(2, 4, 1, 80).half()
    fused.rotary(q, k, cos, sin, position_ids=torch.zeros(2, 4, dtype=torch.int64), layout="bshd", interleaved=True)
    _check(calls, "fused.rope")
    gu = torch.randn(5, 2 * 300).to(torch.bfloat16)
    fused.swiglu_forward(gu[:, :300], gu[:, 300:])
    fused.swiglu_backward(torch.randn(5, 300).to(torch.bfloat16), gu, interleaved=True)
    _check(calls, "fused.swiglu_fwd")
    _check(calls, "fused.swiglu_bwd")
