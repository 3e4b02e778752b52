"""seqlen_info: cumulative offsets of packed variable-length batches."""

from __future__ import annotations

import pytest

from cute_kernels.attention.seqlen_info import check_cu_seqlens, cu_seqlens_from_lengths, seqlen_info


def test_offsets_and_lengths():
    cu_q = cu_seqlens_from_lengths([3, 0, 5])
    cu_k = cu_seqlens_from_lengths([4, 2, 1])
    assert cu_q == [0, 3, 3, 8]
    info = seqlen_info(2, cu_q, cu_k)
    assert (info.offset_q, info.seqlen_q, info.offset_k, info.seqlen_k) == (3, 5, 6, 1)


@pytest.mark.parametrize("cu, total, pattern", [
    ([1, 3], None, r"\[0\] must be 0"),
    ([0, 3, 2], None, "decreases at index 2"),
    ([0, 3], 4, "has 4 rows"),
    ([0], None, "at least 2"),
])
def test_bad_offsets_are_named(cu, total, pattern):
    with pytest.raises(ValueError, match=pattern):
        check_cu_seqlens(cu, total)


def test_negative_length_and_bad_index():
    with pytest.raises(ValueError, match="non-negative"):
        cu_seqlens_from_lengths([2, -1])
    with pytest.raises(IndexError):
        seqlen_info(3, [0, 1, 2], [0, 1, 2])
