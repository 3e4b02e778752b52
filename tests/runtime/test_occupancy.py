"""The sm_90 occupancy calculator against hand-computed cases."""

import pytest

from cute_kernels.runtime.occupancy import SM90, occupancy


@pytest.mark.parametrize(
    "threads, regs, smem, blocks, limiter",
    [
        # 4 warps: 64 // 4 = 16 blocks by warps; 10 regs -> 16 -> 512/warp -> 128 warps -> 32 blocks.
        (128, 10, 0, 16, "warps"),
        # 128 regs -> 4096/warp -> 16 warps -> 2 blocks of 8 warps; smem (200 KiB + 1 KiB) -> 1 block.
        (256, 128, 200 * 1024, 1, "shared memory"),
        # 255 regs round to 256 -> 8192/warp -> 8 warps -> 2 blocks of 4 warps.
        (128, 255, 0, 2, "registers"),
        # 1024 threads, 64 regs -> 2048/warp -> 32 warps -> 1 block; warps also allow 2.
        (1024, 64, 0, 1, "registers"),
        # 3 warps, 40 regs -> 1280/warp -> 51 warps -> 17 blocks; warps allow 21.
        (96, 40, 0, 17, "registers"),
        # 100 B smem rounds to 128 + 1 KiB reserved = 1152 -> 202 blocks; 1 warp/block: blocks cap 32.
        (32, 8, 100, 32, "blocks"),
        # The largest block allocation: 227 KiB + 1 KiB reserved = the whole 228 KiB.
        (128, 32, 227 * 1024, 1, "shared memory"),
        # One byte more cannot launch.
        (128, 32, 227 * 1024 + 1, 0, "shared memory"),
        # 256 registers exceed the per-thread maximum.
        (128, 256, 0, 0, "registers"),
        # Tie: 128 regs -> 16 warps -> 4 blocks; 55 KiB + 1 KiB = 56 KiB -> 228 // 56 = 4 blocks.
        (128, 128, 55 * 1024, 4, "registers & shared memory"),
    ],
)
def test_hand_computed(threads, regs, smem, blocks, limiter):
    occ = occupancy(threads, regs, smem)
    assert occ.blocks_per_sm == blocks
    assert occ.limiter == limiter
    assert occ.warps_per_sm == blocks * -(-threads // 32)
    assert min(occ.limits_by.values()) == blocks


def test_thread_limit_and_fraction():
    occ = occupancy(512, 32, 0)
    # 16 warps per block: 64 // 16 = 4 blocks by warps, 2048 // 512 = 4 by threads; regs allow 4.
    assert occ.blocks_per_sm == 4
    assert occ.occupancy == 1.0
    assert "4 block(s)/SM" in occ.describe()


@pytest.mark.parametrize("threads, regs, smem", [(0, 32, 0), (1025, 32, 0), (128, -1, 0), (128, 32, -5)])
def test_rejects_impossible_inputs(threads, regs, smem):
    with pytest.raises(ValueError):
        occupancy(threads, regs, smem)


def test_limits_are_hopper():
    assert SM90.registers_per_sm == 65536
    assert SM90.smem_per_sm == 228 * 1024 and SM90.max_smem_per_block == 227 * 1024
    assert (SM90.max_warps_per_sm, SM90.max_blocks_per_sm, SM90.max_threads_per_sm) == (64, 32, 2048)
