"""The dtypes the fused kernels take, by name ("bfloat16", "float16", "float32"), as DSL types."""

from __future__ import annotations

import cutlass

__all__ = ["CUTLASS_DTYPES", "element_bytes", "FLOAT_DTYPES"]

CUTLASS_DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16, "float32": cutlass.Float32}
FLOAT_DTYPES = tuple(CUTLASS_DTYPES)
_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "int64": 8}


def element_bytes(name: str) -> int:
    try:
        return _BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype name {name!r}; known: {sorted(_BYTES)}") from None
