"""How every probe is built and run: one `CompileJob` from fake tensors, used twice.

`job(...)` makes the job a probe registers for the compile-only tier (`cute-kernels sass
probes.NAME`, the `compile` tests); `run(job, *args)` compiles the very same job once per
process (memory and disk cache) and launches it on torch's current stream with the torch
tensors in `args` viewed as DSL tensors. So the SASS the course shows is the code the GPU ran.
"""

from __future__ import annotations

from cute_kernels.runtime import CompileJob, compile_kernel, current_stream, fake_stream, fake_tensor, from_torch

__all__ = ["job", "run", "fake_1d"]


def fake_1d(dtype, align: int = 16):
    """A compile-only 1-D tensor of `dtype`, any length, `align`-byte aligned."""
    return fake_tensor(dtype, 1, leading_dim=0, assumed_align=align)


def job(kernel, key: tuple, *args, options: str | None = None) -> CompileJob:
    """The CompileJob of `kernel(*args, stream)` (args: fake tensors and scalars)."""
    return CompileJob(kernel, (*args, fake_stream()), ("probes",) + tuple(key), options)


def run(compile_job: CompileJob, *args, align: int = 16) -> None:
    """Launch `compile_job` on torch's current stream with `args`: torch tensors (each viewed
    with its last mode as the unit-stride one and `align`-byte alignment) and scalars."""
    import torch

    fn = compile_kernel(compile_job.jit_fn, *compile_job.args[:-1], compile_job.args[-1],
                        key=compile_job.key, options=compile_job.options)
    converted = [from_torch(a, assumed_align=align, leading_dim=a.dim() - 1) if isinstance(a, torch.Tensor) else a
                 for a in args]
    fn(*converted, current_stream())
