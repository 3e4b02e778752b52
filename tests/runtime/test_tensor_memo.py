"""runtime.TensorMemo: a value derived from tensors is kept while the same tensor objects hold
the same contents (weak reference and version counter), rebuilt otherwise."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.runtime import TensorMemo  # noqa: E402


class Builds:
    def __init__(self):
        self.count = 0

    def __call__(self, tensors):
        def build():
            self.count += 1
            return sum(float(t.sum()) for t in tensors if t is not None)

        return build


def test_a_value_is_kept_until_a_tensor_changes_or_another_key_asks():
    memo, builds = TensorMemo("test", 4), Builds()
    a, b = torch.randn(5), torch.randn(3)
    first = memo.get((a, b, None), ("k",), builds((a, b)))
    assert memo.get((a, b, None), ("k",), builds((a, b))) == first and builds.count == 1
    memo.get((a, b, None), ("other key",), builds((a, b)))
    assert builds.count == 2
    a.add_(1.0)  # an in-place write bumps the version
    assert memo.get((a, b, None), ("k",), builds((a, b))) == pytest.approx(first + 5.0) and builds.count == 3
    memo.get((b, a, None), ("k",), builds((a, b)))  # the order of the tensors is part of the key
    assert builds.count == 4


def test_a_new_tensor_never_matches_a_freed_one():
    memo, builds = TensorMemo("test", 4), Builds()
    for _ in range(20):  # ids of freed tensors are reused; the weak reference tells them apart
        t = torch.randn(4)
        assert memo.get((t,), (), builds((t,))) == pytest.approx(float(t.sum()))
        del t
    assert builds.count == 20


def test_untrackable_arguments_build_every_time_and_the_memo_is_bounded():
    memo, builds = TensorMemo("test", 2), Builds()
    with torch.inference_mode():
        t = torch.randn(3)
    for _ in range(2):
        memo.get((t,), (), builds((t,)))
    assert builds.count == 2 and len(memo) == 0
    assert memo.get(([1, 2],), (), lambda: "built") == "built"
    kept = [torch.randn(2) for _ in range(3)]
    for x in kept:
        memo.get((x,), (), builds((x,)))
    assert len(memo) <= 2
    with pytest.raises(ValueError, match="max_entries must be >= 1"):
        TensorMemo("bad", 0)
