"""Issue 16's schedule options, timed side by side: the sm90_flash backward with its default
config and with the options under test (dQ added the other way: by the writer warp, one bulk
reduction per warpgroup tile, or by the consumers' own reductions; the deterministic dQ order
with either; the unmasked copy of the step for interior tiles; with GQA, dK and dV summed in the kernel
(`gqa_loop`) and in per-query-head fp32 buffers), against cuDNN's SDPA backward and FA4's, on
the same tensors in one process.

    python3 scripts/attn_bwd_schedules.py [--out FILE.json] [--cases 0,1,6]

Per case and implementation: the backward's median time (triton's do_bench, L2 flushed; ours
the whole `sm90_flash_bwd.backward` call, prep and post included; the peers' through autograd
from a retained graph), its ratio to the faster peer (peer time / ours), its peak memory above
the inputs (ours), and each option's largest relative error against the default's gradients."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

CASES = [  # B, Hq, Hkv, S, D, causal
    (4, 32, 32, 2048, 128, False), (4, 32, 32, 2048, 128, True), (8, 16, 16, 2048, 64, False),
    (8, 16, 16, 2048, 64, True), (2, 16, 16, 4096, 128, True), (2, 16, 16, 2048, 96, False),
    (4, 32, 8, 4096, 128, True), (4, 32, 8, 4096, 128, False), (2, 32, 4, 2048, 64, True),
    (64, 12, 12, 197, 64, False), (8, 16, 16, 2048, 32, True), (4, 16, 16, 2048, 80, False),
    (2, 16, 16, 2048, 192, True), (32, 16, 16, 1024, 128, True),
]


def _peak_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)


def _peer_backwards(q, k, v, dout, causal, gqa):
    """{name: backward fn} for cuDNN (SDPA) and FA4 where they run here."""
    fns = {}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=gqa)
        fns["cudnn"] = lambda o=o, leaves=leaves: torch.autograd.grad(o, leaves, dout, retain_graph=True)
    except Exception as e:  # noqa: BLE001  (a peer that does not run here is reported, not fatal)
        print("cudnn:", type(e).__name__, str(e)[:120])
    try:
        from flash_attn.cute import flash_attn_func

        leaves = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
        r = flash_attn_func(*leaves, causal=causal)
        o = r[0] if isinstance(r, tuple) else r
        g = dout.transpose(1, 2).contiguous()
        fns["fa4"] = lambda o=o, leaves=leaves, g=g: torch.autograd.grad(o, leaves, g, retain_graph=True)
    except Exception as e:  # noqa: BLE001
        print("fa4:", type(e).__name__, str(e)[:120])
    return fns


def main() -> int:
    import triton.testing

    from cute_kernels.attention import sm90_flash_bwd as bwd
    from cute_kernels.attention.api import attention_forward, check_inputs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--cases", help="comma-separated indices into CASES (default: all)")
    args = parser.parse_args()
    rows = []
    picked = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES
    for b, hq, hkv, s, d, causal in picked:
        torch.manual_seed(s + d)
        q, dout = (torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        align, gqa = ("top_left" if causal else None), hq != hkv
        out, lse = attention_forward(q, k, v, causal=align, enable_gqa=gqa)
        problem = check_inputs(q, k, v, causal=align, scale=None, enable_gqa=gqa)
        base = bwd._launch_for(problem, None).config
        other = "consumer_red" if base.dq_writer else "dq_writer"  # the dQ path the default does not take
        options = {"default": None, other: replace(base, dq_writer=not base.dq_writer),
                   "deterministic": replace(base, deterministic=True),
                   f"{other}_deterministic": replace(base, dq_writer=not base.dq_writer, deterministic=True),
                   "unmasked_interior": replace(base, unmasked_interior=True)}
        if gqa:
            options["gqa_loop" if not base.gqa_loop else "per_head"] = replace(
                base, gqa_loop=not base.gqa_loop, dkv_fp32=base.gqa_loop)
        ours = {name: (lambda c=c: bwd.backward(dout, q, k, v, out, lse, problem, config=c))
                for name, c in options.items()}
        ref = [g.float() for g in ours["default"]()]
        row = {"case": f"B{b} H{hq}/{hkv} S{s} D{d}{' causal' if causal else ''}", "ms": {}, "err": {},
               "peak_mib": {name: _peak_mib(fn) for name, fn in ours.items()}}
        for name, fn in {**ours, **_peer_backwards(q, k, v, dout, causal, gqa)}.items():
            try:
                if name in ours and name != "default":
                    got = fn()
                    row["err"][name] = max(((a.float() - r).norm() / r.norm()).item() for a, r in zip(got, ref))
                row["ms"][name] = round(triton.testing.do_bench(fn, warmup=25, rep=100), 4)
            except Exception as e:  # noqa: BLE001
                row["ms"][name] = None
                print(row["case"], name, type(e).__name__, str(e)[:200])
        peers = [t for n, t in row["ms"].items() if n in ("cudnn", "fa4") and t]
        best = min(peers) if peers else None
        row["ratio_to_best_peer"] = {n: round(best / t, 3) for n, t in row["ms"].items()
                                     if best and t and n in ours}
        rows.append(row)
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
