"""Where a patched model's `generate` spends its host time: wall time of the stock and the
patched model's greedy generate (interleaved), then cProfile over the patched one's, per
decode step, and the same for stock.

    python3 scripts/generate_profile.py [--model llama_gqa] [--prompts 8] [--prompt-len 512]
                                        [--new-tokens 32] [--top 25] [--out FILE.json]

A decode step of a small model is host-bound (transformers syncs once per step to test its
stopping criteria), so every µs of host time an operator adds per call shows in tokens/s.
"""

from __future__ import annotations

import argparse
import cProfile
import copy
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import cute_kernels.nn as cnn  # noqa: E402
from cute_kernels.bench import model_specs  # noqa: E402


def _rows(stats: pstats.Stats, key: str, steps: int, top: int) -> list[dict]:
    out = []
    for (path, line, fn), (_, nc, tt, ct, _) in stats.stats.items():
        out.append({"fn": f"{Path(path).name}:{line}:{fn}", "calls_per_step": nc / steps,
                    "tottime_us": tt / steps * 1e6, "cumtime_us": ct / steps * 1e6})
    out.sort(key=lambda e: -e[key])
    return out[:top]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama_gqa")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path)
    a = p.parse_args()

    spec = model_specs.spec(a.model)
    stock = model_specs.build(spec).eval()
    ours = cnn.patch(copy.deepcopy(stock))
    ids = torch.randint(3, stock.config.vocab_size, (a.prompts, a.prompt_len), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))
    kw = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    models = {"stock": stock, "cute_kernels": ours}
    result = {"settings": vars(a) | {"out": str(a.out)}, "wall_ms": {}, "profile": {}}
    with torch.no_grad():
        for m in models.values():
            m.generate(ids, **kw)
        torch.cuda.synchronize()
        walls = {k: [] for k in models}
        for _ in range(3):
            for name, m in models.items():
                t0 = time.perf_counter()
                m.generate(ids, **kw)
                torch.cuda.synchronize()
                walls[name].append((time.perf_counter() - t0) * 1e3)
        for name, w in walls.items():
            result["wall_ms"][name] = sorted(w)[1]
            print(f"{name}: generate {sorted(w)[1]:.1f} ms ({a.new_tokens} new tokens)")
        for name, m in models.items():
            prof = cProfile.Profile()
            prof.enable()
            m.generate(ids, **kw)
            torch.cuda.synchronize()
            prof.disable()
            stats = pstats.Stats(prof)
            result["profile"][name] = {k: _rows(stats, k, a.new_tokens, a.top) for k in ("tottime_us", "cumtime_us")}
            for key in ("tottime_us", "cumtime_us"):
                print(f"\n{name}: top by {key} per decode step")
                for r in result["profile"][name][key]:
                    print(f"  {r['tottime_us']:9.1f} {r['cumtime_us']:9.1f} {r['calls_per_step']:7.1f}  {r['fn']}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
