"""attention_varlen_forward and attention_varlen_backward without a GPU: their signatures (the
ones cute_kernels.ops calls), the argument checks that run before any launch, the rung choice,
and the compiled varlen launch's SASS."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention import attention_varlen_backward, attention_varlen_forward  # noqa: E402
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
    for name in ("causal", "scale", "window_size", "kernel"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    params = inspect.signature(attention_varlen_backward).parameters
    assert list(params)[:10] == ["dout", "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                 "max_seqlen_k"]
    for name in ("causal", "scale", "window_size", "kernel", "deterministic"):
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
    ({}, {"window_size": (1, -3)}, ValueError, "window_size values must be >= -1"),
    ({}, {"window_size": 4}, TypeError, "window_size must be None or a pair of ints"),
    ({}, {"window_size": (4, 1), "causal": "bottom_right"}, ValueError, "bounds the window on the right at 0"),
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
                self.varlen = lambda *args, offsets: (self.name, args, offsets)

        def supports(self, q, k, v, problem):
            return None

    fake = {"sm80_flash": Rung("sm80_flash", True), "sm90_flash": Rung("sm90_flash", False)}
    problem = AttentionProblem(3, 4, 2, 5, 7, 64, 64, torch.bfloat16, None, 0.125)
    offsets = varlen.HostOffsets((0, 2, 5), (0, 3, 7), None)
    monkeypatch.setattr(varlen, "checked_varlen_inputs", lambda *a, **k: (problem, offsets))
    monkeypatch.setattr(registry, "KERNELS", fake)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    name, _, given = attention_varlen_forward(*packed())
    assert name == "sm80_flash" and given is offsets  # the offsets the check read, passed on
    with pytest.raises(ValueError, match="'sm90_flash' has no varlen launch"):
        attention_varlen_forward(*packed(), kernel="sm90_flash")


# ---- attention_varlen_backward ----------------------------------------------------------------

def backward_args(**changes):
    """(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k) for `packed()`, as the forward returns them."""
    q, k, v, cu_q, cu_k, max_q, max_k = packed()
    d = dict(dout=torch.randn_like(q), q=q, k=k, v=v, out=torch.randn_like(q),
             lse=torch.randn(q.shape[1], q.shape[0]), cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k)
    d.update(changes)
    return list(d.values())


def test_backward_rejects_cpu_tensors_after_the_checks():
    with pytest.raises(ValueError, match="attention_varlen_backward: tensors are on 'cpu'.*CUDA"):
        attention_varlen_backward(*backward_args())


@pytest.mark.parametrize("change, kwargs, error, pattern", [
    ({"dout": torch.randn(9, 4, 32, dtype=torch.bfloat16)}, {}, ValueError, r"dout must be a \(9, 4, 64\)"),
    ({"dout": torch.randn(9, 4, 64)}, {}, ValueError, r"dout must be a .* torch.bfloat16 tensor"),
    ({"out": torch.randn(8, 4, 64, dtype=torch.bfloat16)}, {}, ValueError, r"out must be a \(9, 4, 64\)"),
    ({"lse": torch.randn(9, 4)}, {}, ValueError, r"lse must be a \(4, 9\) torch.float32"),
    ({"lse": torch.randn(4, 9, dtype=torch.bfloat16)}, {}, ValueError, "lse must be a"),
    ({"lse": None}, {}, TypeError, "lse must be a torch.Tensor"),
    ({"max_q": 4}, {}, ValueError, "attention_varlen_backward: max_seqlen_q = 4"),
    ({"q": torch.randn(9, 4, 32, dtype=torch.bfloat16)}, {}, ValueError, "q head dim 32 differs"),
    ({}, {"window_size": (1, 2), "causal": "top_left"}, ValueError, "bounds the window on the right at 0"),
    ({}, {"causal": "diagonal"}, ValueError, "causal must be one of"),
])
def test_backward_bad_arguments_are_named(change, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        attention_varlen_backward(*backward_args(**change), **kwargs)


class VarlenRung:
    dtypes = (torch.bfloat16,)
    min_capability = None

    def __init__(self, name, backward=None, refuse=None):
        self.name, self.refuse, self.calls = name, refuse, []
        if backward is not None:
            self.varlen_backward = backward(self)

    def supports(self, q, k, v, problem):
        return None

    def supports_backward(self, problem):
        return self.refuse


def _plain_backward(rung):
    def varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, problem):
        rung.calls.append((dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, problem))
        return q + 1, k + 1, v + 1
    return varlen_backward


def _deterministic_backward(rung):
    def varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, problem, *, deterministic=False):
        rung.calls.append(deterministic)
        return q, k, v
    return varlen_backward


@pytest.fixture
def fake_ladder(monkeypatch):
    """Install a fake registry; skip check_varlen_inputs' device check by returning its problem."""
    from cute_kernels.attention import dispatch, registry, varlen
    from cute_kernels.attention.api import AttentionProblem

    problem = AttentionProblem(3, 4, 2, 5, 7, 64, 64, torch.bfloat16, None, 0.125, 2, None)
    offsets = varlen.HostOffsets((0, 2, 5), (0, 3, 7), None)
    monkeypatch.setattr(varlen, "checked_varlen_inputs", lambda *a, **k: (problem, offsets))
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))

    def install(rungs):
        monkeypatch.setattr(registry, "KERNELS", {r.name: r for r in rungs})
    return install, problem


def test_backward_runs_the_highest_rung_with_a_varlen_backward(fake_ladder):
    install, problem = fake_ladder
    low, high = VarlenRung("sm80_flash", _plain_backward), VarlenRung("sm90_flash")
    install([low, high])
    args = backward_args()
    dq, dk, dv = attention_varlen_backward(*args)
    (call,) = low.calls
    assert all(a is b for a, b in zip(call[:8], args[:8])) and call[8:] == (5, 7, problem)
    assert torch.equal(dq, args[1] + 1) and torch.equal(dv, args[3] + 1)
    with pytest.raises(NotImplementedError, match="'sm90_flash' has no varlen backward"):
        attention_varlen_backward(*args, kernel="sm90_flash")


def test_backward_without_any_varlen_backward_is_not_implemented(fake_ladder):
    install, _ = fake_ladder
    install([VarlenRung("sm80_flash")])
    with pytest.raises(NotImplementedError, match="no attention kernel has a varlen backward"):
        attention_varlen_backward(*backward_args())


def test_backward_refusals_name_the_reason(fake_ladder):
    install, _ = fake_ladder
    install([VarlenRung("sm80_flash", _plain_backward, refuse="sliding windows are not implemented")])
    for kernel in ("auto", "sm80_flash"):
        with pytest.raises(NotImplementedError, match="sliding windows are not implemented"):
            attention_varlen_backward(*backward_args(), kernel=kernel)


def test_backward_passes_deterministic_to_rungs_that_take_it(fake_ladder, monkeypatch):
    install, _ = fake_ladder
    rung = VarlenRung("sm80_flash", _deterministic_backward)
    install([rung])
    attention_varlen_backward(*backward_args())
    attention_varlen_backward(*backward_args(), deterministic=True)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    attention_varlen_backward(*backward_args())
    assert rung.calls == [False, True, True]


def test_backward_without_keys_or_queries_is_zero(fake_ladder):
    install, _ = fake_ladder
    install([])  # no rung is asked
    q, k, v = (torch.randn(0, 4, 64, dtype=torch.bfloat16), torch.randn(13, 2, 64, dtype=torch.bfloat16),
               torch.randn(13, 2, 64, dtype=torch.bfloat16))
    dq, dk, dv = attention_varlen_backward(*backward_args(q=q, dout=q, out=q, lse=torch.zeros(4, 0)))
    assert dq.shape == q.shape and torch.equal(dk, torch.zeros_like(k)) and torch.equal(dv, torch.zeros_like(v))


def test_backward_takes_an_expanded_output_gradient():
    """autograd hands `out.sum()`'s gradient over as an expanded (stride 0) tensor: the checks
    let it through (the rung copies what its loads cannot read); only the device stops it."""
    args = backward_args()
    args[0] = torch.ones((), dtype=torch.bfloat16).expand(args[0].shape)
    with pytest.raises(ValueError, match="on 'cpu'.*CUDA"):
        attention_varlen_backward(*args)
