"""Fused epilogue and fp8 on the sm90 rungs.

CPU: argument checks raise clear errors before any launch; the configs the fp8 heuristic picks
fit promotion's two accumulators in registers. GPU: act(alpha * A.B + beta * C + bias) and
fp8 scaled products against a float64 reference (fresh N(0,1) inputs, NaN-poisoned outputs),
NaN propagation through every activation, and the ping-pong schedule on multi-tile CTAs.
"""

import pytest
import torch

from cute_kernels.gemm.sm90_config import Sm90GemmConfig, pick_fp8_config

ACTS = (None, "relu", "gelu", "gelu_tanh", "silu")


def _ref_act(x, act):
    if act == "relu":
        return torch.relu(x)
    if act == "gelu":
        return 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if act == "silu":
        return torch.nn.functional.silu(x)
    return x


# ---- CPU -------------------------------------------------------------------------------------

def test_epilogue_spec_rejects_unknown_terms():
    from cute_kernels.hopper.epilogue import EpilogueSpec

    with pytest.raises(ValueError, match="activation"):
        EpilogueSpec(activation="tanh").validate()
    with pytest.raises(ValueError, match="bias"):
        EpilogueSpec(bias="k").validate()
    assert EpilogueSpec(beta_c=True, bias="n", activation="silu").validate().tag == "c+bias_n+silu"


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(bias=torch.zeros(7)), ValueError, r"shape \(5,\)"),
    (dict(bias=torch.zeros(3), bias_dim="m"), ValueError, r"shape \(4,\)"),
    (dict(bias=torch.zeros(5), bias_dim="k"), ValueError, "bias_dim"),
    (dict(activation="gelu_erf"), ValueError, "activation"),
    (dict(beta=1.0), ValueError, "needs c"),
    (dict(beta=1.0, c=torch.zeros(1, 4, 6)), ValueError, "c has shape"),
    (dict(bias=torch.zeros(5, dtype=torch.int32)), TypeError, "bias must be"),
])
def test_bad_epilogue_arguments_raise(kw, exc, msg):
    from cute_kernels.gemm.sm90_rung import _check_epilogue

    out = torch.empty(1, 4, 5)
    args = dict(beta=0.0, c=None, bias=None, bias_dim="n", activation=None) | kw
    with pytest.raises(exc, match=msg):
        _check_epilogue("rung", out, args["beta"], args["c"], args["bias"], args["bias_dim"], args["activation"])


def test_scales_are_per_tensor_or_row_wise_device_fp32():
    from cute_kernels.gemm.sm90_rung import _check_scales

    out = torch.empty(1, 4, 5)
    with pytest.raises(ValueError, match="both"):
        _check_scales("rung", out, torch.ones(1), None)
    with pytest.raises(ValueError, match=r"per tensor .* or row-wise: scale_a with M = 4"):
        _check_scales("rung", out, torch.ones(2), torch.ones(1))
    with pytest.raises(ValueError, match="float32"):
        _check_scales("rung", out, torch.ones(1, dtype=torch.float16), torch.ones(1))
    assert _check_scales("rung", out, None, None) is None
    sa, sb, rows = _check_scales("rung", out, torch.ones(()), torch.ones(1, 1))
    assert not rows and sa.shape == sb.shape == (1,)
    sa, sb, rows = _check_scales("rung", out, torch.rand(4, 1), torch.rand(1, 5))
    assert rows and sa.shape == (4,) and sb.shape == (5,) and sa.is_contiguous()
    sa, sb, rows = _check_scales("rung", out, torch.rand(4, 1), torch.tensor(2.0))  # one of each: repeated
    assert rows and sb.shape == (5,) and bool((sb == 2.0).all())


@pytest.mark.parametrize("m,n,k", [(16, 8192, 8192), (4096, 4096, 4096), (8192, 8192, 8192), (333, 517, 4096)])
def test_fp8_heuristic_fits_promotion(m, n, k):
    cfg = pick_fp8_config(m, n, k).validate()
    assert cfg.tile_k == 128 and cfg.fp8_promotion_fits()
    cfg.resolved_stages(1, 16)
    assert not Sm90GemmConfig(tile_m=128, tile_n=256).fp8_promotion_fits()


def test_fusing_kernel_names_a_rung_only_where_one_can_fuse(monkeypatch):
    from cute_kernels.gemm import epilogue_api

    x = torch.randn(4, 8, dtype=torch.bfloat16)
    assert epilogue_api.fusing_kernel(x) is None  # not on a CUDA device
    assert epilogue_api.fusing_kernel(x, "sm80_mma") is None  # not a fusing rung
    fake = type("FakeCuda", (), {"device": torch.device("cuda", 0), "dtype": torch.bfloat16})()
    monkeypatch.setattr(epilogue_api, "_HOPPER", {0: True})
    assert epilogue_api.fusing_kernel(fake) == "auto"  # matmul_epilogue picks per problem (gemv or sm90_persistent)
    assert epilogue_api.fusing_kernel(fake, "sm90_tma_wgmma") == "sm90_tma_wgmma"
    fake.dtype = torch.float32
    assert epilogue_api.fusing_kernel(fake) is None  # the sm90 rungs take 16-bit inputs here
    fake.dtype = torch.bfloat16
    monkeypatch.setattr(epilogue_api, "_HOPPER", {0: False})
    assert epilogue_api.fusing_kernel(fake) is None  # below sm_90


# ---- GPU -------------------------------------------------------------------------------------

def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["sm90_persistent", "sm90_warp_specialized"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape,bias_dim,beta,out_dtype", [
    ((1, 384, 640, 256), "n", 0.5, torch.bfloat16),   # fused path, edge tiles in M and N
    ((2, 256, 512, 192), "m", 0.0, torch.float32),     # batched, per-row bias, fp32 out
    ((1, 333, 517, 129), "n", 1.0, torch.bfloat16),    # unaligned: padded copy, torch epilogue
])
def test_fused_epilogue_matches_float64(kernel, act, shape, bias_dim, beta, out_dtype):
    _hopper()
    from cute_kernels.gemm.epilogue_api import matmul_epilogue

    L, M, N, K = shape
    a = torch.randn(L, M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(L, N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N if bias_dim == "n" else M, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(L, M, N, device="cuda", dtype=out_dtype) if beta else None
    out = matmul_epilogue(a, w.transpose(1, 2), bias=bias, bias_dim=bias_dim, activation=act, alpha=0.75,
                          beta=beta, c=c, out_dtype=out_dtype, kernel=kernel)
    pre = 0.75 * (a.double() @ w.double().transpose(1, 2))
    pre = pre + (bias.double().view(1, 1, -1) if bias_dim == "n" else bias.double().view(1, -1, 1))
    if beta:
        pre = pre + beta * c.double()
    ref = _ref_act(pre, act)
    assert out.shape == (L, M, N) and out.dtype == out_dtype
    assert _rel(out, ref) < (1e-2 if out_dtype == torch.float32 else 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("act", ACTS)
def test_nan_propagates_through_activation(act):
    _hopper()
    from cute_kernels.gemm.epilogue_api import matmul_epilogue

    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    a[7, 3] = float("nan")
    out = matmul_epilogue(a, b, bias=torch.randn(256, device="cuda"), activation=act)
    assert out[7].isnan().all() and not out[8].isnan().any()


@pytest.mark.gpu
def test_beta_zero_ignores_nan_in_c():
    _hopper()
    from cute_kernels.gemm.epilogue_api import matmul_epilogue

    a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    c = torch.full((256, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert not matmul_epilogue(a, b, beta=0.0, c=c).isnan().any()


@pytest.mark.gpu
@pytest.mark.parametrize("dt_a,dt_b", [(torch.float8_e4m3fn, torch.float8_e4m3fn), (torch.float8_e5m2, torch.float8_e4m3fn)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fast_accum", [False, True])
def test_fp8_scaled_mm_matches_float64(dt_a, dt_b, out_dtype, fast_accum):
    _hopper()
    from cute_kernels.gemm.epilogue_api import scaled_mm

    M, N, K = 512, 768, 1024
    a = torch.randn(M, K, device="cuda").to(dt_a)
    w = torch.randn(N, K, device="cuda").to(dt_b)
    sa = torch.tensor([0.5], device="cuda")
    sb = torch.tensor([1.5], device="cuda")
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    cfg = (Sm90GemmConfig(tile_m=128, tile_n=256, tile_k=128, fp8_fast_accum=True) if fast_accum
           else pick_fp8_config(M, N, K))
    out = scaled_mm(a, w.t(), sa, sb, bias=bias, activation="gelu_tanh", out_dtype=out_dtype, config=cfg)
    ref = _ref_act(0.75 * (a.double() @ w.double().t()) + bias.double(), "gelu_tanh")
    assert _rel(out, ref) < (1e-2 if out_dtype == torch.float32 else 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [(2, 1), (1, 2)])
def test_pingpong_multi_tile_ctas(cluster):
    """4096 x 4096 in 128 x 128 tiles: about 8 tiles per CTA, each warpgroup 4, with more
    k-tiles (16) than pipeline stages, where a parity-only wait would run a phase ahead."""
    _hopper()
    from cute_kernels.gemm.sm90_persistent import rung

    cfg = Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=cluster[0], cluster_n=cluster[1], schedule="pingpong")
    a = torch.randn(1, 4096, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, 4096, 1024, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    out = torch.full((1, 4096, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(4096, device="cuda")
    rung(a, b, out, config=cfg, bias=bias, activation="relu")
    ref = torch.relu(a.double() @ b.double() + bias.double().view(1, 1, -1))
    assert _rel(out, ref) < 2e-2


@pytest.mark.gpu
def test_fp8_pingpong_promoted():
    """fp8 with promotion on the ping-pong schedule (64-wide tiles keep both accumulators in a
    warpgroup's registers); several tiles per CTA."""
    _hopper()
    from cute_kernels.gemm.epilogue_api import scaled_mm

    a = torch.randn(2048, 2048, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(2048, 2048, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones(1, device="cuda")
    cfg = Sm90GemmConfig(tile_m=128, tile_n=64, tile_k=128, cluster_m=2, schedule="pingpong")
    out = scaled_mm(a, w.t(), one, one, out_dtype=torch.float32, config=cfg)
    assert _rel(out, a.double() @ w.double().t()) < 1e-3

