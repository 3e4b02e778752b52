"""`runtime.kernel_registry.LadderRegistry`, the registry every kernel family's `KERNELS` is: table
order, absent modules, lookups that fail loudly, what is remembered and `clear()`."""

from __future__ import annotations

import pytest

from cute_kernels.runtime import kernel_registry
from cute_kernels.runtime.kernel_registry import LadderRegistry

TABLE = (
    ("first", "cute_kernels.runtime.arch:target_arch"),
    ("absent", "cute_kernels.runtime.no_such_module:RUNG"),
    ("nameless", "cute_kernels.runtime.arch:NO_SUCH_ATTRIBUTE"),
    ("last", "cute_kernels.runtime.arch:has_cuda"),
)


def test_present_names_in_table_order_and_lookups():
    from cute_kernels.runtime import arch

    reg = LadderRegistry(TABLE, family="toy")
    assert list(reg) == ["first", "nameless", "last"] and len(reg) == 3
    assert reg.ladder == ("first", "absent", "nameless", "last")
    assert reg["first"] is arch.target_arch and "last" in reg and "absent" not in reg and 3 not in reg
    with pytest.raises(ImportError, match="does not define NO_SUCH_ATTRIBUTE, the 'nameless' rung"):
        reg["nameless"]
    with pytest.raises(KeyError, match="toy kernel 'absent' is not available"):
        reg["absent"]
    with pytest.raises(KeyError, match="no toy kernel named 'other'"):
        reg["other"]
    with pytest.raises(ValueError, match="module:attribute"):
        LadderRegistry((("bad", "no_colon"),))


def test_found_modules_and_rungs_are_remembered_until_refresh(monkeypatch):
    reg = LadderRegistry(TABLE[:2])
    rung = reg["first"]
    asked = []
    monkeypatch.setattr(kernel_registry, "_module_exists", lambda module: asked.append(module) or False)
    assert list(reg) == ["first"] and reg["first"] is rung
    assert set(asked) == {"cute_kernels.runtime.no_such_module"}  # only the absent one is looked for again
    reg.refresh()
    assert list(reg) == [] and "first" not in reg


def test_the_families_keep_their_names_and_messages():
    from cute_kernels.attention import KERNELS as ATTENTION
    from cute_kernels.attention.registry import AttentionRegistry
    from cute_kernels.gemm import KERNELS as GEMM
    from cute_kernels.gemm.registry import KernelRegistry

    assert isinstance(GEMM, KernelRegistry) and isinstance(ATTENTION, AttentionRegistry)
    assert isinstance(GEMM, LadderRegistry) and isinstance(ATTENTION, LadderRegistry)
    with pytest.raises(KeyError, match="no GEMM kernel named"):
        GEMM["nope"]
    with pytest.raises(KeyError, match="no attention kernel named"):
        ATTENTION["nope"]
