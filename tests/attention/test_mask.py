"""mask: the reference definition of which (query, key) pairs attend."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.attention.mask import allowed, causal_offset, dense_mask  # noqa: E402


def test_causal_offsets():
    assert causal_offset(5, 9, "top_left") == 0
    assert causal_offset(5, 9, "bottom_right") == 4
    assert causal_offset(9, 5, "bottom_right") == -4
    with pytest.raises(ValueError, match="top_left"):
        causal_offset(5, 9, "diagonal")


@pytest.mark.parametrize("sq, sk", [(1, 1), (5, 9), (9, 5), (7, 7)])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_dense_mask_is_allowed(sq, sk, align):
    m = dense_mask(sq, sk, causal=True, align=align)
    for i in range(sq):
        for j in range(sk):
            assert bool(m[i, j]) == allowed(i, j, sq, sk, causal=True, align=align)


@pytest.mark.filterwarnings("ignore:Lower right causal bias")
def test_matches_torch_causal_biases():
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    for sq, sk in ((5, 9), (9, 5), (6, 6)):
        upper = causal_upper_left(sq, sk)._materialize(device="cpu")
        lower = causal_lower_right(sq, sk)._materialize(device="cpu")
        assert torch.equal(dense_mask(sq, sk, causal=True, align="top_left"), upper)
        assert torch.equal(dense_mask(sq, sk, causal=True, align="bottom_right"), lower)


def test_sliding_window_and_bounds():
    # Row 5 with a window of 2 keys to its left sees keys 3, 4, 5.
    assert [j for j in range(8) if allowed(5, j, 8, 8, causal=True, window_left=2)] == [3, 4, 5]
    assert not allowed(0, 8, 8, 8)
    assert not allowed(8, 0, 8, 8)
    with pytest.raises(ValueError, match="window_right"):
        allowed(0, 0, 4, 4, causal=True, window_right=1)
    with pytest.raises(ValueError, match="window_left"):
        allowed(0, 0, 4, 4, window_left=-1)
    m = dense_mask(8, 8, causal=True, window_left=2)
    assert int(m.sum()) == 1 + 2 + 3 * 6


@pytest.mark.parametrize("sq, sk", [(8, 8), (5, 9), (9, 5)])
@pytest.mark.parametrize("left, right", [(2, None), (None, 1), (0, 0), (3, 2)])
def test_window_without_causality_is_aligned_bottom_right(sq, sk, left, right):
    base = sk - sq
    m = dense_mask(sq, sk, window_left=left, window_right=right)
    for i in range(sq):
        for j in range(sk):
            want = (right is None or j <= i + base + right) and (left is None or j >= i + base - left)
            assert bool(m[i, j]) == want == allowed(i, j, sq, sk, window_left=left, window_right=right)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_causal_window_follows_the_causal_alignment(align):
    sq, sk = 6, 10
    base = 0 if align == "top_left" else sk - sq
    m = dense_mask(sq, sk, causal=True, align=align, window_left=3, window_right=0)
    for i in range(sq):
        assert [j for j in range(sk) if m[i, j]] == [j for j in range(sk) if i + base - 3 <= j <= i + base]
