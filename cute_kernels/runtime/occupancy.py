"""How many blocks of a kernel fit on one SM, and which resource limits it.

The limits are those of compute capability 9.0 (H100 and H200), from the CUDA occupancy
rules: registers are allocated per warp in units of 256 (a thread's count first rounded up
to a multiple of 8), shared memory per block in units of 128 bytes plus 1 KB the system
reserves per block, and an SM holds at most 32 blocks, 64 warps and 2048 threads.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SmLimits:
    """Per-SM resources of one architecture."""

    name: str
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255
    register_alloc_unit: int = 256  # registers, per warp
    register_thread_granularity: int = 8
    smem_per_sm: int = 228 * 1024
    max_smem_per_block: int = 227 * 1024
    smem_reserved_per_block: int = 1024
    smem_alloc_unit: int = 128
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    max_threads_per_sm: int = 2048
    max_threads_per_block: int = 1024
    warp_size: int = 32


SM90 = SmLimits(name="sm_90 (H100/H200)")


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM and what bounds them.

    `blocks_per_sm` is the minimum of `limits_by`'s values; `limiter` names the resources
    attaining it ("registers", "shared memory", "warps", "blocks"; several joined by
    " & " on a tie). `blocks_per_sm == 0` means the kernel cannot launch at all.
    """

    blocks_per_sm: int
    warps_per_sm: int
    threads_per_block: int
    limiter: str
    limits_by: dict
    registers_per_thread: int
    smem_per_block: int

    @property
    def occupancy(self) -> float:
        """Resident warps over the SM's maximum (64 on sm_90)."""
        return self.warps_per_sm / SM90.max_warps_per_sm

    def describe(self) -> str:
        by = ", ".join(f"{k} {v}" for k, v in self.limits_by.items())
        return (
            f"{self.blocks_per_sm} block(s)/SM, {self.warps_per_sm} warps/SM "
            f"({self.occupancy:.0%} of {SM90.max_warps_per_sm}); limited by {self.limiter} [{by}]"
        )


def occupancy(
    threads_per_block: int, registers_per_thread: int, smem_per_block: int, limits: SmLimits = SM90
) -> Occupancy:
    """Blocks of (`threads_per_block`, `registers_per_thread`, `smem_per_block` bytes of
    static plus dynamic shared memory) resident on one SM of `limits`.

    Raises ValueError for inputs no kernel can have (non-positive threads, more than the
    per-block thread limit, negative registers or shared memory).
    """
    if not 1 <= threads_per_block <= limits.max_threads_per_block:
        raise ValueError(f"threads_per_block must be in [1, {limits.max_threads_per_block}], got {threads_per_block}")
    if registers_per_thread < 0:
        raise ValueError(f"registers_per_thread must be non-negative, got {registers_per_thread}")
    if smem_per_block < 0:
        raise ValueError(f"smem_per_block must be non-negative, got {smem_per_block}")

    warps = -(-threads_per_block // limits.warp_size)
    by: dict[str, int] = {
        "blocks": limits.max_blocks_per_sm,
        "warps": min(limits.max_warps_per_sm // warps, limits.max_threads_per_sm // (warps * limits.warp_size)),
    }
    if registers_per_thread > limits.max_registers_per_thread:
        by["registers"] = 0
    elif registers_per_thread > 0:
        regs_per_warp = _round_up(
            _round_up(registers_per_thread, limits.register_thread_granularity) * limits.warp_size,
            limits.register_alloc_unit,
        )
        # Registers are handed out per warp: a block needs all its warps' allocations.
        warps_fitting = limits.registers_per_sm // regs_per_warp
        by["registers"] = warps_fitting // warps
    else:
        by["registers"] = limits.max_blocks_per_sm
    if smem_per_block > limits.max_smem_per_block:
        by["shared memory"] = 0
    else:
        per_block = _round_up(smem_per_block, limits.smem_alloc_unit) + limits.smem_reserved_per_block
        by["shared memory"] = limits.smem_per_sm // per_block
    blocks = min(by.values())
    limiter = " & ".join(name for name, v in by.items() if v == blocks)
    return Occupancy(
        blocks_per_sm=blocks,
        warps_per_sm=blocks * warps,
        threads_per_block=threads_per_block,
        limiter=limiter,
        limits_by=by,
        registers_per_thread=registers_per_thread,
        smem_per_block=smem_per_block,
    )
