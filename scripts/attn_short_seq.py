"""Attention at the short sequences of vision transformers (ViT-B/16: S = 197, EVA-02: S = 257,
many heads), where one (batch, head) is a tile or two: our forward with each Q tile it can run,
our backward with each schedule option, and the backward's parts (the prep pass, the kernel,
dQ's conversion), against cuDNN's SDPA and FlashAttention-4 on the same tensors in one process.

    python3 scripts/attn_short_seq.py [--options] [--out FILE.json]

Measured on an H200 (2026-12-02, before the unpadded dQ accumulator), whole backward call at
B64 H12 S197 D64: 0.211 ms with the default schedule, the TMA reduce-add of dQ 0.224, early dV
0.222, the deferred dV/dK wait 0.213, both 0.218, three Q/dO stages 0.212 (the same order at
S 257, 577 and 1024): the default stays.

Times are triton do_bench medians (L2 flushed) of the GPU work of one call; the peers' backward
is autograd.grad of a retained graph (its forward not included). q, k, v are (B, H, S, D) views
of a (B, S, 3, H, D) projection, as timm's attention makes them."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

CASES = [(64, 12, 197, 64), (64, 12, 257, 64), (32, 16, 577, 64), (16, 16, 1024, 64)]  # B, H, S, D


def _bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> int:
    from cute_kernels.attention import sm90_flash as fwd
    from cute_kernels.attention import sm90_flash_bwd as bwd
    from cute_kernels.attention import sm90_bwd_prep as prep
    from cute_kernels.attention.api import attention_forward, check_inputs
    from cute_kernels.attention.sm90_layouts import FlashSm90Config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--options", action="store_true", help="also each backward schedule option")
    args = parser.parse_args()
    rows = []
    for b, h, s, d in CASES:
        torch.manual_seed(s)
        qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        out, lse = attention_forward(q, k, v)
        problem = check_inputs(q, k, v, causal=None, scale=None, enable_gqa=False)
        row = {"case": f"B{b}_H{h}_S{s}_D{d}"}
        # forward: each Q tile (192 rows with three consumers is config_for's at D <= 64)
        out2 = torch.empty_like(out)
        lse2 = torch.empty_like(lse)
        tiles = {"fwd_192x128": fwd.config_for(d, "bfloat16", False),
                 "fwd_128x128": FlashSm90Config(head_dim=d, dtype="bfloat16", causal=False, block_n=128).validate()}
        saved = fwd._config_for_problem
        try:
            for name, cfg in tiles.items():
                fwd._config_for_problem = lambda problem, varlen=False, cfg=cfg: cfg
                fwd.RUNG(q, k, v, out2, lse2, problem)
                row[f"{name}_err"] = ((out2.float() - out.float()).norm() / out.float().norm()).item()
                row[f"{name}_ms"] = _bench(lambda: fwd.RUNG(q, k, v, out2, lse2, problem))
        finally:
            fwd._config_for_problem = saved
        # backward: the schedule options, whole call (prep + kernel + dQ conversion)
        base = bwd.bwd_config_for(d, "bfloat16", False)
        options = {"default": base}
        if args.options:
            options.update({"tma": replace(base, dq_tma_reduce=True), "early_dv": replace(base, early_dv=True),
                            "defer": replace(base, defer_dkv_wait=True),
                            "early_defer": replace(base, early_dv=True, defer_dkv_wait=True),
                            "stages3": replace(base, stages=3)})
        ref = bwd.backward(dout, q, k, v, out, lse, problem)
        for name, cfg in options.items():
            try:
                got = bwd.backward(dout, q, k, v, out, lse, problem, config=cfg)
                row[f"bwd_{name}_err"] = max(((g.float() - r.float()).norm() / r.float().norm()).item()
                                             for g, r in zip(got, ref))
                row[f"bwd_{name}_ms"] = _bench(lambda cfg=cfg: bwd.backward(dout, q, k, v, out, lse, problem,
                                                                            config=cfg))
            except Exception as err:  # noqa: BLE001  (an option that cannot build here is reported)
                row[f"bwd_{name}_error"] = f"{type(err).__name__}: {err}"[:300]
        # the parts: the prep pass alone, and dQ's conversion of the padded fp32 accumulator
        row["bwd_prep_ms"] = _bench(lambda: prep.preprocess_flat(dout, out, lse, base.block_m, True))
        sq_pad = -(-s // base.block_m) * base.block_m
        acc = torch.randn(b, h, sq_pad, d, device="cuda", dtype=torch.float32)
        row["bwd_dq_cast_ms"] = _bench(lambda: acc[:, :, :s].to(torch.bfloat16))
        # peers
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            row["cudnn_fwd_ms"] = _bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
            o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
        row["cudnn_bwd_ms"] = _bench(lambda: torch.autograd.grad(o, (qq, kk, vv), dout, retain_graph=True))
        try:
            from flash_attn.cute import flash_attn_func

            q4, k4, v4 = (t.detach().transpose(1, 2) for t in (q, k, v))
            row["fa4_fwd_ms"] = _bench(lambda: flash_attn_func(q4, k4, v4))
            qq, kk, vv = (t.requires_grad_() for t in (q4.clone(), k4.clone(), v4.clone()))
            r = flash_attn_func(qq, kk, vv)
            o4 = r[0] if isinstance(r, tuple) else r
            row["fa4_bwd_ms"] = _bench(lambda: torch.autograd.grad(o4, (qq, kk, vv), dout.transpose(1, 2),
                                                                   retain_graph=True))
        except Exception as err:  # noqa: BLE001
            row["fa4_error"] = f"{type(err).__name__}: {err}"[:300]
        print(json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()}), flush=True)
        rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
