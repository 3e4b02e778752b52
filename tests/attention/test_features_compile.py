"""The score features (soft cap, sinks, seqused_k) in the kernels, without a GPU: one variant per
kernel compiles for sm_90a with no local-memory spills and with the instructions the feature
adds (the soft cap's tanh is one MUFU.EX2 and one MUFU.RCP per score element; the sm90
backward recovers it with one MUFU.LG2 per element), and the Hopper kernels keep their HGMMA."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.compile


def _report(name: str, config: str):
    pytest.importorskip("cutlass")
    import cute_kernels.attention.sm80_flash  # noqa: F401  (registers the variants)
    import cute_kernels.attention.sm80_flash_bwd_launch  # noqa: F401
    import cute_kernels.attention.sm90_flash  # noqa: F401
    import cute_kernels.attention.sm90_flash_bwd  # noqa: F401
    from cute_kernels.runtime import check_variant, compile_variant, get_variant

    report = compile_variant(name, config)
    assert check_variant(report, get_variant(name)) == []
    assert report.spill_store_bytes == 0 and report.local_memory == 0
    ops: dict = {}
    for kernel in report.kernels:
        for op, n in kernel.sass.opcodes.items():
            ops[op] = ops.get(op, 0) + n
    return lambda prefix: sum(n for op, n in ops.items() if op.startswith(prefix))


def test_sm90_forward_softcap_and_sinks():
    count = _report("attention.sm90_flash", "d128_bfloat16_causal_softcap_sinks")
    # A consumer thread holds 64 * 128 / 128 = 64 scores of a block, in two copies of the code
    # (the first block and the loop body): a tanh (EX2, RCP) and an exponential (EX2) each.
    assert count("MUFU.RCP") >= 2 * 64 and count("MUFU.EX2") >= 4 * 64
    assert count("HGMMA.64x") > 0 and count("UTMALDG") >= 3 and count("USETMAXREG") == 2


def test_sm90_backward_softcap():
    count = _report("attention.sm90_flash_bwd", "d128_bfloat16_causal_softcap")
    # S^T (128 keys x 64 queries over 256 threads): 32 values per thread, each with tanh (EX2,
    # RCP), P (EX2) and the recovered tanh (LG2).
    assert count("MUFU.LG2") >= 32 and count("MUFU.RCP") >= 32 and count("MUFU.EX2") >= 64
    assert count("HGMMA.64x") > 0 and count("REDG.E.ADD.F32x2") > 0


def test_sm80_forward_softcap_sinks_and_seqused():
    count = _report("attention.sm80_flash_varlen", "d128_bfloat16_causal_softcap_sinks_seqused")
    # 64 x 64 blocks over 4 warps: 32 scores per thread, in the masked and the unmasked loop.
    assert count("MUFU.RCP") >= 2 * 32 and count("HMMA") > 0


def test_sm80_backward_softcap():
    count = _report("attention.sm80_flash_bwd_dq", "d128_bfloat16_causal_softcap")
    assert count("MUFU.RCP") >= 32 and count("HMMA") > 0
