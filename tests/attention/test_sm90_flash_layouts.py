"""sm90_flash on the CPU: the register re-views derived from the wgmma atoms, and the tile
arithmetic of its configs (pure Python; no DSL, no GPU)."""

from __future__ import annotations

import pytest

from cute_kernels.attention.sm90_layouts import (HEAD_DIMS, SMEM_LIMIT, FlashSm90Config,
                                                 accumulator_value_layout, config_for, derive_p_as_a,
                                                 mn_view_layout, num_m_blocks, p_as_a_layout)
from cute_kernels.layouts import Layout
from cute_kernels.layouts.atoms import atom

N_VALUES = (16, 64, 80, 96, 128, 176, 256)


def _offset_mn(offset: int) -> tuple[int, int]:
    """(row, column) of an `m + 64 n` offset in a 64-row tile."""
    return offset % 64, offset // 64


@pytest.mark.parametrize("n", N_VALUES)
def test_p_as_a_puts_every_a_value_on_the_accumulator_value_of_the_same_element(n):
    """For every thread t, A value v of k step kb (atom SM90_64x{n}x16 RS, A operand) must be the
    accumulator value g(v, kb) (atom SM90_64x{n}x16 SS, C) at column offset 16 kb: the S tile
    converted to 16 bits is exactly P as wgmma's register A, with no data movement."""
    c_tv = atom(f"SM90_64x{n}x16_F32BF16BF16_SS").c_layout
    a_tv = atom(f"SM90_64x{n}x16_F32BF16BF16_RS").a_layout
    g = derive_p_as_a(n)
    assert g.shape == ((2, 2, 2), n // 16)
    seen = set()
    for t in range(128):
        for kb in range(n // 16):
            for v in range(8):
                v_crd = (v % 2, (v // 2) % 2, v // 4)
                acc_value = g((v_crd, kb))
                a_row, a_col = _offset_mn(a_tv((t, v_crd)))
                c_row, c_col = _offset_mn(c_tv((t, acc_value)))
                assert (c_row, c_col) == (a_row, a_col + 16 * kb), (t, kb, v)
                seen.add((t, acc_value))
    assert len(seen) == 128 * n // 2  # every accumulator value is used exactly once


def test_p_as_a_is_the_k_split_of_the_third_value_mode():
    """The derivation's closed form (the split of the N/8 mode into (2, N/16)), and its DSL form
    with the size-1 MMA_M mode inserted."""
    assert derive_p_as_a(128) == Layout(((2, 2, 2), 8), ((1, 2, 4), 8))
    assert p_as_a_layout(64) == Layout(((2, 2, 2), 1, 4), ((1, 2, 4), 0, 8))
    with pytest.raises(ValueError, match="multiple of 16"):
        derive_p_as_a(72)  # P as A needs whole k16 steps; the accumulator itself takes N = 72
    assert accumulator_value_layout(72).shape == (2, 2, 9)
    with pytest.raises(ValueError, match="multiple of 8"):
        accumulator_value_layout(36)


@pytest.mark.parametrize("n", (8, 64, 128, 256))
def test_mn_view_orders_rows_and_columns_of_the_accumulator(n):
    """mn_view_layout maps (r, c) to the accumulator value holding row 8 r (+ the thread's row)
    and this thread's c-th column, in increasing order."""
    values = atom(f"SM90_64x{n}x16_F32BF16BF16_SS").c_layout[1]
    view = mn_view_layout(n)
    for r in range(2):
        cols = [_offset_mn(values(view((r, c))))[1] for c in range(n // 4)]
        rows = {_offset_mn(values(view((r, c))))[0] for c in range(n // 4)}
        assert rows == {8 * r}
        assert cols == sorted(cols) and len(set(cols)) == n // 4
        assert cols == [8 * (c // 2) + c % 2 for c in range(n // 4)]


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_tuned_configs_fit_shared_memory_and_registers(d):
    for causal in (False, True):
        c = config_for(d, "bfloat16", causal)
        wgs = c.consumer_warpgroups
        assert c.smem_bytes <= SMEM_LIMIT
        assert c.accumulator_regs <= c.consumer_regs - 32
        assert 128 * (c.producer_regs + wgs * c.consumer_regs) <= 65536
        # three 64-row consumers (192 x 128, FA3's tile) up to D = 64, two (128 rows) above
        assert wgs == (3 if d <= 64 else 2)
        assert c.block_m == 64 * wgs and c.threads == 128 * (wgs + 1)
        assert c.tx_bytes_kv == 2 * c.block_n * d and c.tx_bytes_q == 2 * c.block_m * d


def test_config_validation_names_the_problem():
    with pytest.raises(ValueError, match="head_dim must be a multiple of 16"):
        FlashSm90Config(head_dim=72).validate()
    with pytest.raises(ValueError, match="dtype"):
        FlashSm90Config(dtype="float32").validate()
    with pytest.raises(ValueError, match="block_n"):
        FlashSm90Config(block_n=40).validate()
    with pytest.raises(ValueError, match="shared memory"):
        FlashSm90Config(head_dim=256, block_n=64, stages=4).validate()
    with pytest.raises(ValueError, match="exceed"):
        FlashSm90Config(producer_regs=40, consumer_regs=248).validate()
    with pytest.raises(ValueError, match="registers per consumer thread"):
        FlashSm90Config(head_dim=256, block_n=256, stages=1).validate()
    with pytest.raises(ValueError, match="pingpong"):
        FlashSm90Config(pingpong=1).validate()
    for name in ("k_lead", "lpt", "local", "rescale_early"):
        with pytest.raises(ValueError, match=name):
            FlashSm90Config(**{name: "yes"}).validate()
    with pytest.raises(ValueError, match="consumer_warpgroups must be 2 or 3"):
        FlashSm90Config(consumer_warpgroups=4).validate()
    with pytest.raises(ValueError, match="rescale_threshold"):
        FlashSm90Config(rescale_threshold=16.0).validate()  # P up to 2^16 overflows fp16
    with pytest.raises(ValueError, match="rescale_threshold"):
        FlashSm90Config(rescale_threshold=-1.0).validate()
    # three consumers need the budgets cut: 24 + 3 x 240 registers do not fit an SM
    with pytest.raises(ValueError, match="3 x 240 per thread exceed"):
        FlashSm90Config(consumer_warpgroups=3).validate()


def test_three_consumer_warpgroups_make_a_192_row_tile():
    c = FlashSm90Config(head_dim=64, consumer_warpgroups=3, producer_regs=32, consumer_regs=160, block_n=80).validate()
    assert c.block_m == 192 and c.threads == 512 and c.tx_bytes_q == 2 * 192 * 64
    assert c.smem_bytes == 2 * 64 * (192 + 4 * 80) + 8 * 10 + 1024


def test_tuned_configs_lead_with_k_and_launch_causal_work_longest_first():
    for d in HEAD_DIMS:
        for causal in (False, True):
            c = config_for(d, "bfloat16", causal)
            assert c.k_lead and c.lpt == causal and not c.local
            # a left window bound makes every Q block's work about the window's width: plain grid
            w = config_for(d, "bfloat16", causal, local=True)
            assert w.local and w.causal == causal and not w.lpt
    assert config_for(256, "bfloat16", False).block_n == 80


def test_grid_tiles():
    assert [num_m_blocks(s) for s in (1, 127, 128, 129, 2048, 8192)] == [1, 1, 1, 2, 16, 64]


def test_short_q_sequences_take_128_row_tiles_where_192_would_pad_more():
    from cute_kernels.attention.sm90_layouts import short_rows

    # ViT-B/16 (197 rows: 384 padded at 192 against 256 at 128) and ViT-L/16 at 384 px (577)
    assert short_rows(197, 64) and short_rows(577, 64) and short_rows(100, 32)
    # EVA-02's 257 rows pad to 384 either way; long sequences keep the faster 192-row tile
    assert not short_rows(257, 64) and not short_rows(1024, 64) and not short_rows(4096, 64)
    assert not short_rows(192, 64) and not short_rows(197, 128) and not short_rows(0, 64)
    short = config_for(64, "bfloat16", False, short=True)
    assert short.block_m == 128 and short.consumer_warpgroups == 2 and short.block_n == 128
    assert config_for(64, "bfloat16", False).block_m == 192
    assert config_for(128, "bfloat16", False, short=True) == config_for(128, "bfloat16", False)


def test_the_rung_picks_the_short_tile_from_the_problem_q_length():
    import torch

    from cute_kernels.attention.api import AttentionProblem
    from cute_kernels.attention.sm90_flash import _config_for_problem

    def problem(sq):
        return AttentionProblem(2, 3, 3, sq, 300, 64, 64, torch.bfloat16, None, 0.125)

    assert _config_for_problem(problem(197)).block_m == 128
    assert _config_for_problem(problem(257)).block_m == 192
    assert _config_for_problem(problem(197), varlen=True).block_m == 192
