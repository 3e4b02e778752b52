"""Where the host time of a warm attention forward + backward goes, part by part, at ViT-B/16's
shape (B64 H12 S197 D64, bf16): each part timed alone as host µs per call with the GPU kept busy
(`bench.overhead.make_host_timer`, so no call waits for the device), next to torch's SDPA. The
whole forward + backward is timed three ways: contiguous q, k, v leaves with dO in (B, S, H, D)
storage (what a ViT block's output projection hands back), the same with dO in (B, H, S, D)
storage (the overhead suite's case), and q, k, v as views of one projection output.

    python3 scripts/sdpa_host.py [--shape B,H,S,D] [--calls 200] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402


class _Identity(torch.autograd.Function):
    """An autograd node doing no GPU work: what autograd alone costs per forward + backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, g):
        return g, None, None


def main() -> int:
    from cute_kernels.attention import sm90_bwd_prep as prep
    from cute_kernels.attention import sm90_flash as fwd
    from cute_kernels.attention import sm90_flash_bwd as bwd
    from cute_kernels.attention.api import attention_forward, check_inputs
    from cute_kernels.bench.overhead import cuda_busy_probe, make_host_timer
    from cute_kernels.nn.functional import scaled_dot_product_attention as ours_sdpa

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="64,12,197,64")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--out")
    args = p.parse_args()
    b, h, s, d = (int(x) for x in args.shape.split(","))
    timer = make_host_timer(calls=args.calls, busy=cuda_busy_probe(), sync=torch.cuda.synchronize)
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention_forward(q, k, v)
    problem = check_inputs(q, k, v, causal=None, scale=None, enable_gqa=False)
    config = bwd.bwd_config_for(d, "bfloat16", False)
    d_rows, lse2, dq_flat, dq_acc = prep.preprocess_flat(dout, out, lse, config.block_m, True)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    fn = bwd._COMPILED.get(config) or bwd._compile_tvm_ffi(config)
    scale = problem.scale
    launch = fwd.RUNG.launch_plan(problem)
    out2, lse3 = torch.empty_like(out), torch.empty_like(lse)

    def fwd_bwd(sdpa, grad=None):
        grad = dout if grad is None else grad

        def run():
            o = sdpa(*leaves)
            torch.autograd.grad(o, leaves, grad)
        return run

    # as a ViT block has them: q, k, v views of one (B, S, 3, H, D) projection that requires grad
    qkv_leaf = qkv.detach().clone().requires_grad_()

    def fwd_bwd_views(sdpa):
        def run():
            o = sdpa(*qkv_leaf.permute(2, 0, 3, 1, 4).unbind(0))
            torch.autograd.grad(o, qkv_leaf, dout)
        return run

    dout_bhsd = dout.contiguous()  # (B, H, S, D) storage, as the overhead suite's gradient

    parts = {
        "stock_fwd_bwd": fwd_bwd(torch.nn.functional.scaled_dot_product_attention),
        "ours_fwd_bwd": fwd_bwd(ours_sdpa),
        "stock_fwd_bwd_dout_bhsd": fwd_bwd(torch.nn.functional.scaled_dot_product_attention, dout_bhsd),
        "ours_fwd_bwd_dout_bhsd": fwd_bwd(ours_sdpa, dout_bhsd),
        "stock_fwd_bwd_qkv_views": fwd_bwd_views(torch.nn.functional.scaled_dot_product_attention),
        "ours_fwd_bwd_qkv_views": fwd_bwd_views(ours_sdpa),
        "stock_fwd_grad": lambda: torch.nn.functional.scaled_dot_product_attention(*leaves),
        "ours_fwd_grad": lambda: ours_sdpa(*leaves),
        "ours_fwd_nograd": lambda: ours_sdpa(q, k, v),
        "identity_node_fwd_bwd": lambda: torch.autograd.grad(_Identity.apply(*leaves), leaves[:1], dout),
        "ours_bwd_entry": lambda: bwd.backward(dout, q, k, v, out, lse, problem),
        "prep_call": lambda: prep.preprocess_flat(dout, out, lse, config.block_m, True),
        "bwd_kernel_call": lambda: fn(q, k, v, dout, lse2, d_rows, dq_flat, dk, dv, scale, 0, 0, 1, None),
        "fwd_kernel_call": lambda: launch(q, k, v, out2, lse3),
        "dq_cast": lambda: dq_acc.to(torch.bfloat16),
        "torch_empty_dq": lambda: torch.empty(dq_acc.shape, dtype=torch.float32, device="cuda"),
        "empty_like_k": lambda: torch.empty_like(k),
    }
    rows = {}
    for name, run in parts.items():
        rows[name] = timer(run, name) * 1e3
        print(f"{name:24s} {rows[name]:8.1f} us/call", flush=True)
    if timer.drained:
        print("drained (the GPU went idle, host time may include waits):", timer.drained)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": [b, h, s, d], "host_us": rows, "drained": timer.drained}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
