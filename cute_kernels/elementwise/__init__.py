"""Elementwise kernels: the vectorized copy that sets the memory-bandwidth baseline.

`copy(src, dst=None)` is the torch-facing entry point; the kernel (`VectorCopy`), its config
(`CopyConfig`) and its thread-value layout (`copy_tv_layout`) live in `vector_copy`. Where the
CuTe DSL is installed, importing this package imports `vector_copy`, which registers its
compile-only variants with the runtime's inspection registry.
"""

from __future__ import annotations

import importlib.util

from .api import copy

__all__ = ["copy"]

if importlib.util.find_spec("cutlass") is not None:
    from .vector_copy import CopyConfig, VectorCopy, copy_tv_layout

    __all__ += ["CopyConfig", "VectorCopy", "copy_tv_layout"]
