"""`LadderRegistry`: a kernel family's ladder, rung name -> rung object, in ladder order.

The one registry mechanism every family uses (`cute_kernels.gemm.KERNELS`,
`cute_kernels.attention.KERNELS`, and the fused kernels'). A family gives a static table of
(name, "module:attribute") pairs; a module is imported only when its rung is looked up, so
listing a ladder needs neither the CuTe DSL nor a GPU, and a rung whose module does not exist
(yet) is simply absent.

    KERNELS = LadderRegistry((("naive", "cute_kernels.gemm.naive:RUNG"), ...), family="GEMM")
    list(KERNELS); "naive" in KERNELS; KERNELS["naive"]; KERNELS.ladder; KERNELS.refresh()

Post-conditions: iteration yields, in table order, exactly the names whose module exists;
`registry[name]` imports that module and returns its attribute; import errors (a module that
lacks the attribute included) propagate as ImportError, never as a silently absent rung. A
module found and a rung looked up are remembered (warm lookups touch no file system); a module
not found is looked for again at the next question, and `refresh()` forgets everything (after
a rung module is added or reloaded).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping

__all__ = ["LadderRegistry"]


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class LadderRegistry(Mapping):
    """A read-only mapping rung name -> rung object over a static "module:attribute" table
    (module docstring). `family` (an argument, or a subclass's attribute) names the kernels in
    error messages ("GEMM", "attention")."""

    family = "kernel"

    def __init__(self, table: tuple[tuple[str, str], ...], family: str | None = None):
        for name, target in table:
            if target.count(":") != 1:
                raise ValueError(f"registry entry {name!r}: target {target!r} is not 'module:attribute'")
        if family is not None:
            self.family = family
        self._table = dict(table)
        self._found: set[str] = set()  # names whose module was found (a module found stays found)
        self._rungs: dict[str, object] = {}

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
        rung = self._rungs.get(name)
        if rung is not None:
            return rung
        if name not in self._table:
            raise KeyError(f"no {self.family} kernel named {name!r}; the ladder is {list(self._table)}")
        module, attr = self._table[name].split(":")
        if not self._present(name):
            raise KeyError(f"{self.family} kernel {name!r} is not available: module {module} does not exist (yet)")
        rung = getattr(importlib.import_module(module), attr, None)
        if rung is None:  # as `from module import attr` would: an ImportError
            raise ImportError(f"module {module} does not define {attr}, the {name!r} rung")
        self._rungs[name] = rung
        return rung

    @property
    def ladder(self) -> tuple[str, ...]:
        """Every rung name of the table, present or not, in ladder order."""
        return tuple(self._table)

    def refresh(self) -> None:
        """Forget which modules were found and which rungs were looked up."""
        self._found.clear()
        self._rungs.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)})"
