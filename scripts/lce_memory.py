"""Where fused linear + cross-entropy's peak memory goes (GPU).

The fused suite measured our linear_cross_entropy at 2132 MiB above its inputs against Liger's
1129 MiB (8192 x 4096 -> 128256, bf16): Liger's is dW + dx + one chunk of logits, ours one
weight-sized buffer more. This runs one forward + backward as the suite does with the CUDA
allocator's history on, and prints the blocks alive at the peak, largest first, each with the
Python frames that allocated it.

    python scripts/lce_memory.py [--tokens 8192 --hidden 4096 --vocab 128256] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    import torch

    from cute_kernels.nn import fused_functional as ff

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(args.vocab, args.hidden, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.tokens,), device="cuda")

    def step():
        loss = ff.linear_cross_entropy(x, w, labels, check_labels=False)
        return (loss, *torch.autograd.grad(loss, (x, w)))

    step()  # compile and warm the allocator
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    out = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    del out

    # replay the trace to the moment of the peak: the blocks alive then
    alive, best, at_peak, now = {}, -1, {}, 0
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            alive[event["addr"]] = event
            now += event["size"]
        elif event["action"] == "free_completed" and event["addr"] in alive:
            now -= alive.pop(event["addr"])["size"]
        if now > best:
            best, at_peak = now, dict(alive)
    rows = sorted(at_peak.values(), key=lambda e: -e["size"])
    print(f"peak above the inputs: {peak / 2**20:.1f} MiB; blocks allocated in the step and alive at its peak:")
    report = []
    for e in rows[:12]:
        frames = [f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in e.get("frames", [])
                  if "python" not in f["filename"] or "cute_kernels" in f["filename"]][:8]
        print(f"  {e['size'] / 2**20:9.1f} MiB  " + " <- ".join(frames))
        report.append({"mib": e["size"] / 2**20, "frames": frames})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"peak_mib": peak / 2**20, "blocks": report}, f, indent=1)


if __name__ == "__main__":
    main()
