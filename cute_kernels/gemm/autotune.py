"""The opt-in autotuner of the Hopper GEMM rungs, and its on-disk table of winners.

`pick_config` (sm90_config) is a heuristic; `autotune` searches the configs around it and
stores the fastest correct one. Definitions:

search space: every `Sm90GemmConfig` with tile (M x N) in 128x256, 256x128, 128x128, 128x64,
    64x128; cluster 1x1, 2x1, 1x2; schedule cooperative or pingpong; stages = the most that fit
    in shared memory, and one fewer; raster/swizzle ("m", 1) or ("n", 8). A combination enters
    only if `validate()` and `resolved_stages()` accept it (and, for fp8 without fast
    accumulation, `fp8_promotion_fits()`); `search_space` returns the rejected ones with the
    reason, and no rejected config is ever compiled or timed.
winner key: (rung name, a/b/out dtypes, a/b majors, epilogue kind) plus a shape. A winner is
    stored twice: under its exact (M, N, K) and under its bucket, each of M, N, K rounded up to
    a power of two (at least 64); a lookup tries the exact shape, then the bucket, so 4000 x
    4096 x 4096 reuses the winner tuned at 4096^3 (bucket 4096 x 4096 x 4096) until it is tuned
    itself. The later tuning of a shape in a bucket overwrites the bucket entry.
file: cache_dir()/autotune/<arch>-dsl<version>.json, written atomically (a temporary file in
    the same folder, then os.replace); one process's save merges what is on disk first. A file
    that does not parse is ignored (with a warning) and replaced at the next save.

Opt-in: with CUTE_KERNELS_AUTOTUNE=1 a rung called with no config tunes each new bucket on its
first call (then uses the winner); without it the rung only reads stored winners. The file is
read once per process; a warm call costs at most two dict lookups and reads no file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cute_kernels.gemm.sm90_config import Sm90GemmConfig

TILES = ((128, 256), (256, 128), (128, 128), (128, 64), (64, 128))
CLUSTERS = ((1, 1), (2, 1), (1, 2))
RASTERS = (("m", 1), ("n", 8))
ENV = "CUTE_KERNELS_AUTOTUNE"
FORMAT_VERSION = 1

_BITS = {"torch.bfloat16": 16, "torch.float16": 16, "torch.float32": 32, "torch.float8_e4m3fn": 8,
         "torch.float8_e5m2": 8}


# --- search space -------------------------------------------------------------------------

def search_space(in_bytes: int = 2, out_bits: int = 16, fp8_fast_accum: bool = False
                 ) -> tuple[list[Sm90GemmConfig], list[tuple[Sm90GemmConfig, str]]]:
    """(candidates, rejected): every valid config of the search space (module docstring), in a
    fixed order, and each excluded combination with the error that excluded it.

    Post-condition: every candidate passes `validate()` and `resolved_stages(in_bytes, out_bits)`
    with its explicit `stages`; no two candidates are equal.
    """
    tile_k = 128 if in_bytes == 1 else 64
    kept: list[Sm90GemmConfig] = []
    rejected: list[tuple[Sm90GemmConfig, str]] = []
    for (tm, tn) in TILES:
        for (cm, cn) in CLUSTERS:
            for schedule in ("cooperative", "pingpong"):
                for raster, swizzle in RASTERS:
                    base = Sm90GemmConfig(tile_m=tm, tile_n=tn, tile_k=tile_k, cluster_m=cm, cluster_n=cn,
                                          schedule=schedule, raster=raster, swizzle=swizzle,
                                          fp8_fast_accum=fp8_fast_accum if in_bytes == 1 else False)
                    try:
                        fit = base.validate().resolved_stages(in_bytes, out_bits)
                        if in_bytes == 1 and not fp8_fast_accum and not base.fp8_promotion_fits():
                            raise ValueError("fp8 promotion's two accumulators do not fit a consumer's registers")
                    except ValueError as err:
                        rejected.append((base, str(err)))
                        continue
                    for stages in (fit, fit - 1):
                        cfg = dataclasses.replace(base, stages=stages)
                        try:
                            cfg.validate().resolved_stages(in_bytes, out_bits)
                        except ValueError as err:
                            rejected.append((cfg, str(err)))
                            continue
                        kept.append(cfg)
    return kept, rejected


# --- keys -----------------------------------------------------------------------------------

def bucket(m: int, n: int, k: int) -> tuple[int, int, int]:
    """The shape bucket of M x N x K: each rounded up to a power of two, at least 64."""
    return tuple(max(64, 1 << max(0, int(x) - 1).bit_length()) for x in (m, n, k))


def epilogue_kind(spec) -> str:
    """A short name of an EpilogueSpec's terms, e.g. "plain", "c+bias_n+gelu_tanh+scale"."""
    parts = []
    if spec.beta_c:
        parts.append("c")
    if spec.bias:
        parts.append(f"bias_{spec.bias}")
    if spec.activation:
        parts.append(spec.activation)
    if getattr(spec, "scale_ab", False):
        parts.append("scale")
    return "+".join(parts) or "plain"


def problem_key(rung_name: str, a_dtype, b_dtype, out_dtype, a_major: str, b_major: str, epi: str) -> tuple:
    """The shape-free part of a winner key (dtypes as their str(), majors "K" or "MN")."""
    return (rung_name, str(a_dtype), str(b_dtype), str(out_dtype), a_major, b_major, epi)


def _majors(a, b) -> tuple[str, str]:
    """Majors of (L, M, K) a and (L, K, N) b: "K" when unit stride is along K."""
    return ("K" if a.stride(2) == 1 else "MN"), ("K" if b.stride(1) == 1 else "MN")


def _key_str(key: tuple) -> str:
    return "|".join(str(x) for x in key)


# --- the table of winners ----------------------------------------------------------------

def _arch() -> str:
    from cute_kernels.runtime.arch import target_arch

    try:
        return target_arch()
    except RuntimeError:
        return "unknown"


def _dsl() -> str:
    try:
        from cute_kernels.runtime.arch import dsl_version

        return dsl_version()
    except Exception:  # noqa: BLE001 - no DSL installed: the table is still readable
        return "unknown"


def store_path(arch: str | None = None) -> Path:
    """cache_dir()/autotune/<arch>-dsl<version>.json."""
    from cute_kernels.runtime.cache import cache_dir

    return cache_dir() / "autotune" / f"{arch or _arch()}-dsl{_dsl()}.json"


def config_to_dict(config: Sm90GemmConfig) -> dict:
    return dataclasses.asdict(config)


def config_from_dict(d: dict) -> Sm90GemmConfig:
    """The validated config a stored dict names; ValueError on unknown fields or bad values."""
    names = {f.name for f in dataclasses.fields(Sm90GemmConfig)}
    extra = set(d) - names
    if extra:
        raise ValueError(f"unknown Sm90GemmConfig fields {sorted(extra)}")
    return Sm90GemmConfig(**d).validate()


def _read(path: Path, warn: bool = True) -> dict:
    """The entries of a winners file ({key string: record}); {} if absent, corrupt or foreign."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as err:
        warnings.warn(f"autotune: cannot read {path}: {err}; ignoring it", stacklevel=3)
        return {}
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION \
                or not isinstance(doc.get("entries"), dict):
            raise ValueError("not a version-1 winners table")
        return doc["entries"]
    except ValueError as err:
        if warn:
                warnings.warn(f"autotune: {path} is not a valid winners table ({err}); ignoring it", stacklevel=3)
        return {}


def _write_atomic(path: Path, entries: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"version": FORMAT_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _parses(rec) -> bool:
    try:
        tuple(rec["key"])
        config_from_dict(rec["config"])
        return True
    except (KeyError, TypeError, ValueError):
        return False


class WinnerStore:
    """The winners of one (arch, DSL version): a file, and a dict mirror loaded once.

    `get(key)` is a dict lookup (key = problem_key(...) + (M, N, K)); `put` updates memory and
    rewrites the file atomically, merged with what another process may have saved meanwhile.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._entries: dict | None = None
        self._configs: dict[tuple, Sm90GemmConfig] = {}

    def _load(self) -> None:
        self._entries = _read(self.path)
        self._configs = {}
        for ks, rec in self._entries.items():
            try:
                self._configs[tuple(rec["key"])] = config_from_dict(rec["config"])
            except (KeyError, TypeError, ValueError) as err:
                warnings.warn(f"autotune: ignoring entry {ks!r} of {self.path}: {err}", stacklevel=3)

    def get(self, key: tuple) -> Sm90GemmConfig | None:
        if self._entries is None:
            self._load()
        return self._configs.get(key)

    def __len__(self) -> int:
        if self._entries is None:
            self._load()
        return len(self._configs)

    def put(self, key: tuple, config: Sm90GemmConfig, **record) -> None:
        """Store `config` under `key` (a tuple of str/int) and save."""
        # a corrupt table was reported on load and is replaced; entries that no longer parse go
        merged = {ks: rec for ks, rec in _read(self.path, warn=False).items() if _parses(rec)}
        rec = {"key": list(key), "config": config_to_dict(config.validate()), **record}
        merged[_key_str(key)] = rec
        _write_atomic(self.path, merged)
        self._entries = merged
        self._configs[tuple(key)] = config
        _forget_plans()

    def clear(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self._entries, self._configs = {}, {}
        _forget_plans()


def _forget_plans() -> None:
    """Replayed launch plans (runtime.plan_cache) captured the config picked before this change."""
    from cute_kernels.runtime.plan_cache import invalidate

    invalidate()


_stores: dict = {}
_tried: set = set()  # (problem key, bucket) tuned (or failed) in this process under opt-in


def store() -> WinnerStore:
    """This process's table for the current arch (the path is resolved once)."""
    s = _stores.get("current")
    if s is None:
        s = _stores["current"] = WinnerStore(store_path())
    return s


def clear() -> None:
    """Delete the stored winners of the current arch and DSL version, and forget them here."""
    store().clear()
    _tried.clear()


def enabled() -> bool:
    """Opted in, and not in a dry run (precompile's and compile-ahead's workers launch nothing,
    so whatever they timed would be stored as a winner)."""
    from cute_kernels.runtime.cache import dry_run

    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on") and not dry_run()


def lookup(pkey: tuple, m: int, n: int, k: int) -> Sm90GemmConfig | None:
    """The stored winner for this problem: its exact shape, else its bucket, else None."""
    s = store()
    return s.get(pkey + ("exact", m, n, k)) or s.get(pkey + ("bucket", *bucket(m, n, k)))


def config_for(rung, a, b, out, spec, m: int, n: int, k: int, epi: tuple = ()) -> Sm90GemmConfig | None:
    """What the rung should run when the caller gave no config: a stored winner, or (opted in,
    first call of the bucket) a freshly tuned one, or None (the heuristic).

    epi: the call's (beta, c, bias, bias_dim, scale_a, scale_b), used only when tuning.
    With no stored winner and no opt-in this returns before building a key.
    """
    s = store()
    if not len(s) and not enabled():
        return None
    pkey = problem_key(rung.name, a.dtype, b.dtype, out.dtype, *_majors(a, b), epilogue_kind(spec))
    found = lookup(pkey, m, n, k)
    if found is not None or not enabled():
        return found
    tkey = pkey + bucket(m, n, k)
    if tkey in _tried:
        return None
    _tried.add(tkey)
    import torch

    beta, c, bias, bias_dim, scale_a, scale_b = epi or (0.0, None, None, "n", None, None)
    kwargs = dict(beta=beta, c=c, bias=bias, bias_dim=bias_dim, activation=spec.activation, scale_a=scale_a,
                  scale_b=scale_b)
    # tune on the caller's inputs into a scratch output (the caller's `out` is written afterwards)
    budget = float(os.environ.get("CUTE_KERNELS_AUTOTUNE_BUDGET_S", "60"))
    try:
        return tune_rung(rung, a, b, torch.empty_like(out), kwargs, pkey=pkey, budget_s=budget).winner
    except Exception as err:  # noqa: BLE001 - tuning is an optimization: never fail the call for it
        warnings.warn(f"autotune: tuning {pkey} at {m}x{n}x{k} failed ({err}); using the heuristic", stacklevel=3)
        return None


# --- the search ---------------------------------------------------------------------------

@dataclass
class Trial:
    """One candidate's fate: ms (median) when it ran correctly, else `dropped` says why."""

    config: Sm90GemmConfig
    ms: float | None = None
    rel_err: float | None = None
    dropped: str | None = None


@dataclass
class TuneResult:
    winner: Sm90GemmConfig
    heuristic: Sm90GemmConfig
    heuristic_ms: float
    winner_ms: float
    trials: list[Trial] = field(default_factory=list)
    key: tuple = ()

    @property
    def speedup(self) -> float:
        return self.heuristic_ms / self.winner_ms


def default_timer(fn: Callable[[], object]) -> float:
    """Median milliseconds of fn() by triton.testing.do_bench (CUDA events without triton)."""
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, return_mode="median"))
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def rel_error(x, ref) -> float:
    """||x - ref|| / ||ref|| in float64; inf if x has a NaN/Inf where ref is finite."""
    x, ref = x.double(), ref.double()
    finite = ref.isfinite()
    if not bool(x[finite].isfinite().all()) or not bool((x[~finite].isnan() == ref[~finite].isnan()).all()):
        return math.inf
    den = float(ref[finite].norm())
    return float((x[finite] - ref[finite]).norm()) / max(den, 1e-30)


def tolerance(out_dtype) -> float:
    """Relative error allowed between two configs (different fp32 summation orders, one rounding
    to the output type each)."""
    return {"torch.float32": 1e-4}.get(str(out_dtype), 2e-2)


def tune_configs(candidates, heuristic: Sm90GemmConfig, run: Callable, timer: Callable, *, budget_s: float,
                 tol: float) -> TuneResult:
    """The fastest correct config among `heuristic` and `candidates`.

    run(config) launches the GEMM with that config into a freshly poisoned output and returns
    (a zero-argument launcher for timing, the output); timer(launcher) -> median ms. The
    heuristic runs first and is the reference; a candidate whose output differs from it by more
    than `tol` (relative, NaN-aware), or that fails to compile or launch, is dropped and never
    chosen. Candidates stop being tried once `budget_s` seconds have passed.
    Post-condition: winner_ms <= heuristic_ms, and the winner is the heuristic or passed the check.
    """
    t0 = time.monotonic()
    launch, ref = run(heuristic)
    ref = ref.clone()
    h_ms = timer(launch)
    trials = [Trial(heuristic, ms=h_ms, rel_err=0.0)]
    for cfg in candidates:
        if cfg == heuristic:
            continue
        trial = Trial(cfg)
        trials.append(trial)
        if time.monotonic() - t0 > budget_s:
            trial.dropped = "budget"
            continue
        try:
            launch, got = run(cfg)
            trial.rel_err = rel_error(got, ref)
            if not trial.rel_err <= tol:
                trial.dropped = f"wrong: rel err {trial.rel_err:.3g} > {tol:g}"
                continue
            trial.ms = float(timer(launch))
        except Exception as err:  # noqa: BLE001 - a config the kernel cannot build is skipped
            trial.dropped = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    best = min((t for t in trials if t.ms is not None), key=lambda t: t.ms)
    return TuneResult(best.config, heuristic, h_ms, best.ms, trials)


def tune_rung(rung, a3, b3, out3, epi: dict, *, pkey: tuple | None = None, budget_s: float = 120.0,
              timer: Callable | None = None, candidates=None, save: bool = True) -> TuneResult:
    """Tune `rung` on (L, M, K) a3, (L, K, N) b3 into (L, M, N) out3 (overwritten) with the rung
    keyword arguments `epi`, and store the winner (exact and bucket keys) when `save`."""
    import torch

    from cute_kernels.gemm.sm90_rung import _check_epilogue

    _, m, k = a3.shape
    n = b3.shape[2]
    in_bytes = a3.element_size()
    spec = _check_epilogue(rung.name, out3, epi.get("beta", 0.0), epi.get("c"), epi.get("bias"),
                           epi.get("bias_dim", "n"), epi.get("activation"))
    if epi.get("scale_a") is not None:
        spec = dataclasses.replace(spec, scale_ab=True)
    if pkey is None:
        pkey = problem_key(rung.name, a3.dtype, b3.dtype, out3.dtype, *_majors(a3, b3), epilogue_kind(spec))
    heuristic = rung.pick(m, n, k, in_bytes).validate()
    out_bits = _BITS[str(out3.dtype)]
    if candidates is None:
        candidates = search_space(in_bytes, out_bits, heuristic.fp8_fast_accum)[0]
    # the heuristic's automatic depth is one of the candidates: time it once
    same = dataclasses.replace(heuristic, stages=heuristic.resolved_stages(in_bytes, out_bits))
    candidates = [c for c in candidates if c != same]

    def run(cfg):
        def launch():
            rung(a3, b3, out3, config=cfg, **epi)

        out3.fill_(float("nan"))
        launch()
        torch.cuda.synchronize() if out3.is_cuda else None
        return launch, out3

    res = tune_configs(candidates, heuristic, run, timer or default_timer, budget_s=budget_s,
                       tol=tolerance(out3.dtype))
    res.key = pkey + (m, n, k)
    if save:
        rec = dict(ms=res.winner_ms, heuristic_ms=res.heuristic_ms, shape=[m, n, k], tuned_at=time.time())
        s = store()
        s.put(pkey + ("exact", m, n, k), res.winner, **rec)
        s.put(pkey + ("bucket", *bucket(m, n, k)), res.winner, **rec)
    return res


def autotune(a, b, out_dtype=None, epilogue: dict | None = None, *, kernel: str = "sm90_persistent",
             budget_s: float = 120.0, timer: Callable | None = None, save: bool = True) -> TuneResult:
    """Tune the GEMM a @ b (a (M, K) or (L, M, K), b (K, N) or (L, K, N), on an sm_90 GPU) on
    the rung `kernel` and store the winner; returns every candidate's trial.

    epilogue: the rung's epilogue keyword arguments (bias=, bias_dim=, activation=, beta=, c=,
    scale_a=, scale_b=); the winner is keyed by their kind. out_dtype: default a's (bf16 for fp8).
    """
    import torch

    from cute_kernels.gemm.epilogue_api import _normalize, _rung

    a3, b3, L, _ = _normalize("autotune", a, b)
    fp8 = a.element_size() == 1
    out_dtype = out_dtype or (torch.bfloat16 if fp8 else a.dtype)
    out3 = torch.empty((L, a3.shape[1], b3.shape[2]), dtype=out_dtype, device=a.device)
    rung = _rung(kernel)
    why = rung.supports(a3, b3, out3)
    if why is not None:
        raise ValueError(f"autotune: kernel {kernel!r} cannot run this problem: {why}")
    return tune_rung(rung, a3, b3, out3, dict(epilogue or {}), budget_s=budget_s, timer=timer, save=save)


# --- CLI ------------------------------------------------------------------------------------

def _cfg_name(c: Sm90GemmConfig) -> str:
    return (f"{c.tile_m}x{c.tile_n}x{c.tile_k} cl{c.cluster_m}x{c.cluster_n} st{c.stages or 'auto'} "
            f"{c.schedule[:4]} r{c.raster}/{c.swizzle}")


def format_table(res: TuneResult, shape) -> str:
    m, n, k = shape
    flops = 2.0 * m * n * k
    lines = [f"{m}x{n}x{k}: winner {_cfg_name(res.winner)} {res.winner_ms:.4f} ms, heuristic "
             f"{_cfg_name(res.heuristic)} {res.heuristic_ms:.4f} ms ({res.speedup:.3f}x)",
             f"  {'config':<44} {'ms':>9} {'TFLOP/s':>8}  note"]
    for t in sorted(res.trials, key=lambda t: (t.ms is None, t.ms or 0)):
        ms = f"{t.ms:9.4f}" if t.ms is not None else f"{'-':>9}"
        tf = f"{flops / t.ms / 1e9:8.1f}" if t.ms else f"{'-':>8}"
        note = t.dropped or " ".join(name for name, c in (("winner", res.winner), ("heuristic", res.heuristic))
                                     if t.config == c)
        lines.append(f"  {_cfg_name(t.config):<44} {ms} {tf}  {note}")
    return "\n".join(lines)


def _parse_shape(s: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be MxNxK, got {s!r}") from None
    return m, n, k


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cute_kernels.gemm.autotune",
                                description="Tune Hopper GEMM configs per shape and store the winners.")
    p.add_argument("--shapes", required=True, help="comma-separated MxNxK, e.g. 4096x4096x4096,8192x8192x1024")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "e4m3", "e5m2"))
    p.add_argument("--out-dtype", default=None, choices=("bf16", "fp16", "fp32"))
    p.add_argument("--kernel", default="sm90_persistent")
    p.add_argument("--budget", type=float, default=120.0, help="seconds per shape")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    try:
        shapes = [_parse_shape(s) for s in args.shapes.split(",") if s]
    except argparse.ArgumentTypeError as err:
        p.error(str(err))
    import torch

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn,
          "e5m2": torch.float8_e5m2}
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda").to(dt[args.dtype])
        b = torch.randn(n, k, device="cuda").to(dt[args.dtype]).t()  # K-major b, as nn.Linear
        epi = {}
        if args.dtype in ("e4m3", "e5m2"):
            one = torch.ones(1, device="cuda")
            epi = dict(scale_a=one, scale_b=one)
        res = autotune(a, b, dt[args.out_dtype] if args.out_dtype else None, epi, kernel=args.kernel,
                       budget_s=args.budget, save=not args.no_save)
        print(format_table(res, (m, n, k)), flush=True)
    if not args.no_save:
        print(f"winners stored in {store().path}")
    return 0


if __name__ == "__main__":
    # run the imported module's main, so that the rungs and the CLI share one table in memory
    from cute_kernels.gemm.autotune import main as _main

    raise SystemExit(_main())
