"""Values derived from tensors' contents, kept while those tensors and their contents last.

Reading a device tensor's values to the host waits for every launch queued before it. Where a
model hands the same small tensor to every layer (a padding mask, cumulative sequence lengths),
what was derived from it once holds for all of them:

    memo = TensorMemo("varlen.offsets", max_entries=8)
    offsets = memo.get((cu_seqlens_q, cu_seqlens_k), (total_rows,), build)

An entry is keyed by the tensors' identities and `key`, and is confirmed on each lookup by a
weak reference to each tensor (a freed tensor whose id is reused never matches) and by its
version counter (any in-place write through torch bumps it). None stands for an absent tensor.
`build()` runs when nothing matches, and where a tensor keeps no version counter (inference
tensors) or an argument is not a tensor (then `build` is what raises). Errors are not kept.

What it cannot see: a write that bypasses torch's version counter (a raw-pointer kernel, a CUDA
graph replaying into the tensor, a write through `.data`). Callers pass tensors that they, or
the model code around them, only ever write through torch.
"""

from __future__ import annotations

import weakref

__all__ = ["TensorMemo"]


class TensorMemo:
    """A bounded memo of values derived from tensors' contents (module docstring)."""

    def __init__(self, name: str, max_entries: int = 8):
        if max_entries < 1:
            raise ValueError(f"TensorMemo {name!r}: max_entries must be >= 1, got {max_entries}")
        self.name, self.max_entries = name, max_entries
        self._entries: dict = {}

    def get(self, tensors: tuple, key: tuple, build):
        """The value kept for `tensors` (torch tensors or None) and `key`, else `build()` (kept
        when every tensor can be tracked)."""
        import torch

        versions = []
        for t in tensors:
            if t is None:
                versions.append(None)
                continue
            if not isinstance(t, torch.Tensor):
                return build()
            try:
                versions.append(t._version)
            except RuntimeError:  # an inference tensor keeps no version counter
                return build()
        ident = (tuple(id(t) for t in tensors), key)
        entry = self._entries.get(ident)
        if entry is not None:
            refs, kept_versions, value = entry
            if kept_versions == versions and all((r is None and t is None) or (r is not None and r() is t)
                                                 for r, t in zip(refs, tensors)):
                return value
        value = build()
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        refs = tuple(None if t is None else weakref.ref(t) for t in tensors)
        self._entries[ident] = (refs, versions, value)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TensorMemo({self.name!r}, {len(self._entries)} entries)"
