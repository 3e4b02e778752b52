"""GEMM: `matmul` (torch.matmul semantics) over a ladder of kernels, one idea per rung.

`KERNELS` lists the rungs in ladder order (naive, simt_smem, sm70_mma, sm80_mma,
sm90_tma_wgmma, sm90_warp_specialized, sm90_persistent; those not written yet are absent);
`matmul(..., kernel="auto")` runs the best one that supports the problem (see `dispatch`).
"""

from __future__ import annotations

from .api import matmul
from .registry import KERNELS

__all__ = ["matmul", "KERNELS"]
