"""What each probe must compute, in torch (float64 where it sums), and the inputs it reads.

These run on any device, so the GPU tests and the course's measurements check a probe against
them before trusting its timing, and CI checks them against plain Python on small cases.
"""

from __future__ import annotations

__all__ = ["chase_chain", "chase_end", "read_sums", "smem_read_sums", "divergence_values", "fma_values"]

LINE_ELEMS = 32  # int32 entries per 128-byte line (memory.LINE_ELEMS)


def chase_chain(working_set_bytes: int, *, device="cpu", seed: int = 0):
    """An int32 chain over `working_set_bytes` (a multiple of 128): one entry per 128-byte line
    is used, and following `j = chain[j]` from 0 visits every line once per lap, in a random order."""
    import torch

    lines = working_set_bytes // (4 * LINE_ELEMS)
    if lines < 2 or working_set_bytes % (4 * LINE_ELEMS):
        raise ValueError(f"chase_chain: the working set must be a multiple of 128 bytes, at least 256, got "
                         f"{working_set_bytes}")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(lines - 1, generator=gen) + 1  # line 0 starts the lap
    order = torch.cat([torch.zeros(1, dtype=order.dtype), order])
    chain = torch.zeros(lines * LINE_ELEMS, dtype=torch.int32)
    chain[order * LINE_ELEMS] = (torch.roll(order, -1) * LINE_ELEMS).to(torch.int32)
    return chain.to(device)


def chase_end(chain, hops: int) -> int:
    """The index reached from 0 after `hops` steps of `j = chain[j]`, for a chain made by
    `chase_chain` (one lap through every line)."""
    lines = chain.numel() // LINE_ELEMS
    line_next = chain.view(lines, LINE_ELEMS)[:, 0].cpu()
    j = 0
    for _ in range(hops % lines):
        j = int(line_next[j // LINE_ELEMS])
    return j


def read_sums(src, *, threads: int, vectors: int, blocks: int, passes: int):
    """`ReadBandwidth`'s output: out[b * threads + t] = sum over p < passes of thread t's 4 *
    vectors elements of tile (b + p) mod tiles (elements 4 t + v + 4 threads r of the tile)."""
    import torch

    tile = threads * 4 * vectors
    tiles = src.numel() // tile
    per = src[: tiles * tile].double().view(tiles, vectors, threads, 4).sum(dim=(1, 3))  # (tiles, threads)
    laps, rest = divmod(passes, tiles)
    starts = torch.arange(blocks, device=src.device) % tiles
    out = laps * per.sum(dim=0).expand(blocks, threads).clone()
    if rest:
        prefix = torch.cat([torch.zeros_like(per[:1]), torch.cat([per, per]).cumsum(dim=0)])  # (2 tiles + 1, threads)
        out += prefix[starts + rest] - prefix[starts]
    return out.reshape(-1)


def smem_read_sums(src, *, threads: int, vectors: int, blocks: int, passes: int):
    """`SmemBandwidth`'s output: shared memory holds src[:4 V] (V = threads * vectors vectors);
    out[b * threads + t] = sum over p of the 4 values of vector (t + p * threads) mod V."""
    import torch

    vec = src[: 4 * threads * vectors].double().view(vectors, threads, 4).sum(dim=2)  # (j, t): vector t + j threads
    counts = torch.tensor([len(range(j, passes, vectors)) for j in range(vectors)], dtype=torch.float64,
                          device=src.device)
    per_thread = (counts[:, None] * vec).sum(dim=0)
    return per_thread.repeat(blocks)


def divergence_values(group: int, *, threads: int, blocks: int, iters: int, chains: int = 8, device="cpu"):
    """`Divergence`'s output in float32: the sum over c < chains of chain c, from (t + c) / 1024,
    stepped by side 0 (x <- 0.999 x + 0.5) or side 1 (x <- x*x/2 + 0.1)."""
    import torch

    t = torch.arange(threads, device=device)
    x0 = (t[:, None] + torch.arange(chains, device=device)[None, :]).float() / 1024  # (threads, chains)
    a, b = x0.clone(), x0.clone()
    for _ in range(iters):
        a = a * 0.999 + 0.5
        b = b * b * 0.5 + 0.1
    x = torch.where(((t // group) % 2 == 0)[:, None], a, b).sum(-1)
    return x.repeat(blocks)


def fma_values(chains: int, *, threads: int, blocks: int, iters: int, device="cpu"):
    """`FmaChains`' output in float64: sum over c of chain c, from (t + c) / 1024, after `iters`
    steps of x <- 0.999 x + 0.5 (closed form: the steps are an affine contraction)."""
    import torch

    t = torch.arange(threads, device=device, dtype=torch.float64)
    fixed = 0.5 / (1 - 0.999)
    decay = 0.999 ** iters
    x = sum(fixed + ((t + c) / 1024 - fixed) * decay for c in range(chains))
    return x.repeat(blocks)
