"""`KERNELS`: the attention ladder, rung name -> rung object, in ladder order.

The table is static ("module:attribute" per rung); a module is imported only when its rung is
looked up, and a rung whose module does not exist (yet) is absent: the registry mechanism all
families share (`runtime.kernel_registry.LadderRegistry`).

A rung object has `name`, `dtypes`, `min_capability` ((major, minor) or None),
`supports(q, k, v, problem) -> str | None` (None when it can run this `api.AttentionProblem`,
else the reason) and `__call__(q, k, v, out, lse, problem)`, which writes out (B, Hq, Sq, Dv)
and lse (B, Hq, Sq), fp32 natural-log log-sum-exp of the scaled scores, on torch's current
stream. q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv) have unit head-dim stride.
Optional launches: `varlen(...)` (packed sequences, `varlen.attention_varlen_forward`) and, for
the `decode` rung, `supports_paged(problem)` / `paged(...)` (`paged.paged_decode`).
Score features (`features`): a rung lists those its forward implements in `features` and
declines the others in `supports`; a problem with sinks reaches `__call__` / `varlen` with a
`sinks=` keyword (and `seqused_k=` for varlen), softcap through the problem.
"""

from __future__ import annotations

from cute_kernels.runtime.kernel_registry import LadderRegistry

__all__ = ["LADDER", "AttentionRegistry", "KERNELS"]

LADDER: tuple[tuple[str, str], ...] = (
    ("sm80_flash", "cute_kernels.attention.sm80_flash:RUNG"),
    ("sm90_flash", "cute_kernels.attention.sm90_flash:RUNG"),
    ("decode", "cute_kernels.attention.decode:RUNG"),
)


class AttentionRegistry(LadderRegistry):
    """The attention family's `runtime.kernel_registry.LadderRegistry`."""

    family = "attention"


KERNELS = AttentionRegistry(LADDER)
