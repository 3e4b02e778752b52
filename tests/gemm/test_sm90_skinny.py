"""The small-M host path (sm90_skinny) and its heuristic, on the CPU: which configs skinny
problems get, how K is split in the swapped orientation, and which route each call takes."""

from types import SimpleNamespace

import pytest
import torch

from cute_kernels.gemm import sm90_rung, sm90_skinny
from cute_kernels.gemm.sm90_config import SKINNY_M, Sm90GemmConfig, pick_config, pick_skinny_config, pick_split_k
from cute_kernels.hopper.epilogue import EpilogueSpec

FUSING = SimpleNamespace(split_k=True, kernel_cls=SimpleNamespace(fuses_epilogue=True))
UNFUSED = SimpleNamespace(split_k=True, kernel_cls=SimpleNamespace(fuses_epilogue=False))


@pytest.mark.parametrize("m", [1, 7, 16, 17, 64, 100, 128])
@pytest.mark.parametrize("in_bytes", [1, 2])
def test_skinny_config_covers_m_and_keeps_a_deep_pipeline(m, in_bytes):
    cfg = pick_config(m, 8192, 8192, in_bytes)
    assert cfg == pick_skinny_config(m, 8192, 8192, in_bytes)
    assert cfg.swap_ab and cfg.validate() is cfg
    assert cfg.tile_n >= m and (cfg.tile_n // 2 < m or cfg.tile_n == 16)
    stages = cfg.resolved_stages(in_bytes, 16)
    # the point of the swap: little zero fill per stage, so many stages of loads in flight
    assert stages * cfg.ab_stage_bytes(in_bytes) >= 150 * 1024
    assert stages >= (12 if m <= 16 else 4)
    if in_bytes == 1:
        assert cfg.tile_k == 128 and cfg.fp8_promotion_fits()


def test_large_m_and_unswappable_paths_keep_the_unswapped_configs():
    assert not pick_config(SKINNY_M + 1, 8192, 8192).swap_ab
    old = pick_config(16, 8192, 8192, swap_ab=False)
    assert not old.swap_ab and (old.tile_m, old.tile_n) == (128, 64)
    assert not pick_config(16, 8192, 8192, 1, swap_ab=False).swap_ab
    swap = pick_config(16, 8192, 8192)
    assert sm90_skinny.fallback_config(swap, 16, 8192, 8192, 2) == old
    assert sm90_skinny.fallback_config(old, 16, 8192, 8192, 2) is old


@pytest.mark.parametrize("m,n,k,want", [(16, 8192, 8192, 1), (128, 8192, 8192, 1), (16, 1024, 8192, 16),
                                        (100, 3000, 4096, 4), (16, 4096, 8192, 4)])
def test_split_k_counts_tiles_in_the_swapped_orientation(m, n, k, want):
    cfg = pick_config(m, n, k)
    s = pick_split_k(m, n, k, 1, cfg)
    assert s == want
    tiles = -(-n // cfg.tile_m) * -(-m // cfg.tile_n)
    assert s == 1 or (2 * tiles <= 132 and tiles * s <= 264 and k % s == 0 and k // s >= 8 * cfg.tile_k)
    assert pick_split_k(m, n, k, 2, cfg) == 1  # batched: the batch mode is taken


def _operands(m, n, k, l=1, a_mm=False, b_nm=False, dtype=torch.bfloat16, out_dtype=torch.bfloat16):
    a = torch.randn(l, k, m, dtype=torch.float32).to(dtype).transpose(1, 2) if a_mm else \
        torch.randn(l, m, k, dtype=torch.float32).to(dtype)
    b = torch.randn(l, k, n, dtype=torch.float32).to(dtype) if b_nm else \
        torch.randn(l, n, k, dtype=torch.float32).to(dtype).transpose(1, 2)
    out = torch.empty(l, m, n, dtype=out_dtype)
    A, B = (t.as_strided(t.shape, (*t.stride()[:2], max(t.stride()[2], 8))) for t in (a.permute(1, 2, 0), b.permute(2, 1, 0)))
    return A, B, out


@pytest.mark.parametrize("m,n,k,l,a_mm,b_nm,want", [
    (16, 8192, 1024, 1, False, False, ("swap", 1)),
    (16, 8192, 1024, 1, True, True, ("swap", 1)),
    (1, 8192, 1024, 1, False, False, ("swap", 1)),        # a (1, K) row: unit stride along K
    (7, 4096, 1024, 3, False, True, ("swap", 1)),         # batched: swapped, never split
    (16, 1024, 8192, 1, False, False, ("swap_split", 16)),
    (16, 1022, 8192, 1, False, False, ("swap_split", 16)),  # fp32 partials padded to 16-byte rows
    (16, 4095, 1024, 1, False, False, ("swap_split", 2)),  # odd N: split, so C^T itself is never TMA-stored
    (16, 4095, 8192 * 4, 2, False, False, (None, 1)),     # odd N, batched (no split): C^T's rows unaligned
])
def test_route(m, n, k, l, a_mm, b_nm, want):
    A, B, out = _operands(m, n, k, l, a_mm, b_nm)
    cfg = pick_config(m, n, k)
    assert sm90_skinny.route(FUSING, cfg, A, B, out, EpilogueSpec()) == want


@pytest.mark.parametrize("m,n,k,a_mm", [(16, 4096, 1023, False), (7, 4096, 1024, True)])
def test_operands_tma_cannot_address_never_reach_a_route(m, n, k, a_mm):
    # odd K (rows of 2046 bytes), or an M-major a with M = 7 (14-byte rows): no TMA view, so
    # the rung copies them (sm90_rung._operands) before any route sees them
    a = torch.randn(1, k, m).to(torch.bfloat16).transpose(1, 2) if a_mm else torch.randn(1, m, k).to(torch.bfloat16)
    assert sm90_rung.tma_operand(a.permute(1, 2, 0)) is None


def test_route_respects_fp8_majors_fusion_and_unswapped_configs():
    A, B, out = _operands(16, 8192, 1024)
    cfg = pick_config(16, 8192, 1024)
    # a kernel that cannot fuse the epilogue: only the plain product is swapped
    assert sm90_skinny.route(UNFUSED, cfg, A, B, out, EpilogueSpec(bias="n")) == (None, 1)
    assert sm90_skinny.route(UNFUSED, cfg, A, B, out, EpilogueSpec()) == ("swap", 1)
    # an unswapped config on a problem with few tiles: plain split-K, as before
    small = Sm90GemmConfig(tile_m=128, tile_n=128, cluster_m=1)
    A, B, out = _operands(16, 2048, 8192)
    how, s = sm90_skinny.route(FUSING, small, A, B, out, EpilogueSpec())
    assert how == "split" and s == pick_split_k(16, 2048, 8192, 1, small) > 1
    no_split = SimpleNamespace(split_k=False, kernel_cls=FUSING.kernel_cls)
    assert sm90_skinny.route(no_split, small, A, B, out, EpilogueSpec()) == (None, 1)


def test_swapped_spec_trades_bias_rows_and_columns():
    spec = EpilogueSpec(beta_c=True, bias="n", activation="silu", scale_ab=True)
    assert sm90_skinny.swapped_spec(spec) == EpilogueSpec(True, "m", "silu", True)
    assert sm90_skinny.swapped_spec(EpilogueSpec(bias="m")).bias == "n"
    assert sm90_skinny.swapped_spec(EpilogueSpec()) == EpilogueSpec()


def test_tma_view_prefers_the_unit_stride_mode_and_fixes_extent_one_strides():
    row = torch.empty(1, 1000).T.unsqueeze(-1).permute(1, 0, 2)  # (1, K, 1) with unit stride along K
    assert row.stride(1) == 1 and sm90_rung.tma_operand(row) is not None
    assert sm90_rung.tma_operand(torch.empty(3, 1001, 1)[:, 1:]) is None  # misaligned base
    assert sm90_rung.tma_operand(torch.empty(4, 6, 2).permute(2, 1, 0)[:, :, ::2]) is None  # no unit stride
    # (M, 1, 1) fp32 with every stride 1: N's stride (4 bytes) would build a bad descriptor
    col = torch.empty(129, 1, 1)
    v = sm90_rung.tma_operand(col)
    assert v.stride(0) == 1 and (v.stride(1) * 4) % 16 == 0 and (v.stride(2) * 4) % 16 == 0
    assert sm90_rung.tma_operand(v) is v and v.data_ptr() == col.data_ptr()
    assert sm90_rung.tma_operand(torch.empty(4096, 2, 1)) is None  # 8-byte rows of 2 floats


@pytest.fixture
def recorded(monkeypatch):
    """sm90_persistent's rung on CPU tensors: no CUDA checks, a compiler whose function records
    each launch's arguments (as tests/gemm/test_sm90_call_path.py)."""
    pytest.importorskip("cutlass")
    from cute_kernels.gemm import sm90_rung
    from cute_kernels.gemm.sm90_persistent import rung

    builds, launches = [], []

    def compiler(jit_fn, *args, key, options=None):
        builds.append(key)
        return lambda *launch_args: launches.append(launch_args)

    monkeypatch.setattr(sm90_rung, "_cuda_reason", lambda a, b, out: None)
    monkeypatch.setattr(sm90_rung, "compile_kernel", compiler)
    monkeypatch.setattr(sm90_rung, "tvm_ffi_available", lambda: True)
    monkeypatch.setattr(sm90_rung, "max_active_clusters", lambda n: 132 // n)
    monkeypatch.setattr(sm90_rung, "_compiled", {})
    return rung, builds, launches


def test_swap_hands_the_kernel_the_transposed_problem(recorded):
    rung, builds, launches = recorded
    x = torch.randn(1, 16, 64).to(torch.bfloat16)
    w = torch.randn(1, 8192, 64).to(torch.bfloat16)  # nn.Linear weight (N, K)
    bias = torch.randn(8192)
    out = torch.empty(1, 16, 8192, dtype=torch.bfloat16)
    rung(x, w.transpose(1, 2), out, bias=bias, activation="relu")
    A, B, C, _, bias_arg = launches[-1][:5]
    assert A.data_ptr() == w.data_ptr() and tuple(A.shape[:2]) == (8192, 64) and A.stride(1) == 1
    assert B.data_ptr() == x.data_ptr() and tuple(B.shape[:2]) == (16, 64) and B.stride(1) == 1
    # C^T: (N, M) with unit stride along N, the caller's storage
    assert C.data_ptr() == out.data_ptr() and tuple(C.shape[:2]) == (8192, 16) and C.stride()[:2] == (1, 8192)
    assert bias_arg is bias
    config, spec = builds[-1][1], builds[-1][2]
    assert config.swap_ab and (config.tile_m, config.tile_n) == (64, 16)
    assert spec == EpilogueSpec(bias="m", activation="relu")  # a bias per column of C is per row of C^T


def test_swap_with_split_k_in_the_kernel_writes_out_transposed(recorded):
    """The default split: one SplitKLaunch on the whole K (chunks are the kernel's), C^T straight
    into `out`, a workspace of a block per (tile, chunk) and the stream's counters."""
    rung, builds, launches = recorded
    x = torch.randn(1, 16, 8192).to(torch.bfloat16)
    w = torch.randn(1, 1024, 8192).to(torch.bfloat16)
    out = torch.empty(1, 16, 1024, dtype=torch.bfloat16)
    rung(x, w.transpose(1, 2), out)
    A, B, C, _, _, _, _, ws, counters, s = launches[-1][:10]
    config = pick_config(16, 1024, 8192)
    assert s == pick_split_k(16, 1024, 8192, 1, config, in_kernel=True) > 1 and "split_k" in builds[-1]
    assert tuple(A.shape) == (1024, 8192, 1) and A.data_ptr() == w.data_ptr()
    assert tuple(B.shape) == (16, 8192, 1) and B.data_ptr() == x.data_ptr()
    assert C.data_ptr() == out.data_ptr() and tuple(C.shape) == (1024, 16, 1) and C.stride(0) == 1
    tiles = -(-1024 // config.tile_m) * -(-16 // config.tile_n)
    assert ws.dtype == torch.float32 and ws.numel() == tiles * s * config.tile_m * config.tile_n
    assert counters.dtype == torch.int32 and not counters.any()


def test_swap_with_split_k_writes_transposed_fp32_partials(recorded, monkeypatch):
    """The torch-summed split (`REDUCE_IN_KERNEL` False): the chunks as the batch mode."""
    from cute_kernels.gemm import sm90_skinny

    monkeypatch.setattr(sm90_skinny, "REDUCE_IN_KERNEL", False)
    rung, builds, launches = recorded
    x = torch.randn(1, 16, 8192).to(torch.bfloat16)
    w = torch.randn(1, 1024, 8192).to(torch.bfloat16)
    out = torch.empty(1, 16, 1024, dtype=torch.bfloat16)
    rung(x, w.transpose(1, 2), out)
    A, B, C = launches[-1][:3]
    s = pick_split_k(16, 1024, 8192, 1, pick_config(16, 1024, 8192))
    assert s > 1 and tuple(A.shape) == (1024, 8192 // s, s) and tuple(B.shape) == (16, 8192 // s, s)
    assert A.data_ptr() == w.data_ptr() and B.data_ptr() == x.data_ptr()
    assert C.dtype == torch.float32 and tuple(C.shape) == (1024, 16, s) and C.stride(0) == 1
    # the kernel's partials are never written on CPU; out is their sum (zeros or garbage), but
    # the shapes and strides above are what the GPU tests check numerically
