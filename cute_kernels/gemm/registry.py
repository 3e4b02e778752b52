"""`KERNELS`: the GEMM ladder, rung name -> rung object, in ladder order (slowest idea first),
then the specialists (rungs for one class of shapes, which "auto" asks before the ladder).

The table below is static: each rung is named by "module:attribute", and the module is
imported only when the rung is looked up, so listing the ladder needs neither the CuTe DSL
nor a GPU. A rung whose module does not exist (yet) is simply absent. The mapping is the
registry mechanism all families share (`runtime.kernel_registry.LadderRegistry`).

A rung object has `name`, `dtypes` (the input dtypes it takes), `supports(a, b, out) -> str |
None` (None when it can run this problem on this device, else the reason) and
`__call__(a, b, out, *, alpha, beta, c)`, which writes `out` on torch's current stream. The
operands are the 3-D views `matmul` builds: a (L, M, K), b (L, K, N), out (L, M, N), each with
one of its last two strides equal to 1. Rungs may also carry `min_capability` ((major, minor)
of the oldest GPU they run on), which dispatch checks before asking `supports`.
"""

from __future__ import annotations

from cute_kernels.runtime.kernel_registry import LadderRegistry

__all__ = ["LADDER", "KernelRegistry", "KERNELS"]

# Ladder order, with the attribute each module exports its rung object as.
LADDER: tuple[tuple[str, str], ...] = (
    ("naive", "cute_kernels.gemm.naive:RUNG"),
    ("simt_smem", "cute_kernels.gemm.simt_smem:RUNG"),
    ("sm70_mma", "cute_kernels.gemm.sm70_mma:RUNG"),
    ("sm80_mma", "cute_kernels.gemm.sm80_mma:RUNG"),
    ("sm90_tma_wgmma", "cute_kernels.gemm.sm90_tma_wgmma:rung"),
    ("sm90_warp_specialized", "cute_kernels.gemm.sm90_warp_specialized:rung"),
    ("sm90_persistent", "cute_kernels.gemm.sm90_persistent:rung"),
    # Specialists: rungs for one class of shapes, above the ladder's top so that "auto" asks
    # them first; each declines (`supports`) every problem outside its class.
    ("gemv", "cute_kernels.gemm.gemv:RUNG"),  # a side of at most 16: GEMV, decode batches, small heads
)


class KernelRegistry(LadderRegistry):
    """The GEMM family's `runtime.kernel_registry.LadderRegistry` (errors say "GEMM kernel")."""

    family = "GEMM"


KERNELS = KernelRegistry(LADDER)
