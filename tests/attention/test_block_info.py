"""block_info: the K/V blocks a Q block visits, checked against the mask's definition by brute
force (every tile's pairs enumerated with `mask.allowed`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cute_kernels.attention.block_info import block_range, n_block_range, visited_pairs
from cute_kernels.attention.mask import allowed


def brute_force(m, sq, sk, bm, bn, causal, align):
    """(n_block_max, n_unmasked_end) from the definitions: the last block with an allowed pair for
    a real row of the Q block, and the length of the prefix of fully allowed blocks."""
    rows = range(m * bm, min((m + 1) * bm, sq))
    n_blocks = -(-sk // bn)
    any_allowed = [any(allowed(i, j, sq, sk, causal=causal, align=align) for i in rows
                       for j in range(n * bn, (n + 1) * bn)) for n in range(n_blocks)]
    all_allowed = [all(allowed(i, j, sq, sk, causal=causal, align=align) for i in rows
                       for j in range(n * bn, (n + 1) * bn)) for n in range(n_blocks)]
    n_max = max((n + 1 for n, a in enumerate(any_allowed) if a), default=0)
    prefix = 0
    while prefix < n_max and all_allowed[prefix]:
        prefix += 1
    return n_max, prefix


@given(
    sq=st.integers(1, 70), sk=st.integers(1, 70), bm=st.sampled_from([16, 32, 64]),
    bn=st.sampled_from([16, 32, 64]), causal=st.booleans(), align=st.sampled_from(["top_left", "bottom_right"]),
)
def test_block_range_matches_the_mask_definition(sq, sk, bm, bn, causal, align):
    for m in range(-(-sq // bm)):
        r = block_range(m, sq, sk, block_m=bm, block_n=bn, causal=causal, align=align)
        assert (r.n_block_max, r.n_unmasked_end) == brute_force(m, sq, sk, bm, bn, causal, align)


def test_visiting_order_is_masked_blocks_first_descending():
    r = block_range(1, 256, 256, block_m=128, block_n=64, causal=True)
    # Rows 128..255 reach column 255: blocks 0..3 visited; rows from 128 see blocks 0 and 1 whole.
    assert (r.n_block_max, r.n_unmasked_end) == (4, 2)
    assert r.order == [3, 2, 1, 0]
    assert list(r.masked) == [3, 2] and list(r.unmasked) == [1, 0]


def test_bottom_right_with_more_queries_than_keys_leaves_early_q_blocks_empty():
    # Sq=300, Sk=100: rows 0..199 see no key (offset -200); Q block 0 (rows 0..127) visits nothing.
    r0 = block_range(0, 300, 100, block_m=128, block_n=64, causal=True, align="bottom_right")
    assert (r0.n_block_max, r0.n_unmasked_end) == (0, 0)
    assert r0.order == []
    r2 = block_range(2, 300, 100, block_m=128, block_n=64, causal=True, align="bottom_right")
    # Rows 256..299 reach columns 56..99: blocks 0 and 1, and row 256 does not cover block 0 whole.
    assert (r2.n_block_max, r2.n_unmasked_end) == (2, 0)


def test_sequence_end_block_is_masked_without_causality():
    assert n_block_range(0, 10, 130, 0, block_m=64, block_n=64, causal=False) == (3, 2)
    assert n_block_range(0, 10, 128, 0, block_m=64, block_n=64, causal=False) == (2, 2)


def test_visited_pairs_cover_exactly_the_allowed_pairs():
    sq, sk, bm, bn = 50, 37, 16, 16
    for causal, align in ((False, "top_left"), (True, "top_left"), (True, "bottom_right")):
        tiles = {(m, n) for m, n, _ in visited_pairs(sq, sk, block_m=bm, block_n=bn, causal=causal, align=align)}
        for i in range(sq):
            for j in range(sk):
                if allowed(i, j, sq, sk, causal=causal, align=align):
                    assert (i // bm, j // bn) in tiles


@given(
    sq=st.integers(1, 70), sk=st.integers(1, 70), bm=st.sampled_from([16, 32, 64]),
    bn=st.sampled_from([16, 32, 64]), causal=st.booleans(), align=st.sampled_from(["top_left", "bottom_right"]),
)
def test_m_block_range_covers_exactly_the_q_blocks_seeing_a_key_block(sq, sk, bm, bn, causal, align):
    from cute_kernels.attention.block_info import m_block_range
    from cute_kernels.attention.mask import causal_offset

    offset = causal_offset(sq, sk, align) if causal else 0
    for n in range(-(-sk // bn)):
        lo, hi = m_block_range(n, sq, offset, block_m=bm, block_n=bn, causal=causal)
        seeing = [m for m in range(-(-sq // bm))
                  if any(allowed(i, j, sq, sk, causal=causal, align=align)
                         for i in range(m * bm, min((m + 1) * bm, sq)) for j in range(n * bn, min((n + 1) * bn, sk)))]
        # Every Q block that sees the key block is visited; the first visited one sees it when
        # any does (the range is tight at the start; blocks after it all see it).
        assert set(seeing) <= set(range(lo, hi))
        if seeing:
            assert lo == seeing[0] and seeing == list(range(lo, hi))


@given(m=st.integers(1, 9), heads=st.integers(1, 6), batch=st.integers(1, 4), group=st.integers(1, 40))
def test_lpt_tile_is_a_longest_first_bijection_over_groups_of_heads(m, heads, batch, group):
    from cute_kernels.attention.block_info import lpt_tile

    order = [lpt_tile(i, m, heads, batch, group) for i in range(m * heads * batch)]
    assert sorted(order) == [(mb, h, b) for mb in range(m) for h in range(heads) for b in range(batch)]
    g = min(group, heads * batch)
    for start in range(0, len(order), g * m):
        chunk = order[start:start + g * m]
        # one group of consecutive (head, batch) pairs, Q blocks non-increasing (longest first)
        pairs = {b * heads + h for _, h, b in chunk}
        assert pairs == set(range(min(pairs), max(pairs) + 1)) and len(pairs) <= g
        assert [mb for mb, _, _ in chunk] == sorted((mb for mb, _, _ in chunk), reverse=True)
        assert all(mb == m - 1 - k // len(pairs) for k, (mb, _, _) in enumerate(chunk))


def test_lpt_group_keeps_kv_within_the_l2_budget():
    from cute_kernels.attention.block_info import L2_KV_BUDGET, lpt_heads_per_group

    for sk, d in ((2048, 128), (8192, 128), (4096, 256), (1, 64), (10**7, 256)):
        g = lpt_heads_per_group(sk, d)
        assert g >= 1
        assert g == 1 or g * 2 * sk * d * 2 <= L2_KV_BUDGET
        assert (g + 1) * 2 * sk * d * 2 > L2_KV_BUDGET
    assert lpt_heads_per_group(2048, 128) == 32 and lpt_heads_per_group(8192, 128) == 8


_WINDOWS = st.one_of(st.none(), st.integers(0, 40))


@given(
    sq=st.integers(1, 60), sk=st.integers(1, 60), bm=st.sampled_from([16, 32]), bn=st.sampled_from([16, 32]),
    causal=st.booleans(), align=st.sampled_from(["top_left", "bottom_right"]), left=_WINDOWS, right=_WINDOWS,
)
def test_windowed_visits_cover_exactly_the_blocks_with_an_allowed_pair(sq, sk, bm, bn, causal, align, left, right):
    if causal:
        right = None if right is None else 0
    kw = dict(causal=causal, align=align, window_left=left, window_right=right)
    for m in range(-(-sq // bm)):
        r = block_range(m, sq, sk, block_m=bm, block_n=bn, **kw)
        rows = range(m * bm, min((m + 1) * bm, sq))
        need = {j // bn for i in rows for j in range(sk) if allowed(i, j, sq, sk, **kw)}
        visited = set(r.order)
        assert need <= visited
        # Tight at both ends: the first and last visited blocks hold an allowed pair.
        if need:
            assert min(visited) == min(need) and max(visited) == max(need)
        # Unmasked blocks need no test: every pair of the tile is allowed.
        for n in r.unmasked:
            assert all(allowed(i, j, sq, sk, **kw) for i in rows for j in range(n * bn, (n + 1) * bn))
        if left is not None:
            assert list(r.unmasked) == []


@given(
    sq=st.integers(1, 60), sk=st.integers(1, 60), bm=st.sampled_from([16, 32]), bn=st.sampled_from([16, 32]),
    causal=st.booleans(), align=st.sampled_from(["top_left", "bottom_right"]), left=_WINDOWS, right=_WINDOWS,
)
def test_windowed_m_block_range_covers_the_q_blocks_seeing_a_key_block(sq, sk, bm, bn, causal, align, left, right):
    from cute_kernels.attention.block_info import m_block_range
    from cute_kernels.attention.mask import window_offsets

    if causal:
        right = None if right is None else 0
    kw = dict(causal=causal, align=align, window_left=left, window_right=right)
    upper, lower = window_offsets(sq, sk, **kw)
    for n in range(-(-sk // bn)):
        lo, hi = m_block_range(n, sq, upper or 0, block_m=bm, block_n=bn, causal=upper is not None,
                               offset_lo=lower or 0, local=lower is not None)
        seeing = [m for m in range(-(-sq // bm))
                  if any(allowed(i, j, sq, sk, **kw)
                         for i in range(m * bm, min((m + 1) * bm, sq)) for j in range(n * bn, min((n + 1) * bn, sk)))]
        assert set(seeing) <= set(range(lo, hi))
        if seeing:
            assert seeing[0] == lo
            if (n + 1) * bn <= sk and (hi - 1) * bm < sq:
                # tight at the end too when no key of the block lies past the sequence end
                assert seeing[-1] == hi - 1


@given(
    sq=st.integers(1, 90), sk=st.integers(1, 90), bm=st.sampled_from([16, 32]), bn=st.sampled_from([16, 32]),
    offset=st.integers(-40, 40), width=st.integers(0, 60), causal=st.booleans(), local=st.booleans(),
    rows_masked=st.booleans(),
)
def test_tile_unmasked_is_exactly_the_tiles_whose_every_pair_is_allowed(sq, sk, bm, bn, offset, width, causal,
                                                                         local, rows_masked):
    """`tile_unmasked` against every (i, j) of every tile: the key exists, j <= i + offset with
    `causal`, j >= i + offset - width with `local`; every row exists with `rows_masked` (else
    rows past sq count as the rest of the tile's rows do)."""
    from cute_kernels.attention.block_info import tile_unmasked

    offset_lo = offset - width

    def ok(i, j):
        return (j < sk and (not causal or j <= i + offset) and (not local or j >= i + offset_lo)
                and (not rows_masked or i < sq))

    for m in range(-(-sq // bm)):
        for n in range(-(-sk // bn)):
            want = all(ok(i, j) for i in range(m * bm, (m + 1) * bm) for j in range(n * bn, (n + 1) * bn))
            got = tile_unmasked(m, n, sq, sk, offset, offset_lo, block_m=bm, block_n=bn, causal=causal,
                                local=local, rows_masked=rows_masked)
            assert got == want, (m, n)
