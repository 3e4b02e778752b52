"""`cute-kernels demo`: a tour of the workbench that works on any machine.

Without a GPU it explores layouts, an MMA atom and a bank-conflict analysis, then compiles a
Hopper kernel for sm_90a and summarizes its SASS. With a GPU it also runs our GEMM beside cuBLAS
on the same tensors and prints the ratio. A base install (no torch, no CuTe DSL) runs the layout
part and says in one line which extra the rest needs.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

from .errors import CliError

GPU_EXTRA = "pip install 'cute-kernels[gpu]'"


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="a tour: layouts, atoms, bank conflicts, SASS, and a GEMM vs cuBLAS on a GPU")
    p.add_argument("--kernel", default=None, help="GEMM rung to compile and (on a GPU) time; default: the top rung available")
    p.add_argument("--size", type=int, default=4096, help="square GEMM size for the GPU part")
    p.set_defaults(func=run)


def _section(title: str) -> None:
    print(f"\n== {title} ==")


def _layouts_part() -> None:
    from cute_kernels import layouts as L

    _section("A layout and its algebra")
    tv = L.Layout((4, (2, 2)), (2, (1, 8)))
    print(f">>> L = Layout((4, (2, 2)), (2, (1, 8)))\n{tv}")
    print(f">>> [L(i) for i in range(size(L))]\n{[tv(i) for i in range(L.size(tv))]}")
    print(f">>> coalesce(L)          -> {L.coalesce(tv)}")
    print(f">>> complement(L, 32)    -> {L.complement(tv, 32)}")
    print(f">>> logical_divide(Layout(16), 4) -> {L.logical_divide(L.Layout(16), L.Layout(4))}")

    atom = getattr(L, "atom", None)
    if atom is not None:
        _section("An MMA atom's thread-value layouts")
        print(atom("SM80_16x8x16_F32BF16BF16F32_TN"))

    bank_conflicts = getattr(L, "bank_conflicts", None)
    if bank_conflicts is not None:
        _section("Bank conflicts of an ldmatrix read: swizzled vs plain row-major bf16 8x64 tile")
        plain = L.Layout((8, 64), (64, 1))
        swizzled = L.ComposedLayout(L.Swizzle(3, 4, 3), 0, plain)
        for name, smem in (("row-major", plain), ("Sw<3,4,3>", swizzled)):
            print(f"{name:>10}: {bank_conflicts(smem, 'ldmatrix_x4', dtype='bf16')}")


def _sass_part(kernel: str | None) -> str | None:
    from cute_kernels.runtime import has_cuda

    if not has_cuda():
        # Without a GPU the DSL still compiles for Hopper; it must know the target before tracing.
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    try:
        from cute_kernels.runtime import registry
    except ImportError as err:  # the DSL is an optional dependency
        print(f"(skipping SASS: {err})")
        return None
    names = [variant.name for variant in registry.list_variants()]
    if not names:
        print("(no kernel variants registered)")
        return None
    if kernel and kernel not in names:
        print(f"(no SASS variant is registered for {kernel}; skipping SASS)")
        return None
    preferred = [kernel] if kernel else ["gemm.sm90_persistent", "gemm.sm90_tma_wgmma", "gemm.naive", "elementwise.vector_copy"]
    name = next((n for n in preferred if n in names), names[0])
    _section(f"Compiling {name} for {os.environ.get('CUTE_DSL_ARCH')}")
    t0 = time.perf_counter()
    report = registry.compile_variant(name)
    print(f"compiled in {time.perf_counter() - t0:.1f} s")
    print(report.summary())
    return name


def _gpu_part(size: int, kernel: str | None) -> None:
    import torch

    if not torch.cuda.is_available():
        print("\n(no CUDA device: skipping the timed GEMM; on a GPU this part runs our GEMM beside cuBLAS)")
        return
    from cute_kernels.bench.timing import interleaved, make_gpu_timer
    from cute_kernels.gemm import KERNELS, matmul

    _section(f"GEMM {size}^3 bf16 on {torch.cuda.get_device_name()}")
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    # The named rung, or the highest rung of the ladder that takes this problem.
    name = kernel
    for candidate in ([kernel] if kernel else reversed(list(KERNELS))):
        try:
            out = matmul(a, b, kernel=candidate)
        except (ValueError, TypeError, NotImplementedError) as err:
            if kernel:
                raise
            print(f"{candidate:>24}: skipped ({err})")
            continue
        name = candidate
        break
    else:
        print("no GEMM rung takes this problem on this device")
        return
    err = ((out.float() - ref).norm() / ref.norm()).item()
    times = interleaved({"cublas": lambda: torch.matmul(a, b), name: lambda: matmul(a, b, kernel=name)},
                        make_gpu_timer(), rounds=3)
    flops = 2.0 * size**3
    for impl, t in times.items():
        print(f"{impl:>24}: {flops / t.median / 1e9:7.1f} TFLOP/s")
    print(f"{name} / cublas: {times['cublas'].median / times[name].median:.2f}x (rel_err {err:.1e})")


def _missing_gpu_stack() -> list[str]:
    return [name for module, name in (("torch", "PyTorch"), ("cutlass", "the CuTe DSL"))
            if importlib.util.find_spec(module) is None]


def _check_kernel(kernel: str | None) -> None:
    """An unknown --kernel is an error before anything runs (not a silent switch to another rung)."""
    if kernel is None:
        return
    from cute_kernels.gemm import KERNELS

    if kernel not in KERNELS:
        raise CliError(f"unknown GEMM kernel {kernel!r}; the rungs are: {', '.join(KERNELS)}")


def run(args) -> int:
    missing = _missing_gpu_stack()
    if missing and args.kernel:
        raise CliError(f"--kernel needs {' and '.join(missing)}, which the base install lacks: {GPU_EXTRA}")
    if not missing:
        _check_kernel(args.kernel)
    _layouts_part()
    if missing:
        print(f"cute-kernels demo: the SASS and GEMM parts need {' and '.join(missing)}, not installed here; "
              f"install them with: {GPU_EXTRA}", file=sys.stderr)
        return 0
    _sass_part(args.kernel and f"gemm.{args.kernel}")
    _gpu_part(args.size, args.kernel)
    return 0
