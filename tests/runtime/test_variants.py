"""Every registered kernel variant compiles for sm_90a and its SASS contains the instructions
its design relies on (`requires`) and none it must avoid (`forbids`, by default local-memory
spills)."""

import pytest

pytestmark = pytest.mark.compile


def _cases():
    try:
        from cute_kernels.runtime import list_variants
        from cute_kernels.runtime.scale import register_variant_for_tests
    except ImportError as err:  # the DSL is absent: conftest skips compile tests
        return [pytest.param(None, None, id=f"unavailable: {err}")]
    register_variant_for_tests()
    try:
        variants = list_variants()
    except ImportError as err:
        # A kernel module that does not import fails here, visibly, not by silently vanishing.
        return [pytest.param(None, str(err), id="kernel-module-import-error")]
    return [pytest.param(v.name, c, id=f"{v.name}[{c}]") for v in variants for c in v.configs]


@pytest.mark.parametrize("name, config", _cases())
def test_variant_sass(name, config):
    if name is None:
        pytest.fail(config or "no variants")
    from cute_kernels.runtime import check_variant, compile_variant, get_variant

    report = compile_variant(name, config, arch="sm_90a")
    assert report.kernels, f"{name}[{config}] compiled to no kernel"
    problems = check_variant(report, get_variant(name))
    assert not problems, f"{name}[{config}]: " + "; ".join(problems) + "\n" + report.summary()
    occ = report.occupancy
    assert occ is None or occ.blocks_per_sm >= 1, f"{name}[{config}] cannot launch: {occ.describe()}"
