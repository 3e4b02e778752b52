"""Warp-specialization roles: which warpgroup produces (TMA) and which consume (wgmma).

Warpgroup 0 is the producer: one elected warp issues TMA, and the group gives registers back
with `setmaxnreg.dec` so the consumer warpgroups can grow theirs with `setmaxnreg.inc`
(the register file is 64K 32-bit registers per SM: budgets must satisfy
128 * (producer + consumers * consumer_regs) <= 65536 and be multiples of 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass.cute as cute

THREADS_PER_WARPGROUP = 128


@dataclass(frozen=True)
class WarpRoles:
    """Producer warpgroup 0 plus `consumer_warpgroups` MMA warpgroups, with setmaxnreg budgets."""

    consumer_warpgroups: int
    producer_regs: int = 40
    consumer_regs: int = 232

    def validate(self) -> None:
        if self.consumer_warpgroups not in (1, 2):
            raise ValueError(f"consumer_warpgroups must be 1 or 2, got {self.consumer_warpgroups}")
        for r in (self.producer_regs, self.consumer_regs):
            if r % 8 or not 24 <= r <= 256:
                raise ValueError(f"setmaxnreg counts are multiples of 8 in [24, 256], got {r}")
        total = THREADS_PER_WARPGROUP * (self.producer_regs + self.consumer_warpgroups * self.consumer_regs)
        if total > 65536:
            raise ValueError(f"register budget {total} exceeds the 65536 registers of an SM")

    @property
    def threads(self) -> int:
        return THREADS_PER_WARPGROUP * (1 + self.consumer_warpgroups)

    @property
    def consumer_threads(self) -> int:
        return THREADS_PER_WARPGROUP * self.consumer_warpgroups

    @property
    def consumer_warps(self) -> int:
        return 4 * self.consumer_warpgroups

    def become_producer(self) -> None:
        cute.arch.warpgroup_reg_dealloc(self.producer_regs)

    def become_consumer(self) -> None:
        cute.arch.warpgroup_reg_alloc(self.consumer_regs)
