"""Paged keys for the varlen forward (prefill and chunked prefill over a paged KV cache).

`attention_varlen_forward(..., page_table=...)` takes FlashAttention-4's varlen paged layout:
k_cache (num_pages, page_size, Hkv, D) and v_cache (num_pages, page_size, Hkv, Dv) (vLLM's),
page_table (B, max_pages) int32, no cu_seqlens_k, and optionally seqused_k (B,) int32: key t
of sequence b is slot t % page_size of page page_table[b, t // page_size], for t below
seqused_k[b] (every slot of the sequence's max_pages pages without it). Causal alignment,
windows, softcap and sinks are as with packed keys: the cache holds a sequence's whole prefix,
so a chunk of new queries aligns bottom-right to its end.

How it runs today: the used pages are gathered into packed keys (`packed_keys`: one indexed
read of the cache per K and V, exactly the used slots, so its cost is one pass over the keys
in bytes), and the packed varlen kernels run on them; the result equals the same call with
packed keys bit for bit. Against the attention itself that pass is small for prefill (about
S^2 / S of the work) and about 15% for a 512-token chunk over 32k cached keys (an estimate,
not yet measured). Reading pages straight from the cache in `sm90_flash`'s producer (a TMA
box per page, zeroing the slots past the sequence in the last page) is what would remove it.

Checks (on the host, in the device-to-host copy the varlen entry makes anyway): the shapes and
dtypes, that no sequence asks for more keys than its pages hold, and that every page a
sequence uses lies inside the cache (an index out of range raises here, naming the sequence
and the column, never reaches the device). Pages past a sequence's keys are never read.
"""

from __future__ import annotations

__all__ = ["check_page_table", "packed_keys"]


def check_page_table(page_table, k_cache, v_cache, batch: int, seqused_k, who: str) -> list[int]:
    """Validate the paged inputs of `batch` sequences; return each sequence's key count.

    Raises TypeError/ValueError naming the argument: k_cache/v_cache not 4-D or not sharing
    (num_pages, page_size, Hkv) or the head dim not contiguous; page_table not a (batch,
    max_pages) int32 tensor on the cache's device; seqused_k not (batch,) int32 or above a
    sequence's max_pages * page_size; a used page index outside [0, num_pages)."""
    import torch

    for name, t in (("k", k_cache), ("v", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{who}: with page_table, {name} must be the 4-D paged cache (num_pages, page_size, "
                             f"heads, head_dim), got shape {tuple(t.shape)}")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{who}: {name} must have a contiguous head dim (stride 1), got strides {t.stride()}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"{who}: k {tuple(k_cache.shape)} and v {tuple(v_cache.shape)} differ in pages, page size "
                         "or heads")
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    if page_size == 0:
        raise ValueError(f"{who}: the paged cache has a page size of 0")
    if not isinstance(page_table, torch.Tensor):
        raise TypeError(f"{who}: page_table must be a torch.Tensor, got {type(page_table).__name__}")
    if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != batch:
        raise ValueError(f"{who}: page_table must be a ({batch}, max_pages) int32 tensor (one row per sequence), "
                         f"got {tuple(page_table.shape)} {page_table.dtype}")
    if page_table.device != k_cache.device:
        raise ValueError(f"{who}: page_table is on {page_table.device} but the cache is on {k_cache.device}")
    capacity = page_table.shape[1] * page_size
    if seqused_k is None:
        lengths = [capacity] * batch
    else:
        if not isinstance(seqused_k, torch.Tensor):
            raise TypeError(f"{who}: seqused_k must be a torch.Tensor or None, got {type(seqused_k).__name__}")
        if seqused_k.dtype != torch.int32 or tuple(seqused_k.shape) != (batch,):
            raise ValueError(f"{who}: seqused_k must be a ({batch},) int32 tensor (one key count per sequence), got "
                             f"{tuple(seqused_k.shape)} {seqused_k.dtype}")
        if seqused_k.device != k_cache.device:
            raise ValueError(f"{who}: seqused_k is on {seqused_k.device} but the cache is on {k_cache.device}")
        lengths = seqused_k.tolist()
        for b, n in enumerate(lengths):
            if not 0 <= n <= capacity:
                raise ValueError(f"{who}: seqused_k[{b}] = {n} but a sequence's {page_table.shape[1]} pages of "
                                 f"{page_size} hold {capacity} keys")
    table = page_table.cpu()
    for b, n in enumerate(lengths):
        used = table[b, :-(-n // page_size)]
        bad = ((used < 0) | (used >= num_pages)).nonzero()
        if bad.numel():
            col = int(bad[0, 0])
            raise ValueError(f"{who}: page_table[{b}, {col}] = {int(used[col])} is outside the cache's {num_pages} "
                             f"pages (sequence {b} uses its first {used.numel()} columns)")
    return lengths


def packed_keys(k_cache, v_cache, page_table, lengths: list[int]):
    """(k (Tk, Hkv, D), v (Tk, Hkv, Dv), cu_seqlens_k (B + 1,) int32): the keys `lengths` says
    each sequence uses, gathered from the paged cache in sequence order (`check_page_table`
    has validated the indices). Differentiable in k_cache and v_cache (an indexed read)."""
    import torch

    device, page_size = k_cache.device, k_cache.shape[1]
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    total = sum(lengths)
    if lengths:
        cu[1:] = counts.cumsum(0)
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), counts, output_size=total)
    pos = torch.arange(total, device=device) - cu[seq].long()
    pages = page_table.long()[seq, pos // page_size]
    slots = pos % page_size
    return k_cache[pages, slots], v_cache[pages, slots], cu
