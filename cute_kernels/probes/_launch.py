"""How every probe is built and run: one `CompileJob` from fake tensors, used twice.

`job(...)` makes the job a probe registers for the compile-only tier (`cute-kernels sass
probes.NAME`, the `compile` tests); `run(job, *args)` compiles the very same job once per
process (memory and disk cache) and launches it on torch's current stream with the torch
tensors in `args` viewed as DSL tensors. So the SASS the course shows is the code the GPU ran.
"""

from __future__ import annotations

from cute_kernels.runtime import CompileJob, compile_kernel, current_stream, fake_stream, fake_tensor, from_torch

__all__ = ["job", "run", "fake_1d", "assumed_align"]


def fake_1d(dtype, align: int = 16):
    """A compile-only 1-D tensor of `dtype`, any length, `align`-byte aligned."""
    return fake_tensor(dtype, 1, leading_dim=0, assumed_align=align)


def job(kernel, key: tuple, *args, options: str | None = None) -> CompileJob:
    """The CompileJob of `kernel(*args, stream)` (args: fake tensors and scalars)."""
    return CompileJob(kernel, (*args, fake_stream()), ("probes",) + tuple(key), options)


def run(compile_job: CompileJob, *args) -> None:
    """Launch `compile_job` on torch's current stream with `args`: torch tensors and scalars, in
    the order of the job's fake arguments. Each tensor is viewed with its last mode as the
    unit-stride one and the alignment its fake tensor was compiled with (checked by `from_torch`:
    a misaligned tensor raises ValueError before the launch)."""
    import torch

    fn = compile_kernel(compile_job.jit_fn, *compile_job.args, key=compile_job.key, options=compile_job.options)
    converted = [from_torch(a, assumed_align=assumed_align(fake), leading_dim=a.dim() - 1)
                 if isinstance(a, torch.Tensor) else a for a, fake in zip(args, compile_job.args)]
    fn(*converted, current_stream())


def assumed_align(fake) -> int:
    """The byte alignment a fake tensor was made with (`fake_tensor(..., assumed_align=)`)."""
    align = getattr(fake, "_assumed_align", None)
    if not isinstance(align, int):
        raise TypeError(f"cannot read the alignment of {type(fake).__name__}; the DSL's fake tensor changed")
    return align
