"""Tensor parallelism over torch.distributed with the cute_kernels `linear`.

A weight W (out_features, in_features) is split over the `world` ranks of a process group:

- `ColumnParallelLinear` holds rows [r·n, (r+1)·n) of W (n = out_features / world) and that
  slice of the bias: y_r = act(x @ W_rᵀ + b_r), the r-th slice of the full output's last dim.
  Its input is replicated, so its forward is the identity on x and its backward all-reduces dx
  (each rank's dx covers only its rows of W).
- `RowParallelLinear` holds columns [r·k, (r+1)·k) of W (k = in_features / world) and the whole
  bias: y = Σ_r x_r @ W_rᵀ + b, with x_r the r-th slice of the input's last dim. The partial sums
  are all-reduced in the forward (the backward is the identity: every rank needs all of dy, which
  it already has) and the bias is added once, after the reduce.
- `TensorParallelMLP`: column-parallel up (and gate, for SwiGLU) then row-parallel down, so the
  intermediate activation is never gathered: one all-reduce forward, one backward.

Post-condition (what `tests/nn/test_tensor_parallel.py` checks): a module built with `from_full`
from a full layer computes that layer's output on every rank, and the gradients of its shards are
the matching slices of the full layer's gradients.

Each rank's GEMM is `cute_kernels::linear` (our kernels; `fallback="torch"` routes input they do
not take, CPU tensors for instance, to PyTorch). The collectives are autograd.Functions around
`torch.distributed.all_reduce`, so they run on whatever backend the group has (NCCL for CUDA
tensors, gloo for CPU ones). Without an initialised process group (and no `process_group`
given) the modules are the world-of-one case: the full layer, no collectives.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from cute_kernels.ops import ACTIVATIONS, linear as linear_op
from cute_kernels.ops.fallback import check_fallback

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP", "copy_to_parallel",
           "reduce_from_parallel", "MLP_ACTIVATIONS"]

MLP_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu")


# ---- collectives with gradients -------------------------------------------------------------------

def _all_reduce(t: torch.Tensor, group) -> torch.Tensor:
    # A fresh contiguous buffer: all_reduce works in place, and the tensor handed to us may be
    # saved by autograd, shared with another consumer, or strided.
    out = t.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


class _CopyToParallel(torch.autograd.Function):
    """Forward: identity (the input is replicated). Backward: all-reduce of the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromParallel(torch.autograd.Function):
    """Forward: all-reduce (sum) of the partial results. Backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """x unchanged; in the backward, the gradient summed over `group` (default: the world)."""
    return _CopyToParallel.apply(x, group)


def reduce_from_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """The sum of x over the ranks of `group` (default: the world); gradient passed through."""
    return _ReduceFromParallel.apply(x, group)


# ---- shared plumbing --------------------------------------------------------------------------------

def _group_rank_world(name: str, process_group, rank, world) -> tuple[int, int]:
    """(rank, world) for the module: given explicitly (checked against the group when one is
    initialised), else read from the group; (0, 1) without torch.distributed."""
    initialised = dist.is_available() and dist.is_initialized()
    if process_group is not None and not initialised:
        raise RuntimeError(f"cute_kernels.nn.{name}: a process_group was given but torch.distributed is not "
                           "initialised (call torch.distributed.init_process_group first)")
    if initialised:
        g_rank, g_world = dist.get_rank(process_group), dist.get_world_size(process_group)
        if g_rank < 0:
            raise ValueError(f"cute_kernels.nn.{name}: this process is not a member of the process group")
        if (rank is not None and rank != g_rank) or (world is not None and world != g_world):
            raise ValueError(f"cute_kernels.nn.{name}: rank={rank}, world={world} do not match the process group "
                             f"(rank {g_rank} of {g_world})")
        return g_rank, g_world
    rank, world = (0 if rank is None else rank), (1 if world is None else world)
    if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
        raise ValueError(f"cute_kernels.nn.{name}: need 0 <= rank < world, got rank={rank}, world={world}")
    return rank, world


def _shard_size(name: str, what: str, features: int, world: int) -> int:
    if features % world:
        raise ValueError(f"cute_kernels.nn.{name}: {what}={features} is not divisible by the world size {world}")
    return features // world


def _check_options(name: str, activation, kernel, fallback) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"cute_kernels.nn.{name}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if not isinstance(kernel, str):
        raise TypeError(f"cute_kernels.nn.{name}: kernel must be a str, got {type(kernel).__name__}")
    check_fallback(f"nn.{name}", fallback)


def _init_uniform_(t: torch.Tensor, fan_in: int) -> None:
    # torch.nn.Linear's default (kaiming_uniform with a=√5, bias alike) is U(±1/√fan_in) with
    # the FULL layer's fan_in; a row shard's own width would give a wider distribution.
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    with torch.no_grad():
        t.uniform_(-bound, bound)


def _require_group(name: str, world: int) -> None:
    if world > 1 and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"cute_kernels.nn.{name}: sharded over {world} ranks but torch.distributed is not "
                           "initialised (call torch.distributed.init_process_group first)")


class _ParallelLinear(torch.nn.Module):
    """What both shardings share: options, rank/world, parameter creation, repr."""

    _NAME = "ParallelLinear"

    def __init__(self, in_features: int, out_features: int, weight_shape, bias_features: int, *, bias: bool,
                 activation, process_group, kernel: str, fallback: str, rank, world, device, dtype):
        super().__init__()
        _check_options(self._NAME, activation, kernel, fallback)
        self.in_features, self.out_features = in_features, out_features
        self.activation, self.kernel, self.fallback = activation, kernel, fallback
        self.process_group, self.rank, self.world = process_group, rank, world
        kw = dict(device=device, dtype=dtype)
        self.weight = torch.nn.Parameter(torch.empty(weight_shape, **kw))
        self.register_parameter("bias", torch.nn.Parameter(torch.empty(bias_features, **kw)) if bias else None)
        _init_uniform_(self.weight, in_features)
        if self.bias is not None:
            _init_uniform_(self.bias, in_features)

    def extra_repr(self) -> str:
        extra = f", activation={self.activation!r}" if self.activation else ""
        extra += f", kernel={self.kernel!r}" + (f", fallback={self.fallback!r}" if self.fallback != "none" else "")
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"rank={self.rank}, world={self.world}, shard={tuple(self.weight.shape)}" + extra)


# ---- the two shardings ------------------------------------------------------------------------------

class ColumnParallelLinear(_ParallelLinear):
    """The rank's rows of a Linear: weight (out_features/world, in_features), bias
    (out_features/world,). forward(x) with x (..., in_features) replicated over the group returns
    act(x @ weight_shardᵀ + bias_shard), shape (..., out_features/world): the rank's slice of the
    full output (the activation is elementwise, so it commutes with the slicing)."""

    _NAME = "ColumnParallelLinear"

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, activation=None,
                 process_group=None, kernel: str = "auto", fallback: str = "none", device=None, dtype=None,
                 rank=None, world=None):
        rank, world = _group_rank_world(self._NAME, process_group, rank, world)
        local = _shard_size(self._NAME, "out_features", out_features, world)
        super().__init__(in_features, out_features, (local, in_features), local, bias=bias, activation=activation,
                         process_group=process_group, kernel=kernel, fallback=fallback, rank=rank, world=world,
                         device=device, dtype=dtype)

    @classmethod
    def from_full(cls, module: torch.nn.Linear, rank=None, world=None, *, activation=None, process_group=None,
                  kernel: str = "auto", fallback: str = "none") -> "ColumnParallelLinear":
        """The shard of `module` (a torch.nn.Linear or cute_kernels.nn.Linear) for `rank` of
        `world`: copies of rows [rank·n, (rank+1)·n) of its weight and bias."""
        new = cls(module.in_features, module.out_features, bias=module.bias is not None, activation=activation,
                  process_group=process_group, kernel=kernel, fallback=fallback, device=module.weight.device,
                  dtype=module.weight.dtype, rank=rank, world=world)
        rows = slice(new.rank * new.weight.shape[0], (new.rank + 1) * new.weight.shape[0])
        with torch.no_grad():
            new.weight.copy_(module.weight[rows])
            if new.bias is not None:
                new.bias.copy_(module.bias[rows])
        return new

    def local_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The GEMM alone, for an x already passed through `copy_to_parallel` (several
        column-parallel layers reading one input share its backward all-reduce this way)."""
        return linear_op(x, self.weight, self.bias, self.activation, rung=self.kernel, fallback=self.fallback)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _require_group(self._NAME, self.world)
        if self.world > 1:
            x = copy_to_parallel(x, self.process_group)
        return self.local_forward(x)


class RowParallelLinear(_ParallelLinear):
    """The rank's columns of a Linear: weight (out_features, in_features/world), and the full
    bias (out_features,), replicated. forward(x) with x (..., in_features/world), the rank's
    slice of the full input, returns the full output x_full @ Wᵀ + b on every rank: the partial
    products are all-reduced, then the bias is added once. No activation: it could only act
    after the reduce, so it belongs to the caller."""

    _NAME = "RowParallelLinear"

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, process_group=None,
                 kernel: str = "auto", fallback: str = "none", device=None, dtype=None, rank=None, world=None):
        rank, world = _group_rank_world(self._NAME, process_group, rank, world)
        local = _shard_size(self._NAME, "in_features", in_features, world)
        super().__init__(in_features, out_features, (out_features, local), out_features, bias=bias, activation=None,
                         process_group=process_group, kernel=kernel, fallback=fallback, rank=rank, world=world,
                         device=device, dtype=dtype)

    @classmethod
    def from_full(cls, module: torch.nn.Linear, rank=None, world=None, *, process_group=None, kernel: str = "auto",
                  fallback: str = "none") -> "RowParallelLinear":
        """The shard of `module` for `rank` of `world`: a copy of columns [rank·k, (rank+1)·k)
        of its weight and of its whole bias."""
        new = cls(module.in_features, module.out_features, bias=module.bias is not None, process_group=process_group,
                  kernel=kernel, fallback=fallback, device=module.weight.device, dtype=module.weight.dtype,
                  rank=rank, world=world)
        cols = slice(new.rank * new.weight.shape[1], (new.rank + 1) * new.weight.shape[1])
        with torch.no_grad():
            new.weight.copy_(module.weight[:, cols])
            if new.bias is not None:
                new.bias.copy_(module.bias)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _require_group(self._NAME, self.world)
        if self.world == 1:
            return linear_op(x, self.weight, self.bias, None, rung=self.kernel, fallback=self.fallback)
        partial = linear_op(x, self.weight, None, None, rung=self.kernel, fallback=self.fallback)
        y = reduce_from_parallel(partial, self.process_group)
        return y if self.bias is None else y + self.bias


# ---- the MLP ------------------------------------------------------------------------------------------

class TensorParallelMLP(torch.nn.Module):
    """down(act(up(x))) (activation "relu", "gelu", "gelu_tanh" or "silu"), or down(silu(gate(x)) ·
    up(x)) ("swiglu"), with up/gate column-parallel (intermediate/world features per rank) and
    down row-parallel. x (..., hidden) is replicated over the group; so is the output.
    Communication: one all-reduce of (..., hidden) forward, one backward."""

    def __init__(self, hidden: int, intermediate: int, *, activation: str = "silu", bias: bool = False,
                 process_group=None, kernel: str = "auto", fallback: str = "none", device=None, dtype=None,
                 rank=None, world=None):
        super().__init__()
        if activation not in MLP_ACTIVATIONS:
            raise ValueError(f"cute_kernels.nn.TensorParallelMLP: activation must be one of {MLP_ACTIVATIONS}, "
                             f"got {activation!r}")
        self.activation, self.process_group = activation, process_group
        kw = dict(bias=bias, process_group=process_group, kernel=kernel, fallback=fallback, device=device,
                  dtype=dtype, rank=rank, world=world)
        gated = activation == "swiglu"
        self.gate = ColumnParallelLinear(hidden, intermediate, activation="silu", **kw) if gated else None
        self.up = ColumnParallelLinear(hidden, intermediate, activation=None if gated else activation, **kw)
        self.down = RowParallelLinear(intermediate, hidden, **kw)
        self.rank, self.world = self.up.rank, self.up.world

    @classmethod
    def from_full(cls, up: torch.nn.Linear, down: torch.nn.Linear, rank=None, world=None, *, gate=None,
                  activation: str = "silu", process_group=None, kernel: str = "auto",
                  fallback: str = "none") -> "TensorParallelMLP":
        """The shard for `rank` of `world` of the full MLP down(act(up(x))), or with
        activation="swiglu" and `gate` given, down(silu(gate(x)) · up(x))."""
        if activation not in MLP_ACTIVATIONS:
            raise ValueError(f"cute_kernels.nn.TensorParallelMLP: activation must be one of {MLP_ACTIVATIONS}, "
                             f"got {activation!r}")
        if (activation == "swiglu") != (gate is not None):
            raise ValueError("cute_kernels.nn.TensorParallelMLP.from_full: pass gate= exactly when "
                             f"activation='swiglu' (got activation={activation!r}, gate={'given' if gate else None})")
        if up.out_features != down.in_features or down.out_features != up.in_features:
            raise ValueError(f"cute_kernels.nn.TensorParallelMLP.from_full: up ({up.in_features}->{up.out_features}) "
                             f"and down ({down.in_features}->{down.out_features}) do not form an MLP")
        if gate is not None and (gate.in_features, gate.out_features) != (up.in_features, up.out_features):
            raise ValueError("cute_kernels.nn.TensorParallelMLP.from_full: gate and up must have the same shape")
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.activation, new.process_group = activation, process_group
        kw = dict(process_group=process_group, kernel=kernel, fallback=fallback)
        gated = activation == "swiglu"
        new.gate = ColumnParallelLinear.from_full(gate, rank, world, activation="silu", **kw) if gated else None
        new.up = ColumnParallelLinear.from_full(up, rank, world, activation=None if gated else activation, **kw)
        new.down = RowParallelLinear.from_full(down, rank, world, **kw)
        new.rank, new.world = new.up.rank, new.up.world
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _require_group("TensorParallelMLP", self.world)
        if self.world > 1:
            # One copy for up and gate both, so their input gradients are summed locally and
            # all-reduced once.
            x = copy_to_parallel(x, self.process_group)
        h = self.up.local_forward(x)
        if self.gate is not None:
            h = self.gate.local_forward(x) * h
        return self.down(h)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, rank={self.rank}, world={self.world}"
