"""The sm90_flash backward's host path without a GPU: a warm call builds nothing and wraps
nothing (TVM-FFI functions take the torch tensors), the TVM-FFI and `from_torch` paths hand the
kernels the same arguments, the TVM-FFI builds compile for sm_90a with parameter lists that
match what the host passes, and the post-processing (dQ's padding and dtype, GQA's group sums)
turns the kernel's buffers into the results. The launches are recorders on CPU tensors; the
numerics are the GPU tests' (test_sm90_flash_bwd_gpu.py, test_sm90_bwd_window_gpu.py, and the
path comparison at the end of this file)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

import cute_kernels.runtime as runtime  # noqa: E402
from cute_kernels.attention import sm90_bwd_prep as prep  # noqa: E402
from cute_kernels.attention import sm90_flash_bwd as bwd  # noqa: E402
from cute_kernels.attention.api import AttentionProblem  # noqa: E402
from cute_kernels.runtime.plan_cache import WarmCache  # noqa: E402


def _problem(b=2, hq=4, hkv=4, sq=100, sk=130, d=64, dtype=torch.bfloat16, causal="bottom_right", **window):
    return AttentionProblem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d, head_dim_v=d,
                            dtype=dtype, causal=causal, scale=0.3, **window)


def _inputs(p, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g).to(p.dtype)  # noqa: E731
    q, dout, out = (rand(p.batch, p.heads_q, p.seqlen_q, p.head_dim) for _ in range(3))
    k, v = (rand(p.batch, p.heads_kv, p.seqlen_k, p.head_dim) for _ in range(2))
    if requires_grad:
        for t in (q, k, v, out):
            t.requires_grad_()
    lse = torch.randn(p.batch, p.heads_q, p.seqlen_q, generator=g)
    return dout, q, k, v, out, lse


class _Host:
    """Recorders for the compiles, `from_torch` calls and launches of one test."""

    def __init__(self):
        self.compiles, self.wrapped, self.launches = [], [], []
        self.dq_values = None  # what the fake backward kernel writes (see `kernel`)

    def kernel(self, name):
        def launch(*args):
            self.launches.append((name, args))
            if name == "bwd":
                # Stand in for the kernel's results: known values in the dQ accumulator and dK, dV.
                dq, dk, dv = (_unwrap(a) for a in args[6:9])
                dq.copy_(torch.arange(dq.numel(), dtype=torch.float32) % 251 - 125.0)
                for i, t in enumerate((dk, dv)):
                    t.copy_((torch.arange(t.numel(), dtype=torch.float32) % 17 + i).view(t.shape))
        return launch


def _unwrap(a):
    return a[1] if isinstance(a, tuple) and a and a[0] == "dsl" else a


@pytest.fixture
def host(monkeypatch):
    h = _Host()
    for module in (bwd, prep):
        for cache in ("_KERNELS", "_COMPILED"):
            monkeypatch.setattr(module, cache, {})
    monkeypatch.setattr(bwd, "_LAUNCHES", WarmCache("test.launches", bwd._MAX_LAUNCHES))
    monkeypatch.setattr(bwd, "_SUPPORTED", WarmCache("test.supported", bwd._MAX_LAUNCHES))

    def bwd_build(config):
        h.compiles.append(("bwd", "tvm_ffi", config))
        fn = bwd._COMPILED[config] = h.kernel("bwd")
        return fn

    def prep_build(d, dtype):
        h.compiles.append(("prep", "tvm_ffi", d, dtype))
        return h.kernel("prep")

    def compile_kernel(jit_fn, *args, key, options=None):
        h.compiles.append(key)
        return h.kernel("bwd" if key[0] == "attention.sm90_flash_bwd" else "prep")

    def from_torch(t, **kw):
        h.wrapped.append(kw)
        return ("dsl", t, kw)

    monkeypatch.setattr(bwd, "_compile_tvm_ffi", bwd_build)
    monkeypatch.setattr(prep, "_compile_tvm_ffi", prep_build)
    monkeypatch.setattr(bwd, "compile_kernel", compile_kernel)
    monkeypatch.setattr(runtime, "compile_kernel", compile_kernel)
    monkeypatch.setattr(runtime, "from_torch", from_torch)
    monkeypatch.setattr(runtime, "current_stream", lambda: "stream")

    def use_tvm_ffi(flag):
        monkeypatch.setattr(bwd, "tvm_ffi_available", lambda: flag)
        h.launches.clear()

    h.use_tvm_ffi = use_tvm_ffi
    return h


def _describe(args):
    """The launch's arguments as comparable values: tensors by (shape, strides, dtype, whether
    they alias an input, from_torch's options), scalars by value (DSL scalars unwrapped)."""
    out = []
    for a in args:
        kw = a[2] if isinstance(a, tuple) and a and a[0] == "dsl" else None
        a = _unwrap(a)
        if isinstance(a, torch.Tensor):
            out.append(("tensor", tuple(a.shape), a.stride(), a.dtype, kw))
        elif a == "stream":
            continue
        else:
            out.append(("scalar", getattr(a, "value", a)))
    return out


def _launch(host, p, config=None, requires_grad=False):
    dout, q, k, v, o, lse = _inputs(p, requires_grad)
    grads = bwd.backward(dout, q, k, v, o, lse, p, config=config)
    return grads, (dout, q, k, v, o, lse)


PROBLEMS = {
    "causal_br_padded": (_problem(), None),
    "gqa_loop": (_problem(hq=6, hkv=2, sq=150, sk=200, causal="bottom_right"),
                 bwd.bwd_config_for(64, "bfloat16", True, gqa_loop=True)),
    "gqa_window": (_problem(hq=4, hkv=2, sq=128, sk=128, d=128, dtype=torch.float16, causal=None, window_left=20,
                            window_right=5), None),
    "torch_prep_gqa": (_problem(hq=6, hkv=2, sq=70, sk=64, causal="top_left"),
                       replace(bwd.bwd_config_for(64, "bfloat16", True, dkv_fp32=True), prep_kernel=False)),
    "softcap_sinks": (_problem(causal="top_left", softcap=20.0, sinks=True), None),
    "deterministic": (_problem(hq=6, hkv=2, sq=150, sk=200, causal="bottom_right"),
                      bwd.bwd_config_for(64, "bfloat16", True, gqa_loop=True, deterministic=True)),
    "dq_writer_deterministic": (_problem(hq=4, hkv=4, sq=150, sk=200, d=128),
                                replace(bwd.bwd_config_for(128, "bfloat16", True, deterministic=True),
                                        dq_writer=True)),
}


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_both_paths_pass_identical_arguments(host, name):
    p, config = PROBLEMS[name]
    host.use_tvm_ffi(False)
    dsl_grads, _ = _launch(host, p, config)
    dsl = [(n, _describe(a)) for n, a in host.launches]
    host.use_tvm_ffi(True)
    tvm_grads, _ = _launch(host, p, config)
    tvm = [(n, _describe(a)) for n, a in host.launches]
    assert [n for n, _ in tvm] == [n for n, _ in dsl] == (["prep", "bwd"] if config is None or config.prep_kernel
                                                          else ["bwd"])
    strip = lambda launches: [[x[:4] if x[0] == "tensor" else x for x in a] for _, a in launches]  # noqa: E731
    assert strip(tvm) == strip(dsl)
    # The DSL path wraps the 4-D tensors with the head dim as the unit mode, the flat ones on mode 0.
    bwd_dsl = dict(dsl)["bwd"]
    # (A deterministic launch's int32 counters trail the rest, flat.)
    counters = [0] if config is not None and config.deterministic else []
    assert [x[4]["leading_dim"] for x in bwd_dsl if x[0] == "tensor"] == [3, 3, 3, 3, 0, 0, 0, 3, 3] + counters
    # The scalars: scale, the upper offset (Sk - Sq bottom-right, + window_right), offset_lo, group.
    base = p.seqlen_k - p.seqlen_q if p.causal == "bottom_right" or p.causal is None else 0
    expect_offset = base + (p.window_right or 0)
    expect_lo = base - p.window_left if p.window_left is not None else 0
    scalars = [x[1] for x in dict(tvm)["bwd"] if x[0] == "scalar"]
    # ... and, after the stream, the soft cap (None without one; sinks need nothing here).
    assert scalars[1:] == [expect_offset, expect_lo, p.heads_q // p.heads_kv, p.softcap]
    assert scalars[0] == pytest.approx(p.scale)
    bm = bwd._launch_for(p, config).config.block_m  # 128 Q rows a block up to D = 64, else 64
    sq_pad = -(-p.seqlen_q // bm) * bm
    flat = [x[1] for x in dict(tvm)["bwd"] if x[0] == "tensor" and len(x[1]) == 1]
    n = p.batch * p.heads_q * sq_pad
    # D and lse2 padded to whole Q blocks, the dQ accumulator unpadded (Sq rows per head; dq_writer's
    # tiles: whole Q blocks) (and a deterministic launch's counters: one per Q block of each (batch,
    # query head))
    acc_rows = sq_pad if bwd._launch_for(p, config).config.dq_writer else p.seqlen_q
    assert flat == [(n,), (n,), (p.batch * p.heads_q * acc_rows * p.head_dim,)] + [(n // bm,)] * len(counters)
    for a, b in zip(dsl_grads, tvm_grads):
        assert torch.equal(a, b)


def test_warm_call_compiles_nothing_and_wraps_nothing(host):
    host.use_tvm_ffi(True)
    p = _problem(hq=4, hkv=2)
    _launch(host, p)
    assert sorted(c[0] for c in host.compiles) == ["bwd", "prep"]
    first = [(n, _describe(a)) for n, a in host.launches]
    host.launches.clear()
    host.compiles.clear()
    (dq, dk, dv), (dout, q, k, v, o, lse) = _launch(host, p)
    assert host.compiles == [] and host.wrapped == []
    assert [(n, _describe(a)) for n, a in host.launches] == first
    # The kernels read the caller's tensors in place (they are contiguous and aligned).
    (_, prep_args), (_, bwd_args) = host.launches
    assert bwd_args[0].data_ptr() == q.data_ptr() and bwd_args[3].data_ptr() == dout.data_ptr()
    assert prep_args[1].data_ptr() == o.data_ptr() and prep_args[2].data_ptr() == lse.data_ptr()
    # The kernel writes the flat buffers prep allocated, all 16-byte aligned.
    assert bwd_args[6].data_ptr() == prep_args[5].data_ptr()
    assert all(t.data_ptr() % 16 == 0 for t in (*prep_args[3:6], *bwd_args[4:9]))
    # Another sequence length is a new problem: no compile either.
    _launch(host, replace(p, seqlen_q=33, seqlen_k=200))
    assert host.compiles == [] and host.wrapped == []


def test_tvm_ffi_path_detaches_inputs_that_require_grad(host):
    host.use_tvm_ffi(True)
    _launch(host, _problem(), requires_grad=True)
    for _, args in host.launches:
        assert not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


@pytest.mark.parametrize("name", ["causal_br_padded", "gqa_window", "softcap_sinks", "gqa_fp32"])
def test_backward_plan_replays_the_checked_call(host, name):
    # `backward_plan`: a replay with every decision made once launches exactly what `backward`
    # launches for tensors of the same layouts (fresh values), compiles and wraps nothing, and
    # returns the same results
    p = PROBLEMS[name][0] if name in PROBLEMS else _problem(hq=6, hkv=2, sq=70, sk=64, causal="top_left")
    host.use_tvm_ffi(True)
    grads, tensors = _launch(host, p)
    checked = [(n, _describe(a)) for n, a in host.launches]
    replay = bwd.backward_plan(*tensors, p)
    assert replay is not None
    host.launches.clear(), host.compiles.clear()
    again = replay(*tensors)
    assert [(n, _describe(a)) for n, a in host.launches] == checked
    assert host.compiles == [] and host.wrapped == []
    for a, b in zip(again, grads):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def test_backward_plan_declines_what_backward_decides_per_call(host):
    p = _problem()
    dout, q, k, v, o, lse = _inputs(p)
    host.use_tvm_ffi(True)
    assert bwd.backward_plan(dout, q, k, v, o, lse, p, deterministic=True) is None  # the sm80 dQ pass
    q_cols = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # head dim not the unit stride: backward copies
    assert bwd.backward_plan(dout, q_cols, k, v, o, lse, p) is None
    assert bwd.backward_plan(dout, q, k, v, o, lse.double(), p) is None  # an lse backward converts
    host.use_tvm_ffi(False)
    assert bwd.backward_plan(dout, q, k, v, o, lse, p) is None


@pytest.mark.parametrize("gqa", [False, True])
def test_post_processing_turns_the_kernel_buffers_into_the_results(host, gqa):
    """With the consumers' own dQ reductions (the writer warp's tiles: the next test)."""
    host.use_tvm_ffi(True)
    p = _problem(hq=4, hkv=2 if gqa else 4, sq=100, sk=90)
    config = bwd.bwd_config_for(64, "bfloat16", True, dkv_fp32=gqa, dq_writer=False)
    (dq, dk, dv), (dout, q, k, v, o, lse) = _launch(host, p, config)
    _, args = host.launches[-1]
    dq_acc = args[6].view(p.batch, p.heads_q, -1, p.head_dim)
    assert dq_acc.shape[2] == 100  # Sq rows per head, no padding: converted in one contiguous pass
    # Every result stored (B, S, H, D), as the forward's out: the models' transpose(1, 2).reshape
    # of their gradients is then a view.
    assert dq.dtype == q.dtype and dq.transpose(1, 2).is_contiguous() and torch.equal(dq, dq_acc.to(q.dtype))
    for grad, per_head, like in ((dk, args[7], k), (dv, args[8], v)):
        assert grad.shape == like.shape and grad.dtype == like.dtype and grad.transpose(1, 2).is_contiguous()
        if gqa:
            assert per_head.dtype == torch.float32
            want = per_head.view(p.batch, 2, 2, p.seqlen_k, p.head_dim).sum(2).to(like.dtype)
            assert torch.equal(grad, want) and not torch.equal(grad, per_head[:, ::2].to(like.dtype))
        else:
            assert grad.data_ptr() == per_head.data_ptr()
    assert dk.data_ptr() != dv.data_ptr()


@pytest.mark.parametrize("d, sq, wide", [(128, 150, False), (64, 200, True), (96, 64, False)])
def test_dq_writer_accumulator_is_converted_from_fragment_order(host, d, sq, wide):
    """`dq_writer`: the prep pass zeroes an accumulator of whole Q blocks per head, which the
    kernel fills with warpgroup tiles in fragment order; the conversion puts each value where
    `sm90_layouts.dq_tile_layout` says its tile holds it, drops the padding rows and returns
    dQ stored (B, S, H, D) as the other results."""
    from cute_kernels.attention.sm90_layouts import dq_tile_layout

    host.use_tvm_ffi(True)
    p = _problem(b=2, hq=3, hkv=3, sq=sq, sk=90, d=d)
    config = replace(bwd.bwd_config_for(d, "bfloat16", True, wide_q=wide), dq_writer=True)
    (dq, _, _), (_, q, *_) = _launch(host, p, config)
    (_, prep_args), (_, args) = host.launches
    bm, cols = config.block_m, config.dq_tile_cols
    blocks = -(-sq // bm)
    acc = args[6]
    assert acc.numel() == 2 * 3 * blocks * bm * d and prep_args[-1] == blocks * bm  # zeroed rows per head
    tile = 64 * cols
    layout = dq_tile_layout(cols)
    pos = torch.tensor([layout(f) for f in range(tile)])
    want = torch.empty(2 * 3, blocks * bm, d)
    for t, chunk in enumerate(acc.view(-1, tile)):  # tiles in (batch x head, Q block, warpgroup) order
        bh, m, w = t // (2 * blocks), t // 2 % blocks, t % 2
        rows = m * bm + (64 * w if wide else 0) + pos % 64
        want[bh, rows, (0 if wide else w * cols) + pos // 64] = chunk
    assert dq.shape == q.shape and dq.dtype == q.dtype and dq.transpose(1, 2).is_contiguous()
    assert torch.equal(dq, want.view(2, 3, -1, d)[:, :, :sq].to(q.dtype))


@pytest.mark.parametrize("sq, d, writer", [(2048, 128, True), (1000, 128, True), (2048, 64, True),
                                           (197, 64, False), (257, 64, False), (130, 128, False), (2048, 256, False)])
def test_default_takes_the_dq_writer_where_its_accumulator_pads_little(host, sq, d, writer):
    """The dQ writer's accumulator holds whole Q blocks: the default takes it where that pads
    Sq by at most an eighth (and its tiles fit: not at D = 256), else the consumers' reductions
    into Sq rows."""
    p = _problem(sq=sq, sk=sq, d=d)
    assert bwd._launch_for(p, None).config.dq_writer is writer
    assert bwd._launch_for(p, None, deterministic=True).config.dq_writer is writer


def test_gqa_loop_writes_key_value_heads_directly(host):
    """With `gqa_loop` the kernel's dK, dV are the results themselves: (B, Hkv, Sk, D) in k's
    dtype, no fp32 per-query-head buffer and no group sum; the kernel is told the group size."""
    host.use_tvm_ffi(True)
    p = _problem(hq=6, hkv=2, sq=100, sk=90)
    config = bwd.bwd_config_for(64, "bfloat16", True, gqa_loop=True)
    (dq, dk, dv), (dout, q, k, v, o, lse) = _launch(host, p, config)
    _, args = host.launches[-1]
    for grad, kernel_out, like in ((dk, args[7], k), (dv, args[8], v)):
        assert kernel_out.shape == like.shape and kernel_out.dtype == like.dtype
        assert grad.data_ptr() == kernel_out.data_ptr()
    assert args[12] == 3  # qhead_per_kvhead
    with pytest.raises(ValueError, match="does not match the problem"):  # GQA needs a group sum: one of the two
        _launch(host, p, bwd.bwd_config_for(64, "bfloat16", True))
    with pytest.raises(ValueError, match="gqa_loop"):
        bwd.bwd_config_for(64, "bfloat16", True, gqa_loop=True, dkv_fp32=True)


def test_bad_config_is_refused_on_every_call_and_the_problem_cache_is_bounded(host, monkeypatch):
    host.use_tvm_ffi(True)
    p = _problem()
    wrong = bwd.bwd_config_for(64, "float16", False)
    for _ in range(2):
        with pytest.raises(ValueError, match="does not match the problem"):
            _launch(host, p, wrong)
    assert host.launches == []
    for _ in range(2):  # a refusal is never remembered as a pass
        with pytest.raises(ValueError, match="not 72"):
            _launch(host, replace(p, head_dim=72, head_dim_v=72))
        with pytest.raises(ValueError, match="must be finite"):
            _launch(host, replace(p, scale=math.nan))
    assert host.launches == []
    monkeypatch.setattr(bwd, "_LAUNCHES", WarmCache("test.launches", 3))  # a bound of 3
    for s in range(64, 69):
        _launch(host, replace(p, seqlen_q=s))
    assert 1 <= len(bwd._LAUNCHES) <= 3


def test_preprocess_refuses_unaligned_blocks():
    x = torch.randn(1, 1, 8, 64).to(torch.float16)
    with pytest.raises(ValueError, match="multiple of 4"):
        prep.preprocess(x, x, torch.randn(1, 1, 8), 6, tvm_ffi=True)


# ---- the real TVM-FFI builds (compile for sm_90a, no GPU) -------------------------------------------

_PARAM = re.compile(r"(\w+): (Tensor\(\[([^\]]*)\], (\w+)\)|\w+)")


def _signature(fn, args) -> list:
    """(rank, dtype) per parameter of the TVM-FFI function `fn`, from the error it raises when
    called with `args` (CPU tensors: it expects CUDA ones and names its whole parameter list)."""
    with pytest.raises(ValueError, match="expected device_type=cuda") as err:
        fn(*args)
    params = re.search(r"(?:__call__|call_\w+)\((.*)\)`", str(err.value)).group(1)
    return [(len(m.group(3).split(",")), m.group(4)) if m.group(3) is not None else (0, m.group(2))
            for m in _PARAM.finditer(params)]


def _passed(args) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((a.dim(), str(a.dtype).removeprefix("torch.")))
        elif a is None:  # an absent optional argument (the soft cap of a problem without one)
            out.append((0, "None"))
        else:
            out.append((0, "float32" if isinstance(a, float) else "int32"))
    return out


@pytest.mark.compile
@pytest.mark.parametrize("name", ["causal_br_padded", "gqa_window", "gqa_loop", "deterministic"])
def test_tvm_ffi_builds_compile_and_take_what_the_host_passes(monkeypatch, name):
    pytest.importorskip("tvm_ffi")
    import tvm_ffi

    from cute_kernels.runtime import cache

    p, config = PROBLEMS[name]
    for module in (bwd, prep):
        monkeypatch.setattr(module, "_COMPILED", {})
    monkeypatch.setattr(bwd, "_LAUNCHES", WarmCache("test.launches", bwd._MAX_LAUNCHES))
    monkeypatch.setattr(bwd, "tvm_ffi_available", lambda: True)
    launches = []
    real_bwd, real_prep = bwd._compile_tvm_ffi, prep._compile_tvm_ffi

    def recorded(build, name):
        def compile_and_record(*key):
            fn = build(*key)
            assert isinstance(fn, tvm_ffi.Function)

            def launch(*args):
                launches.append((name, fn, args))
            if name == "bwd":
                bwd._COMPILED[key[0]] = launch
            return launch
        return compile_and_record

    monkeypatch.setattr(bwd, "_compile_tvm_ffi", recorded(real_bwd, "bwd"))
    monkeypatch.setattr(prep, "_compile_tvm_ffi", recorded(real_prep, "prep"))
    dout, q, k, v, o, lse = _inputs(p)
    bwd.backward(dout, q, k, v, o, lse, p, config=config)
    assert [n for n, _, _ in launches] == ["prep", "bwd"]
    for _, fn, args in launches:
        assert _signature(fn, args) == _passed(args)
    # Warm: the same functions, no compile, no disk load.
    before = dict(cache.stats)
    bwd.backward(dout, q, k, v, o, lse, p, config=config)
    assert [n for n, _, _ in launches] == ["prep", "bwd"] * 2
    assert cache.stats["compiled"] == before["compiled"] and cache.stats["disk_loaded"] == before["disk_loaded"]


# ---- on the GPU: the TVM-FFI path against the from_torch path ----------------------------------------

def _true_lse(p, q, k):
    """The log-sum-exp of the problem's masked, scaled scores (fp32), as the forward returns it."""
    from cute_kernels.attention.mask_rule import dense_mask

    kf = k.detach().float().repeat_interleave(p.heads_q // p.heads_kv, dim=1)
    s = (q.detach().float() @ kf.transpose(-1, -2)) * p.scale
    keep = dense_mask(p.seqlen_q, p.seqlen_k, causal=p.causal is not None, align=p.causal or "top_left",
                      window_left=p.window_left, window_right=p.window_right, device=s.device)
    return torch.logsumexp(s.masked_fill(~keep, -math.inf), dim=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["causal_br_padded", "gqa_window"])
def test_tvm_ffi_and_from_torch_paths_agree_on_gpu(monkeypatch, name):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    if not runtime.tvm_ffi_available():
        pytest.skip("TVM-FFI is not available here: the GPU tests already run the from_torch path")
    p, _ = PROBLEMS[name]
    dout, q, k, v, o, lse = (t.cuda() for t in _inputs(p, requires_grad=True))
    lse = _true_lse(p, q, k)  # P <= 1, so fp16 gradients stay finite
    lse[..., :3] = -math.inf  # rows that saw no key
    results = {}
    for tvm in (True, False):
        monkeypatch.setattr(bwd, "tvm_ffi_available", lambda tvm=tvm: tvm)
        torch.empty(1 << 24, device="cuda").fill_(math.nan)  # poison the allocator's free memory
        results[tvm] = bwd.backward(dout, q, k, v, o, lse, p)
    torch.cuda.synchronize()
    for name_, a, b in zip("dq dk dv".split(), results[True], results[False]):
        assert torch.isfinite(a.float()).all(), name_
        # dK, dV are deterministic; dQ's fp32 atomics may round differently from run to run.
        if name_ == "dq":
            assert ((a.double() - b.double()).norm() / b.double().norm()).item() < 1e-2
        else:
            assert torch.equal(a, b), name_


@pytest.mark.parametrize("d", [192, 256])
def test_wide_head_dims_launch_the_head_split_kernel(host, d):
    """D = 192 and 256: the default config is the head-split one (64 keys a CTA) with the same
    outputs' shapes and dtypes, and GQA keeps its per-query-head fp32 buffers where the grid
    would not fill."""
    host.use_tvm_ffi(True)
    p = _problem(hq=4, hkv=2, d=d)
    assert host.launches == []
    (dq, dk, dv), (dout, q, k, v, *_) = _launch(host, p)
    (config,) = [c for kind, _, c in (x for x in host.compiles if x[0] == "bwd")]
    assert config.head_split and config.block_n == 64 and config.ds_buffers == (1 if d == 256 else 2)
    assert config.dkv_fp32 and not config.gqa_loop  # no SMs without CUDA: the grid does not fill
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dq.dtype == dk.dtype == dv.dtype == q.dtype


@pytest.mark.parametrize("tvm", [True, False], ids=["tvm_ffi", "from_torch"])
def test_varlen_backward_hands_the_kernel_packed_views_and_converts_its_buffers(host, tvm):
    """The packed backward: first the dense prep pass over dO and O viewed (1, H, T, D) with Tq padded to
    whole Q blocks, then the kernel, which takes q, k, v, dO and the dK, dV buffers as (1, H, T,
    D) views and the prep's lse2, D and dQ accumulator; that fp32 (Hq, Tq, D) accumulator comes
    back transposed to (Tq, Hq, D), GQA's per-query-head fp32 dK, dV summed over each group;
    cu_seqlens, the launch order, the longest key length and the bottom-right flag trail the
    soft cap (both host paths: TVM-FFI takes no stream argument)."""
    host.use_tvm_ffi(tvm)
    lengths_q, lengths_k = (3, 0, 6), (5, 2, 6)
    hq, hkv, d = 3, 1, 64
    tq, tk = sum(lengths_q), sum(lengths_k)
    p = AttentionProblem(batch=3, heads_q=hq, heads_kv=hkv, seqlen_q=6, seqlen_k=6, head_dim=d, head_dim_v=d,
                         dtype=torch.bfloat16, causal="bottom_right", scale=0.3, window_left=4)
    g = torch.Generator().manual_seed(1)
    q, dout, out = (torch.randn(tq, hq, d, generator=g).to(torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(tk, hkv, d, generator=g).to(torch.bfloat16) for _ in range(2))
    lse = torch.randn(hq, tq, generator=g)
    lse[1, 2] = -math.inf
    cu_q = torch.tensor([0, 3, 3, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 7, 13], dtype=torch.int32)
    dq, dk, dv = bwd.varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, 6, 6, p)
    assert [n for n, _ in host.launches] == ["prep", "bwd"]
    prep_args, (_, args) = [_unwrap(a) for a in host.launches[0][1]], host.launches[1]
    packed = lambda t: t.permute(1, 0, 2).unsqueeze(0)  # noqa: E731
    assert torch.equal(prep_args[0], packed(dout)) and torch.equal(prep_args[1], packed(out))
    assert torch.equal(prep_args[2].view(hq, tq), lse)
    # Tq rows, padded to a Q block (128 rows at D = 64)
    assert [getattr(a, "value", a) for a in prep_args[6:8]] == [tq, bwd._varlen_config(p).block_m]
    # The backward's compile: the TVM-FFI build (the fixture's "bwd" record) or the from_torch one.
    ((*_, config),) = [c for c in host.compiles if c[0] in ("bwd", "attention.sm90_flash_bwd")]
    assert config.varlen and config.dkv_fp32 and config.causal and config.local and not config.head_split
    tensors = [_unwrap(a) for a in args]
    for i, t in ((0, q), (1, k), (2, v), (3, dout)):
        assert tensors[i].shape == (1, t.shape[1], t.shape[0], d) and tensors[i].data_ptr() == t.data_ptr()
    # The prep's buffers: (D, lse2, dQ accumulator) there, (lse2, D, dQ accumulator) here.
    assert [t.data_ptr() for t in tensors[4:7]] == [prep_args[i].data_ptr() for i in (4, 3, 5)]
    pad = bwd._varlen_config(p).block_m  # Tq = 9 rows padded to one Q block
    assert tensors[4].numel() == tensors[5].numel() == hq * pad and tensors[6].numel() == hq * tq * d
    assert tensors[7].shape == (1, hq, tk, d) and tensors[7].dtype == torch.float32  # GQA: fp32 per query head
    scalars = [getattr(a, "value", a) for a in args[9:13]]
    assert scalars[0] == pytest.approx(0.3) and scalars[1:] == [0, -4, 3]  # window_right 0, -window_left, group
    tail = args[13 if tvm else 14:]
    assert [_unwrap(t).tolist() for t in tail[1:4]] == [cu_q.tolist(), cu_k.tolist(), [0, 1, 2]]
    assert [getattr(t, "value", t) for t in tail[4:]] == [6, 1]
    # With the host's offsets, the sequences launch the most work first (9 x ... rows: 2, 0, 1).
    from cute_kernels.attention.varlen import HostOffsets

    host.launches.clear()
    bwd.varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, 6, 6, p,
                        offsets=HostOffsets(tuple(cu_q.tolist()), tuple(cu_k.tolist()), None))
    assert _unwrap(host.launches[1][1][(13 if tvm else 14) + 3]).tolist() == [2, 0, 1]
    # The recorder's values (`_Host.kernel`): dQ accumulator i % 251 - 125, dK / dV i % 17 (+1).
    acc = (torch.arange(hq * tq * d, dtype=torch.float32) % 251 - 125.0).view(hq, tq, d)
    assert dq.shape == q.shape and dq.is_contiguous() and torch.equal(dq, acc.transpose(0, 1).to(torch.bfloat16))
    per_head = (torch.arange(tk * hq * d, dtype=torch.float32) % 17).view(hq, tk, d).transpose(0, 1)
    assert dk.shape == k.shape and dk.dtype == torch.bfloat16
    torch.testing.assert_close(dk.float(), per_head.view(tk, hkv, hq, d).sum(2).to(torch.bfloat16).float())


def test_varlen_backward_plan_replays_the_checked_call(host, monkeypatch):
    """The unverified path `varlen_backward_plan`: a warm `attention_varlen_backward` call with
    the first call's signature launches what that checked call launched (fresh values), checks
    nothing again but the offsets (read again when their contents change, refused when wrong),
    compiles and wraps nothing, and returns the same results."""
    from cute_kernels.attention import dispatch, varlen
    from cute_kernels.runtime import plan_cache, unverified

    host.use_tvm_ffi(True)
    monkeypatch.setattr(varlen, "_require_cuda", lambda q, who: None)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    for name in ("_BACKWARD_PLANS", "_BACKWARD_RUNGS"):
        monkeypatch.setattr(varlen, name, WarmCache(name))
    monkeypatch.setattr(varlen, "_OFFSETS", varlen.TensorMemo("test.offsets"))
    checked, real = [], varlen.checked_varlen_inputs
    monkeypatch.setattr(varlen, "checked_varlen_inputs", lambda *a, **kw: checked.append(1) or real(*a, **kw))
    g = torch.Generator().manual_seed(2)
    hq, hkv, d, tq, tk = 4, 2, 64, 9, 13
    fresh = lambda: ((torch.randn(tq, hq, d, generator=g).to(torch.bfloat16) for _ in range(3)),  # noqa: E731
                     (torch.randn(tk, hkv, d, generator=g).to(torch.bfloat16) for _ in range(2)))
    cu_q = torch.tensor([0, 3, 3, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 7, 13], dtype=torch.int32)

    def call():
        (q, dout, out), (k, v) = fresh()
        lse = torch.randn(hq, tq, generator=g)
        host.launches.clear(), host.compiles.clear()
        grads = varlen.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, 6, 6, causal="bottom_right",
                                                 scale=0.3, kernel="sm90_flash")
        return grads, [(n, _describe(a)) for n, a in host.launches]

    with unverified.allowing("varlen_backward_plan"):
        first, launches = call()
        assert [n for n, _ in launches] == ["prep", "bwd"] and checked == [1]
        for _ in range(2):
            again, replayed = call()
            assert replayed == launches and host.compiles == [] and host.wrapped == [] and checked == [1]
            for a, b in zip(again, first):  # the recorders write the same values (`_Host.kernel`)
                assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        cu_q.copy_(torch.tensor([0, 4, 4, 9]))  # new contents, same layout: read again, still valid
        _, replayed = call()
        assert replayed == launches and checked == [1]
        cu_k[3] = 99  # past the keys: refused before any launch
        with pytest.raises(ValueError, match="cu_seqlens_k"):
            call()
        assert host.launches == []
    assert len(varlen._BACKWARD_PLANS) == 1


def _stub_prep(monkeypatch):
    """The prep pass as buffers of its shapes, launching nothing (on CPU tensors a TVM-FFI
    function refuses to run)."""
    def prep_buffers(dout, out, lse, block_m, tvm_ffi, acc_rows=None):
        b, h, sq, dh = dout.shape
        rows = -(-sq // block_m) * block_m
        acc = sq if acc_rows is None else acc_rows
        return torch.zeros(b * h * rows), torch.zeros(b * h * rows), torch.zeros(b * h * acc * dh), None

    monkeypatch.setattr(prep, "preprocess_flat", prep_buffers)


@pytest.mark.compile
@pytest.mark.parametrize("d, hq, hkv, causal, window_left, softcap, tvm", [
    (128, 4, 4, "bottom_right", None, None, False), (64, 4, 2, "top_left", 5, 30.0, False),
    (256, 2, 2, None, None, None, False), (64, 4, 2, "top_left", 5, 30.0, True)])
def test_varlen_backward_compiles_from_the_arguments_the_host_passes(monkeypatch, d, hq, hkv, causal, window_left,
                                                                     softcap, tvm):
    """The packed backward's own arguments (from_torch views of CPU tensors, the trailing
    cu_seqlens and scalars; or the TVM-FFI build's fake ones) trace and compile for sm_90a; the
    launch is left out."""
    from cute_kernels.runtime import fake_stream

    if tvm:
        pytest.importorskip("tvm_ffi")
    monkeypatch.setattr(bwd, "tvm_ffi_available", lambda: tvm)
    monkeypatch.setattr(bwd, "_COMPILED", {})
    real, keys = bwd.compile_kernel, []

    def compile_only(fn, *args, key, options=None):
        args = [fake_stream() if isinstance(a, str) and a == "stream" else a for a in args]
        real(fn, *args, key=key, options=options)
        keys.append(key)
        return lambda *a: None

    monkeypatch.setattr(bwd, "compile_kernel", compile_only)
    monkeypatch.setattr(runtime, "current_stream", lambda: "stream")
    _stub_prep(monkeypatch)
    p = AttentionProblem(batch=2, heads_q=hq, heads_kv=hkv, seqlen_q=9, seqlen_k=9, head_dim=d, head_dim_v=d,
                         dtype=torch.bfloat16, causal=causal, scale=0.3, window_left=window_left, softcap=softcap)
    q, dout, out = (torch.randn(12, hq, d).to(torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(13, hkv, d).to(torch.bfloat16) for _ in range(2))
    cu_q, cu_k = torch.tensor([0, 3, 12], dtype=torch.int32), torch.tensor([0, 4, 13], dtype=torch.int32)
    bwd.varlen_backward(dout, q, k, v, out, torch.randn(hq, 12), cu_q, cu_k, 9, 9, p)
    ((_, kind, config),) = keys  # the TVM-FFI build's key, or the from_torch path's
    assert kind == ("tvm_ffi" if tvm else "varlen") and config.varlen and config.head_split == (d == 256)


@pytest.mark.compile
def test_varlen_tvm_ffi_build_takes_what_the_host_passes(monkeypatch):
    """The real TVM-FFI build of the packed backward (GQA, window, soft cap) names the same
    parameter list (rank and dtype each) as the arguments `varlen_backward` hands it."""
    pytest.importorskip("tvm_ffi")
    import tvm_ffi

    monkeypatch.setattr(bwd, "_COMPILED", {})
    monkeypatch.setattr(bwd, "tvm_ffi_available", lambda: True)
    calls = []
    real = bwd._compile_tvm_ffi

    def build(config):
        fn = real(config)
        assert isinstance(fn, tvm_ffi.Function)
        return lambda *args: calls.append((fn, args))

    monkeypatch.setattr(bwd, "_compile_tvm_ffi", build)
    _stub_prep(monkeypatch)
    p = AttentionProblem(batch=2, heads_q=4, heads_kv=2, seqlen_q=9, seqlen_k=9, head_dim=64, head_dim_v=64,
                         dtype=torch.bfloat16, causal="top_left", scale=0.3, window_left=5, softcap=30.0)
    q, dout, out = (torch.randn(12, 4, 64).to(torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(13, 2, 64).to(torch.bfloat16) for _ in range(2))
    cu_q, cu_k = torch.tensor([0, 3, 12], dtype=torch.int32), torch.tensor([0, 4, 13], dtype=torch.int32)
    bwd.varlen_backward(dout, q, k, v, out, torch.randn(4, 12), cu_q, cu_k, 9, 9, p)
    ((fn, args),) = calls
    assert _signature(fn, args) == _passed(args)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_varlen_lse_and_d_boxes_start_16_byte_aligned_and_cover_the_block(d):
    """A 1-D TMA box must start 16-byte aligned (an unaligned one stopped the first GPU run of
    the varlen backward with an illegal instruction); a sequence's rows start anywhere in the
    flat lse2 / D rows, so a varlen box starts at the 4-float boundary at or below the block's
    first row and is `row_box` rows long: for every first row it covers the block's rows, its
    bytes are whole 16-byte units, the stages are 128-byte aligned, the transaction count
    includes both boxes and shared memory still fits. Dense configs keep block_m-row boxes."""
    for causal in (False, True):
        dense = bwd.bwd_config_for(d, "bfloat16", causal)
        assert dense.row_box == dense.row_stage == dense.block_m
        c = bwd.bwd_config_for(d, "bfloat16", causal, varlen=True)
        bm, head_rows = c.block_m, 3 * c.block_m  # rows a head in the flat buffers: whole Q blocks
        assert (4 * c.row_box) % 16 == 0 and (4 * c.row_stage) % 128 == 0 and c.row_stage >= c.row_box
        assert c.tx_bytes_qdo == 2 * 2 * bm * d + 2 * 4 * c.row_box
        assert c.smem_bytes <= 227 * 1024
        for head in range(2):
            for first in range(0, 2 * head_rows, 7):
                for m in range(3):
                    start = head * head_rows + first - first % 4 + m * bm  # the kernel's box start
                    shift = first % 4  # the consumers' view starts this many rows in
                    row0 = head * head_rows + first + m * bm
                    assert (4 * start) % 16 == 0
                    assert start + shift == row0 and shift + bm <= c.row_box


def test_deterministic_backward_orders_dq_on_hopper(host):
    """deterministic=True: the Hopper kernel's deterministic
    entry, with zeroed int32 counters, one per (batch, query head, Q block), after the other
    arguments; without deterministic, the plain entry and no counters."""

    host.use_tvm_ffi(True)
    p = _problem(b=2, hq=4, hkv=4, sq=100, sk=130)
    dout, q, k, v, o, lse = _inputs(p)
    bwd.backward(dout, q, k, v, o, lse, p, deterministic=True)
    ((*_, config),) = [c for c in host.compiles if c[0] == "bwd"]
    assert config.deterministic and not config.dq_tma_reduce
    ((name, args),) = [x for x in host.launches if x[0] == "bwd"]
    turns = args[-1]
    assert turns.dtype == torch.int32 and turns.numel() == 2 * 4 * 1 and not turns.any()  # 100 rows: one 128-row block
    host.launches.clear()
    bwd.backward(dout, q, k, v, o, lse, p)  # not deterministic: the plain entry, no counters
    ((name, args),) = [x for x in host.launches if x[0] == "bwd"]
    assert not isinstance(args[-1], torch.Tensor) or args[-1].dtype != torch.int32


@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=12), block_m=st.sampled_from([64, 128]))
def test_varlen_writer_rows_give_each_sequence_its_own_whole_q_blocks(lengths, block_m):
    """The packed writer's accumulator rows: each sequence's tokens are consecutive rows from a
    block boundary, its whole Q blocks overlap no other sequence's, and all fit the head's rows."""
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    tq = int(cu[-1])
    rows = bwd.varlen_token_rows(cu, tq, block_m).tolist()
    total = bwd.varlen_tile_rows(tq, len(lengths), block_m)
    spans = []
    for b, n in enumerate(lengths):
        mine = rows[int(cu[b]):int(cu[b + 1])]
        if n:
            assert mine == list(range(mine[0], mine[0] + n)) and mine[0] % block_m == 0
            spans.append((mine[0], mine[0] + -(-n // block_m) * block_m))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and all(end <= total for _, end in spans)


def test_varlen_writer_converts_its_tiles_into_each_sequence_rows(host, monkeypatch):
    """With `dq_writer` the packed backward hands the kernel a zeroed tile accumulator of
    `varlen_tile_rows` rows per head (the prep pass zeroes none) and returns, for each token,
    the row `varlen_token_rows` gives it, un-permuted from fragment order."""
    host.use_tvm_ffi(True)
    real = bwd._varlen_config
    monkeypatch.setattr(bwd, "_VARLEN_CONFIGS", {})
    monkeypatch.setattr(bwd, "_varlen_config", lambda p: replace(real(p), dq_writer=True))
    lengths = (70, 0, 130)
    hq, d = 2, 64
    tq = sum(lengths)
    p = AttentionProblem(batch=3, heads_q=hq, heads_kv=hq, seqlen_q=130, seqlen_k=130, head_dim=d, head_dim_v=d,
                         dtype=torch.bfloat16, causal="bottom_right", scale=0.3)
    g = torch.Generator().manual_seed(2)
    q, dout, out, k, v = (torch.randn(tq, hq, d, generator=g).to(torch.bfloat16) for _ in range(5))
    cu = torch.tensor([0, 70, 70, 200], dtype=torch.int32)
    dq, _, _ = bwd.varlen_backward(dout, q, k, v, out, torch.randn(hq, tq, generator=g), cu, cu, 130, 130, p)
    (_, prep_args), (_, args) = host.launches
    config = bwd._varlen_config(p)
    rows = bwd.varlen_tile_rows(tq, 3, config.block_m)
    assert _unwrap(prep_args[5]).numel() == 4 and getattr(prep_args[8], "value", prep_args[8]) == 0  # zeroes none
    acc = _unwrap(args[6])
    assert acc.numel() == hq * rows * d
    full = bwd.dq_from_tiles(acc.view(1, hq, rows, d), config, rows, torch.float32)[0]  # (Hq, rows, D)
    want = full[:, bwd.varlen_token_rows(cu, tq, config.block_m)].transpose(0, 1).to(q.dtype)
    assert dq.shape == q.shape and dq.is_contiguous() and torch.equal(dq, want)
    # With the host's offsets the rows are built once per batch and kept.
    from cute_kernels.attention.varlen import HostOffsets

    monkeypatch.setattr(bwd, "_TOKEN_ROWS", {})
    offsets = HostOffsets(cu_q=(0, 70, 70, 200), cu_k=(0, 70, 70, 200), seqused_k=None)
    kept = bwd._token_rows(cu, tq, config.block_m, offsets)
    assert bwd._token_rows(cu, tq, config.block_m, offsets) is kept
    assert torch.equal(kept, bwd.varlen_token_rows(cu, tq, config.block_m))
