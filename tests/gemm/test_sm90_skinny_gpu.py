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
