"""The probe kernels compute what `probes.reference` says, on the GPU (the course times them only
after the same checks). Argument checks of `vector_add` run anywhere the DSL imports."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("cutlass")

gpu = pytest.mark.gpu


def _randn(n, seed=0, dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(n, device="cuda", generator=g, dtype=dtype)


def _nan(n, dtype=torch.float32):
    return torch.full((n,), float("nan"), device="cuda", dtype=dtype)


def test_vector_add_rejects_bad_input_before_launching():
    from cute_kernels.probes.vector_add import vector_add

    a = torch.randn(8)
    with pytest.raises(ValueError, match="float32"):
        vector_add(a.double(), a.double())
    with pytest.raises(ValueError, match="shape"):
        vector_add(a, torch.randn(9))
    with pytest.raises(ValueError, match="multiple of 4"):
        vector_add(torch.randn(10), torch.randn(10), vec=4)
    with pytest.raises(ValueError, match="CUDA"):
        vector_add(a, a)
    with pytest.raises(TypeError):
        vector_add([1.0], a)
    with pytest.raises(ValueError, match="vec"):
        vector_add(a, a, vec=2)


@gpu
@pytest.mark.parametrize("n", [1, 255, 257, 1_000_003])
def test_vector_add_scalar_any_length(n):
    from cute_kernels.probes.vector_add import vector_add

    a, b = _randn(n, 1), _randn(n, 2)
    out = _nan(n)
    vector_add(a, b, out)
    assert torch.equal(out, a + b)


@gpu
@pytest.mark.parametrize("n", [4, 1020, 4 * 250_001])
def test_vector_add_vectorized(n):
    from cute_kernels.probes.vector_add import vector_add

    a, b = _randn(n, 3), _randn(n, 4)
    assert torch.equal(vector_add(a, b, vec=4), a + b)


@gpu
@pytest.mark.parametrize("space, working_set", [("global", 4096), ("global", 1 << 20), ("shared", 16384)])
def test_pointer_chase_ends_where_the_chain_says_and_counts_cycles(space, working_set):
    from cute_kernels.probes._launch import run
    from cute_kernels.probes.memory import build_chase
    from cute_kernels.probes.reference import chase_chain, chase_end

    chain = chase_chain(working_set, device="cuda", seed=5)
    out = torch.full((2,), -1, dtype=torch.int64, device="cuda")
    steps = 1000
    run(build_chase(space), chain, out, steps)
    torch.cuda.synchronize()
    assert int(out[1]) == chase_end(chain, 2 * steps)
    assert steps * 10 < int(out[0]) < steps * 5000  # between 10 and 5000 cycles per dependent load


@gpu
@pytest.mark.parametrize("blocks, passes, tiles, pad", [(7, 3, 5, 0), (64, 1, 64, 0), (33, 17, 4, 65536)])
def test_read_bandwidth_sums(blocks, passes, tiles, pad):
    from cute_kernels.probes._launch import run
    from cute_kernels.probes.memory import build_read
    from cute_kernels.probes.reference import read_sums

    threads, vectors = 256, 4
    src = _randn(tiles * threads * 4 * vectors + 12, 6)
    out = _nan(blocks * threads)
    run(build_read(threads, vectors, pad), src, out, blocks, passes)
    want = read_sums(src, threads=threads, vectors=vectors, blocks=blocks, passes=passes)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-2 * math.sqrt(passes))


@gpu
def test_smem_bandwidth_sums():
    from cute_kernels.probes._launch import run
    from cute_kernels.probes.memory import build_smem_read
    from cute_kernels.probes.reference import smem_read_sums

    src = _randn(4 * 256 * 8, 7)
    blocks, passes = 9, 37
    out = _nan(blocks * 256)
    run(build_smem_read(256, 8), src, out, blocks, passes)
    want = smem_read_sums(src, threads=256, vectors=8, blocks=blocks, passes=passes)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-3)


@gpu
@pytest.mark.parametrize("stride", [1, 3, 32])
def test_strided_read(stride):
    from cute_kernels.probes._launch import run
    from cute_kernels.probes.access import build_strided

    m = 100_003
    src = _randn(m * stride, 8)
    out = _nan(m)
    run(build_strided(), src, out, stride)
    assert torch.equal(out, src[::stride])


@gpu
@pytest.mark.parametrize("layout", ["row_major", "padded", "swizzled"])
@pytest.mark.parametrize("n", [32, 96, 1024])
def test_smem_transpose(layout, n):
    from cute_kernels.probes._launch import run
    from cute_kernels.probes.access import build_transpose

    inp = _randn(n * n, 9).view(n, n)
    out = torch.full_like(inp, float("nan"))
    run(build_transpose(layout), inp, out)
    assert torch.equal(out, inp.t())


@gpu
@pytest.mark.parametrize("group", [1, 4, 32])
def test_divergence_values(group):
    from cute_kernels.probes._launch import run
    from cute_kernels.probes.reference import divergence_values
    from cute_kernels.probes.warps import build_divergence

    blocks, iters = 3, 200
    out = _nan(blocks * 256)
    run(build_divergence(group), out, blocks, iters)
    want = divergence_values(group, threads=256, blocks=blocks, iters=iters, device="cuda")
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


@gpu
@pytest.mark.parametrize("chains, min_blocks", [(1, None), (8, None), (64, 8)])
def test_fma_chains_values_even_when_spilled(chains, min_blocks):
    from cute_kernels.probes._launch import run
    from cute_kernels.probes.reference import fma_values
    from cute_kernels.probes.warps import build_fma

    blocks, iters = 5, 301  # not a multiple of the unroll
    out = _nan(blocks * 256)
    run(build_fma(chains, min_blocks), out, blocks, iters)
    want = fma_values(chains, threads=256, blocks=blocks, iters=iters, device="cuda")
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-3)  # fp32 steps against a closed form


@gpu
@pytest.mark.parametrize("strategy", ["atomic_each", "atomic_thread", "smem_tree", "shuffle"])
@pytest.mark.parametrize("n, blocks", [(1, 1), (1000, 3), (1 << 20, 264)])
def test_block_sum(strategy, n, blocks):
    from cute_kernels.probes._launch import run
    from cute_kernels.probes.reduce import build_sum

    src = _randn(n, 10)
    out = torch.zeros(1, device="cuda")
    run(build_sum(strategy), src, out, blocks)
    torch.cuda.synchronize()
    want = src.double().sum().item()
    assert abs(out.item() - want) <= 1e-5 * src.double().abs().sum().item() + 1e-6


@gpu
def test_block_sum_propagates_nan():
    from cute_kernels.probes._launch import run
    from cute_kernels.probes.reduce import build_sum

    src = _randn(4096, 11)
    src[1234] = float("nan")
    out = torch.zeros(1, device="cuda")
    run(build_sum("shuffle"), src, out, 4)
    assert math.isnan(out.item())
