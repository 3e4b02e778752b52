"""Which K/V blocks a Q block visits, and which of them need a mask.

Definitions (0-based rows i of Q, columns j of K; see `mask` for `offset`):

- A (Q block m, K/V block n) tile covers rows [m*bm, m*bm + bm) and columns [n*bn, n*bn + bn).
- Visited blocks are n in [0, n_block_max): every block holding an allowed (i, j) for some row
  i < seqlen_q of the Q block. Without causality that is ceil(seqlen_k / bn); with it, also at
  most ceil((min(seqlen_q, (m+1)*bm) + offset) / bn), since row i reaches column i + offset.
- With a window's left bound (j >= i + offset_lo, `local`), visited blocks start at
  n_block_min = max(m*bm + offset_lo, 0) // bn (the first row's first key), and kernels mask
  every visited block (no unmasked fast path).
- Unmasked blocks are n in [0, n_unmasked_end) with n_unmasked_end <= n_block_max: every
  (i, j) of the tile with i in the Q block is allowed, so no element needs a test. The rest,
  [n_unmasked_end, n_block_max), need the mask (the causal diagonal or the sequence end).

Kernels visit the masked blocks first, from n_block_max - 1 down, then the unmasked ones: the
one partial K/V block (the sequence end) is then the first loaded, and the steady-state loop
carries no predicate.

The functions take the integer operations as arguments so the same arithmetic runs on Python
ints (tests, the workbench) and on the DSL's Int32 inside a kernel (`cutlass.min`/`max`). Every
value divided here is >= 0, so `//` means floor division in both worlds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BlockRange", "n_block_range", "n_block_min", "m_block_range", "block_range", "visited_pairs",
           "tile_unmasked", "lpt_heads_per_group", "lpt_tile", "L2_KV_BUDGET"]


def _ceil_div(a, b):
    return (a + (b - 1)) // b


def n_block_range(m_block, seqlen_q, seqlen_k, offset, *, block_m: int, block_n: int, causal: bool,
                  minimum=min, maximum=max):
    """(n_block_max, n_unmasked_end) for Q block `m_block` (definitions in the module docstring).

    `offset` is the causal diagonal's column shift (0 top-left, seqlen_k - seqlen_q bottom-right);
    it is ignored without causality. Post-conditions: 0 <= n_unmasked_end <= n_block_max <=
    ceil(seqlen_k / block_n); n_block_max may be 0 (a Q block whose rows see no key).
    """
    n_block_max = _ceil_div(seqlen_k, block_n)
    n_unmasked_end = seqlen_k // block_n
    if causal:
        last_row_end = minimum(seqlen_q, (m_block + 1) * block_m)
        reach = maximum(last_row_end + offset, 0)
        n_block_max = minimum(n_block_max, _ceil_div(reach, block_n))
        # Block n is fully below the diagonal when its last column (n+1)*bn - 1 is at most the
        # first row's last column m*bm + offset.
        first_reach = maximum(m_block * block_m + offset + 1, 0)
        n_unmasked_end = minimum(n_unmasked_end, first_reach // block_n)
    n_unmasked_end = minimum(n_unmasked_end, n_block_max)
    return n_block_max, n_unmasked_end


def n_block_min(m_block, offset_lo, *, block_m: int, block_n: int, local: bool, maximum=max):
    """The first K/V block Q block `m_block` visits: 0 without a left window bound, else the
    block of the first row's first allowed key, max(m_block*bm + offset_lo, 0) // bn. May be
    >= n_block_max (a Q block whose rows see no key)."""
    if not local:
        return 0
    return maximum(m_block * block_m + offset_lo, 0) // block_n


@dataclass(frozen=True)
class BlockRange:
    """The K/V blocks of one Q block: visited [n_block_min, n_block_max), unmasked
    [n_block_min, n_unmasked_end) (empty with a left window bound: every block is masked)."""

    m_block: int
    n_block_max: int
    n_unmasked_end: int
    n_block_min: int = 0

    @property
    def masked(self) -> range:
        """The masked blocks, in the order kernels visit them (descending)."""
        return range(self.n_block_max - 1, max(self.n_unmasked_end, self.n_block_min) - 1, -1)

    @property
    def unmasked(self) -> range:
        return range(self.n_unmasked_end - 1, self.n_block_min - 1, -1)

    @property
    def order(self) -> list[int]:
        """Every visited block in visiting order."""
        return [*self.masked, *self.unmasked]


def block_range(m_block: int, seqlen_q: int, seqlen_k: int, *, block_m: int, block_n: int,
                causal: bool = False, align: str = "top_left", window_left: int | None = None,
                window_right: int | None = None) -> BlockRange:
    """`n_block_range` and `n_block_min` for Python ints, with the causal alignment and window
    named (see `mask.window_offsets`)."""
    from .mask import window_offsets

    upper, lower = window_offsets(seqlen_q, seqlen_k, causal=causal, align=align, window_left=window_left,
                                  window_right=window_right)
    n_max, n_unmasked = n_block_range(m_block, seqlen_q, seqlen_k, upper or 0, block_m=block_m, block_n=block_n,
                                      causal=upper is not None)
    local = lower is not None
    n_min = n_block_min(m_block, lower or 0, block_m=block_m, block_n=block_n, local=local)
    if local:
        n_unmasked = n_min
    return BlockRange(m_block, n_max, n_unmasked, n_min)


def visited_pairs(seqlen_q: int, seqlen_k: int, *, block_m: int, block_n: int, causal: bool = False,
                  align: str = "top_left", window_left: int | None = None,
                  window_right: int | None = None) -> list[tuple[int, int, bool]]:
    """(m_block, n_block, masked) for every tile a kernel computes, in launch-then-visit order."""
    out = []
    for m in range(_ceil_div(seqlen_q, block_m)):
        r = block_range(m, seqlen_q, seqlen_k, block_m=block_m, block_n=block_n, causal=causal, align=align,
                        window_left=window_left, window_right=window_right)
        out += [(m, n, True) for n in r.masked] + [(m, n, False) for n in r.unmasked]
    return out


def tile_unmasked(m_block, n_block, seqlen_q, seqlen_k, offset, offset_lo, *, block_m: int, block_n: int,
                  causal: bool, local: bool, rows_masked: bool):
    """Whether every (i, j) of the (Q block m, K/V block n) tile is allowed, so the tile needs
    no mask: its columns exist (j < seqlen_k), with `causal` its last column is within the
    first row's reach (j <= i + offset), with `local` its first column within the last row's
    window (j >= i + offset_lo), and with `rows_masked` (packed sequences, whose rows past the
    end are another sequence's) its rows exist. Without `rows_masked`, rows past seqlen_q are
    left to the caller (the backward's lse2 = +inf there). A bool on Python ints, a Boolean on
    the DSL's Int32 (`&` only)."""
    ok = (n_block + 1) * block_n <= seqlen_k
    if rows_masked:
        ok = ok & ((m_block + 1) * block_m <= seqlen_q)
    if causal:
        ok = ok & ((n_block + 1) * block_n - 1 <= m_block * block_m + offset)
    if local:
        ok = ok & (n_block * block_n >= (m_block + 1) * block_m - 1 + offset_lo)
    return ok


def m_block_range(n_block, seqlen_q, offset, *, block_m: int, block_n: int, causal: bool, maximum=max,
                  offset_lo=0, local: bool = False, minimum=min):
    """(m_block_min, m_block_max): the Q blocks whose real rows see some key of K/V block n_block
    (the backward's dK/dV pass walks them). Row i sees key j when j <= i + offset, so block n's
    first key n*bn is seen from row n*bn - offset on; with a left window bound (`local`, j >=
    i + offset_lo) its last key (n+1)*bn - 1 is seen up to row (n+1)*bn - 1 - offset_lo.
    Post-condition: 0 <= m_block_min, and the range may be empty (m_block_min >= m_block_max)."""
    m_block_max = _ceil_div(seqlen_q, block_m)
    m_block_min = 0
    if causal:
        m_block_min = maximum(n_block * block_n - offset, 0) // block_m
    if local:
        rows_end = maximum((n_block + 1) * block_n - offset_lo, 0)
        m_block_max = minimum(m_block_max, _ceil_div(rows_end, block_m))
    return m_block_min, m_block_max


# Bytes of K/V that a group of heads visited together may occupy in L2 (H100/H200 have 50 MB;
# the rest is left to Q, O and other traffic).
L2_KV_BUDGET = 32 * 1024 * 1024


def lpt_heads_per_group(seqlen_k, head_dim: int, *, elem_bytes: int = 2, budget: int = L2_KV_BUDGET,
                        maximum=max):
    """How many (head, batch) pairs `lpt_tile` groups: as many as have K and V (2 x seqlen_k x
    head_dim elements each) within `budget` bytes of L2, at least 1."""
    per_row = 2 * head_dim * elem_bytes
    return maximum((budget // per_row) // maximum(seqlen_k, 1), 1)


def lpt_tile(linear, num_m_blocks, num_heads, num_batch, group, *, minimum=min):
    """(m_block, head, batch) of launch slot `linear` in [0, num_m_blocks * num_heads * num_batch)
    under the longest-first schedule: the (head, batch) pairs are cut into groups of `group`
    consecutive pairs (the last group may be smaller); a group's tiles come before the next
    group's, and inside a group the Q blocks go from the last (the longest causal row range) to
    the first, each over all of the group's pairs. So tiles that run together share the K/V of
    at most `group` heads (kept small enough for L2) and, with causality, long tiles start first.

    Post-condition (tested): a bijection onto the tiles, and m_block is non-increasing within a
    group. Pure integer arithmetic on values >= 0 (Python ints or the DSL's Int32)."""
    group = minimum(group, num_heads * num_batch)
    per_group = group * num_m_blocks
    g = linear // per_group
    r = linear - g * per_group
    first = g * group
    width = minimum(group, num_heads * num_batch - first)
    m_block = num_m_blocks - 1 - r // width
    hb = first + r % width
    batch = hb // num_heads
    head = hb - batch * num_heads
    return m_block, head, batch
