"""GPU: what our caches keep stays out of CUDA graph pools (`runtime.lasting`), so torch.compile's
CUDA graph trees (`mode="reduce-overhead"`) take our ops. The pool check is the one graph trees
run after recording (`_cuda_checkPoolLiveAllocations`: the pool's live blocks are exactly the
given ones)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _pool_holds_exactly(device, pool, tensors) -> bool:
    import torch

    return torch._C._cuda_checkPoolLiveAllocations(device.index, pool, {t.untyped_storage().data_ptr()
                                                                        for t in tensors})


def test_lasting_allocates_outside_the_pool_graph_trees_route_to():
    import torch
    from torch._inductor.cudagraph_trees import _use_cuda_memory_pool_manager

    from cute_kernels.runtime.lasting import lasting

    device = torch.device("cuda", torch.cuda.current_device())
    side, pool, graph = torch.cuda.Stream(), torch.cuda.graph_pool_handle(), torch.cuda.CUDAGraph()
    x = torch.randn(64, device=device)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        y = x * 2
    with _use_cuda_memory_pool_manager(device.index, pool, side):
        kept = lasting(device, torch.zeros, 1000, dtype=torch.int32, device=device)
        pooled = torch.zeros(1000, dtype=torch.int32, device=device)
    torch.cuda.synchronize()
    assert _pool_holds_exactly(device, pool, [y, pooled])  # `kept` is not in the pool
    assert not _pool_holds_exactly(device, pool, [y])  # the check sees a tensor made in the pool
    assert kept.count_nonzero().item() == 0


def test_split_k_matmul_under_cuda_graph_trees_matches_torch():
    """A weight-gradient shape (long K, few output tiles: split-K with its counters) compiled
    with mode="reduce-overhead": warm-up, recording and replays agree with float64."""
    import torch

    from cute_kernels.ops import matmul

    torch.manual_seed(0)
    x = torch.randn(12608, 768, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(12608, 768, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda a, b: matmul(a.t(), b) * 1.0, mode="reduce-overhead")
    want = x.double().t() @ dy.double()
    for _ in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        got = f(x, dy).double()
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-2, err
