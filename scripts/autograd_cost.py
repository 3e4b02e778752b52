"""What autograd itself costs on the host, per warm forward + backward call, on CUDA tensors:
a C++ node against Python `autograd.Function` nodes of growing weight, and the ViT linear layer
(ours and stock), each with the engine's device threads on (the default: a CUDA backward runs on
the device's worker thread) and off (`torch.autograd.set_multithreading_enabled(False)`: on the
calling thread).

    python3 scripts/autograd_cost.py [--calls 100] [--rounds 3] [--out FILE.json]

The GPU is kept busy (`bench.overhead`'s host timer), so every figure is host work alone."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


class _TenViews(torch.autograd.Function):
    """A Python node whose backward makes ten cheap torch calls: with device threads on, what
    each call costs beyond its own work (the GIL released and taken back around it) shows
    against `_Identity`."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        for _ in range(10):
            g = g.view(g.shape)
        return g


class _LinearShaped(torch.autograd.Function):
    """The shape of our linear's node: six inputs (three tensors, three options), three saved
    tensors, three fresh gradients."""

    @staticmethod
    def forward(ctx, x, w, b, activation, rung, fallback):
        ctx.save_for_backward(x, w, b)
        ctx.rung = rung
        return torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)

    @staticmethod
    def backward(ctx, g):
        x, w, b = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w), torch.empty_like(b), None, None, None


def cases(device: str = "cuda") -> dict:
    import cute_kernels.nn as cnn

    x = torch.randn(64, 64, device=device, requires_grad=True)
    g = torch.randn(64, 64, device=device)
    m, n, k = 12608, 3072, 768
    xl = torch.randn(64, m // 64, k, device=device, dtype=torch.bfloat16, requires_grad=True)
    gl = torch.randn(64, m // 64, n, device=device, dtype=torch.bfloat16)
    stock = torch.nn.Linear(k, n, device=device, dtype=torch.bfloat16)
    ours = cnn.Linear.from_linear(stock)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, device=device, dtype=torch.bfloat16, requires_grad=True)
    x2 = xl.detach().view(m, k).requires_grad_()
    g2 = gl.view(m, n)
    return {
        "cpp_clone": lambda: torch.autograd.grad(x.clone(), x, g),
        "py_identity": lambda: torch.autograd.grad(_Identity.apply(x), x, g),
        "py_ten_views": lambda: torch.autograd.grad(_TenViews.apply(x), x, g),
        "py_linear_shaped": lambda: torch.autograd.grad(_LinearShaped.apply(x2, w, b, None, "auto", "none"),
                                                        (x2, w, b), g2),
        "stock_linear": lambda: torch.autograd.grad(stock(xl), (xl, *stock.parameters()), gl),
        "ours_linear": lambda: torch.autograd.grad(ours(xl), (xl, *ours.parameters()), gl),
    }


def primitives(device: str = "cuda") -> dict:
    """Single host operations the warm paths are made of, each timed alone."""
    x = torch.randn(64, 197, 3072, device=device, dtype=torch.bfloat16)
    xg = x.detach().requires_grad_()
    small = torch.randn(1024, device=device)
    return {
        "empty_3d": lambda: torch.empty((64, 197, 3072), dtype=torch.bfloat16, device=device),
        "empty_like": lambda: torch.empty_like(x),
        "view": lambda: x.view(12608, 3072),
        "mT": lambda: x.mT,
        "detach": lambda: xg.detach(),
        "is_contiguous": lambda: x.is_contiguous(),
        "stride": lambda: x.stride(),
        "data_ptr": lambda: x.data_ptr(),
        "sum0": lambda: x.view(12608, 3072).sum(0),
        "to_bf16_from_fp32_small": lambda: small.to(torch.bfloat16),
        "zeros_small": lambda: torch.zeros(1024, device=device),
    }


def main(argv=None) -> int:
    from cute_kernels.bench.overhead import cuda_busy_probe, make_host_timer

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    timer = make_host_timer(calls=args.calls, warmup=20, busy=cuda_busy_probe(), sync=torch.cuda.synchronize)
    rows = []
    for name, fn in primitives().items():
        us = sorted(timer(fn, name, calls=50) * 1e3 for _ in range(args.rounds))[args.rounds // 2]
        rows.append({"case": name, "host_us": round(us, 2)})
        print(f"{name:24s} {us:8.2f} us", flush=True)
    for name, fn in cases().items():
        for threads in (True, False):
            with torch.autograd.set_multithreading_enabled(threads):
                us = sorted(timer(fn, name) * 1e3 for _ in range(args.rounds))[args.rounds // 2]
            rows.append({"case": name, "device_threads": threads, "host_us": round(us, 1),
                         "drained": bool(timer.drained.get(name))})
            print(f"{name:20s} device threads {'on ' if threads else 'off'} {us:8.1f} us"
                  + ("  (drained)" if timer.drained.get(name) else ""), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
