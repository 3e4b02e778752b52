"""The bridge from cute-kernels to the CuTe DSL and the GPU.

- `target_arch()`, `has_cuda()`: what kernels compile for; `sm_count(device)`: its SMs.
- `compile_kernel(jit_fn, *args, key=..., options=...)`: `cute.compile` cached in memory
  and on disk, keyed by kernel, static config, dtypes, arch and DSL version; sizes are
  dynamic, so new problem sizes never recompile.
- `from_torch`, `fake_tensor`, `fake_stream`, `current_stream`, `cutlass_dtype`: arguments.
- `to_cute(layout)`: our `cute_kernels.layouts` objects as DSL layouts, at trace time.
- `register_variant`, `list_variants`, `compile_variant` -> `SassReport`: SASS inspection.
- `occupancy(...)`: blocks and warps per SM on H100/H200.
- `LadderRegistry`: a kernel family's ladder (rung name -> rung, imported on lookup).
- `WarmCache`, `memo`, `PlanCache`, `warm_caches`: the warm-path caches (configs, kernel
  objects, compiled functions, launch plans) every rung and entry point keeps.
- `EagerOp`, `Plan`: an operator's eager direct path beside its torch.library op (`eager`).
- `lean_dispatch.install(op)`: a cheaper Autograd kernel for a custom op's calls without autograd.
- `unverified`: paths built without a GPU, off until their GPU tests have run.
- `lasting(device, build, ...)`: tensors a cache keeps, made outside any CUDA graph pool.
- `TensorMemo`: values derived from tensors' contents (host reads), kept while they last.

Names are imported lazily, so `import cute_kernels.runtime` costs nothing until used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "target_arch": "arch",
    "has_cuda": "arch",
    "sm_count": "arch",
    "dsl_version": "arch",
    "arch_from_capability": "arch",
    "compile_kernel": "cache",
    "lookup_kernel": "cache",
    "compile_now": "cache",
    "clear_memory_cache": "cache",
    "clear_disk_cache": "cache",
    "tvm_ffi_available": "cache",
    "TVM_FFI_OPTION": "cache",
    "TvmFfiMissingWarning": "cache",
    "cache_dir": "cache",
    "from_torch": "tensors",
    "fake_tensor": "tensors",
    "fake_stream": "tensors",
    "current_stream": "tensors",
    "lasting": "lasting",
    "TensorMemo": "tensor_memo",
    "tma_view": "tensors",
    "cutlass_dtype": "dtypes",
    "torch_dtype": "dtypes",
    "to_cute": "to_cute",
    "CompileJob": "registry",
    "Variant": "registry",
    "register_variant": "registry",
    "unregister_variant": "registry",
    "list_variants": "registry",
    "get_variant": "registry",
    "compile_variant": "registry",
    "check_variant": "registry",
    "SassReport": "sass_report",
    "occupancy": "occupancy",
    "Occupancy": "occupancy",
    "SM90": "occupancy",
    "LadderRegistry": "kernel_registry",
    "WarmCache": "plan_cache",
    "PlanCache": "plan_cache",
    "memo": "plan_cache",
    "warm_caches": "plan_cache",
    "EagerOp": "eager",
    "Plan": "eager",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cute_kernels.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
