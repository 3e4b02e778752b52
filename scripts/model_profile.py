"""Where a patched model's time goes: each part of `nn.patch` alone, and the kernels of a step.

    python3 scripts/model_profile.py [--models vit_b16,llama_gqa_padded] [--stack] [--out FILE.json]

For each model of the models suite (bench size, bf16): the infer and train steps of the stock
model and of copies patched with everything, linear layers only, norms only and attention only,
timed in one process (CUDA events, interleaved rounds, `bench.models`' steps); then one profiled
infer and one train step of stock and of the full patch: the top CUDA kernels by total time, the aten ops
that launched GPU time (with their input shapes), the step's summed kernel time against its wall
time, and where the GPU idled within it (`bench.timeline`: each gap charged to the host op, and
with --stack the Python frame, that launched the kernel ending it), the warm caches that still
stored something during the profiled step (calls that took the checked path), the eager
entries' keys that call the op every time and how our op bodies' calls went (replayed or
not, `runtime.eager.inside`); and each variant's host time per step (the GPU kept
busy, so the step only queues: a host time near the GPU time is a host-bound step).
Prints the tables; writes them as JSON with --out."""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.bench import model_specs  # noqa: E402
from cute_kernels.bench.models import _event_timer, _infer_step, _train_step  # noqa: E402
from cute_kernels.bench.timing import interleaved  # noqa: E402

VARIANTS = {  # name: nn.patch options (None: the stock model)
    "stock": None,
    "patched": {},
    "linear_only": dict(sdpa=False, norms=False),
    "norms_only": dict(linear=False, sdpa=False),
    "sdpa_only": dict(linear=False, norms=False),
}


def _use_op_keys() -> dict:
    """{eager entry: keys whose plan is "call the op"}: calls that take the op's checked body
    every time (in eager mode and, through `runtime.eager.inside`, in compiled graphs)."""
    from cute_kernels.runtime import eager

    out = {}
    for name, entry in eager._ENTRIES.items():
        n = sum(1 for plan in entry.plans.values() if plan is eager.USE_OP)
        if n:
            out[name] = n
    return out


def _count_inside():
    """Wrap `runtime.eager.inside` (what our op bodies call) to count, per entry, how each call
    went: "plan" (replayed), "record" (ran the body and recorded), "use_op" (ran the body: the
    key's plan is the op), "no_key" (ran the body: a call that cannot have a key) or "grad" (ran
    the body: autograd recorded); returns (counts, undo)."""
    from collections import Counter

    from cute_kernels.runtime import eager

    counts, original = Counter(), eager.inside

    def counted(name, body, args):
        entry = eager._ENTRIES.get(name)
        key = None if entry is None else eager.call_key(args)
        if key is None:
            how = "no_key"
        elif key[-1]:
            how = "grad"
        else:
            plan = entry.plans.get(key)
            how = "record" if plan is None else "use_op" if plan is eager.USE_OP else "plan"
        counts[name, how] += 1
        return original(name, body, args)

    eager.inside = counted
    return counts, lambda: setattr(eager, "inside", original)


def _profile(step, stack: bool = False) -> dict:
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from cute_kernels.bench.timeline import format_gaps, gpu_gaps
    from cute_kernels.runtime.plan_cache import cache_activity

    step()
    torch.cuda.synchronize()
    before = cache_activity()
    inside, undo = _count_inside()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stack) as prof:
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - t0) * 1e3
    finally:
        undo()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name[:90], [0.0, 0])
            k[0] += e.device_time_total / 1e3 if hasattr(e, "device_time_total") else e.cuda_time_total / 1e3
            k[1] += 1
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:18]
    # which CPU ops (with their input shapes) launched the GPU time: copies and casts show here
    ops = []
    for e in prof.key_averages(group_by_input_shape=True):
        dev = getattr(e, "self_device_time_total", 0) / 1e3
        if dev > 0 and e.key.startswith("aten::"):
            ops.append({"op": e.key, "shapes": str(e.input_shapes)[:120], "self_ms": round(dev, 4), "calls": e.count})
    ops.sort(key=lambda o: -o["self_ms"])
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        gaps = gpu_gaps(json.loads(Path(f.name).read_text()))
    # a warm step should store nothing: each cache listed took the checked path during it
    stored = cache_activity(before)
    return {"cold_caches": stored, "use_op_keys": _use_op_keys(),
            "op_bodies": {f"{name}:{how}": n for (name, how), n in sorted(inside.items())},
            "wall_ms": round(wall_ms, 3), "kernel_ms": round(sum(v[0] for v in kernels.values()), 3),
            "gaps": format_gaps(gaps), "idle_ms": round(gaps.idle_us / 1e3, 3),
            "launches": sum(v[1] for v in kernels.values()),
            "top": [{"kernel": n, "ms": round(v[0], 4), "calls": v[1]} for n, v in top], "aten": ops[:16]}


def _host_ms(step, reps: int = 3) -> str:
    """Host time of one step (`bench.overhead`'s method: the GPU given a long sleep first, so
    the step only queues); the median of `reps` steps, marked with how many of them outlasted
    the sleep (the host then waited on the GPU somewhere, a full launch queue for instance, and
    the figure is not host work alone)."""
    from cute_kernels.bench.overhead import cuda_busy_probe, make_host_timer

    timer = make_host_timer(calls=1, warmup=0, busy=cuda_busy_probe(), sync=torch.cuda.synchronize)
    times = sorted(timer(step, "step") for _ in range(reps))
    drained = timer.drained.get("step", 0)
    return f"{times[len(times) // 2]:.2f}" + (f" (drained {drained}/{reps})" if drained else "")


def run(name: str, rounds: int, iters: int, stack: bool = False, compiled: bool = False) -> dict:
    spec = model_specs.spec(name)
    stock = model_specs.build(spec, device="cuda", dtype=torch.bfloat16)
    batch = model_specs.make_batch(spec, device="cuda", dtype=torch.bfloat16)
    models = {}
    for variant, options in VARIANTS.items():
        if compiled and variant not in ("stock", "patched"):
            continue
        m = stock if options is None else cnn.patch(copy.deepcopy(stock), **options)
        models[variant] = m
    out = {"model": name, "patch": repr(models["patched"].cute_kernels_patch)}
    if compiled:  # each side compiled on its own, as the models suite's *_compiled modes
        from torch._dynamo.utils import counters

        counters.clear()
        models = {v: torch.compile(m) for v, m in models.items()}
    for mode, step in (("infer", _infer_step), ("train", _train_step)):
        fns = {v: (lambda m=m, step=step: step(spec, m, batch)) for v, m in models.items()}
        for fn in fns.values():
            fn(), fn()
        t = interleaved(fns, _event_timer(iters, "cuda"), rounds)
        out[mode] = {v: round(t[v].median, 3) for v in fns}
        out[f"{mode}_host"] = {v: _host_ms(fn) for v, fn in fns.items()}
        print(f"{name} {mode}: " + ", ".join(f"{v} {ms:.2f} ms" for v, ms in out[mode].items()), flush=True)
        print(f"{name} {mode} host only: " + ", ".join(f"{v} {ms} ms" for v, ms in out[f'{mode}_host'].items()),
              flush=True)
    if compiled:
        out["graph_breaks"] = {str(k): v for k, v in counters["graph_break"].items()}
        out["recompiles"] = dict(counters["recompiles"]) if "recompiles" in counters else {}
        print(f"{name} compiled: graph breaks {out['graph_breaks']}, {dict(counters['stats'])}", flush=True)
    for mode, step in (("infer", _infer_step), ("train", _train_step)):
        for variant in ("stock", "patched"):
            prof = _profile(lambda m=models[variant], step=step: step(spec, m, batch), stack)
            out[f"profile_{mode}_{variant}"] = prof
            print(f"{name} {mode} {variant}: wall {prof['wall_ms']} ms, kernels {prof['kernel_ms']} ms, "
                  f"{prof['launches']} launches")
            print(prof["gaps"])
            print(f"    caches that stored during this warm step (checked calls): {prof['cold_caches'] or 'none'}; "
                  f"eager keys that call the op every time: {prof['use_op_keys'] or 'none'}")
            print(f"    op bodies (runtime.eager.inside) by outcome: {prof['op_bodies'] or 'none'}")
            for k in prof["top"]:
                print(f"    {k['ms']:8.3f} ms {k['calls']:5d}x  {k['kernel']}")
            for o in prof["aten"]:
                print(f"    aten {o['self_ms']:8.3f} ms {o['calls']:5d}x  {o['op']} {o['shapes']}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="vit_b16,llama_gqa_padded")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", type=Path)
    p.add_argument("--compiled", action="store_true", help="stock and the full patch, each under torch.compile "
                                                           "(graph breaks reported)")
    p.add_argument("--stack", action="store_true", help="record Python frames in the profiled steps (gaps are "
                                                        "then charged to frames too; the host runs slower)")
    args = p.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        try:
            rows.append(run(name, args.rounds, args.iters, args.stack, args.compiled))
        except Exception as err:  # noqa: BLE001 - the other models still run; the row says why
            print(f"{name}: {type(err).__name__}: {err}", flush=True)
            rows.append({"model": name, "error": f"{type(err).__name__}: {err}"[:500]})
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
