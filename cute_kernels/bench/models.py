"""The `models` suite: real models (`model_specs`), stock against cute_kernels, in one process.

For each model: the stock model (random weights from its config, bf16) and a copy patched by
`cute_kernels.nn.patch`. Per mode, correctness first, then timing, interleaved:

- `train_eager`, `train_compiled`: one step, forward + loss + backward (no optimizer), eager or
  under torch.compile (each side compiled on its own). Checked: loss, logits and every
  gradient, by relative error against the stock side; `rel_err` is the worst of them.
- `infer_eager`, `infer_compiled`: the forward under no_grad; checked on the logits.
- `train_graphs`, `infer_graphs`: as the compiled modes, under
  `torch.compile(mode="reduce-overhead")`: the steps replay CUDA graphs, so the host's cost per
  step leaves the timing and the kernels alone compare (each call begins a new step of
  cudagraph trees; the checks read clones of its outputs).
- `generate`: greedy prefill + decode of `prompts` x `prompt_len` tokens, `new_tokens` new ones
  (KV cache). Checked by teacher forcing: ours generates with the stock tokens forced, and its
  logits at every step (prefill and decode kernels alike) are compared with stock's; the
  share of equal tokens in a free greedy run is recorded too (`token_agreement`), not judged
  (random weights make greedy decoding chaotic). `ms` is one whole generate; `tokens_per_s`.
- `cold`: the first training step (and for language models the first generate after it) in a
  fresh process with an empty compile cache (a new CUTE_KERNELS_CACHE_DIR), against stock's
  first step in a fresh process; then again after `precompile` filled a cache
  (`cold_train_precompiled`, ...), and with an empty cache and compile-ahead workers
  (`cold_train_ahead`: `runtime.compile_ahead`, on in that child whatever the parent's setting).
  Each record of ours names what its phase compiled (`kernels_compiled`, `compiled_keys`),
  loaded from the disk cache (`kernels_loaded`), waited for while another process compiled it
  (`kernels_waited`), and what the compile-ahead workers did (`ahead`).

Tolerance: bf16 differs from bf16 by rounding alone, so the bar is set per model from the
stock model's own distance to a float32 copy of itself (`rel_err_stock_vs_fp32`, measured on
the eager training step): ours passes when its distance to stock is within 4x that, or 1e-2.

Records (`records.Record`): case `<model>/<mode>`, impls `stock` (kind peer) and
`cute_kernels` (kind ours), `ms`, `rel_err`, `ok`; `ratio_to_best_peer` is stock ms / ours ms.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from cute_kernels.bench import model_specs
from cute_kernels.bench.records import BenchResult, Record

__all__ = ["MODES", "DEFAULT_MODES", "ModelsSettings", "run_models", "precompile"]

MODES = ("train_eager", "infer_eager", "train_compiled", "infer_compiled", "train_graphs", "infer_graphs", "generate",
         "cold")
_EAGER = ("train_eager", "infer_eager")
# What a plain `cute-kernels bench models` runs per model: ~5 minutes on an H200. torch.compile
# (tens of seconds per model and side) and cold starts (fresh processes) are spent where they
# say the most; --modes asks for any mode on any model.
DEFAULT_MODES = {
    "llama_gqa": (*_EAGER, "generate", "cold"),
    "llama_gqa_padded": _EAGER,
    "mistral_swa": _EAGER,
    "qwen2": _EAGER,
    "gpt_oss": _EAGER,
    "vit_b16": (*_EAGER, "train_compiled"),
    "eva02_b14": _EAGER,
}
TOLERANCE_FLOOR = 1e-2
TOLERANCE_FACTOR = 4.0


@dataclass(frozen=True)
class ModelsSettings:
    models: tuple[str, ...] = tuple(model_specs.SPECS)
    modes: tuple[str, ...] | None = None  # None: DEFAULT_MODES per model
    rounds: int = 3
    iters: int = 5
    warmup: int = 2
    prompts: int = 8
    prompt_len: int = 512
    new_tokens: int = 64
    seed: int = 0
    device: str = "cuda"
    size: str = "bench"  # "tiny" exercises the harness (CPU)
    fallback: str = "none"
    fuse_mlps: bool = False  # ours also gets `nn.fuse_gated_mlps` (SwiGLU in the gate/up GEMM's epilogue)

    def validate(self) -> None:
        for name in self.models:
            model_specs.spec(name)
        for mode in self.modes or ():
            if mode not in MODES:
                raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        if min(self.rounds, self.iters, self.prompts, self.prompt_len, self.new_tokens) < 1 or self.warmup < 0:
            raise ValueError("rounds, iters, prompts, prompt_len and new_tokens must be >= 1, warmup >= 0")

    def modes_for(self, name: str) -> tuple[str, ...]:
        modes = self.modes or DEFAULT_MODES.get(name, _EAGER)
        if not model_specs.spec(name).generates:
            modes = tuple(m for m in modes if m != "generate")
        return modes


# ---- one step of each mode --------------------------------------------------------------------

def _forward(spec, model, batch):
    """(loss, logits) of one forward."""
    import torch

    if spec.kind == "causal_lm":
        out = model(**batch, use_cache=False)
        return out.loss, out.logits
    logits = model(batch["x"])
    return torch.nn.functional.cross_entropy(logits.float(), batch["target"]), logits


def _train_step(spec, model, batch):
    model.zero_grad(set_to_none=True)
    loss, logits = _forward(spec, model, batch)
    loss.backward()
    return loss, logits


def _infer_step(spec, model, batch):
    import torch

    with torch.no_grad():
        return _forward(spec, model, batch)


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    den = float(b.norm())
    return float((a - b).norm()) / den if den > 0 else float((a - b).norm())


def _grads(model) -> dict:
    """{parameter name: its gradient}, a fused MLP's under the stock model's names (the gate
    and up gradients split out of the interleaved one), so every gradient is compared."""
    from cute_kernels.gemm.gated import split_gate_up
    from cute_kernels.nn import GatedMLP

    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    for name, m in model.named_modules():
        if isinstance(m, GatedMLP) and m.state_dict_names and m.gate_up.grad is not None:
            gate, up, down = m.state_dict_names
            out[f"{name}.{gate}.weight"], out[f"{name}.{up}.weight"] = split_gate_up(m.gate_up.grad.detach())
            if m.down.weight.grad is not None:
                out[f"{name}.{down}.weight"] = m.down.weight.grad.detach().clone()
    return out


def _errors(spec, ours, stock, batch, train: bool, step_ours, step_stock) -> dict:
    """{quantity: rel err of ours against stock}: loss, logits and (train) the worst gradient."""
    loss_s, logits_s = step_stock()
    grads_s = _grads(stock) if train else {}
    loss_o, logits_o = step_ours()
    real = batch.get("attention_mask")
    if real is not None:
        real = real.bool()
        logits_s, logits_o = logits_s[real], logits_o[real]
    errs = {"loss": _rel(loss_o, loss_s), "logits": _rel(logits_o, logits_s)}
    if train:
        grads_o = _grads(ours)
        common = grads_s.keys() & grads_o.keys()
        if not common:
            raise RuntimeError("no gradients to compare")
        worst = max(common, key=lambda n: _rel(grads_o[n], grads_s[n]))
        errs["grad"], errs["worst_grad"] = _rel(grads_o[worst], grads_s[worst]), worst
    return errs


def _worst(errs: dict) -> float:
    return max(v for k, v in errs.items() if isinstance(v, float))


# ---- timing -------------------------------------------------------------------------------------

def _event_timer(iters: int, device: str):
    """timer(fn, label) -> mean ms per call over `iters` calls (CUDA events; wall clock on CPU)."""
    import torch

    def timer(fn: Callable[[], object], label: str = "") -> float:
        if device == "cpu":
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - t0) * 1e3 / iters
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters

    timer.backend = "cuda events, mean of iters per round" if device != "cpu" else "wall clock"  # type: ignore
    return timer


def _timed(fns: dict, settings: ModelsSettings, iters: int | None = None) -> dict:
    from cute_kernels.bench.timing import interleaved

    for fn in fns.values():
        for _ in range(settings.warmup):
            fn()
    return interleaved(fns, _event_timer(iters or settings.iters, settings.device), settings.rounds)


_DTYPE_NAME = {"cpu": "fp32"}  # what `_dtype` builds on each device; bf16 elsewhere
_RECORD_DTYPE = ["bf16"]  # the running suite's (set by run_models)


def _record(case: str, impl: str, ms, rel_err, ok: bool, error=None, **extra) -> Record:
    return Record(case=case, impl=impl, dtype=_RECORD_DTYPE[0], tflops=0.0 if ms is not None else None, ms=ms,
                  rel_err=rel_err if rel_err is None or math.isfinite(rel_err) else None, ok=ok,
                  kind="ours" if impl == "cute_kernels" else "peer", error=error,
                  extra={k: v for k, v in extra.items() if v is not None})


def _pair_records(case: str, timings: dict, err: float | None, ok: bool, tolerance: float | None, **extra):
    out = []
    for impl in ("stock", "cute_kernels"):
        t = timings.get(impl)
        ours = impl == "cute_kernels"
        r = _record(case, impl, t.median if t else None, err if ours else 0.0, ok or not ours,
                    **(extra if ours else {}))
        if t is not None:
            r.p20_ms, r.p80_ms, r.spread, r.rounds = t.p20, t.p80, t.spread, len(t.samples)
        r.tolerance = tolerance if ours else None
        out.append(r)
    return out


# ---- the modes ----------------------------------------------------------------------------------

@dataclass
class _Model:
    spec: object
    stock: object
    ours: object
    batch: dict
    tolerance: float = TOLERANCE_FLOOR
    stock_fp32_err: dict = field(default_factory=dict)


def _fp32_distance(m: _Model, settings: ModelsSettings) -> dict:
    """The stock model's distance to a float32 copy of itself on the eager training step."""
    import torch

    ref = copy.deepcopy(m.stock).float()
    batch = {k: (v.float() if v.is_floating_point() else v) for k, v in m.batch.items()}
    errs = _errors(m.spec, m.stock, ref, m.batch, True, lambda: _train_step(m.spec, m.stock, m.batch),
                   lambda: _train_step(m.spec, ref, batch))
    del ref
    if settings.device != "cpu":
        torch.cuda.empty_cache()
    return errs


def _step_mode(m: _Model, mode: str, settings: ModelsSettings, log) -> list[Record]:
    import torch

    case = f"{m.spec.name}/{mode}"
    train = mode.startswith("train")
    step = _train_step if train else _infer_step
    stock, ours = m.stock, m.ours
    graphs = mode.endswith("graphs")
    if graphs or mode.endswith("compiled"):
        torch._dynamo.reset()
        kw = {"mode": "reduce-overhead"} if graphs else {}
        stock, ours = torch.compile(m.stock, **kw), torch.compile(m.ours, **kw)
    fns = {"stock": lambda: step(m.spec, stock, m.batch), "cute_kernels": lambda: step(m.spec, ours, m.batch)}
    checks = fns
    if graphs:
        fns = {impl: _graph_step(fn) for impl, fn in fns.items()}
        checks = {impl: _cloned(fn) for impl, fn in fns.items()}
    try:
        errs = _errors(m.spec, m.ours, m.stock, m.batch, train, checks["cute_kernels"], checks["stock"])
    except Exception as exc:  # noqa: BLE001 - a failure of ours is a record, not a crash
        log(f"  {case}: cute_kernels FAILED: {type(exc).__name__}: {exc}")
        return [_record(case, "cute_kernels", None, None, False, f"{type(exc).__name__}: {exc}")]
    err = _worst(errs)
    ok = err <= m.tolerance
    log(f"  {case}: rel_err {err:.2e} (tolerance {m.tolerance:.1e}) {'ok' if ok else 'FAILED'} {errs}")
    timings = _timed(fns, settings) if ok else _timed({"stock": fns["stock"]}, settings)
    details = {f"rel_err_{k}": v for k, v in errs.items()}
    return _pair_records(case, timings, err, ok, m.tolerance,
                         error=None if ok else f"rel_err {err:.3g} above tolerance {m.tolerance:.3g}", **details)


def _graph_step(fn):
    """`fn` as one step of CUDA-graph replays: it begins a new step of cudagraph trees (the
    previous step's outputs, which the next replay overwrites, are not read again)."""
    import torch

    def step():
        torch.compiler.cudagraph_mark_step_begin()
        return fn()
    return step


def _cloned(fn):
    """`fn` with its outputs cloned, for the checks: another graph's replay may overwrite them."""
    def step():
        return tuple(t.detach().clone() for t in fn())
    return step


class _Forced:
    """A logits processor that forces the given tokens (the model's raw logits are read from
    generate's `output_logits`)."""

    def __init__(self, tokens, start: int):
        self.tokens, self.start = tokens, start

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.start
        forced = scores.new_full(scores.shape, float("-inf"))
        forced.scatter_(1, self.tokens[:, step:step + 1], 0.0)
        return forced


def _generate_mode(m: _Model, settings: ModelsSettings, log) -> list[Record]:
    import torch

    from cute_kernels.integrations import graph_decode

    case = f"{m.spec.name}/generate"
    vocab = m.stock.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(settings.seed + 7)
    ids = torch.randint(3, vocab, (settings.prompts, settings.prompt_len), generator=gen).to(settings.device)
    n = settings.new_tokens
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    m.stock.eval(), m.ours.eval()
    try:
        with torch.no_grad():
            want = m.stock.generate(ids, output_logits=True, return_dict_in_generate=True, **kw)
            forced = _Forced(want.sequences[:, ids.shape[1]:], ids.shape[1])
            got = m.ours.generate(ids, logits_processor=[forced], output_logits=True, return_dict_in_generate=True,
                                  **kw)
            err = _rel(torch.stack([s.float() for s in got.logits]), torch.stack([s.float() for s in want.logits]))
            decode = graph_decode.decode_path(got.past_key_values)
            free = m.ours.generate(ids, **kw)
        agreement = float((free[:, ids.shape[1]:] == want.sequences[:, ids.shape[1]:]).float().mean())
        ok = err <= m.tolerance
        log(f"  {case}: teacher-forced logits rel_err {err:.2e} {'ok' if ok else 'FAILED'}, "
            f"greedy token agreement {agreement:.1%}, decode steps {decode}")
        gen_fns = {"stock": lambda: m.stock.generate(ids, **kw), "cute_kernels": lambda: m.ours.generate(ids, **kw)}
        with torch.no_grad():
            timings = _timed(gen_fns if ok else {"stock": gen_fns["stock"]},
                             ModelsSettings(**{**asdict(settings), "warmup": 1, "rounds": min(settings.rounds, 2)}),
                             iters=1)
    except Exception as exc:  # noqa: BLE001
        log(f"  {case}: FAILED: {type(exc).__name__}: {exc}")
        return [_record(case, "cute_kernels", None, None, False, f"{type(exc).__name__}: {exc}")]
    finally:
        m.stock.train(), m.ours.train()
    records = _pair_records(case, timings, err, ok, m.tolerance, token_agreement=agreement, decode=decode,
                            error=None if ok else f"teacher-forced logits rel_err {err:.3g} above {m.tolerance:.3g}")
    for r in records:
        if r.ms:
            r.extra["tokens_per_s"] = settings.prompts * n / (r.ms / 1e3)
    return records


# ---- cold start (fresh processes) --------------------------------------------------------------

def _child(args: list[str], cache_dir: str, timeout: float = 900.0, env: dict | None = None) -> dict:
    env = {**os.environ, "CUTE_KERNELS_CACHE_DIR": cache_dir, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "cute_kernels.bench.models", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return json.loads(lines[-1])


def _cold_mode(m: _Model, settings: ModelsSettings, log) -> list[Record]:
    name = m.spec.name
    base = ["--child", "cold", "--model", name, "--size", settings.size, "--device", settings.device]
    records = []
    with tempfile.TemporaryDirectory(prefix="cute_kernels_cold_") as root:
        try:
            stock = _child([*base, "--impl", "stock"], os.path.join(root, "stock"))
            cold = _child([*base, "--impl", "cute_kernels"], os.path.join(root, "empty"))
            ahead = _child([*base, "--impl", "cute_kernels"], os.path.join(root, "ahead"), env=_with_compile_ahead())
            filled = os.path.join(root, "filled")
            pre = _child(["--child", "precompile", "--model", name, "--size", settings.size, "--device",
                          settings.device], filled)
            warm = _child([*base, "--impl", "cute_kernels"], filled)
        except Exception as exc:  # noqa: BLE001
            log(f"  {name}/cold: FAILED: {exc}")
            return [_record(f"{name}/cold_train", "cute_kernels", None, None, False, str(exc))]
    for what in ("train", "generate"):
        if f"{what}_ms" not in stock:
            continue
        for suffix, ours, note in (("", cold, "empty compile cache"),
                                   ("_ahead", ahead, "empty compile cache, compile-ahead workers (runtime.compile_ahead)"),
                                   ("_precompiled", warm, "after precompile")):
            case = f"{name}/cold_{what}{suffix}"
            records.append(_record(case, "stock", stock[f"{what}_ms"], 0.0, True, note="fresh process"))
            records.append(_record(case, "cute_kernels", ours[f"{what}_ms"], None, True, note=note,
                                   kernels_compiled=ours.get(f"{what}_compiled"),
                                   kernels_loaded=ours.get(f"{what}_loaded"),
                                   kernels_waited=ours.get(f"{what}_waited"),
                                   compiled_keys=ours.get(f"{what}_compiled_keys"),
                                   ahead=ours.get(f"{what}_ahead")))
        log(f"  {name}/cold_{what}: stock {stock[f'{what}_ms']:.0f} ms, ours {cold[f'{what}_ms']:.0f} ms "
            f"(empty cache), {ahead[f'{what}_ms']:.0f} ms with compile-ahead, {warm[f'{what}_ms']:.0f} ms after "
            f"precompile ({pre.get('seconds', 0):.1f} s)")
    return records


def _with_compile_ahead() -> dict:
    """The environment of a child with the `compile_ahead` path on too."""
    from cute_kernels.runtime import unverified

    return {"CUTE_KERNELS_UNVERIFIED": ",".join(sorted(unverified.ENABLED | {"compile_ahead"}))}


def _first_step_child(name: str, impl: str, size: str, device: str) -> dict:
    """In a fresh process: build, then time the first training step (and first generate)."""
    from cute_kernels.runtime import cache

    spec = model_specs.spec(name)
    model = model_specs.build(spec, size=size, device=device, dtype=_dtype(device))
    batch = model_specs.make_batch(spec, size=size, device=device, dtype=_dtype(device))
    if impl == "cute_kernels":
        import cute_kernels.nn as cnn

        cnn.patch(model, fallback="torch" if device == "cpu" else "none")
    since = {"compiled": cache.stats["compiled"], "disk_loaded": cache.stats["disk_loaded"],
             "waited": cache.stats["waited"], "log": len(cache.compiled_log)}
    result = {"train_ms": _wall(lambda: _train_step(spec, model, batch), device)}
    _cache_counts(result, "train", cache, since)
    if spec.generates:
        model.eval()
        result["generate_ms"] = _wall(lambda: _short_generate(model, batch["input_ids"]), device)
        _cache_counts(result, "generate", cache, since)
    return result


# The first generate of a cold start (and of `precompile`'s trace): prompts x tokens, new tokens.
# The precompile trace makes the calls the measured run makes, as a user precompiles for the
# shapes they serve (a new length class picks other tile configs, hence other kernels).
COLD_GENERATE = (2, 128, 8)


def _short_generate(model, input_ids):
    import torch

    prompts, length, new = COLD_GENERATE
    ids = input_ids[:prompts, :length]
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                              attention_mask=torch.ones_like(ids))


def _cache_counts(result: dict, phase: str, cache, since: dict) -> None:
    """The compile cache's counts of `phase` into `result`: kernels compiled and loaded from disk
    since `since` (the counts after the previous phase, updated here), and the keys of those
    compiled (`cache.compiled_log`)."""
    from cute_kernels.runtime import compile_ahead

    result[f"{phase}_compiled"] = cache.stats["compiled"] - since["compiled"]
    result[f"{phase}_loaded"] = cache.stats["disk_loaded"] - since["disk_loaded"]
    result[f"{phase}_waited"] = cache.stats["waited"] - since["waited"]
    result[f"{phase}_compiled_keys"] = cache.compiled_log[since["log"]:]
    result[f"{phase}_ahead"] = compile_ahead.counts()  # the workers' totals so far
    since.update(compiled=cache.stats["compiled"], disk_loaded=cache.stats["disk_loaded"],
                 waited=cache.stats["waited"], log=len(cache.compiled_log))


def _wall(fn, device: str) -> float:
    import torch

    if device != "cpu":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device != "cpu":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _dtype(device: str):
    import torch

    return torch.float32 if device == "cpu" else torch.bfloat16


# ---- precompile ----------------------------------------------------------------------------------

def precompile(name: str | None = None, *, config: str | None = None, batch: int | None = None,
               seq: int | None = None, size: str = "bench", device: str = "cuda", generate: bool = True,
               log=print) -> dict:
    """Fill the compile cache (memory and $CUTE_KERNELS_CACHE_DIR) with every kernel a model
    runs, by a short trace: one training step and a short generate (`COLD_GENERATE`, the first
    generate the cold-start mode times) of the model patched by `cute_kernels.nn.patch`, at its
    shapes. `name` is a suite model (`model_specs`); `config`
    instead is a transformers config (a config.json file, or a directory holding one; read
    locally), trained at `batch` x `seq` tokens. Kernels are compiled for dynamic sizes, so other
    lengths reuse them. Returns {"seconds", "compiled", "disk_loaded", "disk_stored"}."""
    import torch

    import cute_kernels.nn as cnn
    from cute_kernels.runtime import cache

    t0 = time.perf_counter()
    if config is not None:
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(config, local_files_only=True)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=_dtype(device))
        spec = model_specs.ModelSpec("config", "transformers", "causal_lm", str(config), batch=batch or 1,
                                     seq=seq or 512)
        ids = torch.randint(0, cfg.vocab_size, (spec.batch, spec.seq), device=device)
        inputs = {"input_ids": ids, "labels": ids}
    else:
        spec = model_specs.spec(name)
        model = model_specs.build(spec, size=size, device=device, dtype=_dtype(device))
        inputs = model_specs.make_batch(spec, size=size, device=device, dtype=_dtype(device))
    cnn.patch(model, fallback="torch" if device == "cpu" else "none")
    _train_step(spec, model.train(), inputs)
    if generate and spec.generates:
        model.eval()
        _short_generate(model, inputs["input_ids"])
    if device != "cpu":
        torch.cuda.synchronize()
    out = {"seconds": time.perf_counter() - t0, **{k: cache.stats[k] for k in ("compiled", "disk_loaded",
                                                                                 "disk_stored")}}
    log(f"precompile {name or config}: {out['compiled']} kernels compiled, {out['disk_loaded']} loaded from the "
        f"cache, {out['disk_stored']} stored under {cache.cache_dir()} in {out['seconds']:.1f} s")
    return out


# ---- the suite ----------------------------------------------------------------------------------

def _build(name: str, settings: ModelsSettings) -> _Model:
    import cute_kernels.nn as cnn

    spec = model_specs.spec(name)
    dtype = _dtype(settings.device)
    stock = model_specs.build(spec, size=settings.size, device=settings.device, dtype=dtype, seed=settings.seed)
    ours = copy.deepcopy(stock)
    cnn.patch(ours, fallback=settings.fallback)
    if settings.fuse_mlps:
        cnn.fuse_gated_mlps(ours, fallback=settings.fallback)
    batch = model_specs.make_batch(spec, size=settings.size, device=settings.device, seed=settings.seed, dtype=dtype)
    return _Model(spec, stock, ours, batch)


def run_models(settings: ModelsSettings, *, log: Callable[[str], None] | None = None,
               progress: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """Run the suite (module docstring); `progress` gets the result after each model."""
    import torch

    from cute_kernels.bench import environment

    settings.validate()
    _RECORD_DTYPE[0] = _DTYPE_NAME.get(settings.device, "bf16")
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    now = _dt.datetime.now(_dt.timezone.utc)
    result = BenchResult(date=now.strftime("%Y-%m-%d"), timestamp=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                         device=environment.device_name(settings.device),
                         versions=_versions(environment.versions(settings.device)), suite="models", records=[],
                         settings={**asdict(settings), "tolerance": f"max({TOLERANCE_FACTOR:g} x stock vs fp32, "
                                                                  f"{TOLERANCE_FLOOR:g})"}, complete=False)
    for name in settings.models:
        modes = settings.modes_for(name)
        log(f"[models] {name}: {', '.join(modes)}")
        started = time.perf_counter()
        try:
            m = _build(name, settings)
            m.stock_fp32_err = _fp32_distance(m, settings)
            m.tolerance = max(TOLERANCE_FACTOR * _worst(m.stock_fp32_err), TOLERANCE_FLOOR)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be built is skipped, said so
            result.skipped.append({"case": f"{name}/*", "impl": "*", "reason": f"{type(exc).__name__}: {exc}"})
            log(f"  skip {name}: {type(exc).__name__}: {exc}")
            continue
        for mode in modes:
            if mode == "generate":
                recs = _generate_mode(m, settings, log)
            elif mode == "cold":
                recs = _cold_mode(m, settings, log)
            else:
                recs = _step_mode(m, mode, settings, log)
            for r in recs:
                if r.impl == "cute_kernels":
                    r.extra.setdefault("rel_err_stock_vs_fp32", _worst(m.stock_fp32_err))
            result.records += recs
        from cute_kernels.bench.runner import fill_ratios

        fill_ratios(result.records)
        del m
        torch._dynamo.reset()
        if settings.device != "cpu":
            torch.cuda.empty_cache()
        log(f"  {name}: {time.perf_counter() - started:.0f} s")
        if progress is not None:
            progress(result)
    result.complete = True
    return result


def _versions(base: dict) -> dict:
    from importlib import metadata

    out = dict(base)
    for dist in ("transformers", "timm"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


def _child_main(argv: list[str]) -> int:
    """`python -m cute_kernels.bench.models --child cold|precompile ...`: one fresh-process
    measurement, printed as a JSON line (what `_cold_mode` reads)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m cute_kernels.bench.models")
    p.add_argument("--child", choices=("cold", "precompile"), required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--impl", choices=("stock", "cute_kernels"), default="cute_kernels")
    p.add_argument("--size", default="bench")
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    if a.child == "cold":
        out = _first_step_child(a.model, a.impl, a.size, a.device)
    else:
        out = precompile(a.model, size=a.size, device=a.device, log=lambda line: print(line, file=sys.stderr))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
