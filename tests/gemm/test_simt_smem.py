"""The `simt_smem` GEMM rung: its layouts (pure Python: bijections, vector contiguity, shared-
memory bank conflicts), the problems it declines, and correctness against torch in float64."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("cutlass") is None:
    pytest.skip("needs the CuTe DSL", allow_module_level=True)

from cute_kernels.gemm import simt_smem as ss  # noqa: E402


def _bank_conflict_degree(addresses_by_thread, word_bytes=4, vector_words=1):
    """Max number of distinct 4-byte words one bank serves in one memory transaction phase.

    A warp's 128-bit accesses are served 8 threads per phase, 64-bit 16 per phase, 32-bit all 32.
    `addresses_by_thread`: the word offset each of the 32 threads accesses (first word).
    """
    per_phase = 32 // vector_words
    worst = 1
    for start in range(0, 32, per_phase):
        banks: dict[int, set[int]] = {}
        for word in addresses_by_thread[start:start + per_phase]:
            for w in range(word, word + vector_words):
                banks.setdefault(w % 32, set()).add(w)
        worst = max(worst, max(len(words) for words in banks.values()))
    return worst


@pytest.mark.parametrize("k_contiguous", [True, False])
def test_load_layout_is_a_bijection_of_16_byte_vectors(k_contiguous):
    cfg = ss.SimtSmemConfig()
    rows, bk = cfg.block_m, cfg.block_k
    tv = ss.load_tv_layout(rows, bk, cfg.threads, k_contiguous=k_contiguous)
    passes = tv.shape[1][1]
    offsets = [tv((t, (v, r))) for t in range(cfg.threads) for v in range(4) for r in range(passes)]
    assert sorted(offsets) == list(range(rows * bk))
    step = rows if k_contiguous else 1  # the offset step of one element along the contiguous mode
    for t in range(cfg.threads):
        for r in range(passes):
            first = tv((t, (0, r)))
            assert [tv((t, (v, r))) for v in range(4)] == [first + v * step for v in range(4)]


def test_load_layout_rejects_an_untileable_slice():
    with pytest.raises(ValueError, match="do not tile"):
        ss.load_tv_layout(128, 8, 96, k_contiguous=True)


def test_fragment_reads_are_conflict_free():
    cfg = ss.SimtSmemConfig()
    frag = ss.frag_layout(cfg.threads_n, cfg.thread_n)
    pitch = cfg.block_n + 4
    for kk in range(cfg.block_k):
        for g in range(cfg.thread_n // 4):
            # a warp: 32 consecutive thread indices, tn = t % threads_n
            words = [kk * pitch + frag((t % cfg.threads_n, (0, g))) for t in range(32)]
            assert _bank_conflict_degree(words, vector_words=4) == 1


def test_transposed_stores_are_conflict_free_thanks_to_the_padding():
    cfg = ss.SimtSmemConfig()
    tv = ss.load_tv_layout(cfg.block_m, cfg.block_k, cfg.threads, k_contiguous=True)
    smem = ss.smem_layout(cfg.block_m, cfg.block_k)
    unpadded = {}
    for v in range(4):
        words, plain = [], []
        for t in range(32):
            off = tv((t, (v, 0)))
            m, k = off % cfg.block_m, off // cfg.block_m
            words.append(smem((m, k, 0)))
            plain.append(m + cfg.block_m * k)
        assert _bank_conflict_degree(words) == 1
        unpadded[v] = _bank_conflict_degree(plain)
    assert max(unpadded.values()) > 1  # the padding is what removes the conflict


def test_tv_c_layout_covers_the_tile_once():
    cfg = ss.SimtSmemConfig()
    tv = ss.tv_c_layout(cfg)
    offsets = {tv(t, v) for t in range(cfg.threads) for v in range(cfg.thread_m * cfg.thread_n)}
    assert offsets == set(range(cfg.block_m * cfg.block_n))


def test_config_validation():
    with pytest.raises(ValueError, match="multiple of 4"):
        ss.SimtSmemConfig(thread_m=6).validate()
    with pytest.raises(ValueError, match="a_major"):
        ss.SimtSmemConfig(a_major="n").validate()
    with pytest.raises(ValueError, match="threads"):
        ss.SimtSmemConfig(block_m=256, block_n=256).validate()


def _meta(*shape):
    return torch.empty(*shape, device="meta")


@pytest.mark.parametrize(
    "a, b, pattern",
    [
        (_meta(1, 8, 6), _meta(1, 6, 8), "contiguous extent 6"),
        (_meta(1, 8, 8), _meta(1, 8, 6), "contiguous extent 6"),
        (_meta(1, 8, 12)[:, :, :8], _meta(1, 8, 8), "needs CUDA tensors (a on 'meta'"),  # all but the device fit
        (_meta(1, 8, 10)[:, :, :8], _meta(1, 8, 8), "stride 10"),
        (_meta(1, 8, 8).half(), _meta(1, 8, 8).half(), "float32"),
    ],
)
def test_supports_declines_what_it_cannot_vectorize(a, b, pattern):
    out = _meta(1, a.shape[1], b.shape[2])
    reason = ss.RUNG.supports(a, b, out)
    assert reason is not None and pattern in reason


def test_supports_declines_cpu_tensors_naming_them():
    a, b, out = torch.randn(1, 8, 8), torch.randn(1, 8, 8), torch.empty(1, 8, 8)
    assert ss.RUNG.supports(a, b, out) == "needs CUDA tensors (a on 'cpu', b on 'cpu', out on 'cpu')"


# ---- on the GPU -------------------------------------------------------------------------------

def _operand(batch, rows, cols, transposed):
    if transposed:
        return torch.randn(batch, cols, rows, device="cuda").transpose(1, 2)
    return torch.randn(batch, rows, cols, device="cuda")


def _rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def _run(a, b, out_dtype=torch.float32, alpha=1.0, beta=0.0, c=None):
    out = torch.full((a.shape[0], a.shape[1], b.shape[2]), float("nan"), device="cuda", dtype=out_dtype)
    assert ss.RUNG.supports(a, b, out) is None
    ss.RUNG(a, b, out, alpha=alpha, beta=beta, c=c)
    torch.cuda.synchronize()
    return out


SHAPES = [(4, 4, 4), (132, 260, 36), (256, 128, 8), (20, 12, 1028), (128, 128, 128), (260, 124, 100), (388, 516, 260)]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)], ids=["nn", "tn", "nt", "tt"])
def test_matches_float64(m, n, k, ta, tb):
    a = _operand(1, m, k, ta)
    b = _operand(1, k, n, tb)
    out = _run(a, b)
    ref = torch.matmul(a.double(), b.double())
    assert not out.isnan().any()
    assert _rel_err(out, ref) < 1e-5


@pytest.mark.gpu
def test_odd_rows_when_they_are_not_the_contiguous_mode():
    a = _operand(1, 13, 20, False)  # row-major A: M need not be a multiple of 4
    b = _operand(1, 20, 12, False)
    out = _run(a, b)
    assert _rel_err(out, torch.matmul(a.double(), b.double())) < 1e-5


@pytest.mark.gpu
def test_batched_broadcast_alpha_beta_and_bf16_output():
    a = _operand(1, 200, 64, False).expand(3, 200, 64)
    b = _operand(3, 64, 136, True)
    c = torch.randn(136, device="cuda").expand(3, 200, 136)
    out = _run(a, b, alpha=0.5, beta=-2.0, c=c)
    ref = 0.5 * torch.matmul(a.double(), b.double()) - 2.0 * c.double()
    assert _rel_err(out, ref) < 1e-5
    out16 = _run(a, b, out_dtype=torch.bfloat16)
    assert _rel_err(out16, torch.matmul(a.double(), b.double())) < 1e-2


@pytest.mark.gpu
def test_nan_and_inf_propagate_like_torch():
    a = torch.randn(1, 64, 32, device="cuda")
    b = torch.randn(1, 32, 48, device="cuda")
    a[0, 5, 3] = float("nan")
    b[0, 7, 9] = float("inf")
    out = _run(a, b)
    ref = torch.matmul(a.double(), b.double())
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.isinf(), ref.isinf())


@pytest.mark.gpu
def test_auto_dispatch_picks_simt_smem_for_aligned_fp32():
    from cute_kernels.gemm import dispatch

    a, b = torch.randn(1, 64, 64, device="cuda"), torch.randn(1, 64, 64, device="cuda")
    out = torch.empty(1, 64, 64, device="cuda")
    ladder = {name: dispatch.KERNELS[name] for name in ("naive", "simt_smem")}
    assert dispatch.choose(a, b, out, registry=ladder).name == "simt_smem"
    assert dispatch.choose(a[:, :, :63], b[:, :63, :], out, registry=ladder).name == "naive"


@pytest.mark.gpu
@pytest.mark.parametrize("tvm_ffi", [True, False], ids=["tvm_ffi", "dsl_tensors"])
def test_both_launch_paths_with_broadcast_operands(tvm_ffi, monkeypatch):
    if tvm_ffi and not ss.tvm_ffi_available():
        pytest.skip("apache-tvm-ffi is not installed")
    monkeypatch.setattr(ss, "use_tvm_ffi", lambda: tvm_ffi)
    a = _operand(1, 132, 36, True).expand(3, 132, 36)  # batch stride 0, column-major
    b = _operand(3, 36, 68, False)
    c = torch.randn(132, 1, device="cuda").expand(3, 132, 68)  # zero strides in batch and N
    out = _run(a, b, alpha=-1.5, beta=0.25, c=c)
    ref = -1.5 * torch.matmul(a.double(), b.double()) + 0.25 * c.double()
    assert _rel_err(out, ref) < 1e-5
    out = _run(a[:, :68], b[:, :, :40], out_dtype=torch.float16)  # new sizes, another output dtype
    assert _rel_err(out, torch.matmul(a[:, :68].double(), b[:, :, :40].double())) < 2e-3


@pytest.mark.gpu
def test_runs_on_the_current_stream():
    a, b = torch.zeros(1, 128, 64, device="cuda"), torch.zeros(1, 64, 128, device="cuda")
    out = torch.full((1, 128, 128), float("nan"), device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        a.fill_(1.0)
        b.fill_(0.5)
        ss.RUNG(a, b, out, alpha=1.0, beta=0.0, c=None)
    side.synchronize()
    assert torch.all(out == 32.0)
