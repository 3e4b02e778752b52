"""A trace for tests/runtime/test_precompile.py's workers: compiles two small copy kernels
through the compile cache, as a program's first calls would (importable in a fresh process)."""

from cute_kernels.elementwise.vector_copy import build_variant
from cute_kernels.runtime.cache import compile_kernel


def trace(element_bytes: tuple = (2, 4)) -> None:
    for eb in element_bytes:
        job = build_variant(element_bytes=eb)
        compile_kernel(job.jit_fn, *job.args, key=job.key, options=job.options)
