"""Where the host time of a layer's warm call goes: cProfile over many calls of the overhead
suite's layer cases (`bench.overhead_layers`), the GPU kept busy so that no call waits for it.

    python3 scripts/host_profile.py [--cases norm_layer_vit_12608x768/fwd_bwd,...] [--calls 200]
                                    [--impl cute_kernels|stock] [--top 30] [--out FILE.json]

Prints, per case, the host µs per call and the functions with the most time of their own
(tottime) and in total (cumtime), per call; writes them as JSON with --out.

A backward of ours runs in autograd's device thread, which a profile of the calling thread sees
only as time inside `run_backward`. So a third pass times and profiles the inside of every
direct-path backward (`runtime.eager.EagerFunction.backward`) on the thread it runs on: what
is left of the call's host time is autograd's engine and the stock nodes around ours.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cute_kernels.bench.overhead_layers import layer_impls  # noqa: E402

DEFAULT = "norm_layer_vit_12608x768/fwd_bwd,norm_layer_vit_12608x768/fwd,sdpa_B64_H12_S197_D64/fwd_bwd"


def _rows(stats: pstats.Stats, key: str, calls: int, top: int) -> list[dict]:
    entries = []
    for (path, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():
        entries.append({"fn": f"{Path(path).name}:{line}:{fn}", "calls": nc / calls,
                        "tottime_us": tt / calls * 1e6, "cumtime_us": ct / calls * 1e6})
    entries.sort(key=lambda e: -e[key])
    return entries[:top]


def profile_case(case, impl, calls: int, top: int) -> dict:
    inputs = case.make_inputs("cuda")
    fn = impl.prepare(case, inputs).fn
    from cute_kernels.bench.overhead import cuda_busy_probe, make_host_timer

    timer = make_host_timer(calls=calls, warmup=20, busy=cuda_busy_probe(), sync=torch.cuda.synchronize)
    plain_us = timer(fn, case.name) * 1e3  # the overhead suite's figure
    # profiled calls run slower: a sleep of about a second keeps the GPU busy through them
    torch.cuda._sleep(2_000_000_000)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    row = {"case": case.name, "impl": impl.name, "host_us": round(plain_us, 1),
           "drained": bool(timer.drained.get(case.name)),
           "tottime": _rows(stats, "tottime_us", calls, top), "cumtime": _rows(stats, "cumtime_us", calls, top)}
    inner = _inner_backward(fn, calls, top)
    if inner is not None:
        row["backward"] = inner
    return row


def _inner_backward(fn, calls: int, top: int) -> dict | None:
    """Host µs per call spent inside direct-path backwards (timed unprofiled, then profiled on
    their own thread), or None when the case ran none."""
    import time

    from cute_kernels.runtime import eager

    original = eager.EagerFunction.__dict__["backward"]
    spent = [0.0, 0]
    prof = [None]

    def timed(ctx, *grads):
        t0 = time.perf_counter()
        if prof[0] is not None:
            prof[0].enable()
        try:
            return original.__func__(ctx, *grads)
        finally:
            if prof[0] is not None:
                prof[0].disable()
            spent[0] += time.perf_counter() - t0
            spent[1] += 1

    eager.EagerFunction.backward = staticmethod(timed)
    try:
        torch.cuda._sleep(2_000_000_000)
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        if not spent[1]:
            return None
        inner_us, nodes = spent[0] / calls * 1e6, spent[1] / calls
        prof[0] = cProfile.Profile()
        torch.cuda._sleep(2_000_000_000)
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    finally:
        eager.EagerFunction.backward = original
    stats = pstats.Stats(prof[0])
    return {"inner_us": round(inner_us, 1), "nodes_per_call": nodes,
            "tottime": _rows(stats, "tottime_us", calls, top), "cumtime": _rows(stats, "cumtime_us", calls, top)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default=DEFAULT)
    p.add_argument("--impl", default="cute_kernels")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    by_name = {case.name: (case, impls) for case, impls in layer_impls().items()}
    rows = []
    for name in args.cases.split(","):
        case, impls = by_name[name]
        row = profile_case(case, impls[args.impl], args.calls, args.top)
        rows.append(row)
        print(f"== {row['case']} [{row['impl']}]: {row['host_us']} us per call (unprofiled)")
        for key in ("tottime", "cumtime"):
            print(f"  by {key} (us per call):")
            for e in row[key]:
                print(f"    {e['tottime_us']:8.1f} {e['cumtime_us']:8.1f} {e['calls']:6.1f}x  {e['fn']}")
        inner = row.get("backward")
        if inner:
            print(f"  inside our backward: {inner['inner_us']} us per call ({inner['nodes_per_call']:g} nodes), by cumtime:")
            for e in inner["cumtime"]:
                print(f"    {e['tottime_us']:8.1f} {e['cumtime_us']:8.1f} {e['calls']:6.1f}x  {e['fn']}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
