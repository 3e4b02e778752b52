"""Every host route of the sm90 rungs, checked numerically on the CPU.

The compiler is replaced by an emulator of what the kernel computes from its launch arguments:
C = act(alpha * A . B^T (+ beta * Csrc) (+ bias)) in the kernel's own orientation, read and
written through the exact views (sizes and strides) the host hands over, with TMA's rules
checked on each (16-byte aligned base and strides, one unit-stride mode among the first two,
the compiled major matching the view). So whatever the host does to a problem (swap-AB,
split-K partials, padded copies, temporaries, caller-order launches of warm calls), the
result must equal a float64 reference: a route that hands the kernel a wrong view gives a
wrong answer here, without a GPU. The GPU fuzz (tests/gemm/test_gemm_fuzz_gpu.py) checks the
kernels themselves on the same kinds of problems.
"""

from __future__ import annotations

import importlib.util
import random

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("cutlass") is None:
    pytest.skip("needs the CuTe DSL", allow_module_level=True)

from cute_kernels.gemm import api, sm90_rung  # noqa: E402
from cute_kernels.gemm.sm90_persistent import rung as persistent  # noqa: E402
from cute_kernels.gemm.sm90_tma_wgmma import rung as tma_wgmma  # noqa: E402
from cute_kernels.runtime import plan_cache  # noqa: E402
from cute_kernels.runtime.plan_cache import invalidate  # noqa: E402


def _act(x, activation):
    from cute_kernels.gemm import activations  # the definitions, pinned by tests/gemm/test_activations.py

    return activations.apply(x, activation)


def _check_tma(t, lead, what):
    assert t.data_ptr() % 16 == 0, f"{what}: base not 16-byte aligned"
    assert t.stride(lead) == 1, f"{what}: compiled with leading mode {lead}, strides {t.stride()}"
    es = t.element_size()
    for i in range(3):
        if i != lead:
            assert (t.stride(i) * es) % 16 == 0, f"{what}: stride {t.stride()} of mode {i} not 16-byte aligned"


class Emulator:
    """Stands in for `compile_kernel`: each build's function computes what the kernel would."""

    def __init__(self):
        self.launches = 0
        self.split_launches = 0

    def __call__(self, jit_fn, *args, key, options=None):
        if isinstance(jit_fn, sm90_rung.CallerOrderLaunch):
            spec = key[3]

            def caller_order(a, b, out, alpha, beta):
                A, B, C = jit_fn.views(a, b, out)
                self._gemm(A, B, C, None, None, None, alpha, beta, spec, None)

            return caller_order
        spec, leads, config = key[2], key[6:9], key[1]
        fuses = len(args) > 6  # (A, B, C, Csrc, bias, scale_a, scale_b, alpha, beta, clusters, stream)
        split = "split_k" in key  # ... scale_b, workspace, counters, alpha, ...: K chunks summed in the kernel

        def launch(*la):
            if split:
                A, B, C, Csrc, bias, sa, sb, ws, counters, splits, alpha, beta = la
                self._check_split(A, B, C, ws, counters, splits, config)
            elif fuses:
                A, B, C, Csrc, bias, sa, sb, alpha, beta = la
            else:
                (A, B, C, alpha), Csrc, bias, sa, sb, beta = la, None, None, None, None, 0.0
            self._gemm(A, B, C, Csrc, bias, (sa, sb), alpha, beta, spec, leads, split)

        return launch

    def _check_split(self, A, B, C, ws, counters, S, config):
        """A split-K launch's contract (`sm90_persistent.SplitKLaunch`): one batch, K's k-tiles in
        S chunks none of which is empty, a 16-byte aligned fp32 workspace of a block per (tile,
        chunk), and a zeroed int32 counter per output tile."""
        self.split_launches += 1
        M, N, K = A.shape[0], B.shape[0], A.shape[1]
        tiles = -(-M // config.tile_m) * -(-N // config.tile_n)
        k_tiles = -(-K // config.tile_k)
        assert A.shape[2] == B.shape[2] == C.shape[2] == 1, "split-K takes one batch"
        assert isinstance(S, int) and 1 < S and (S - 1) * -(-k_tiles // S) < k_tiles, f"{S} chunks of {k_tiles}"
        assert ws.dtype == torch.float32 and ws.data_ptr() % 16 == 0
        assert ws.numel() >= tiles * S * config.tile_m * config.tile_n, "split-K workspace too small"
        assert counters.dtype == torch.int32 and counters.numel() >= tiles and not counters.any(), \
            "split-K counters must be zero and one per tile"

    def _gemm(self, A, B, C, Csrc, bias, scales, alpha, beta, spec, leads, split=False):
        self.launches += 1
        if leads is not None:
            for t, lead, what in zip((A, B, C), leads, "ABC"):
                _check_tma(t, lead, what)
        M, K, L = A.shape
        N = B.shape[0]
        out_n = N // 2 if spec.gate else N  # a gated build stores the product's gated half
        assert B.shape[1] == K and B.shape[2] == L and C.shape[0] == M and C.shape[1] >= out_n and C.shape[2] == L
        acc = torch.einsum("mkl,nkl->mnl", A.double(), B.double()) * alpha
        if spec.gate:
            from cute_kernels.gemm.gated import swiglu_of_product

            assert N % 16 == 0 and not (spec.beta_c or spec.bias or spec.activation or spec.scale_ab)
            if spec.gate_preact:
                _check_tma(Csrc, 1 if Csrc.stride(1) == 1 else 0, "P")
                Csrc.copy_(acc.to(Csrc.dtype))
            C[:, :out_n].copy_(swiglu_of_product(acc.permute(2, 0, 1)).permute(1, 2, 0).to(C.dtype))
            return
        if spec.scale_rows:
            assert scales[0].shape == (M,) and scales[1].shape == (N,), "row-wise scales: one per kernel row / column"
            acc = acc * scales[0].double().view(-1, 1, 1) * scales[1].double().view(1, -1, 1)
        elif spec.scale_ab:
            acc = acc * (scales[0].double().reshape(()) * scales[1].double().reshape(()))
        if spec.beta_c:
            acc = acc + beta * Csrc.double()
        if spec.bias == "n":
            acc = acc + bias.double().view(1, -1, 1)
        elif spec.bias == "m":
            acc = acc + bias.double().view(-1, 1, 1)
        C[:, :N].copy_(_act(acc, spec.activation).to(C.dtype))


@pytest.fixture
def emulated(monkeypatch):
    emu = Emulator()
    monkeypatch.setattr(sm90_rung, "_cuda_reason", lambda a, b, out: None)
    monkeypatch.setattr(sm90_rung, "compile_kernel", emu)
    monkeypatch.setattr(sm90_rung, "tvm_ffi_available", lambda: True)
    monkeypatch.setattr(sm90_rung, "max_active_clusters", lambda n: 132 // n)
    monkeypatch.setattr(sm90_rung, "_compiled", {})
    monkeypatch.setattr(sm90_rung, "_dummies", {})
    # plans are kept for CUDA tensors only; here CPU tensors stand in, so warm calls replay them
    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    invalidate()
    yield emu
    invalidate()


@pytest.fixture(params=[False, True], ids=["split_summed_in_torch", "split_reduced_in_kernel"])
def split_mode(request, monkeypatch, emulated):
    """Both ways split-K sums its chunks (`sm90_skinny.REDUCE_IN_KERNEL` off and on)."""
    from cute_kernels.gemm import sm90_skinny

    monkeypatch.setattr(sm90_skinny, "REDUCE_IN_KERNEL", request.param)
    yield request.param


def _matrix(rows, cols, dtype, major, pad, batch=None):
    """A (rows, cols) operand (or (batch, rows, cols)) with unit stride along `major` ("row":
    the last mode, "col": the second last), its leading dimension padded by `pad` elements (a
    slice of a larger tensor)."""
    lead = (batch,) if batch else ()
    if major == "row":
        t = torch.randn(*lead, rows, cols + pad, dtype=torch.float32).to(dtype)[..., :cols]
    else:
        t = torch.randn(*lead, cols, rows + pad, dtype=torch.float32).to(dtype)[..., :rows].transpose(-1, -2)
    return t


def _call(rung, a, b, *, out_dtype, alpha=1.0, beta=0.0, c=None, bias=None, activation=None):
    """Run `rung` the way `matmul` does (its 3-D unit-stride views) and return the result as
    the caller sees it, with the float64 reference."""
    batch = api._batch(a, b)
    batched = a.dim() == 3 or b.dim() == 3
    a3, _ = api.as_unit_stride(api._as_3d(a, batch), "a")
    b3, _ = api.as_unit_stride(api._as_3d(b, batch), "b")
    m, n = a.shape[-2], b.shape[-1]
    out = torch.full((batch, m, n), float("nan"), dtype=out_dtype)
    c3 = None
    if beta != 0:
        cf = c.expand((batch, m, n) if batched else (m, n))
        c3, _ = api.as_unit_stride(cf if batched else cf.unsqueeze(0), "c")
    rung(a3, b3, out, alpha=alpha, beta=beta, c=c3, bias=bias, activation=activation)
    ref = alpha * torch.matmul(a3.double(), b3.double())
    if beta != 0:
        ref = ref + beta * c3.double()
    if bias is not None:
        ref = ref + bias.double()
    return out, _act(ref, activation)


def _rel(out, ref):
    if ref.numel() == 0:
        return 0.0
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}

# The sizes that decide the routes: 1 and tiny (extent-1 modes), below and past 16-byte rows,
# around the skinny bound (M <= 128), and few-tile problems with long K (split-K).
SMALL_N_M = (1, 2, 3, 64, 128, 129, 130, 256, 1000)
SMALL_N = (1, 2, 3, 4, 7, 8)


@pytest.mark.parametrize("b_major", ["row", "col"])
@pytest.mark.parametrize("a_major", ["row", "col"])
def test_small_n_regime_every_route_is_right(emulated, a_major, b_major):
    """The regime issue 13 found wrong on the GPU (column-major B, N <= 7, many M), whole."""
    for m in SMALL_N_M:
        for n in SMALL_N:
            a = _matrix(m, 1024, torch.bfloat16, a_major, 0)
            b = _matrix(1024, n, torch.bfloat16, b_major, 0)
            out, ref = _call(persistent, a, b, out_dtype=torch.bfloat16)
            assert not out.isnan().any(), f"M={m} N={n}: outputs left unwritten"
            assert _rel(out, ref) < 1e-2, f"M={m} N={n} a {a_major} b {b_major}: rel err {_rel(out, ref)}"


def _random_problem(rng: random.Random):
    pick = rng.random()
    if pick < 0.3:  # the split-K regime: few tiles, long K
        m, n, k = rng.choice([1, 2, 5, 16, 33, 100, 130, 200]), rng.randint(1, 300), rng.randint(1024, 2100)
    elif pick < 0.5:  # tiny extents everywhere
        m, n, k = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 40)
    else:
        m, n, k = rng.randint(1, 300), rng.randint(1, 300), rng.randint(1, 300)
    dtype = rng.choice([torch.bfloat16, torch.float16])
    out_dtype = rng.choice([dtype, dtype, torch.float32])
    batch = rng.choice([None, None, 1, 3])
    bcast = rng.choice([None, "a", "b"]) if batch and batch > 1 else None
    return dict(m=m, n=n, k=k, dtype=dtype, out_dtype=out_dtype, batch=batch, bcast=bcast,
                a_major=rng.choice(["row", "col"]), b_major=rng.choice(["row", "col"]),
                a_pad=rng.choice([0, 0, 1, 8]), b_pad=rng.choice([0, 0, 3, 8]),
                alpha=rng.choice([1.0, 1.0, 0.5, -2.0]), beta=rng.choice([0.0, 0.0, 1.0, 0.25]),
                c_major=rng.choice(["row", "col"]), bias=rng.random() < 0.3,
                activation=rng.choice([None, None, "relu", "gelu_tanh", "silu"]),
                rung=rng.choice([persistent, persistent, tma_wgmma]))


def _run_random(p):
    batch_a = None if p["bcast"] == "a" else p["batch"]
    batch_b = None if p["bcast"] == "b" else p["batch"]
    a = _matrix(p["m"], p["k"], p["dtype"], p["a_major"], p["a_pad"], batch_a)
    b = _matrix(p["k"], p["n"], p["dtype"], p["b_major"], p["b_pad"], batch_b)
    c = _matrix(p["m"], p["n"], p["out_dtype"], p["c_major"], 0) if p["beta"] else None
    bias = torch.randn(p["n"], dtype=torch.float32).to(p["out_dtype"]) if p["bias"] else None
    return _call(p["rung"], a, b, out_dtype=p["out_dtype"], alpha=p["alpha"], beta=p["beta"], c=c, bias=bias,
                 activation=p["activation"])


def test_random_problems_on_every_route(emulated):
    rng = random.Random(1234)
    wrong = []
    for i in range(300):
        p = _random_problem(rng)
        out, ref = _run_random(p)
        err = _rel(out, ref)
        if out.isnan().any() or not err < TOL[p["out_dtype"]] + TOL[p["dtype"]]:
            wrong.append((i, err, {k: v for k, v in p.items() if k != "rung"}, p["rung"].name))
    assert emulated.launches >= 300
    assert not wrong, f"{len(wrong)} of 300 wrong, first: {wrong[:3]}"


@pytest.mark.parametrize("m, n, k, a_major, b_major, swapped", [
    (256, 256, 8192, "col", "row", False),  # a weight gradient: X^T (M-major) times dY (N-major)
    (200, 136, 4104, "row", "col", False),  # partial tiles on both sides, a partial last k-tile
    (16, 1024, 8192, "row", "col", True),  # decode-sized M: swapped and split
    (1, 512, 16384, "row", "row", True),
])
def test_split_k_reduced_in_kernel_with_every_epilogue(emulated, monkeypatch, m, n, k, a_major, b_major, swapped):
    """The in-kernel split-K reduction (`SplitKLaunch`) takes the whole epilogue in the kernel
    (alpha, beta * C, bias per row or column, activation, fp32 output), cold and warm, and the
    torch sum is never reached."""
    from cute_kernels.gemm import sm90_skinny

    monkeypatch.setattr(torch.Tensor, "sum", lambda *a, **kw: pytest.fail("split-K summed in torch"))
    for alpha, beta, bias, activation, out_dtype in [(1.0, 0.0, False, None, torch.bfloat16),
                                                     (0.5, 1.0, True, "gelu_tanh", torch.float32),
                                                     (-2.0, 0.25, True, "relu", torch.bfloat16)]:
        for _ in range(2):  # cold, then the stored plan
            before = emulated.split_launches
            a = _matrix(m, k, torch.bfloat16, a_major, 0)
            b = _matrix(k, n, torch.bfloat16, b_major, 0)
            c = _matrix(m, n, out_dtype, "row", 0) if beta else None
            bias_t = torch.randn(n).to(out_dtype) if bias else None
            out, ref = _call(persistent, a, b, out_dtype=out_dtype, alpha=alpha, beta=beta, c=c, bias=bias_t,
                             activation=activation)
            assert emulated.split_launches == before + 1, "not reduced in the kernel"
            assert _rel(out, ref) < 1e-2, (m, n, k, alpha, beta, bias, activation, _rel(out, ref))
    cfg = sm90_skinny.pick_config(m, n, k, 2, swap_ab=swapped) if swapped else None
    assert swapped == (cfg is not None and cfg.swap_ab)


def test_warm_calls_replay_the_checked_launch(emulated, monkeypatch, split_mode):
    """A second call of the same signature goes through the stored plan (a direct launch, a
    split-K plan or a staged call) and must give the same answer on fresh data."""
    for m, n, k, a_major, b_major in [(256, 256, 512, "row", "col"), (16, 4096, 1024, "row", "col"),
                                      (129, 1, 1024, "row", "col"), (4096, 2, 1024, "row", "col"),
                                      (2, 3, 1024, "col", "row"), (16, 1024, 8192, "row", "col"),
                                      (64, 100, 1001, "row", "col"), (300, 37, 64, "col", "row")]:
        checked = []
        monkeypatch.setattr(type(persistent), "supports", lambda self, a, b, out: checked.append(1))
        for i in range(3):
            a = api._as_3d(_matrix(m, k, torch.bfloat16, a_major, 0), 1)
            b = api._as_3d(_matrix(k, n, torch.bfloat16, b_major, 0), 1)
            out = torch.full((1, m, n), float("nan"), dtype=torch.bfloat16)
            persistent(a, b, out)
            ref = torch.matmul(a.double(), b.double())
            assert _rel(out, ref) < 1e-2, (m, n, k, a_major, b_major, i)
        assert len(checked) == 1, f"{m}x{n}x{k}: warm calls did not replay a plan ({len(checked)} checked calls)"


def test_matmul_warm_path_on_fresh_data(emulated, monkeypatch):
    """`matmul`'s own plans (caller-order launches) on CPU tensors, cold then warm."""
    monkeypatch.setattr(api, "_check_cuda", lambda t, what, device: None)
    monkeypatch.setattr(api, "resolve", lambda kernel, a, b, out: persistent)
    real_is_cuda = torch.Tensor.is_cuda
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    try:
        for m, n, k in [(300, 200, 256), (8, 1, 1024), (4096, 2, 1024), (1, 4096, 512)]:
            w = torch.randn(n, k).to(torch.bfloat16)
            for _ in range(3):
                x = torch.randn(m, k).to(torch.bfloat16)
                out = api.matmul(x, w.t())
                assert _rel(out, torch.matmul(x.double(), w.double().t())) < 1e-2, (m, n, k)
    finally:
        monkeypatch.setattr(torch.Tensor, "is_cuda", real_is_cuda)


def test_the_gemm_fuzz_problems_through_the_public_entry_points(emulated, monkeypatch, split_mode):
    """The GPU fuzz's own problems (smaller) through `matmul`, `matmul_epilogue` and
    `matmul_swiglu` on the emulated kernel: the entry points' views, broadcasts and plans, cold
    and warm."""
    from cute_kernels.bench import gemm_fuzz
    from cute_kernels.gemm import epilogue_api, gated

    monkeypatch.setattr(api, "_check_cuda", lambda t, what, device: None)
    monkeypatch.setattr(api, "resolve", lambda kernel, a, b, out: persistent)
    monkeypatch.setattr(epilogue_api, "_device_reason", lambda a, b: None)
    # the gemv specialist is simulated by its own tests (tests/gemm/test_gemv*.py): here the
    # sm90 routes take every problem
    from cute_kernels.gemm.gemv import RUNG as gemv

    monkeypatch.setattr(type(gemv), "supports", lambda self, a, b, out: "not emulated here")
    monkeypatch.setattr(gated, "_device_reason", lambda x2: None)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    report = gemm_fuzz.run(4321, 250, device="cpu", max_size=320, dtypes=("bf16", "fp16"))
    monkeypatch.undo()
    assert report.cases == 250
    assert report.wrong == 0, [(f["problem"], f["why"]) for f in report.failures]


def test_split_regime_problems_reduced_in_kernel_through_the_entry_points(emulated, monkeypatch):
    """Problems of the split-K regime (few tiles, long K: the GPU test's draws, smaller) through
    `matmul` and `matmul_epilogue` with the in-kernel reduction on: every major, epilogue,
    output dtype and addend layout reaches `SplitKLaunch` with views it can take, or the torch
    sum where it cannot, and the result is right either way."""
    from cute_kernels.bench import gemm_fuzz
    from cute_kernels.gemm import epilogue_api

    monkeypatch.setattr(api, "_check_cuda", lambda t, what, device: None)
    monkeypatch.setattr(api, "resolve", lambda kernel, a, b, out: persistent)
    monkeypatch.setattr(epilogue_api, "_device_reason", lambda a, b: None)
    from cute_kernels.gemm.gemv import RUNG as gemv

    monkeypatch.setattr(type(gemv), "supports", lambda self, a, b, out: "not emulated here")
    rng = random.Random(99)
    wrong = []
    for _ in range(80):
        dtype = rng.choice(["bf16", "fp16"])
        entry = rng.choice(["matmul", "epilogue"])
        p = gemm_fuzz.Problem(m=rng.choice([1, 7, 16, 64, 100, 128, 256]), n=rng.choice([8, 64, 136, 256, 300]),
                              k=rng.choice([2048, 4096, 4160, 8192]), dtype=dtype,
                              out_dtype=rng.choice([dtype, "fp32"]), entry=entry,
                              a_major=rng.choice(["row", "col"]), b_major=rng.choice(["row", "col"]),
                              alpha=rng.choice([1.0, -0.5]), beta=rng.choice([0.0, 1.0]),
                              c_major=rng.choice(["row", "col"]),
                              bias=rng.choice([None, "n", "m"]) if entry == "epilogue" else None,
                              activation=rng.choice([None, "relu", "gelu_tanh"]) if entry == "epilogue" else None)
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
            t = gemm_fuzz.inputs(p, torch.Generator().manual_seed(rng.randrange(1 << 30)), "cpu")
            out = gemm_fuzz.call(p, t)
        ref = gemm_fuzz.reference(p, t)
        if not _rel(out, ref) <= gemm_fuzz.tolerance(p):
            wrong.append((p.name, _rel(out, ref)))
    assert not wrong, wrong[:5]
    assert emulated.split_launches >= 20, emulated.split_launches


@pytest.mark.parametrize("rowwise", [False, True, "a_only"])
def test_fp8_scales_per_tensor_and_row_wise_on_every_route(emulated, monkeypatch, rowwise, split_mode):
    """scaled_mm's fp8 calls (swap-AB at small M, split-K, the ordinary path, copies of
    non-K-major operands), cold and warm, with per-tensor or row-wise scales."""
    from cute_kernels.gemm import epilogue_api
    from cute_kernels.gemm.epilogue_api import scaled_mm

    fp8 = torch.float8_e4m3fn
    monkeypatch.setattr(epilogue_api, "_device_reason", lambda a, b: None)
    for m, n, k, b_major in [(16, 4096, 1024, "col"), (16, 1024, 8192, "col"), (300, 256, 512, "col"),
                             (200, 96, 256, "row"), (5, 40, 64, "row")]:
        for _ in range(2):
            a = torch.randn(m, k).to(fp8)
            b = _matrix(k, n, fp8, b_major, 0)
            sa = (torch.rand(m, 1) + 0.5) if rowwise else (torch.rand(()) + 0.5)
            sb = (torch.rand(1, n) + 0.5) if rowwise is True else (torch.rand(()) + 0.5)
            out = scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
            ref = (a.double() * sa.double()) @ (b.double() * sb.double())
            assert _rel(out, ref) < 1e-5, (m, n, k, b_major, rowwise)


@pytest.mark.parametrize("rows, k, major, fp8", [(100, 4100, "k", False), (4100, 4100, "mn", False),
                                                 (7, 33, "mn", False), (64, 4100, "mn", True), (1, 9, "mn", False),
                                                 (5, 1, "k", False)])
def test_aligned_copy_keeps_the_major_and_pads_only_strides(rows, k, major, fp8):
    """An operand TMA cannot address is copied in its own major (a coalesced copy, no
    transpose) with 16-byte aligned strides and the same extents; fp8 copies are K-major."""
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    src = torch.randn(2, rows, k).to(dtype)  # (L, rows, K): K-major
    t = src.permute(1, 2, 0)
    if major == "mn":
        t = torch.randn(2, k, rows).to(dtype).permute(2, 1, 0)  # rows-major
    got = sm90_rung._aligned_copy(t, fp8)
    assert got is not None and tuple(got.shape) == tuple(t.shape)
    assert torch.equal(got.float(), t.float())
    # (a K of 1 leaves both modes unit-stride: the copy may keep either)
    lead = 1 if (fp8 or rows == 1 or (major == "k" and k > 1)) else 0
    _check_tma(got, lead, "copy")


@pytest.mark.parametrize("m,i,k", [(129, 8, 16), (300, 200, 192), (1000, 64, 1000), (64, 32, 64), (5, 16, 8)])
@pytest.mark.parametrize("weight_major", ["K", "N"])
@pytest.mark.parametrize("preact", [True, False])
def test_gated_route_hands_the_kernel_its_views(emulated, monkeypatch, m, i, k, weight_major, preact):
    """`gemm.gated.matmul_swiglu` on the emulated kernel: the gated launch (M past the skinny
    bound: output and product views, the weight K- or N-major as it lies) and the unfused one
    below it both give silu(g) * u of the float64 product."""
    from cute_kernels.gemm import gated

    monkeypatch.setattr(api, "_check_cuda", lambda t, what, device: None)
    monkeypatch.setattr(api, "resolve", lambda kernel, a, b, out: persistent)
    monkeypatch.setattr(gated, "_device_reason", lambda x2: None)
    from cute_kernels.gemm.gemv import RUNG as gemv

    monkeypatch.setattr(type(gemv), "supports", lambda self, a, b, out: "not emulated here")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    x = torch.randn(m, k).to(torch.bfloat16)
    w = torch.randn(2 * i, k).to(torch.bfloat16)
    if weight_major == "N":
        w = w.t().contiguous().t()
    launches = emulated.launches
    h, p = gated.matmul_swiglu(x, w, preact=preact, alpha=0.5)
    route = gated.last_route()
    monkeypatch.undo()
    ref_p = 0.5 * x.double() @ w.double().t()
    assert route.startswith("sm90_persistent") == (m > gated.SKINNY_M), route
    assert emulated.launches > launches
    assert _rel(h, gated.swiglu_of_product(ref_p)) < 1e-2
    assert (p is None) != preact and (p is None or _rel(p, ref_p) < 1e-2)
