"""The TVM-FFI build of the dense flash forward rungs (`sm80_flash`, `sm90_flash`), shared: each
rung keeps the result per config in its warm-path cache (`runtime.plan_cache`).

    compile_tvm_ffi(compile_kernel, kernel, dtype, key, tail=(), stride_divisibility=1)

Both rungs compile the same host signature (q, k, v, out 4-D with the head dim contiguous and
16-byte aligned; lse 3-D fp32; scale, causal offset, left-window offset, group; torch's
current stream), followed by each rung's own trailing arguments (`tail`: the score features,
varlen offsets), so one config is one build.
"""

from __future__ import annotations

import cutlass

__all__ = ["compile_tvm_ffi"]

_CUTLASS = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


def compile_tvm_ffi(compile_kernel, kernel, dtype: str, key: tuple, tail: tuple = (), stride_divisibility: int = 1):
    """Compile (or load) the TVM-FFI forward of `kernel` (a rung's kernel object for one config
    of `dtype`) from fake tensors, with `compile_kernel` (the rung module's: tests replace it).

    The fake tensors fix what `from_torch` would: dtype, rank, the unit-stride mode (head dim;
    lse's last mode) and the assumed alignment; sizes and other strides are runtime values,
    which the compiled function reads from the torch tensors (and checks against the build).
    So the config is the whole compile key. stride_divisibility: what the q, k, v, out strides
    outside the head dim are multiples of (in elements; the varlen build's ragged tensor maps
    need 8), which the compiled function checks per call."""
    from cute_kernels.runtime import TVM_FFI_OPTION, fake_stream, fake_tensor

    t = _CUTLASS[dtype]
    qkvo = [fake_tensor(t, 4, leading_dim=3, assumed_align=16, stride_divisibility=stride_divisibility)
            for _ in range(4)]
    lse = fake_tensor(cutlass.Float32, 3, leading_dim=2, assumed_align=4)
    return compile_kernel(kernel, *qkvo, lse, cutlass.Float32(1.0), cutlass.Int32(0), cutlass.Int32(0),
                          cutlass.Int32(1), fake_stream(tvm_ffi_env_stream=True), *tail, key=key,
                          options=TVM_FFI_OPTION)
