"""The GEMMs of a model's linear layers as a training step makes them, ours beside torch's
(cuBLAS), in one process: per layer the forward (`linear` with its bias), the input gradient
dX = dY.W and the weight gradient dW = dYᵀ.X, each on the tensors a model hands over (3-D
activations, (out, in) weights), timed with the L2 flushed and hot (back to back, as in a model
where the previous layer just wrote the input).

    python3 scripts/layer_gemms.py [--model vit_b16] [--out FILE.json]

Prints per GEMM the two times and the ratio (torch ms / ours ms: above 1 is ours faster); the
last line sums each column over the layers, as one transformer block runs them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from scripts.gemm_config_sweep import _hot_ms  # noqa: E402  (back-to-back calls, L2 warm, host time hidden)

# (tokens as (batch, seq), [(layer, in_features, out_features)]) per model
MODELS = {
    "vit_b16": ((64, 197), [("qkv", 768, 2304), ("proj", 768, 768), ("fc1", 768, 3072), ("fc2", 3072, 768)]),
    # timm's EVA-02 has separate q, k, v projections and a SwiGLU MLP (fc1_g, fc1_x, fc2)
    "eva02_b14": ((64, 257), [("q", 768, 768), ("k", 768, 768), ("v", 768, 768), ("proj", 768, 768),
                              ("fc1_g", 768, 2048), ("fc1_x", 768, 2048), ("fc2", 2048, 768)]),
    "llama_1b": ((4, 2048), [("qkv", 2048, 3072), ("o", 2048, 2048), ("gate_up", 2048, 16384), ("down", 8192, 2048)]),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="vit_b16", choices=sorted(MODELS))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    import triton.testing

    import cute_kernels.nn.functional as cf
    from cute_kernels.gemm import matmul

    (b, s), layers = MODELS[args.model]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, totals = [], {}
    for name, k, n in layers:
        x = torch.randn(b, s, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
        g = torch.randn(b, s, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        g2, x2 = g.view(-1, n), x.view(-1, k)
        gemms = {
            "fwd": (lambda: torch.nn.functional.linear(x, w, bias), lambda: cf.linear(x, w, bias)),
            "fwd_nobias": (lambda: torch.matmul(x2, w.t()), lambda: matmul(x2, w.t())),
            "dgrad": (lambda: torch.matmul(g2, w), lambda: matmul(g2, w)),
            "wgrad": (lambda: torch.matmul(g2.mT, x2), lambda: matmul(g2.mT, x2)),
        }
        for what, (theirs, ours) in gemms.items():
            ref = theirs().double()
            got = ours().double()
            err = ((got - ref).norm() / ref.norm()).item()
            row = {"layer": name, "gemm": what, "rel_err": err}
            for mode in ("cold", "hot"):
                bench = (lambda f: triton.testing.do_bench(f, warmup=10, rep=40, return_mode="median")) \
                    if mode == "cold" else _hot_ms
                t, o = bench(theirs), bench(ours)
                row[f"torch_{mode}_us"], row[f"ours_{mode}_us"] = round(t * 1e3, 2), round(o * 1e3, 2)
                if what != "fwd_nobias":
                    totals[f"torch_{mode}"] = totals.get(f"torch_{mode}", 0) + t * 1e3
                    totals[f"ours_{mode}"] = totals.get(f"ours_{mode}", 0) + o * 1e3
            rows.append(row)
            print(f"{name:>7} {what:10s} cold torch {row['torch_cold_us']:8.2f} ours {row['ours_cold_us']:8.2f} "
                  f"({row['torch_cold_us'] / row['ours_cold_us']:.3f}x)  hot torch {row['torch_hot_us']:8.2f} "
                  f"ours {row['ours_hot_us']:8.2f} ({row['torch_hot_us'] / row['ours_hot_us']:.3f}x)  "
                  f"rel_err {err:.1e}", flush=True)
    print("  block  cold {:.1f} vs {:.1f} us ({:.3f}x), hot {:.1f} vs {:.1f} us ({:.3f}x)".format(
        totals["torch_cold"], totals["ours_cold"], totals["torch_cold"] / totals["ours_cold"],
        totals["torch_hot"], totals["ours_hot"], totals["torch_hot"] / totals["ours_hot"]))
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "rows": rows, "totals_us": totals}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
