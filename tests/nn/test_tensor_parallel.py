"""cute_kernels.nn.parallel: a tensor-parallel MLP over two processes matches the full MLP.

Each spawned rank builds the full MLP (our `linear` on one device), shards it with `from_full`,
runs both on the same fresh N(0,1) input, and checks: the output on every rank equals the full
output; dx equals the full dx; every weight/bias shard's gradient equals the matching slice of
the full gradient. CPU: gloo, float64, fallback="torch" (to 1e-12). GPU: NCCL on two GPUs,
bf16, our kernels only (a FallbackWarning is an error there).
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from cute_kernels.nn.parallel import (  # noqa: E402
    ColumnParallelLinear, RowParallelLinear, TensorParallelMLP, copy_to_parallel)
from cute_kernels.ops import linear as linear_op  # noqa: E402
from cute_kernels.ops.fallback import FallbackWarning  # noqa: E402

WORLD = 2
SPAWN_TIMEOUT_S = 120
# The GPU machine requires NVLink multicast off (NVLS in NCCL, multicast in symmetric memory).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
CASES = [("silu", True), ("swiglu", False), ("gelu_tanh", True)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _full_mlp(x, up, down, gate, activation, fallback):
    """The single-device reference, on our `linear` too (so GPU runs compare kernels with
    themselves, sharded and not)."""
    if activation == "swiglu":
        h = linear_op(x, gate.weight, gate.bias, "silu", fallback=fallback) * \
            linear_op(x, up.weight, up.bias, None, fallback=fallback)
    else:
        h = linear_op(x, up.weight, up.bias, activation, fallback=fallback)
    return linear_op(h, down.weight, down.bias, None, fallback=fallback)


def _check_case(rank, device, dtype, activation, bias, tol, fallback):
    hidden, intermediate = 128, 256
    torch.manual_seed(1234)  # the same full weights and input on every rank
    kw = dict(bias=bias, device=device, dtype=dtype)
    up, down = torch.nn.Linear(hidden, intermediate, **kw), torch.nn.Linear(intermediate, hidden, **kw)
    gate = torch.nn.Linear(hidden, intermediate, **kw) if activation == "swiglu" else None
    with torch.no_grad():  # N(0,1) weights, not nn.Linear's small uniform ones
        for p in [*up.parameters(), *down.parameters(), *(gate.parameters() if gate else [])]:
            p.normal_().mul_(0.1)
    x_full = torch.randn(2, 32, hidden, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(2, 32, hidden, device=device, dtype=dtype)
    y_full = _full_mlp(x_full, up, down, gate, activation, fallback)
    y_full.backward(dy)

    tp = TensorParallelMLP.from_full(up, down, rank, WORLD, gate=gate, activation=activation, fallback=fallback)
    x = x_full.detach().clone().requires_grad_(True)
    y = tp(x)
    y.backward(dy)

    what = f"rank {rank} {activation} bias={bias} {dtype}"
    assert torch.isfinite(y).all(), what
    assert _rel_err(y, y_full) < tol, f"{what}: output rel err {_rel_err(y, y_full):.3e}"
    assert _rel_err(x.grad, x_full.grad) < tol, f"{what}: dx rel err {_rel_err(x.grad, x_full.grad):.3e}"
    n = intermediate // WORLD
    rows, cols = slice(rank * n, (rank + 1) * n), (slice(None), slice(rank * n, (rank + 1) * n))
    pairs = [("up.weight", tp.up.weight.grad, up.weight.grad[rows]),
             ("down.weight", tp.down.weight.grad, down.weight.grad[cols])]
    if gate is not None:
        pairs.append(("gate.weight", tp.gate.weight.grad, gate.weight.grad[rows]))
    if bias:
        pairs += [("up.bias", tp.up.bias.grad, up.bias.grad[rows]), ("down.bias", tp.down.bias.grad, down.bias.grad)]
    for name, got, want in pairs:
        assert got is not None and got.shape == want.shape, f"{what}: {name} grad shape"
        assert _rel_err(got, want) < tol, f"{what}: {name} grad rel err {_rel_err(got, want):.3e}"

    # The output really is the reduced one: every rank holds the same tensor.
    others = [torch.empty_like(y) for _ in range(WORLD)]
    dist.all_gather(others, y.detach().contiguous())
    assert all(torch.equal(o, others[0]) for o in others), f"{what}: ranks disagree on the output"


def _check_nan_propagates(rank, device, dtype, fallback):
    torch.manual_seed(7)
    kw = dict(device=device, dtype=dtype)
    up, down = torch.nn.Linear(64, 128, **kw), torch.nn.Linear(128, 64, **kw)
    tp = TensorParallelMLP.from_full(up, down, rank, WORLD, activation="silu", fallback=fallback)
    x = torch.randn(8, 64, device=device, dtype=dtype)
    x[3, 5] = float("nan")
    y = tp(x)
    assert torch.isnan(y[3]).all(), f"rank {rank}: NaN in input row 3 did not reach the output row"
    assert torch.isfinite(y[torch.arange(8) != 3]).all(), f"rank {rank}: NaN leaked into other rows"


def _worker(rank, port, backend, dtype_name, tol, done_dir):
    os.environ.update(NCCL_ENV)
    dtype = getattr(torch, dtype_name)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device, fallback = torch.device("cuda", rank), "none"
        warnings.simplefilter("error", FallbackWarning)  # our kernels only
    else:
        device, fallback = torch.device("cpu"), "torch"
        warnings.simplefilter("ignore", FallbackWarning)
    extra = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60), **extra)
    try:
        for activation, bias in CASES:
            _check_case(rank, device, dtype, activation, bias, tol, fallback)
        _check_nan_propagates(rank, device, dtype, fallback)
        dist.barrier()
        # Recorded before the teardown: torch's gloo/TCPStore teardown can abort a process
        # ("terminate called without an active exception") after every check has passed.
        with open(os.path.join(done_dir, f"rank{rank}.ok"), "w") as f:
            f.write("ok")
    finally:
        dist.destroy_process_group()
    os._exit(0)  # skip the interpreter's teardown of the distributed C++ threads


def _spawn(backend, dtype_name, tol, tmp_path):
    """Run `_worker` on WORLD processes; a failure in any re-raises here with its traceback, and
    a hang is killed after SPAWN_TIMEOUT_S. A process killed by a signal counts as a failure
    unless every rank had recorded that all its checks passed (a crash in torch's teardown)."""
    import torch.multiprocessing as mp

    os.environ.update(NCCL_ENV)  # inherited by the children before they import NCCL
    ctx = mp.spawn(_worker, args=(_free_port(), backend, dtype_name, tol, str(tmp_path)), nprocs=WORLD, join=False)
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail(f"tensor-parallel {backend} test did not finish within {SPAWN_TIMEOUT_S} s")
    except mp.ProcessExitedException:
        if not all((tmp_path / f"rank{r}.ok").exists() for r in range(WORLD)):
            raise


# ---- CPU: gloo, float64 ------------------------------------------------------------------------

@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo needed")
def test_tp_mlp_gloo_float64_matches_full_mlp(tmp_path):
    _spawn("gloo", "float64", 1e-12, tmp_path)


# ---- in-process: the world-of-one case and bad input -------------------------------------------

@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        yield


def test_world_of_one_is_the_full_layer(quiet):
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    torch.manual_seed(0)
    full = torch.nn.Linear(16, 24, dtype=torch.float64)
    x = torch.randn(5, 16, dtype=torch.float64)
    want = torch.nn.functional.silu(full(x))
    col = ColumnParallelLinear.from_full(full, activation="silu", fallback="torch")
    row = RowParallelLinear.from_full(full, fallback="torch")
    assert (col.rank, col.world, tuple(col.weight.shape)) == (0, 1, (24, 16))
    torch.testing.assert_close(col(x), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(row(x), full(x), rtol=1e-12, atol=1e-12)
    assert copy_to_parallel(x) is not x and torch.equal(copy_to_parallel(x), x)


def test_from_full_slices_the_weight_without_a_group():
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    full = torch.nn.Linear(8, 12)
    col = ColumnParallelLinear.from_full(full, 1, 2)
    row = RowParallelLinear.from_full(full, 1, 2)
    assert torch.equal(col.weight, full.weight[6:]) and torch.equal(col.bias, full.bias[6:])
    assert torch.equal(row.weight, full.weight[:, 4:]) and torch.equal(row.bias, full.bias)
    assert "rank=1, world=2" in repr(col)
    with pytest.raises(RuntimeError, match="not initialised"):
        col(torch.randn(3, 8))
    with pytest.raises(RuntimeError, match="not initialised"):
        row(torch.randn(3, 4))


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="out_features=10 is not divisible by the world size 4"):
        ColumnParallelLinear(8, 10, rank=0, world=4)
    with pytest.raises(ValueError, match="in_features=6 is not divisible"):
        RowParallelLinear(6, 8, rank=0, world=4)
    with pytest.raises(ValueError, match="rank < world"):
        ColumnParallelLinear(8, 8, rank=2, world=2)
    with pytest.raises(ValueError, match="activation must be one of"):
        ColumnParallelLinear(8, 8, activation="tanh")
    with pytest.raises(ValueError, match="activation must be one of"):
        TensorParallelMLP(8, 16, activation="geglu")
    with pytest.raises(ValueError, match="fallback must be one of"):
        RowParallelLinear(8, 8, fallback="cpu")
    up, down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
    with pytest.raises(ValueError, match="gate= exactly when"):
        TensorParallelMLP.from_full(up, down, activation="swiglu")
    with pytest.raises(ValueError, match="do not form an MLP"):
        TensorParallelMLP.from_full(up, torch.nn.Linear(16, 4))


# ---- GPU: NCCL on two GPUs, bf16, our kernels ----------------------------------------------------

@pytest.mark.gpu
def test_tp_mlp_nccl_bf16_matches_single_gpu(tmp_path):
    if torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs, found {torch.cuda.device_count()}")
    if not dist.is_nccl_available():
        pytest.skip("torch.distributed NCCL backend not available")
    _spawn("nccl", "bfloat16", 2e-2, tmp_path)
