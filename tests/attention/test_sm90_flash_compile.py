"""sm90_flash without a GPU: every registered variant compiles for sm_90a with the Hopper
instructions its design relies on (HGMMA, TMA loads and the TMA store of O, setmaxnreg) and no
local-memory spills."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.compile


def _variants():
    pytest.importorskip("cutlass")
    from cute_kernels.attention.sm90_flash import VARIANT_CONFIGS

    return list(VARIANT_CONFIGS)


@pytest.mark.parametrize("config", ["d64_float16_causal", "d128_bfloat16_causal", "d256_bfloat16_causal",
                                    "d128_bfloat16_local", "d256_bfloat16_causal_local"])
def test_variant_uses_wgmma_tma_setmaxnreg_without_spills(config):
    from cute_kernels.runtime import check_variant, compile_variant, get_variant

    import cute_kernels.attention.sm90_flash  # noqa: F401,F811  (registers the variant)

    report = compile_variant("attention.sm90_flash", config)
    assert check_variant(report, get_variant("attention.sm90_flash")) == []
    assert report.spill_store_bytes == 0 and report.local_memory == 0
    (kernel,) = report.kernels
    ops = kernel.sass.opcodes
    count = lambda prefix: sum(v for op, v in ops.items() if op.startswith(prefix))  # noqa: E731
    d = int(config.split("_")[0][1:])
    assert count("HGMMA.64x") > 0 and count("UTMALDG") >= 3 and count("UTMASTG") >= 1
    assert count("USETMAXREG") == 2  # the producer gives registers back, the consumers take them
    assert count("STSM") > 0  # O is staged with stmatrix
    # Q plus two slots of K and of V (and the barriers) in dynamic shared memory.
    from cute_kernels.attention.sm90_layouts import config_for

    c = config_for(d, "bfloat16", True)
    assert kernel.dynamic_smem >= 2 * d * (128 + 4 * c.block_n)
