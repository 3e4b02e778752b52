"""`KERNELS`: the GEMM ladder, rung name -> rung object, in ladder order (slowest idea first),
then the specialists (rungs for one class of shapes, which "auto" asks before the ladder).

The table below is static: each rung is named by "module:attribute", and the module is
imported only when the rung is looked up, so listing the ladder needs neither the CuTe DSL
nor a GPU. A rung whose module does not exist (yet) is simply absent.

A rung object has `name`, `dtypes` (the input dtypes it takes), `supports(a, b, out) -> str |
None` (None when it can run this problem on this device, else the reason) and
`__call__(a, b, out, *, alpha, beta, c)`, which writes `out` on torch's current stream. The
operands are the 3-D views `matmul` builds: a (L, M, K), b (L, K, N), out (L, M, N), each with
one of its last two strides equal to 1. Rungs may also carry `min_capability` ((major, minor)
of the oldest GPU they run on), which dispatch checks before asking `supports`.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping

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


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class KernelRegistry(Mapping):
    """A read-only mapping rung name -> rung object over a static "module:attribute" table.

    Post-conditions: iteration yields, in table order, exactly the names whose module exists;
    `registry[name]` imports that module and returns its attribute; import errors (including a
    module that lacks the attribute) propagate as ImportError, never as a silently absent rung.
    """

    def __init__(self, table: tuple[tuple[str, str], ...]):
        for name, target in table:
            if target.count(":") != 1:
                raise ValueError(f"registry entry {name!r}: target {target!r} is not 'module:attribute'")
        self._table = dict(table)
        self._found: set[str] = set()  # names whose module was found (a module found stays found)

    def _present(self, name: str) -> bool:
        if name in self._found:
            return True
        if _module_exists(self._table[name].split(":")[0]):
            self._found.add(name)
            return True
        return False

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._table if self._present(name))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._table and self._present(name)

    def __getitem__(self, name: str):
        if name not in self._table:
            raise KeyError(f"no GEMM kernel named {name!r}; the ladder is {list(self._table)}")
        module, attr = self._table[name].split(":")
        if not self._present(name):
            raise KeyError(f"GEMM kernel {name!r} is not available: module {module} does not exist (yet)")
        rung = getattr(importlib.import_module(module), attr, None)
        if rung is None:  # as `from module import attr` would: an ImportError
            raise ImportError(f"module {module} does not define {attr}, the {name!r} rung")
        return rung

    @property
    def ladder(self) -> tuple[str, ...]:
        """Every rung name of the table, present or not, in ladder order."""
        return tuple(self._table)

    def __repr__(self) -> str:
        return f"KernelRegistry({list(self)})"


KERNELS = KernelRegistry(LADDER)
