"""attention_varlen_forward without a GPU: its signature (the one cute_kernels.ops calls), the
argument checks that run before any launch, and the compiled varlen launch's SASS."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import attention_varlen_forward  # noqa: E402
from cute_kernels.attention.seqlen_info import varlen_seqlens, seqlen_info  # noqa: E402


def packed(lengths_q=(3, 1, 5), lengths_k=(4, 2, 7), hq=4, hkv=2, d=64, dtype=torch.bfloat16):
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), hq, d, dtype=dtype)
    k = torch.randn(int(cu_k[-1]), hkv, d, dtype=dtype)
    v = torch.randn(int(cu_k[-1]), hkv, d, dtype=dtype)
    return q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k)


def test_signature_is_the_one_the_ops_layer_calls():
    params = inspect.signature(attention_varlen_forward).parameters
    assert list(params)[:7] == ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
    for name in ("causal", "scale", "kernel"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY


def test_varlen_seqlens_agrees_with_seqlen_info():
    cu_q, cu_k = [0, 3, 3, 8], [0, 4, 6, 7]
    for b in range(3):
        assert varlen_seqlens(cu_q, cu_k, b) == seqlen_info(b, cu_q, cu_k)


def test_cpu_tensors_are_rejected_after_the_checks():
    with pytest.raises(ValueError, match="on 'cpu'.*CUDA"):
        attention_varlen_forward(*packed())


def _with(args, **changes):
    names = ["q", "k", "v", "cu_q", "cu_k", "max_q", "max_k"]
    d = dict(zip(names, args))
    d.update(changes)
    return [d[n] for n in names]


@pytest.mark.parametrize("change, kwargs, error, pattern", [
    ({"max_q": 4}, {}, ValueError, "max_seqlen_q = 4 but cu_seqlens_q holds a sequence of length 5"),
    ({"max_k": 6}, {}, ValueError, "max_seqlen_k = 6 but cu_seqlens_k holds a sequence of length 7"),
    ({"cu_q": torch.tensor([0, 3, 4, 9], dtype=torch.int64)}, {}, ValueError, "1-D int32"),
    ({"cu_q": torch.tensor([0, 3, 2, 9], dtype=torch.int32)}, {}, ValueError, "decreases at index 2"),
    ({"cu_q": torch.tensor([0, 3, 4, 8], dtype=torch.int32)}, {}, ValueError, "has 9 rows"),
    ({"cu_k": torch.tensor([0, 13], dtype=torch.int32), "max_k": 13}, {}, ValueError,
     "3 sequences but cu_seqlens_k has 1"),
    ({"max_q": -1}, {}, ValueError, "max_seqlen_q must be a non-negative int"),
    ({"q": torch.randn(9, 3, 64, dtype=torch.bfloat16)}, {}, ValueError, r"query heads \(3\) must be a multiple"),
    ({"q": torch.randn(9, 4, 32, dtype=torch.bfloat16)}, {}, ValueError, "q head dim 32 differs from k head dim 64"),
    ({"q": torch.randn(9, 4, 64)}, {}, TypeError, "share a floating dtype"),
    ({"q": torch.randn(4, 9, 64, dtype=torch.bfloat16)}, {}, ValueError, r"has 9 rows|multiple"),
    ({"v": torch.randn(12, 2, 64, dtype=torch.bfloat16)}, {}, ValueError, "differ in tokens or heads"),
    ({"q": torch.randn(9, 4, 64, 2, dtype=torch.bfloat16)[..., 0]}, {}, ValueError, "contiguous head dim"),
    ({}, {"causal": "diagonal"}, ValueError, "causal must be one of"),
    ({}, {"scale": "big"}, TypeError, "scale must be a real number"),
])
def test_bad_arguments_are_named(change, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        attention_varlen_forward(*_with(packed(), **change), **kwargs)


@pytest.mark.compile
def test_varlen_launch_compiles_with_cp_async_and_tensor_cores():
    pytest.importorskip("cutlass")
    from cute_kernels.runtime.registry import check_variant, compile_variant, get_variant

    report = compile_variant("attention.sm80_flash_varlen", "d128_bfloat16_causal")
    assert check_variant(report, get_variant("attention.sm80_flash_varlen")) == []
    ops = report.opcodes
    assert ops.get("LDGSTS.E.BYPASS.LTC128B.128", 0) > 0 and ops.get("HMMA.16816.F32.BF16", 0) > 0


def test_auto_picks_the_highest_rung_with_a_varlen_launch(monkeypatch):
    from cute_kernels.attention import dispatch, registry, varlen
    from cute_kernels.attention.api import AttentionProblem

    class Rung:
        dtypes = (torch.bfloat16,)
        min_capability = None

        def __init__(self, name, has_varlen):
            self.name = name
            if has_varlen:
                self.varlen = lambda *args: (self.name, args)

        def supports(self, q, k, v, problem):
            return None

    fake = {"sm80_flash": Rung("sm80_flash", True), "sm90_flash": Rung("sm90_flash", False)}
    problem = AttentionProblem(3, 4, 2, 5, 7, 64, 64, torch.bfloat16, None, 0.125)
    monkeypatch.setattr(varlen, "check_varlen_inputs", lambda *a, **k: problem)
    monkeypatch.setattr(registry, "KERNELS", fake)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    name, _ = attention_varlen_forward(*packed())
    assert name == "sm80_flash"
    with pytest.raises(ValueError, match="'sm90_flash' has no varlen launch"):
        attention_varlen_forward(*packed(), kernel="sm90_flash")
