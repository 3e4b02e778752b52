"""torch dtype <-> CuTe DSL numeric type."""

from __future__ import annotations

import functools

# torch dtype attribute name -> cutlass numeric type name. Names, not objects, so that this
# table is importable without torch or the DSL.
_TORCH_TO_CUTLASS = {
    "float64": "Float64",
    "float32": "Float32",
    "float16": "Float16",
    "bfloat16": "BFloat16",
    "float8_e4m3fn": "Float8E4M3FN",
    "float8_e5m2": "Float8E5M2",
    "float8_e8m0fnu": "Float8E8M0FNU",
    "int64": "Int64",
    "int32": "Int32",
    "int16": "Int16",
    "int8": "Int8",
    "uint8": "Uint8",
    "uint16": "Uint16",
    "uint32": "Uint32",
    "uint64": "Uint64",
    "bool": "Boolean",
}


@functools.cache
def _table() -> dict:
    import cutlass
    import torch

    table = {}
    for torch_name, cutlass_name in _TORCH_TO_CUTLASS.items():
        torch_dtype = getattr(torch, torch_name, None)
        if torch_dtype is not None:
            table[torch_dtype] = getattr(cutlass, cutlass_name)
    return table


def cutlass_dtype(torch_dtype):
    """The DSL numeric type (e.g. `cutlass.Float16`) for a torch dtype.

    Raises TypeError for a torch dtype the DSL has no type for (complex, for instance).
    """
    try:
        return _table()[torch_dtype]
    except (KeyError, TypeError):
        raise TypeError(f"no CuTe DSL numeric type for torch dtype {torch_dtype!r}") from None


def torch_dtype(cutlass_type):
    """The torch dtype for a DSL numeric type; inverse of `cutlass_dtype`."""
    for t, c in _table().items():
        if c is cutlass_type:
            return t
    raise TypeError(f"no torch dtype for CuTe DSL type {cutlass_type!r}")
