"""Where a varlen forward's (or with --backward, the backward's) time goes, ours beside
FlashAttention-4's `flash_attn_varlen_func`: host time per call, wall time per call, and each
kernel's device time (torch.profiler).

    python3 scripts/varlen_profile.py [--backward] [CASE ...]   (`bench.cases.VarlenCase` names;
                                                      default: the attention_varlen suite's cases)

The backward runs through autograd from a retained graph (the `attention_varlen_bwd` suite's
way: `ops.sdpa_varlen` for ours, the same offsets every call).

Per case and rung with a varlen launch: host µs per call (calls issued back to back, the GPU
left to catch up) and wall µs (with the wait), for the same offset tensors every call (what a
model's layers pass: one device read, `runtime.TensorMemo`) and for fresh copies every call
(read and checked each time); the device µs per call of every kernel; then FA4's host, wall
and kernel times on the same tensors, when it is importable.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cute_kernels.attention import attention_varlen_forward  # noqa: E402
from cute_kernels.bench.cases import VarlenCase  # noqa: E402
from cute_kernels.bench.suites import SUITES  # noqa: E402


def host_and_wall_us(fn, calls: int = 30) -> tuple[float, float]:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / calls * 1e6, (time.perf_counter() - start) / calls * 1e6


def kernel_us(fn, calls: int = 10) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per: dict[str, float] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            per[event.name[:70]] = per.get(event.name[:70], 0.0) + event.device_time / calls
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def _grad_fn(forward, x):
    """A call of the backward through autograd for forward(q, k, v) -> out, from one retained graph."""
    leaves = [x[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]
    out = forward(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def backward(cases) -> None:
    from cute_kernels.ops import sdpa_varlen

    for case in cases:
        x = case.make_inputs("cuda")
        cu, longest = x["cu_seqlens"], x["max_seqlen"]
        causal = "bottom_right" if case.causal else None
        print(case.name, "(backward)")
        fns = {rung: _grad_fn(lambda q, k, v, rung=rung: sdpa_varlen(q, k, v, cu, cu, longest, longest, causal,
                                                                     None, -1, -1, rung=rung), x)
               for rung in ("sm90_flash", "sm80_flash")}
        try:
            from flash_attn.cute import flash_attn_varlen_func

            fns["fa4"] = _grad_fn(lambda q, k, v: flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest,
                causal=case.causal), x)
        except ImportError as err:
            print(f"  fa4: not importable ({err})")
        for name, fn in fns.items():
            print(f"  {name}: host / wall µs per call %.1f / %.1f" % host_and_wall_us(fn))
            for kernel, us in kernel_us(fn).items():
                print(f"    {kernel:70s} {us:9.1f} µs")


def main(names: list[str]) -> None:
    bwd = "--backward" in names
    names = [n for n in names if n != "--backward"]
    cases = [VarlenCase.parse(n) for n in names] if names else list(SUITES["attention_varlen"].cases)
    if bwd:
        backward(cases)
        return
    for case in cases:
        x = case.make_inputs("cuda")
        q, k, v, cu, longest = (x[n] for n in ("q", "k", "v", "cu_seqlens", "max_seqlen"))
        out = case.empty_out(x)
        causal = "bottom_right" if case.causal else None
        print(case.name)
        for rung in ("sm90_flash", "sm80_flash"):
            def ours(fresh=False, rung=rung):
                cu_q, cu_k = (cu.clone(), cu.clone()) if fresh else (cu, cu)
                return attention_varlen_forward(q, k, v, cu_q, cu_k, longest, longest, causal=causal, kernel=rung,
                                                out=out)

            print(f"  {rung}: host / wall µs per call %.1f / %.1f; fresh offsets each call %.1f / %.1f"
                  % (*host_and_wall_us(ours), *host_and_wall_us(lambda: ours(fresh=True))))
            for name, us in kernel_us(ours).items():
                print(f"    {name:70s} {us:9.1f} µs")
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except ImportError as err:
            print(f"  fa4: not importable ({err})")
            continue

        def fa4():
            return flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                                          max_seqlen_k=longest, causal=case.causal)

        print("  fa4: host / wall µs per call %.1f / %.1f" % host_and_wall_us(fa4))
        for name, us in kernel_us(fa4).items():
            print(f"    {name:70s} {us:9.1f} µs")


if __name__ == "__main__":
    main(sys.argv[1:])
