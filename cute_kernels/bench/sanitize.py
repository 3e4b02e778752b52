"""Run one small case of a named kernel, for wrapping in compute-sanitizer.

    python -m cute_kernels.bench.sanitize --list            # names, one per line
    python -m cute_kernels.bench.sanitize gemm.sm80_mma     # one kernel
    python -m cute_kernels.bench.sanitize all               # every registered kernel, in turn
    compute-sanitizer --tool racecheck python -m cute_kernels.bench.sanitize gemm.sm80_mma

Kernel names are `gemm.<rung>` for each rung in `cute_kernels.gemm.KERNELS`,
`attention.<name>` for each kernel in `cute_kernels.attention.KERNELS`, and `elementwise.copy`.
Each runs once on a small case with sizes that are not multiples of the usual tiles where the
kernel takes them (so predication and tails are exercised), output poisoned with NaN first,
and its rel_err is checked against a float32 reference. Exit status: 0 when every named kernel
ran and was correct, 1 when one failed, 2 for a name that is not registered.
"""

from __future__ import annotations

import argparse
import sys

from cute_kernels.bench.cases import AttentionCase, CopyCase, GemmCase, torch_dtype
from cute_kernels.bench.impls import (Unsupported, _our_copy_available, _prepare_attention_kernel,
                                      _prepare_gemm_rung, _prepare_our_copy, our_attention_kernels, our_gemm_rungs)
from cute_kernels.bench.runner import check_correctness

# Small cases, tried in order until the kernel takes one: odd sizes first, tile multiples last,
# then a skinny odd case for the specialists that take only a side of at most 16 (gemv).
GEMM_CASES = [GemmCase(m, n, k, dt) for m, n, k in ((200, 136, 72), (256, 256, 128), (7, 136, 200))
              for dt in ("bf16", "fp16", "fp32")]
ATTENTION_CASES = [AttentionCase(1, 2, s, d, True, "bf16") for d in (128, 64) for s in (200, 256)]
COPY_CASES = [CopyCase(1_000_003, "bf16"), CopyCase(1 << 20, "bf16")]


def kernel_names() -> list[str]:
    """Every registered kernel's sanitizer name (see the module docstring)."""
    names = [f"gemm.{n}" for n in our_gemm_rungs()[0]]
    names += [f"attention.{n}" for n in our_attention_kernels()[0]]
    if _our_copy_available() is None:
        names.append("elementwise.copy")
    return names


def _candidates(name: str):
    family, _, kernel = name.partition(".")
    if family == "gemm":
        return GEMM_CASES, lambda case, inputs: _prepare_gemm_rung(kernel, case, inputs)
    if family == "attention":
        return ATTENTION_CASES, lambda case, inputs: _prepare_attention_kernel(kernel, case, inputs)
    return COPY_CASES, _prepare_our_copy


def _run_paged_decode(device: str) -> bool:
    """The decode kernel reads a paged KV cache, not dense attention: a small GQA case with a
    shuffled block table, ragged lengths and 16-key pages, against the by-definition reference."""
    import torch

    from cute_kernels.attention import paged_decode
    from cute_kernels.ops.attention_reference import paged_decode as reference

    gen = torch.Generator(device=device).manual_seed(0)
    batch, heads_q, heads_kv, dim, page, pages_per_seq = 2, 8, 2, 128, 16, 9
    blocks = batch * pages_per_seq
    k_cache, v_cache = (torch.randn(blocks, page, heads_kv, dim, generator=gen, device=device, dtype=torch.bfloat16)
                        for _ in range(2))
    q = torch.randn(batch, heads_q, dim, generator=gen, device=device, dtype=torch.bfloat16)
    table = torch.randperm(blocks, generator=gen, device=device).view(batch, pages_per_seq).to(torch.int32)
    seqlens = torch.tensor([37, 141], dtype=torch.int32, device=device)
    out = torch.full((batch, heads_q, dim), float("nan"), dtype=torch.bfloat16, device=device)
    paged_decode(q, k_cache, v_cache, table, seqlens, kernel="decode", out=out)
    ref = reference(q.float(), k_cache.float(), v_cache.float(), table, seqlens).float()
    err = float((out.float() - ref).norm() / ref.norm())
    ok = bool(torch.isfinite(out).all()) and err < 1e-2
    print(f"sanitize: attention.decode B{batch}_Hq{heads_q}_Hkv{heads_kv}_D{dim}_page{page} bf16: "
          f"rel_err {err:.2e} {'ok' if ok else 'FAILED'}", flush=True)
    return ok


def run_one(name: str, device: str = "cuda") -> bool:
    """Run `name` on the first small case it takes; print one line; True when correct."""
    if name == "attention.decode":
        return _run_paged_decode(device)
    cases, prepare = _candidates(name)
    reasons = []
    for case in cases:
        inputs = case.make_inputs(device, seed=0)
        try:
            prepared = prepare(case, inputs)
        except (Unsupported, ValueError, NotImplementedError) as exc:
            reasons.append(f"{case.name} {case.dtype}: {exc}")
            continue
        except Exception as exc:  # a kernel that cannot even be built fails; the others still run
            print(f"sanitize: {name} {case.name} {case.dtype}: FAILED to prepare ({type(exc).__name__}: {exc})", flush=True)
            return False
        try:
            err, ok, error = check_correctness(prepared, case.reference(inputs), case.tolerance, device,
                                               torch_dtype(case.result_dtype))
        except Unsupported as exc:
            reasons.append(f"{case.name} {case.dtype}: {exc}")
            continue
        status = "ok" if ok else f"FAILED ({error})"
        print(f"sanitize: {name} {case.name} {case.dtype}: rel_err {err:.2e} {status}", flush=True)
        return ok
    print(f"sanitize: {name}: no small case is supported: {'; '.join(reasons)}", flush=True)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cute_kernels.bench.sanitize", description=__doc__.split("\n")[0])
    parser.add_argument("kernels", nargs="*", help="kernel names (see --list), or 'all'")
    parser.add_argument("--list", action="store_true", help="print the registered kernel names and exit")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    known = kernel_names()
    if args.list:
        print("\n".join(known))
        return 0
    if not args.kernels:
        parser.error("name a kernel (see --list) or 'all'")
    names = known if args.kernels == ["all"] else args.kernels
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"sanitize: unknown kernel(s) {unknown}; registered: {known}", file=sys.stderr)
        return 2
    results = [run_one(n, args.device) for n in names]
    print(f"sanitize: {sum(results)}/{len(results)} kernels ran correctly", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
