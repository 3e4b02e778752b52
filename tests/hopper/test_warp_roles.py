import pytest

pytest.importorskip("cutlass")

from cute_kernels.hopper.warp_roles import WarpRoles


def test_default_budgets_fit_the_register_file():
    r = WarpRoles(consumer_warpgroups=2)
    r.validate()
    assert r.threads == 384 and r.consumer_threads == 256 and r.consumer_warps == 8
    assert 128 * (r.producer_regs + 2 * r.consumer_regs) <= 65536


@pytest.mark.parametrize("kw,msg", [
    ({"consumer_warpgroups": 3}, "consumer_warpgroups"),
    ({"consumer_warpgroups": 2, "consumer_regs": 236}, "multiples of 8"),
    ({"consumer_warpgroups": 2, "consumer_regs": 256, "producer_regs": 56}, "exceeds"),
])
def test_invalid_budgets_raise(kw, msg):
    with pytest.raises(ValueError, match=msg):
        WarpRoles(**kw).validate()
