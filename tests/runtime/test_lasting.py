"""`runtime.lasting` on CPU: where a build runs. CPU tensors and the default stream build in
place; off the default stream (where CUDA graph trees route the calling thread's allocations to
a graph's pool) the build runs on a helper thread under the caller's stream, and its result or
its exception comes back to the caller; during a capture it builds in place (the graph owns
what it makes). The CUDA calls are stand-ins here; tests/runtime/test_lasting_gpu.py checks the
pool itself."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.runtime.lasting import lasting  # noqa: E402


def _record(seen):
    def build(n, *, scale):
        seen.append((threading.current_thread(), _CURRENT[0]))
        return [scale * i for i in range(n)]
    return build


_CURRENT = ["default"]


class _StreamContext:
    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        self.saved, _CURRENT[0] = _CURRENT[0], self.stream

    def __exit__(self, *exc):
        _CURRENT[0] = self.saved


@pytest.fixture
def fake_cuda(monkeypatch):
    state = {"capturing": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _CURRENT[0])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: "default")
    monkeypatch.setattr(torch.cuda, "stream", _StreamContext)
    _CURRENT[0] = "default"
    yield state
    _CURRENT[0] = "default"


def test_cpu_builds_in_place():
    seen = []
    assert lasting("cpu", _record(seen), 3, scale=2) == [0, 2, 4]
    assert seen[0][0] is threading.current_thread()


def test_default_stream_builds_in_place(fake_cuda):
    seen = []
    assert lasting("cuda", _record(seen), 2, scale=1) == [0, 1]
    assert seen == [(threading.current_thread(), "default")]


def test_side_stream_builds_on_a_helper_thread_under_the_callers_stream(fake_cuda):
    seen = []
    _CURRENT[0] = "side"
    assert lasting("cuda", _record(seen), 3, scale=5) == [0, 5, 10]
    (thread, stream), = seen
    assert thread is not threading.current_thread() and thread.name == "cute_kernels.lasting"
    assert stream == "side"
    assert _CURRENT[0] == "side"


def test_side_stream_errors_reach_the_caller(fake_cuda):
    _CURRENT[0] = "side"

    def build():
        raise ValueError("no memory for the counters")

    with pytest.raises(ValueError, match="no memory for the counters"):
        lasting("cuda", build)


def test_capture_builds_in_place(fake_cuda):
    seen = []
    fake_cuda["capturing"] = True
    _CURRENT[0] = "side"
    lasting("cuda", _record(seen), 1, scale=1)
    assert seen == [(threading.current_thread(), "side")]
