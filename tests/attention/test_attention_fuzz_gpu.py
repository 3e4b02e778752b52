"""The attention fuzz: at least 1,000 random problems per run on the GPU, forward and backward,
through the public entry points (`attention_forward` / `attention_backward`, "auto" or a named
rung), against float64.

Problems: random batch, heads, GQA ratio (1 to 8), lengths (1 to ~700, Sq != Sk, odd), causal
alignment (top-left, bottom-right), sliding windows, soft caps, sinks, scales, fp16/bf16, head
dims 64 to 256 (80 and 96 included). What is compiled is bounded: problems come in a fixed set
of config classes (`CLASSES`: dtype, head dim and which mask bounds and features are tested,
the things a kernel is compiled for), and everything else varies at runtime within a class, so
one run compiles each class's kernels once. One class holds the few-query, long-cache problems
"auto" routes to the decode rung (`dense_decode`); the others keep clear of that route.

Tolerance (sound, per tensor): the error against float64 must be within twice the error of a
float32 emulation of the same low-precision algorithm (`emulate`: P and dS rounded to the
input dtype before their GEMMs, out stored in it, D = rowsum(dO * out) from the stored out),
plus 1e-3 of the reference's norm (and, for gradients, 1e-3 of dO's): a problem whose answer is
ill-conditioned (cancellation, one key) gets the slack its own rounding needs, a well-conditioned
one none. lse within 2e-3 + 1e-3 |lse|; rows that see no key must match exactly (out 0, lse
-inf, or the sink). Forward outputs are NaN-poisoned and backward results come from a NaN-filled
allocator, so an unwritten element fails.

The run writes `<date>-attention_fuzz-<device>.json` (suite `attention_fuzz`, settings `cases`
and `wrong`, one record per class with its worst error over its bound) through
`cute_kernels.bench.fuzz_record` into CUTE_KERNELS_RESULTS_DIR (else the test's tmp dir), as the
GEMM and fused fuzzes do; CUTE_KERNELS_FUZZ_CASES
(default 1200) and CUTE_KERNELS_FUZZ_SEED (default: a fresh seed, printed and recorded) set the run. Compiles are cached under
CUTE_KERNELS_CACHE_DIR like every kernel: set it to a persistent folder to time only the run.
"""

from __future__ import annotations

import math
import os
import random
import time

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.bench.fuzz_record import FuzzReport, fuzz_result, write_to_results_dir  # noqa: E402

pytestmark = pytest.mark.gpu

# name: (dtype, head dim, mask bounds (upper: causal or a right window bound; local: a left
# bound), softcap, sinks, GQA (group > 1), forward kernel, whether the backward runs)
CLASSES = {
    "bf16_d128_causal_softcap_sinks_gqa": (torch.bfloat16, 128, "upper", True, True, True, "auto", True),
    "fp16_d64_window_sinks": (torch.float16, 64, "upper+local", False, True, False, "auto", True),
    "bf16_d96_plain_softcap_sinks": (torch.bfloat16, 96, "none", True, True, True, "auto", True),
    "bf16_d256_causal_softcap": (torch.bfloat16, 256, "upper", True, False, False, "auto", True),
    "fp16_d80_causal": (torch.float16, 80, "upper", False, False, True, "auto", False),
    "bf16_d192_left_window_sinks": (torch.bfloat16, 192, "local", False, True, True, "auto", False),
    "fp16_d128_sm80_causal_softcap_sinks": (torch.float16, 128, "upper", True, True, True, "sm80_flash", False),
    # A few queries over a long cache: "auto" routes these to the decode rung (`dense_decode`).
    "bf16_d128_decode_softcap_sinks_gqa": (torch.bfloat16, 128, "decode", True, True, True, "auto", True),
}


def _draw_length(rng: random.Random) -> int:
    if rng.random() < 0.2:
        return rng.randint(1, 16)
    return int(round(math.exp(rng.uniform(math.log(16), math.log(700)))))


# The Hopper backward's wider shapes (first run on a GPU 2026-12-06): other head dims (the
# head-split layout above 128, 16-byte rows at 80 and 112, 128-row Q blocks up to 64) and the
# deterministic dQ (name: as CLASSES, then whether the backward is deterministic).
HOPPER_BWD_CLASSES = {
    "bf16_d256_causal_softcap_gqa": (torch.bfloat16, 256, "upper", True, False, True, "auto", True, False),
    "fp16_d192_window_sinks": (torch.float16, 192, "upper+local", False, True, False, "auto", True, False),
    "bf16_d80_plain_gqa": (torch.bfloat16, 80, "none", False, False, True, "auto", True, False),
    "fp16_d160_causal": (torch.float16, 160, "upper", False, False, False, "auto", True, False),
    "bf16_d128_causal_gqa_deterministic": (torch.bfloat16, 128, "upper", False, False, True, "auto", True, True),
    "fp16_d64_window_deterministic": (torch.float16, 64, "upper+local", False, False, False, "auto", True, True),
    "bf16_d64_causal_softcap_gqa": (torch.bfloat16, 64, "upper", True, False, True, "auto", True, False),
    "fp16_d32_plain": (torch.float16, 32, "none", False, False, False, "auto", True, False),
}


def draw_problem(rng: random.Random, name: str, classes: dict = CLASSES) -> dict:
    """One random problem of class `name` of `classes` (sizes, mask, feature values)."""
    from cute_kernels.attention.dense_decode import DENSE_MAX_QUERIES, DENSE_MIN_KEYS

    dtype, d, bounds, softcap, sinks, gqa, kernel, backward, *deterministic = classes[name]
    hkv = rng.randint(1, 4)
    group = rng.choice((2, 3, 4, 8)) if gqa else 1
    sq, sk = _draw_length(rng), _draw_length(rng)
    if bounds == "decode":  # one group size: one decode kernel to compile
        group, sq, sk = 4, rng.randint(1, DENSE_MAX_QUERIES), rng.randint(DENSE_MIN_KEYS, 4096)
    elif sq <= DENSE_MAX_QUERIES and sk >= DENSE_MIN_KEYS:
        sk = rng.randint(64, DENSE_MIN_KEYS - 1)  # the decode route belongs to its class (bounded compiles)
    p = dict(name=name, dtype=dtype, d=d, b=rng.randint(1, 3), hkv=hkv, hq=hkv * group, sq=sq,
             sk=sk, kernel=kernel, backward=backward, causal=None, window=None,
             scale=None if rng.random() < 0.7 else rng.uniform(0.03, 0.3),
             softcap=rng.uniform(1.0, 60.0) if softcap else None, sinks=sinks,
             deterministic=bool(deterministic and deterministic[0]))
    left = rng.choice((0, 1, rng.randint(2, 64), rng.randint(64, 400)))
    if bounds == "upper":
        if rng.random() < 0.8:
            p["causal"] = rng.choice(("top_left", "bottom_right"))
        else:
            p["window"] = (-1, rng.randint(0, 50))
    elif bounds == "upper+local":
        if rng.random() < 0.5:
            p["causal"], p["window"] = rng.choice(("top_left", "bottom_right")), (left, 0)
        else:
            p["window"] = (left, rng.randint(0, 50))
    elif bounds == "local":
        p["window"] = (left, -1)
    elif bounds == "decode":
        p["causal"] = rng.choice((None, "bottom_right"))
    return p


def describe(p: dict) -> str:
    return (f"{p['name']}: B{p['b']} Hq{p['hq']} Hkv{p['hkv']} Sq{p['sq']} Sk{p['sk']} D{p['d']} causal={p['causal']} "
            f"window={p['window']} scale={p['scale']} softcap={p['softcap']} sinks={p['sinks']}")


def emulate(q, k, v, dout, sinks, p: dict):
    """The float32 emulation of the kernels' algorithm (module docstring): (out, lse, dq, dk,
    dv, dsinks), out rounded to the input dtype."""
    from cute_kernels.attention.features import sinks_gradient
    from cute_kernels.ops import attention_reference as ref

    dtype, hq, hk = q.dtype, q.shape[1], k.shape[1]
    scale = ref._scale(p["scale"], q.shape[-1])
    qf, kf, vf = q.float(), ref._expand_heads(k.float(), hq), ref._expand_heads(v.float(), hq)
    prob, lse, t = ref._probabilities(qf, kf, p["causal"], scale, p["window"], p["softcap"], sinks)
    out = (prob.to(dtype).float() @ vf).to(dtype)
    do = dout.float()
    d_rows = (do * out.float()).sum(-1, keepdim=True)
    ds = prob * (do @ vf.transpose(-1, -2) - d_rows)
    if t is not None:
        ds = ds * (1 - t * t)
    ds16 = ds.to(dtype).float()
    dv = prob.to(dtype).float().transpose(-1, -2) @ do
    dq = (ds16 @ kf) * scale
    dk = (ds16.transpose(-1, -2) @ qf) * scale
    if hk != hq:
        dk = dk.unflatten(1, (hk, hq // hk)).sum(2)
        dv = dv.unflatten(1, (hk, hq // hk)).sum(2)
    dsinks = None if sinks is None else sinks_gradient(dout, out, lse, sinks)
    return out, lse, dq, dk, dv, dsinks


def exact(q, k, v, dout, sinks, p: dict):
    """float64 (out, lse, dq, dk, dv, dsinks) by definition, gradients by autograd."""
    from cute_kernels.ops.attention_reference import masked_attention

    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s = None if sinks is None else sinks.detach().double().requires_grad_()
    out, lse = masked_attention(*leaves, None, 0.0, p["causal"], p["scale"], True, p["window"], p["softcap"], s)
    wrt = [*leaves, *([s] if s is not None else [])]
    grads = [None] * len(wrt)
    if p["backward"]:
        grads = torch.autograd.grad(out, wrt, dout.double(), allow_unused=True)
        grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, wrt)]
    return (out.detach(), lse.double(), *grads[:3], grads[3] if s is not None else None)


def _within(got, want, emul, floor: float) -> tuple[bool, float]:
    """(ok, error ratio): |got - want| <= 2 |emul - want| + 1e-3 |want| + floor (norms)."""
    if got.shape != want.shape:
        return False, math.inf
    if torch.isnan(got).any() and not torch.isnan(want).any():
        return False, math.inf
    err = (got.double() - want).norm().item()
    bound = 2 * (emul.double() - want).norm().item() + 1e-3 * want.norm().item() + floor
    return err <= bound, err / bound if bound > 0 else (0.0 if err == 0 else math.inf)


def check(p: dict, device="cuda") -> tuple[list[str], float]:
    """Run one problem; return (what failed, worst error ratio)."""
    from cute_kernels.attention import attention_backward, attention_forward

    dtype = p["dtype"]
    q = torch.randn(p["b"], p["hq"], p["sq"], p["d"], device=device, dtype=dtype)
    k, v = (torch.randn(p["b"], p["hkv"], p["sk"], p["d"], device=device, dtype=dtype) for _ in range(2))
    dout = torch.randn_like(q)
    sinks = torch.randn(p["hq"], device=device) * 2 if p["sinks"] else None
    kw = dict(causal=p["causal"], scale=p["scale"], enable_gqa=p["hq"] != p["hkv"], window_size=p["window"],
              softcap=p["softcap"], sinks=sinks)
    out = torch.full_like(q, math.nan)
    lse = torch.full(q.shape[:-1], math.nan, device=device)
    attention_forward(q, k, v, kernel=p["kernel"], out=out, lse=lse, **kw)
    grads = None
    if p["backward"]:
        torch.empty(1 << 24, device=device).fill_(math.nan)  # poison the allocator's free blocks
        grads = attention_backward(dout, q, k, v, out, lse, deterministic=p.get("deterministic", False), **kw)
    want = exact(q, k, v, dout, sinks, p)
    emul = emulate(q, k, v, dout, sinks, p)
    failed, worst = [], 0.0
    ok, ratio = _within(out, want[0], emul[0], 0.0)
    worst = max(worst, ratio)
    if not ok:
        failed.append(f"out (error/bound {ratio:.3g})")
    empty = torch.isneginf(want[1])
    if not torch.equal(torch.isneginf(lse), empty) or not (out[empty] == 0).all():
        failed.append("rows without a key")
    close = (lse[~empty].double() - want[1][~empty]).abs() <= 2e-3 + 1e-3 * want[1][~empty].abs()
    if not close.all():
        failed.append("lse")
    if grads is not None:
        floor = 1e-3 * dout.double().norm().item()
        names = ("dq", "dk", "dv", "dsinks")
        for name, got, w, e in zip(names, grads, want[2:], emul[2:]):
            if w is None:
                continue
            ok, ratio = _within(got, w, e, floor)
            worst = max(worst, ratio)
            if not ok:
                failed.append(f"{name} (error/bound {ratio:.3g})")
    return failed, worst


def _seeded(label: str) -> tuple[int, random.Random]:
    """(seed, its Random), torch's generator seeded too: a fresh seed every run (printed, and kept
    in the record) unless CUTE_KERNELS_FUZZ_SEED asks for one."""
    seed = int(os.environ.get("CUTE_KERNELS_FUZZ_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"{label}: seed {seed}")
    torch.manual_seed(seed)
    return seed, random.Random(seed)


def test_attention_fuzz(tmp_path):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("needs an sm_80+ GPU")
    n = int(os.environ.get("CUTE_KERNELS_FUZZ_CASES", "1200"))
    seed, rng = _seeded("attention fuzz")
    names = list(CLASSES)
    per_class = {nm: FuzzReport(seed=seed, measure="error/bound") for nm in names}
    total = FuzzReport(seed=seed, measure="error/bound")
    start, first_done = time.perf_counter(), None
    for i in range(n):
        p = draw_problem(rng, names[i % len(names)])
        failed, worst = check(p)
        for r in (per_class[p["name"]], total):
            r.cases += 1
            r.tally(", ".join(failed) if failed else None, worst,
                    lambda: {"problem": describe(p), "why": ", ".join(failed)}, 10)
        if i == len(names) - 1:
            torch.cuda.synchronize()
            first_done = time.perf_counter()  # every class compiled
    torch.cuda.synchronize()
    total.seconds = round(time.perf_counter() - start, 1)
    result = fuzz_result(total, "attention_fuzz", "cute_kernels",
                         {"seconds_first_pass": round((first_done or time.perf_counter()) - start, 1)},
                         command="pytest -m gpu tests/attention/test_attention_fuzz_gpu.py",
                         classes={nm: (str(CLASSES[nm][0]).removeprefix("torch."), r) for nm, r in per_class.items()})
    path = write_to_results_dir(result) or result.write(tmp_path / "attention_fuzz.json")
    print(f"attention fuzz: {n} problems, {total.wrong} wrong, {total.seconds} s -> {path}")
    assert n >= 1000 or "CUTE_KERNELS_FUZZ_CASES" in os.environ
    assert total.wrong == 0, (f"{total.wrong} of {n} problems wrong (seed {seed}); first: "
                              + "; ".join(f"{f['problem']}: {f['why']}" for f in total.failures))


def test_attention_fuzz_of_the_hopper_backward_classes():
    """The fuzz over `HOPPER_BWD_CLASSES` (head dims 32 to 256, deterministic dQ, 128-row Q
    blocks; CUTE_KERNELS_FUZZ_CASES_UNVERIFIED, default 300 problems): every class's backward
    reaches sm90_flash and none is wrong against float64 (the deterministic classes' bitwise
    repetition is `test_sm90_flash_bwd_gpu`'s)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper (sm_90) GPU")
    from cute_kernels.attention import sm90_flash_bwd

    n = int(os.environ.get("CUTE_KERNELS_FUZZ_CASES_UNVERIFIED", "300"))
    seed, rng = _seeded("attention fuzz (Hopper backward classes)")
    names, wrong, ran = list(HOPPER_BWD_CLASSES), [], []
    real = sm90_flash_bwd._launch_for

    def spy(problem, config, deterministic=False):
        ran.append(problem.head_dim)
        return real(problem, config, deterministic)

    sm90_flash_bwd._launch_for = spy
    try:
        for i in range(n):
            p = draw_problem(rng, names[i % len(names)], HOPPER_BWD_CLASSES)
            failed, _ = check(p)
            if failed:
                wrong.append(f"{describe(p)}: {', '.join(failed)}")
    finally:
        sm90_flash_bwd._launch_for = real
    print(f"attention fuzz (Hopper backward classes): {n} problems, {len(wrong)} wrong")
    assert set(ran) >= {32, 64, 80, 128, 160, 192, 256}, sorted(set(ran))  # each class reached sm90_flash
    assert not wrong, f"{len(wrong)} of {n} wrong (seed {seed}); first: " + "; ".join(wrong[:3])
