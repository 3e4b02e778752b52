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
# LM heads (2026-12-05, H100).
PATHS: dict[str, str] = {
    "compile_ahead": "kernels predicted to be needed next (a call's backward; a patched model's layers) compiled "
                     "in background worker processes while the program runs (`runtime.compile_ahead`)",
    "linear_ce_wide_chunk": "fused linear + cross-entropy takes tokens in chunks of up to 256 MiB of logits "
                            "(`fused.linear_ce.default_chunk`) instead of Liger's x-sized chunks",
    "sm90_bwd_head_dims": "the Hopper attention backward at head dims other than 64, 96 and 128 (any multiple of "
                          "16 up to 256; above 128 its two consumer warpgroups share 64 keys and split the head "
                          "dim, `FlashSm90BwdConfig.head_split`) instead of handing the backward to sm80_flash",
    "sm90_bwd_varlen": "the Hopper attention backward of packed sequences (`attention.sm90_flash_bwd."
                       "varlen_backward`: ragged tensor maps, rows past a sequence masked) instead of sm80_flash's",
    "sm90_bwd_deterministic": "the Hopper attention backward with deterministic=True: dQ added in key-block "
                              "order under a counter per Q block (`FlashSm90BwdConfig.deterministic`) instead of "
                              "handing the call to sm80_flash's backward",
    "sm90_bwd_wide_q": "the Hopper attention backward takes 128 Q rows a step at head dims up to 64 "
                       "(`FlashSm90BwdConfig.block_m`, FlashAttention-3's tile there) instead of 64",
    "sm90_bwd_dq_writer": "the Hopper attention backward's dQ staged in shared memory and added by a producer "
                          "warp with one bulk reduction per row (`FlashSm90BwdConfig.dq_writer`) instead of the "
                          "consumers' red.global per value pair",
    "norm_backward_prefetch": "the RMSNorm / LayerNorm backward loads its next row block while it computes "
                              "the current one (`fused.norms`, `NormConfig.prefetch`)",
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
