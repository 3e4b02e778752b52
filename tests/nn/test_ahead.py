"""nn.ahead: a patched model armed for compile-ahead predicts, at its first layer call, one call
per distinct layer at that call's leading dimensions; the calls rebuild the layers from meta
copies and run (here on CPU, with torch computing: the dry-run compile is the worker's)."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch


class Block(torch.nn.Module):
    def __init__(self, width=16, hidden=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)
        self.rms = torch.nn.RMSNorm(width)

    def forward(self, x):
        return self.rms(x + self.down(torch.relu(self.up(self.norm(x)))))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.blocks(x)[:, 0])


@pytest.fixture
def armed(monkeypatch):
    """Compile-ahead on, with `submit` and `start` recording instead of starting workers."""
    from cute_kernels.nn import ahead
    from cute_kernels.runtime import compile_ahead, unverified

    record = {"submitted": [], "started": []}
    monkeypatch.setattr(compile_ahead, "submit", lambda calls: record["submitted"].extend(calls) or len(calls))
    monkeypatch.setattr(compile_ahead, "start", lambda imports=(): record["started"].append(imports))
    with unverified.allowing("compile_ahead"):
        yield ahead, record


def _patched():
    import cute_kernels.nn as cnn

    torch.manual_seed(0)
    return cnn.patch(Model(), fallback="torch")


def test_patch_arms_every_layer_and_the_first_call_disarms_and_predicts(armed, monkeypatch):
    ahead, record = armed
    model = _patched()
    assert [type(m).__name__ for m in ahead.layers(model)] == ["LayerNorm", "Linear", "Linear", "RMSNorm"] * 2 + [
        "Linear"]
    assert record["started"] == [("cute_kernels.nn",)]
    import cute_kernels.nn as cnn

    lone = cnn.Linear(4, 4)
    assert ahead.layers(lone) == [lone]
    outer = torch.nn.Sequential(cnn.GatedMLP(16, 32), cnn.Linear(16, 16))
    assert [type(m).__name__ for m in ahead.layers(outer)] == ["GatedMLP", "Linear"]  # not what GatedMLP holds
    assert all(len(m._forward_pre_hooks) == 1 for m in ahead.layers(model))
    monkeypatch.setattr(ahead, "_has_kernels", lambda x: True)
    x = torch.randn(4, 5, 16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's FallbackWarning
        model(x).sum().backward()
    assert all(len(m._forward_pre_hooks) == 0 for m in ahead.layers(model))
    calls = record["submitted"]
    # the two blocks' layers are alike: one forward each, plus the head (at the blocks' tokens);
    # then backwards in reverse, a linear layer's as two calls: its input's gradient, its weights'
    names = [type(c.target).__name__ for c in calls]
    assert names == ["LayerNorm", "Linear", "Linear", "RMSNorm", "Linear",
                     "Linear", "Linear", "RMSNorm", "Linear", "Linear", "Linear", "Linear", "LayerNorm"]
    assert [c.args[0].shape for c in calls[:5]] == [(4, 5, 16), (4, 5, 16), (4, 5, 32), (4, 5, 16), (4, 5, 16)]
    assert all(c.grad and c.training for c in calls) and all(c.args[0].requires_grad for c in calls[:5])
    assert [c.backward for c in calls] == [False] * 5 + [True] * 8
    up = calls[1]  # 16 -> 32 on (4, 5, 16) fp32: input, output and weight (the device reserve's measure)
    assert up.footprint == 4 * (4 * 5 * 16 + 4 * 5 * 32 + 32 * 16) + (1 << 20)
    assert calls[5].footprint == 2 * 4 * (4 * 5 * 16 + 4 * 5 * 3 + 3 * 16) + (1 << 20)  # the head's dX, gradients too
    head_dx, head_dw = calls[5:7]
    assert not any(p.requires_grad for p in head_dx.target.parameters()) and head_dx.args[0].requires_grad
    assert all(p.requires_grad for p in head_dw.target.parameters()) and not head_dw.args[0].requires_grad
    assert all(p.device.type == "meta" for c in calls for p in c.target.parameters())
    model(x)  # disarmed: nothing more
    assert len(calls) == 13


def test_a_compile_rearms_and_a_new_token_count_is_predicted_once(armed, monkeypatch):
    from cute_kernels.runtime import cache

    ahead, record = armed
    model = _patched()
    monkeypatch.setattr(ahead, "_has_kernels", lambda x: True)
    assert ahead._rearm in cache.compile_listeners
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(torch.randn(2, 7, 16))
        assert len(record["submitted"]) == 5 and not model.head._forward_pre_hooks
        ahead._rearm()  # what a compile of this process does
        assert model.head._forward_pre_hooks
        model(torch.randn(2, 7, 16))  # predicted already: nothing new
        assert len(record["submitted"]) == 5 and not model.head._forward_pre_hooks
        model(torch.randn(2, 1, 16))  # not re-armed: nothing
        ahead._rearm()
        model(torch.randn(2, 1, 16))  # a decode step's token count
    assert len(record["submitted"]) == 10 and record["submitted"][5].args[0].shape == (2, 1, 16)


def test_predicted_calls_rebuild_their_layers_and_run_forward_and_backward(armed):
    from cute_kernels.runtime import ahead_worker

    ahead, _ = armed
    model = _patched().eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        calls = ahead.predict(model, x)
    assert calls and not any(c.grad or c.backward or c.training for c in calls)
    model.train()
    calls = ahead.predict(model, x)  # x needs no grad, the weights do: one backward call each
    assert [c.backward for c in calls] == [False] * 5 + [True] * 5
    assert not any(c.args[0].requires_grad for c in calls)
    for call in calls:
        call = pickle.loads(pickle.dumps(call))  # as a worker receives it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's FallbackWarning
            ahead_worker.run(call)


def test_a_meta_copy_leaves_the_layer_alone_and_pickles_small(armed):
    ahead, _ = armed
    model = _patched()
    layer = model.blocks[0].up
    clone = ahead.meta_copy(layer)
    assert layer._forward_pre_hooks and not clone._forward_pre_hooks
    assert layer.weight.device.type == "cpu" and clone.weight.device.type == "meta"
    assert clone.weight.shape == layer.weight.shape and clone.weight.requires_grad
    assert clone.in_features == 16 and clone.fallback == "torch"
    assert len(pickle.dumps(clone)) < 4096
    pickle.dumps(model)  # the armed model still pickles (its hook is a module-level function)


def test_nothing_is_armed_where_compile_ahead_is_off():
    from cute_kernels.nn import ahead
    from cute_kernels.runtime import unverified

    with unverified.allowing("compile_ahead", on=False):
        model = _patched()
    assert all(not m._forward_pre_hooks for m in ahead.layers(model))
