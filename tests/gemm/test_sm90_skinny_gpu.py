"""The small-M path (sm90_skinny: swap-AB, split-K) of sm90_persistent on the GPU against a
float64 reference: fresh N(0,1) inputs, NaN-poisoned outputs, every route asserted taken.

M in {1, 7, 16, 64, 100, 128}; N, K aligned (swap), small N (swap + split-K), odd N or K (the
padded fallback); all four majors; batched; the fused epilogue (alpha, beta * C, bias per row
or column, activations), fp32 output and fp8 inputs through the swap.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

MS = (1, 7, 16, 64, 100, 128)


def _rung():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    from cute_kernels.gemm.sm90_persistent import rung

    return rung


def _operands(L, M, N, K, a_mm=False, b_nm=False, dtype=torch.bfloat16):
    a = torch.randn(L, K, M, device="cuda").to(dtype).transpose(1, 2) if a_mm else \
        torch.randn(L, M, K, device="cuda").to(dtype)
    b = torch.randn(L, K, N, device="cuda").to(dtype) if b_nm else \
        torch.randn(L, N, K, device="cuda").to(dtype).transpose(1, 2)
    return a, b


def _route(rung, a, b, out, spec=None):
    """The route sm90_skinny takes for this call (as Sm90Rung.__call__ prepares it)."""
    from cute_kernels.gemm import sm90_rung, sm90_skinny
    from cute_kernels.gemm.sm90_config import pick_config
    from cute_kernels.hopper.epilogue import EpilogueSpec

    L, M, K = a.shape
    A, B = (sm90_rung.tma_operand(t) for t in (a.permute(1, 2, 0), b.permute(2, 1, 0)))
    if A is None or B is None or (a.element_size() == 1 and (A.stride(1) != 1 or B.stride(1) != 1)):
        return None  # copied first (sm90_rung._operands): the ordinary path
    cfg = pick_config(M, b.shape[2], K, a.element_size())
    return sm90_skinny.route(rung, cfg, A, B, out, spec or EpilogueSpec())[0]


def _ref_act(x, act):
    if act == "relu":
        return torch.relu(x)
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    return x


def _check(out, ref, tol):
    assert not out.isnan().any()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < tol, err


@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("N,K,want", [(8192, 1024, "swap"), (1024, 4096, "swap_split"), (3001, 1537, None)],
                         ids=["swap", "split", "odd"])
@pytest.mark.parametrize("a_mm,b_nm", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["aK-bK", "aM-bK", "aK-bN", "aM-bN"])
def test_skinny_matches_float64(M, N, K, want, a_mm, b_nm):
    rung = _rung()
    a, b = _operands(1, M, N, K, a_mm, b_nm)
    out = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    route = _route(rung, a, b, out)
    # M-major a needs 16-byte rows of M; otherwise the call falls back (still correct)
    # M-major a needs 16-byte rows of M (M = 1 is a row: any stride serves); otherwise the call falls back (still correct)
    assert route == (want if not (a_mm and M % 8 and M > 1) else None)
    rung(a, b, out, alpha=1.0, beta=0.0, c=None)
    _check(out, a.double() @ b.double(), 2e-2)


@pytest.mark.parametrize("M", [7, 64])
def test_batched_swaps_without_split(M):
    rung = _rung()
    a, b = _operands(3, M, 2048, 1024, b_nm=True)
    out = torch.full((3, M, 2048), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert _route(rung, a, b, out) == "swap"
    rung(a, b, out, alpha=1.0, beta=0.0, c=None)
    _check(out, a.double() @ b.double(), 2e-2)


@pytest.mark.parametrize("M,N", [(16, 8192), (100, 1024)], ids=["swap", "split"])
@pytest.mark.parametrize("bias_dim", ["n", "m"])
@pytest.mark.parametrize("act", [None, "gelu_tanh", "relu"])
def test_fused_epilogue_through_the_swap(M, N, bias_dim, act):
    from cute_kernels.hopper.epilogue import EpilogueSpec

    rung = _rung()
    K = 2048
    a, b = _operands(1, M, N, K)
    c = torch.randn(1, M, N, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N if bias_dim == "n" else M, device="cuda", dtype=torch.float32)
    out = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.float32)
    spec = EpilogueSpec(beta_c=True, bias=bias_dim, activation=act)
    assert _route(rung, a, b, out, spec) == ("swap" if N == 8192 else "swap_split")
    rung(a, b, out, alpha=0.5, beta=-1.5, c=c, bias=bias, bias_dim=bias_dim, activation=act)
    ref = 0.5 * (a.double() @ b.double()) - 1.5 * c.double()
    ref = ref + (bias.double().view(1, 1, -1) if bias_dim == "n" else bias.double().view(1, -1, 1))
    _check(out, _ref_act(ref, act), 1e-3)


@pytest.mark.parametrize("M", [16, 128])
def test_fp8_scaled_through_the_swap(M):
    from cute_kernels.hopper.epilogue import EpilogueSpec

    rung = _rung()
    N, K = 8192, 1024
    a = torch.randn(1, M, K, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(1, N, K, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
    sa, sb = (torch.tensor([s], device="cuda") for s in (0.5, 0.25))
    bias = torch.randn(N, device="cuda")
    out = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert _route(rung, a, b, out, EpilogueSpec(bias="n", scale_ab=True)) == "swap"
    rung(a, b, out, alpha=1.0, beta=0.0, c=None, bias=bias, scale_a=sa, scale_b=sb)
    ref = 0.125 * (a.double() @ b.double()) + bias.double().view(1, 1, -1)
    _check(out, ref, 2e-2)


@pytest.mark.parametrize("N", [8192, 1024], ids=["swap", "split"])
def test_nan_propagates_through_the_swap(N):
    rung = _rung()
    a, b = _operands(1, 16, N, 1024)
    a[0, 3, 5] = float("nan")
    out = torch.zeros(1, 16, N, device="cuda", dtype=torch.bfloat16)
    rung(a, b, out, alpha=1.0, beta=0.0, c=None)
    assert out[0, 3].isnan().all() and not out[0, 4].isnan().any()


# ---- split-K reduced in the kernel (sm90_persistent.SplitKLaunch, the default) ----

@pytest.fixture
def in_kernel(monkeypatch):
    """Every call that takes the in-kernel reduction counted (`_reduced_plan`)."""
    from cute_kernels.gemm import sm90_skinny
    from cute_kernels.runtime.plan_cache import invalidate

    taken = []
    real = sm90_skinny._reduced_plan

    def spy(*args, **kw):
        taken.append(args[1])
        return real(*args, **kw)

    monkeypatch.setattr(sm90_skinny, "_reduced_plan", spy)
    invalidate()  # plans made with the torch sum must not replay
    yield taken
    invalidate()


def _counters_clean():
    from cute_kernels.gemm import sm90_rung

    torch.cuda.synchronize()
    return all(not t.any() for t in sm90_rung._split_counters.values())


@pytest.mark.parametrize("M,N,K,a_mm,b_nm", [
    (768, 768, 12608, True, True),  # ViT-B's weight gradient: X^T (M-major) times dY (N-major); 197 k-tiles in 5
    (256, 4096, 16384, True, True),
    (512, 2048, 8192, False, False),
    (512, 1024, 4104, False, False),  # a partial last k-tile
    (16, 1024, 8192, False, False),  # decode-sized M: swapped and split
    (100, 1000, 4096, False, True),  # partial tiles (the swapped output's rows are 16-byte aligned)
])
def test_split_k_in_kernel_matches_float64_deterministically(in_kernel, M, N, K, a_mm, b_nm):
    rung = _rung()
    a, b = _operands(1, M, N, K, a_mm, b_nm)
    out = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    rung(a, b, out, alpha=1.0, beta=0.0, c=None)
    assert len(in_kernel) == 1, "not reduced in the kernel"
    _check(out, a.double() @ b.double(), 1e-2)
    first = out.clone()
    for _ in range(3):  # warm (the stored plan), on the same data: the same bits whichever CTA ends first
        out.fill_(float("nan"))
        rung(a, b, out, alpha=1.0, beta=0.0, c=None)
        assert torch.equal(out, first)
    assert _counters_clean()


@pytest.mark.parametrize("bias_dim", ["n", "m"])
@pytest.mark.parametrize("act", [None, "gelu_tanh", "relu"])
@pytest.mark.parametrize("M,N", [(768, 768), (16, 1024)], ids=["split", "swap_split"])
def test_split_k_in_kernel_fuses_the_whole_epilogue(in_kernel, M, N, bias_dim, act):
    rung = _rung()
    K = 8192
    a, b = _operands(1, M, N, K, a_mm=True, b_nm=True)
    c = torch.randn(1, M, N, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N if bias_dim == "n" else M, device="cuda", dtype=torch.bfloat16)
    out = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.float32)
    rung(a, b, out, alpha=0.5, beta=-1.5, c=c, bias=bias, bias_dim=bias_dim, activation=act)
    assert len(in_kernel) == 1
    ref = 0.5 * (a.double() @ b.double()) - 1.5 * c.double()
    ref = ref + (bias.double().view(1, 1, -1) if bias_dim == "n" else bias.double().view(1, -1, 1))
    _check(out, _ref_act(ref, act), 1e-3)
    assert _counters_clean()


@pytest.mark.parametrize("rowwise", [False, True])
def test_split_k_in_kernel_fp8(in_kernel, rowwise):
    """fp8 through the in-kernel reduction, as close to float64 as the torch-summed split of the
    same call (fp8 wgmma accumulates with fewer mantissa bits: about 1e-4 at K = 8192)."""
    from cute_kernels.gemm import sm90_skinny
    from cute_kernels.gemm.epilogue_api import scaled_mm
    from cute_kernels.runtime.plan_cache import invalidate

    _rung()
    M, N, K = 16, 1024, 8192
    a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn).t()
    sa = torch.rand(M, 1, device="cuda") + 0.5 if rowwise else torch.tensor(0.5, device="cuda")
    sb = torch.rand(1, N, device="cuda") + 0.5 if rowwise else torch.tensor(0.25, device="cuda")
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    out = scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert len(in_kernel) == 1
    sm90_skinny.REDUCE_IN_KERNEL = False
    invalidate()
    try:
        summed = scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    finally:
        sm90_skinny.REDUCE_IN_KERNEL = True
        invalidate()
    assert len(in_kernel) == 1
    err, err_summed = ((t.double() - ref).norm().item() / ref.norm().item() for t in (out, summed))
    assert not out.isnan().any() and err < 2e-3 and err <= 1.5 * err_summed + 1e-6, (err, err_summed)


@pytest.mark.parametrize("M,N", [(768, 768), (16, 1024)], ids=["split", "swap_split"])
def test_split_k_in_kernel_propagates_nan(in_kernel, M, N):
    rung = _rung()
    a, b = _operands(1, M, N, 8192)
    a[0, 3, 5000] = float("nan")  # in one K chunk of row 3 only
    out = torch.zeros(1, M, N, device="cuda", dtype=torch.bfloat16)
    rung(a, b, out, alpha=1.0, beta=0.0, c=None)
    assert len(in_kernel) == 1
    assert out[0, 3].isnan().all() and not out[0, 4].isnan().any()


def test_split_k_in_kernel_fuzz(in_kernel):
    """Random problems of the split-K regime (few output tiles, long K) through `matmul` and
    `matmul_epilogue` with the in-kernel reduction on, against float64: zero wrong."""
    import random

    from cute_kernels.bench import gemm_fuzz

    _rung()
    rng = random.Random(int(torch.randint(0, 1 << 30, ()).item()))
    wrong, cases = [], 0
    for _ in range(300):
        k = rng.choice([2048, 4096, 8192, 12608, 16384]) + rng.choice([0, 0, 64, 1024])
        dtype = rng.choice(["bf16", "fp16"])
        entry = rng.choice(["matmul", "epilogue"])
        p = gemm_fuzz.Problem(m=rng.choice([1, 7, 16, 64, 100, 128, 256, 512, 768, 1024]),
                              n=rng.choice([8, 64, 256, 768, 1000, 1024, 2048]), k=k, dtype=dtype,
                              out_dtype=rng.choice([dtype, "fp32"]), entry=entry,
                              a_major=rng.choice(["row", "col"]), b_major=rng.choice(["row", "col"]),
                              alpha=rng.choice([1.0, -0.5]), beta=rng.choice([0.0, 1.0]),
                              c_major=rng.choice(["row", "col"]),
                              bias=rng.choice([None, "n", "m"]) if entry == "epilogue" else None,
                              activation=rng.choice([None, "relu", "gelu_tanh", "silu"]) if entry == "epilogue"
                              else None)
        t = gemm_fuzz.inputs(p, torch.Generator(device="cuda").manual_seed(rng.randrange(1 << 30)), "cuda")
        gemm_fuzz._poison("cuda", 2 * p.m * p.n + (p.m + p.n) * p.k)
        out = gemm_fuzz.call(p, t)
        ref = gemm_fuzz.reference(p, t)
        cases += 1
        err = ((out.double() - ref).norm() / ref.norm()).item()
        elem = gemm_fuzz.element_error(p, out, ref)
        if not (err <= gemm_fuzz.tolerance(p) and elem <= gemm_fuzz.element_tolerance(p)):
            wrong.append(f"{p.name}: rel {err:.3g}, element {elem:.3g}")
    print(f"split-K in-kernel fuzz: {cases} cases, {len(in_kernel)} reduced in the kernel, {len(wrong)} wrong")
    assert len(in_kernel) >= 50, "too few problems reached the in-kernel reduction"
    assert not wrong, f"{len(wrong)} wrong: {wrong[:10]}"
    assert _counters_clean()
