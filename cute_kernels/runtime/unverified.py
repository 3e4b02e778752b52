"""Paths built without a GPU, off until an H200 has run their tests.

A path here is tested on CPU (a kernel path also compiles for sm_90a in CI: no spills, the
instructions it must hold) and has GPU tests that have not yet run. A silent wrong answer is
the worst bug this project can have, so the default routes keep away from it until those tests
pass on the device; then the path leaves this list and becomes the default.

    enabled("a_path") -> bool
    CUTE_KERNELS_UNVERIFIED=a_path,another   (or "all") turns paths on

The GPU tests of a path turn it on themselves (`allowing` for a block of code: it also forgets
the stored launch plans, which may have been made with the other setting), whatever the
environment says.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["PATHS", "ENABLED", "enabled", "allowing"]

# name -> what it is. Paths built without a GPU leave this list (and become defaults) the day their
# GPU tests pass and they measure faster: split-K summed in the GEMM kernel and the Hopper
# attention backward at head dim 96 (2026-12-05), the op bodies' plan replay,
# generate's decode steps from a CUDA graph, the lean Autograd kernel, the compiled backward's
# one op a layer and the norms' dense forward (2026-12-05), the GEMV's four-warp CTAs on the
# LM heads (2026-12-05, H100), the Hopper attention backward at every head dim, its
# deterministic dQ and its 128-row Q blocks up to D = 64 (2026-12-06, H100), its backward of
# packed sequences (2026-12-06, H200: 2-2.5x sm80_flash's), the norms' prefetching backward
# (2026-12-06, H100: RMSNorm backward 1.02x quack, 1.12x torch.compile).
PATHS: dict[str, str] = {
    "compile_ahead": "kernels predicted to be needed next (a call's backward; a patched model's layers) compiled "
                     "in background worker processes while the program runs (`runtime.compile_ahead`)",
    "linear_ce_wide_chunk": "fused linear + cross-entropy takes tokens in chunks of up to 256 MiB of logits "
                            "(`fused.linear_ce.default_chunk`) instead of Liger's x-sized chunks",
    "varlen_backward_plan": "a warm `attention_varlen_backward` call replays a plan stored under its signature "
                            "(the rung's `varlen_backward_plan`: its decisions made once), not the checked path",
}


def _from_env() -> set[str]:
    raw = os.environ.get("CUTE_KERNELS_UNVERIFIED", "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    if "all" in names:
        return set(PATHS)
    unknown = names - set(PATHS)
    if unknown:
        raise ValueError(f"CUTE_KERNELS_UNVERIFIED names unknown paths {sorted(unknown)}; known: {sorted(PATHS)}")
    return names


ENABLED: set[str] = _from_env()


def enabled(name: str) -> bool:
    """Whether the unverified path `name` (one of `PATHS`) may run."""
    if name not in PATHS:
        raise KeyError(f"unknown unverified path {name!r}; known: {sorted(PATHS)}")
    return name in ENABLED


@contextlib.contextmanager
def allowing(*names: str, on: bool = True):
    """Within the block, the paths `names` are on (`on=False`: off), then as they were."""
    for name in names:
        enabled(name)  # a known name
    from .plan_cache import invalidate

    saved = set(ENABLED)
    if on:
        ENABLED.update(names)
    else:
        ENABLED.difference_update(names)
    invalidate()  # a stored plan may have been made with the other setting
    try:
        yield
    finally:
        ENABLED.clear()
        ENABLED.update(saved)
        invalidate()
