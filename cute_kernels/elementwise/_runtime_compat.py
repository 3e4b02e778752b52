"""Deprecated: re-exports of `cute_kernels.runtime` for modules written before it was complete.

The first kernels were written against the runtime contract through this module while the
runtime was being built. The runtime now provides every name; import them from
`cute_kernels.runtime` directly. This module is kept only so that code still importing it
keeps working, and can be deleted once nothing does.
"""

from __future__ import annotations

from cute_kernels.runtime import (  # noqa: F401
    CompileJob,
    compile_kernel,
    current_stream,
    fake_stream,
    fake_tensor,
    from_torch,
    register_variant,
    to_cute,
)

__all__ = [
    "CompileJob",
    "compile_kernel",
    "current_stream",
    "fake_stream",
    "fake_tensor",
    "from_torch",
    "register_variant",
    "to_cute",
]
