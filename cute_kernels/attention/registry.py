"""`KERNELS`: the attention ladder, rung name -> rung object, in ladder order.

The table is static ("module:attribute" per rung); a module is imported only when its rung is
looked up, and a rung whose module does not exist (yet) is absent. This mirrors
`cute_kernels.gemm.registry`.

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

import importlib
import importlib.util
from collections.abc import Iterator, Mapping

__all__ = ["LADDER", "AttentionRegistry", "KERNELS"]

LADDER: tuple[tuple[str, str], ...] = (
    ("sm80_flash", "cute_kernels.attention.sm80_flash:RUNG"),
    ("sm90_flash", "cute_kernels.attention.sm90_flash:RUNG"),
    ("decode", "cute_kernels.attention.decode:RUNG"),
)


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class AttentionRegistry(Mapping):
    """A read-only mapping rung name -> rung over a static "module:attribute" table.

    Post-conditions: iteration yields, in table order, exactly the names whose module exists;
    `registry[name]` imports the module and returns the attribute (import errors propagate).
    Both answers are remembered per name: the table is static and a module that exists (or an
    attribute that was found) stays so for the process, so warm lookups touch no file system.
    """

    def __init__(self, table: tuple[tuple[str, str], ...]):
        for name, target in table:
            if target.count(":") != 1:
                raise ValueError(f"registry entry {name!r}: target {target!r} is not 'module:attribute'")
        self._table = dict(table)
        self._exists: dict[str, bool] = {}
        self._rungs: dict[str, object] = {}

    def _present(self, name: str) -> bool:
        found = self._exists.get(name)
        if found is None:
            found = self._exists[name] = _module_exists(self._table[name].split(":")[0])
        return found

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._table if self._present(name))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._table and self._present(name)

    def __getitem__(self, name: str):
        rung = self._rungs.get(name)
        if rung is not None:
            return rung
        if name not in self._table:
            raise KeyError(f"no attention kernel named {name!r}; the ladder is {list(self._table)}")
        module, attr = self._table[name].split(":")
        if not self._present(name):
            raise KeyError(f"attention kernel {name!r} is not available: module {module} does not exist (yet)")
        rung = getattr(importlib.import_module(module), attr, None)
        if rung is None:
            raise AttributeError(f"module {module} does not define {attr}, the {name!r} rung")
        self._rungs[name] = rung
        return rung

    @property
    def ladder(self) -> tuple[str, ...]:
        """Every rung name of the table, present or not, in ladder order."""
        return tuple(self._table)

    def __repr__(self) -> str:
        return f"AttentionRegistry({list(self)})"


KERNELS = AttentionRegistry(LADDER)
