"""The gated (SwiGLU) epilogue on an sm_90 GPU: silu(x Wg^T) * (x Wu^T) and the product itself
from one `sm90_persistent` GEMM, against float64, for every schedule and tile class the
heuristic picks, edge tiles, both majors of the weight and NaN propagation; `ops.linear_swiglu`
forward and backward on the gated and the unfused routes. Outputs come from an allocator
poisoned with NaN, so an element the kernel does not write fails the check."""

import pytest
import torch

from cute_kernels.bench.fuzz_record import poison
from cute_kernels.gemm import gated
from cute_kernels.gemm.sm90_config import Sm90GemmConfig

pytestmark = pytest.mark.gpu

CONFIGS = {
    "heuristic": None,
    "coop_128x256_2x1": Sm90GemmConfig(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1),
    "coop_128x192_1x1": Sm90GemmConfig(tile_m=128, tile_n=192, cluster_m=1, cluster_n=1),
    "pingpong_128x128_1x2": Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, schedule="pingpong"),
    "pingpong_64x128": Sm90GemmConfig(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong"),
}


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def _problem(m, i, k, dtype, weight_major="K", seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
    w = torch.randn(2 * i, k, generator=gen, device="cuda").to(dtype)
    if weight_major == "N":  # the same values with unit stride along the 2I rows
        w = w.t().contiguous().t()
    return x, w


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("m,i,k", [(384, 512, 256), (300, 200, 192), (129, 1000, 520)])
@pytest.mark.parametrize("preact", [True, False])
def test_gated_kernel_matches_float64(name, m, i, k, preact):
    _hopper()
    x, w = _problem(m, i, k, torch.bfloat16, seed=m + i)
    poison("cuda", 4 * m * i)
    out = gated.gated_product(x, w, preact, alpha=0.75, config=CONFIGS[name])
    assert out is not None
    h, p = out
    ref_p = 0.75 * x.double() @ w.double().t()
    assert h.shape == (m, i) and _rel(h, gated.swiglu_of_product(ref_p)) < 6e-3
    if preact:
        assert p.shape == (m, 2 * i) and _rel(p, ref_p) < 5e-3
    else:
        assert p is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_major", ["K", "N"])
def test_public_entry_routes_and_matches(dtype, weight_major):
    _hopper()
    for m in (1, 64, 128, 129, 1000):
        x, w = _problem(m, 256, 384, dtype, weight_major, seed=m)
        poison("cuda", 8 * m * 256)
        h, p = gated.matmul_swiglu(x, w, preact=True)
        route = gated.last_route()
        assert route.startswith("sm90_persistent") == (m > gated.SKINNY_M), (m, route)
        ref_p = x.double() @ w.double().t()
        assert _rel(h, gated.swiglu_of_product(ref_p)) < (6e-3 if dtype == torch.bfloat16 else 2e-3), (m, route)
        assert _rel(p, ref_p) < 5e-3


def test_nan_in_a_row_stays_in_that_row():
    _hopper()
    x, w = _problem(512, 256, 256, torch.bfloat16)
    x[7, 3] = float("nan")
    h, _ = gated.matmul_swiglu(x, w)
    assert gated.last_route().startswith("sm90_persistent")
    assert h[7].isnan().all() and not h[8].isnan().any() and not h[:7].isnan().any()


@pytest.mark.parametrize("m", [64, 777])
def test_op_forward_and_backward_against_float64(m):
    _hopper()
    import cute_kernels.ops as ops

    wg = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    wu = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = gated.interleave_gate_up(wg, wu).requires_grad_()
    h, p = ops.linear_swiglu(x, w, True)
    dh = torch.randn_like(h)
    dx, dw = torch.autograd.grad(h, (x, w), dh)
    xd, gd, ud = (t.detach().double().requires_grad_() for t in (x, wg, wu))
    ref = torch.nn.functional.silu(xd @ gd.t()) * (xd @ ud.t())
    rx, rg, ru = torch.autograd.grad(ref, (xd, gd, ud), dh.double())
    assert _rel(h, ref) < 6e-3
    assert _rel(dx, rx) < 1e-2 and _rel(dw, gated.interleave_gate_up(rg, ru)) < 1e-2


def test_swiglu_backward_writes_the_gradient_blocks_in_place():
    _hopper()
    from cute_kernels.fused import swiglu_backward

    p = torch.randn(300, 512, device="cuda", dtype=torch.bfloat16)
    dh = torch.randn(300 * 256 // 8, 8, device="cuda", dtype=torch.bfloat16)
    g, u = gated.gate_up_rows(p)
    dg, du = swiglu_backward(dh, g, u)
    dp = torch.full_like(p, float("nan"))
    out = gated.gate_up_rows(dp)
    got = swiglu_backward(dh, g, u, out=out)
    assert got[0].data_ptr() == out[0].data_ptr() and got[1].data_ptr() == out[1].data_ptr()
    assert torch.equal(out[0], dg) and torch.equal(out[1], du) and not dp.isnan().any()


def test_a_transformers_llama_with_fused_mlps_matches_stock():
    _hopper()
    transformers = pytest.importorskip("transformers")
    import copy

    import cute_kernels.nn as cnn

    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=1000)
    torch.manual_seed(0)
    stock = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    ours = copy.deepcopy(stock)
    assert cnn.fuse_gated_mlps(ours) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    ids = torch.randint(0, 1000, (2, 100), device="cuda")  # 200 tokens: past the skinny bound, the gated kernel
    ref = copy.deepcopy(stock).float()
    out_ref, out_s, out_o = ref(ids, labels=ids), stock(ids, labels=ids), ours(ids, labels=ids)
    # ours against the fp32 model, no further than stock's bf16 is (with margin)
    bound = 3 * _rel(out_s.logits, out_ref.logits.double()) + 1e-3
    assert _rel(out_o.logits, out_ref.logits.double()) < bound
    out_o.loss.backward()
    out_ref.loss.backward()
    mlp_o, mlp_r = ours.model.layers[0].mlp, ref.model.layers[0].mlp
    want = gated.interleave_gate_up(mlp_r.gate_proj.weight.grad, mlp_r.up_proj.weight.grad)
    assert _rel(mlp_o.gate_up.grad, want.double()) < 3e-2
