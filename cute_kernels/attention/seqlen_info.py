"""Variable-length batches: sequences packed end to end, delimited by cumulative offsets.

A packed batch of n sequences has `cu_seqlens` = [0, l0, l0 + l1, ..., total] (n + 1 int32
values, FlashAttention's convention): sequence b occupies rows [cu_seqlens[b], cu_seqlens[b+1])
of a (total, H, D) tensor. `SeqlenInfo` is what one CTA needs to know about its sequence.
`varlen.attention_varlen_forward` / `attention_varlen_backward` are the entry points;
`sm80_flash` and its backward kernels (`sm80_flash_bwd`) read each CTA's sequence with
`varlen_seqlens` (the same arithmetic on the DSL's Int32 as on Python ints).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SeqlenInfo", "cu_seqlens_from_lengths", "check_cu_seqlens", "seqlen_info", "varlen_seqlens"]


@dataclass(frozen=True)
class SeqlenInfo:
    """Sequence `batch` of a packed batch: its first row (`offset_q`, `offset_k`) and lengths."""

    batch: int
    offset_q: int
    seqlen_q: int
    offset_k: int
    seqlen_k: int


def cu_seqlens_from_lengths(lengths) -> list[int]:
    """[0, l0, l0 + l1, ...]; raises ValueError for a negative length."""
    out = [0]
    for i, n in enumerate(lengths):
        if int(n) != n or n < 0:
            raise ValueError(f"sequence length {i} is {n!r}; lengths must be non-negative integers")
        out.append(out[-1] + int(n))
    return out


def check_cu_seqlens(cu_seqlens, total: int | None = None, what: str = "cu_seqlens") -> list[int]:
    """`cu_seqlens` as a list of ints, checked: starts at 0, non-decreasing, ends at `total`
    (the packed tensor's row count) when given. Raises ValueError naming the first violation."""
    values = [int(x) for x in (cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens)]
    if len(values) < 2:
        raise ValueError(f"{what} needs at least 2 entries (one sequence), got {len(values)}")
    if values[0] != 0:
        raise ValueError(f"{what}[0] must be 0, got {values[0]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(f"{what} decreases at index {i}: {values[i - 1]} -> {values[i]}")
    if total is not None and values[-1] != total:
        raise ValueError(f"{what}[-1] = {values[-1]} but the packed tensor has {total} rows")
    return values


def seqlen_info(batch: int, cu_seqlens_q, cu_seqlens_k) -> SeqlenInfo:
    """The `SeqlenInfo` of sequence `batch`."""
    q, k = list(cu_seqlens_q), list(cu_seqlens_k)
    if len(q) != len(k):
        raise ValueError(f"cu_seqlens_q has {len(q) - 1} sequences but cu_seqlens_k has {len(k) - 1}")
    if not 0 <= batch < len(q) - 1:
        raise IndexError(f"sequence {batch} out of range for {len(q) - 1} sequences")
    return SeqlenInfo(batch, q[batch], q[batch + 1] - q[batch], k[batch], k[batch + 1] - k[batch])


def varlen_seqlens(cu_seqlens_q, cu_seqlens_k, batch) -> SeqlenInfo:
    """The `SeqlenInfo` of sequence `batch`, read from indexable offsets without checks: inside
    a kernel (cu_seqlens are int32 gmem tensors, `batch` the CTA's index; the host validated
    the offsets) or on Python lists. Post-condition: equals `seqlen_info` on valid offsets."""
    offset_q, offset_k = cu_seqlens_q[batch], cu_seqlens_k[batch]
    return SeqlenInfo(batch, offset_q, cu_seqlens_q[batch + 1] - offset_q, offset_k,
                      cu_seqlens_k[batch + 1] - offset_k)
