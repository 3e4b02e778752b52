"""Cross-entropy over large vocabularies: loss, log-sum-exp and the logits' gradient, in one kernel
or two.

Per row i of logits x (M, V) with label t = labels[i], smoothing e and z-loss weight z, in fp32:

    lse  = log(sum_j exp(x_j))
    loss = lse - (1 - e) x_t - (e / V) sum_j x_j + z lse^2        (0 where t == ignore_index)
    grad = dloss_i * (softmax(x)_j (1 + 2 z lse) - e / V - (1 - e) [j == t])   (0 where ignored)

which is torch's F.cross_entropy(label_smoothing=e) plus the z-loss of PaLM (`lse_square_scale`
in Liger). A label outside [0, V) that is not ignore_index gives a NaN loss (the host checks
labels unless told not to). The kernel's modes (`CrossEntropyConfig`):

- forward (`forward=True, grad=False`): one read of the logits; writes loss and lse.
- fused (`forward=True, grad=True`): the forward, then a second read that writes the gradient
  (in place over the logits when the caller passes the same tensor), scaled by `dloss` (one fp32
  per row, or one for all rows: the mean's 1 / n_valid computed on the device, no sync).
- backward (`forward=False, grad=True`): the gradient from a saved lse.

One CTA covers `rows_per_cta` rows and walks them in chunks of `capacity` columns (one chunk for
narrow vocabularies). In the fused mode a streaming CTA first copies the row's leading
`stash_chunks` chunks into shared memory (cp.async, all in flight at once: `rowkit.RowStash`), and
both passes read those chunks there: the logits are read from global memory once where the stash
holds them. Each thread keeps a running (max, sum of exp) over its columns, rescaling the
sum when its max grows (and the sum of x for smoothing); the threads of a row combine them once,
at the end. The target logit is read by the row's first thread with one scalar load.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from cute_kernels.runtime import to_cute

from .dtypes import CUTLASS_DTYPES, element_bytes
from .rowkit import RowReducer, RowSlice, RowStash, reduction_slots_layout, stash_layout
from .softmax import LOG2_E, combine, online_update
from .tiling import RowTiling, check_stash, min_blocks_per_sm, smem_carveout

__all__ = ["CrossEntropyConfig", "CrossEntropy", "LABEL_DTYPES", "LN_2"]

LN_2 = 0.6931471805599453
LABEL_DTYPES = {"int64": cutlass.Int64, "int32": cutlass.Int32}


@dataclass(frozen=True)
class CrossEntropyConfig:
    """One compiled cross-entropy kernel (module docstring for the modes).

    dtype: the logits' (and gradient's) dtype name; label_dtype: "int64" or "int32";
    smoothing / z_loss: whether those terms are present (their weights are runtime values);
    dloss_per_row: dloss has one value a row (else one for all rows).
    """

    tiling: RowTiling
    dtype: str
    label_dtype: str = "int64"
    forward: bool = True
    grad: bool = False
    smoothing: bool = False
    z_loss: bool = False
    dloss_per_row: bool = False
    stash_chunks: int = 0  # fused mode: the row's first chunks kept in shared memory for the gradient pass

    def validate(self) -> "CrossEntropyConfig":
        if self.dtype not in CUTLASS_DTYPES:
            raise ValueError(f"CrossEntropyConfig.dtype must be one of {sorted(CUTLASS_DTYPES)}, got {self.dtype!r}")
        if self.label_dtype not in LABEL_DTYPES:
            raise ValueError(f"CrossEntropyConfig.label_dtype must be one of {sorted(LABEL_DTYPES)}, "
                             f"got {self.label_dtype!r}")
        if not (self.forward or self.grad):
            raise ValueError("CrossEntropyConfig: nothing to compute (forward and grad both False)")
        self.tiling.validate(element_bytes(self.dtype))
        check_stash("CrossEntropyConfig", self.stash_chunks, self.tiling, element_bytes(self.dtype),
                    self.forward and self.grad and self.tiling.rows_per_cta == 1)
        return self


class CrossEntropy:
    """Loss, lse and / or the gradient of rows of logits (module docstring)."""

    def __init__(self, config: CrossEntropyConfig):
        self.config = config.validate()
        self.tiling = config.tiling
        self.smem_layout = reduction_slots_layout(self.tiling, 3)
        self.stash_layout = stash_layout(self.tiling, config.stash_chunks) if config.stash_chunks else None

    @cute.jit
    def __call__(self, mX: cute.Tensor, mLabels: cute.Tensor, mLoss, mLSE: cute.Tensor, mDLoss, mGrad,
                 ignore_index: Int32, smoothing: Float32, z_loss: Float32, stream):
        """mX (M, V) logits; mLabels (M,); mLoss (M,) fp32 out (forward) or None; mLSE (M,) fp32, out
        (forward) or in; mDLoss (M,) or (1,) fp32 (grad) or None; mGrad (M, V) out (grad) or None."""
        t = self.tiling
        smem = to_cute(self.smem_layout)

        @cute.struct
        class SharedStorage:
            partials: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(smem)], 16]
            # the row's stashed chunks (rowkit.RowStash); empty without a stash
            stash: cute.struct.Align[cute.struct.MemRange[mX.element_type, self.config.stash_chunks * t.capacity], 16]

        grid = (cute.ceil_div(mX.shape[0], t.rows_per_cta), 1, 1)
        self.kernel(mX, mLabels, mLoss, mLSE, mDLoss, mGrad, ignore_index, smoothing, z_loss, SharedStorage).launch(
            grid=grid, block=[t.threads, 1, 1], min_blocks_per_mp=min_blocks_per_sm(t.threads),
            preferred_smem_carveout=smem_carveout(self.config.stash_chunks), stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mLabels: cute.Tensor, mLoss, mLSE: cute.Tensor, mDLoss, mGrad,
               ignore_index: Int32, smoothing: Float32, z_loss: Float32, SharedStorage: cutlass.Constexpr):
        c, t = self.config, self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        num_rows, width = mX.shape[0], mX.shape[1]
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        partials = storage.partials.get_tensor(to_cute(self.smem_layout))
        head = RowSlice(t, tidx, bidx, num_rows, width)
        r_x = head.fragment(mX.element_type)
        x = head.fragment(Float32)
        num_chunks = cute.ceil_div(width, t.capacity)

        label = cutlass.Int64(ignore_index)
        if head.row_ok:
            label = cutlass.Int64(mLabels[head.row])
        valid = label != cutlass.Int64(ignore_index)

        # The fused mode's first chunks go to shared memory at once (RowStash); both passes read
        # them there. Trace-time helpers (RowSlice, RowStash) are made inside the loops: a dynamic
        # loop carries only DSL values.
        stash_smem = (storage.stash.get_tensor(to_cute(self.stash_layout))
                      if const_expr(self.config.stash_chunks) else None)
        lse = Float32(0.0)
        if const_expr(c.forward):
            run_max = -Float32.inf
            run_sum = Float32(0.0)
            run_x = Float32(0.0)
            RowStash(t, stash_smem, c.stash_chunks, tidx).fetch(mX, bidx, num_rows, width)
            for chunk in cutlass.range(num_chunks):
                rs = RowSlice(t, tidx, bidx, num_rows, width, chunk)
                RowStash(t, stash_smem, c.stash_chunks, tidx).load(rs, rs.view(mX), r_x, chunk, fill=-float("inf"))
                x.store(r_x.load().to(Float32))
                run_max, run_sum = online_update(x, run_max, run_sum)
                if const_expr(c.smoothing):
                    # Masked columns hold -inf: sum the valid vectors only.
                    for j in cutlass.range_constexpr(t.vecs_per_thread):
                        if rs.col(j) < width:
                            for e in cutlass.range_constexpr(t.vec):
                                run_x = run_x + x[e, j]
            reducer = RowReducer(t, partials)
            row_max, total = combine(reducer, run_max, run_sum, tidx)
            lse = row_max + cute.math.log2(total, fastmath=True) * Float32(LN_2)
            sum_x = Float32(0.0)
            if const_expr(c.smoothing):
                sum_x = reducer.sum(run_x, tidx, 2)
            if head.lane == 0 and head.row_ok:
                mLSE[head.row] = lse
                loss = Float32(0.0)
                if valid:
                    target = Float32(float("nan"))
                    if label >= cutlass.Int64(0) and label < cutlass.Int64(width):
                        target = Float32(mX[head.row, Int32(label)])
                    loss = lse - target
                    if const_expr(c.smoothing):
                        loss = lse - (Float32(1.0) - smoothing) * target - smoothing * sum_x / Float32(width)
                    if const_expr(c.z_loss):
                        loss = loss + z_loss * lse * lse
                mLoss[head.row] = loss
        else:
            if head.row_ok:
                lse = mLSE[head.row]

        if const_expr(c.grad):
            dloss = Float32(0.0)
            if head.row_ok and valid:
                if const_expr(c.dloss_per_row):
                    dloss = mDLoss[head.row]
                else:
                    dloss = mDLoss[0]
            # grad = dloss * (p * p_scale - e/V) - dloss * (1 - e) at the target.
            p_scale = dloss
            if const_expr(c.z_loss):
                p_scale = dloss * (Float32(1.0) + Float32(2.0) * z_loss * lse)
            uniform = Float32(0.0)
            on_target = dloss
            if const_expr(c.smoothing):
                uniform = dloss * smoothing / Float32(width)
                on_target = dloss * (Float32(1.0) - smoothing)
            lse2 = lse * Float32(LOG2_E)
            r_g = head.fragment(mGrad.element_type)
            g = head.fragment(Float32)
            for chunk in cutlass.range(num_chunks):
                rs = RowSlice(t, tidx, bidx, num_rows, width, chunk)
                RowStash(t, stash_smem, c.stash_chunks, tidx).load(rs, rs.view(mX), r_x, chunk, fill=-float("inf"))
                p = cute.math.exp2(r_x.load().to(Float32) * Float32(LOG2_E) - lse2, fastmath=True)
                g.store(p * p_scale - uniform)
                for j in cutlass.range_constexpr(t.vecs_per_thread):
                    col = rs.col(j)
                    for e in cutlass.range_constexpr(t.vec):
                        if cutlass.Int64(col + e) == label:
                            g[e, j] = g[e, j] - on_target
                r_g.store(g.load().to(mGrad.element_type))
                rs.store(r_g, rs.view(mGrad))


# ---- compile-only builds ----------------------------------------------------------------------------

def kernel_args(config: CrossEntropyConfig, tvm_ffi: bool = True) -> tuple:
    """Fake arguments of `CrossEntropy(config)` (None where the mode has no such tensor)."""
    from cute_kernels.runtime import fake_stream, fake_tensor

    c, vec = config, config.tiling.vec
    logits = lambda: fake_tensor(CUTLASS_DTYPES[c.dtype], 2, leading_dim=1,  # noqa: E731
                                 assumed_align=min(16, vec * element_bytes(c.dtype)), stride_divisibility=vec)
    vector = lambda dtype: fake_tensor(dtype, 1, leading_dim=0, assumed_align=4)  # noqa: E731
    return (logits(), vector(LABEL_DTYPES[c.label_dtype]), vector(Float32) if c.forward else None, vector(Float32),
            vector(Float32) if c.grad else None, logits() if c.grad else None,
            Int32(-100), Float32(0.0), Float32(0.0), fake_stream(tvm_ffi_env_stream=tvm_ffi))


def build_variant(width: int = 128256, dtype: str = "bfloat16", forward: bool = True, grad: bool = False,
                  smoothing: bool = False, z_loss: bool = False, threads: int | None = None,
                  values: int | None = None, stash_chunks: int | None = None):
    """The kernel dispatch picks; `threads`, `values` (a thread's elements a chunk) and
    `stash_chunks` override a streaming tile (for sweeps and SASS reports)."""
    from cute_kernels.runtime import CompileJob

    from .dispatch import cross_entropy_tiling, stash_chunks_for

    tiling = cross_entropy_tiling(width, dtype, fused=forward and grad)
    if tiling.rows_per_cta == 1 and (threads or values):
        tiling = RowTiling(tiling.vec, threads or tiling.threads, 1, (values or tiling.values_per_thread) // tiling.vec)
    if stash_chunks is None:
        stash_chunks = stash_chunks_for(width, tiling, dtype) if forward and grad and tiling.rows_per_cta == 1 else 0
    config = CrossEntropyConfig(tiling, dtype, forward=forward, grad=grad, smoothing=smoothing, z_loss=z_loss,
                                stash_chunks=stash_chunks).validate()
    return CompileJob(CrossEntropy(config), kernel_args(config, False), ("fused.cross_entropy", config))


def _register() -> None:
    from cute_kernels.runtime import register_variant

    configs = {
        "fwd_128256_bf16": {},
        "fused_128256_bf16_all_options": {"grad": True, "smoothing": True, "z_loss": True},
    }
    register_variant("fused.cross_entropy", build_variant, configs=configs, requires={"LDG.E.128", "MUFU.EX2"})


_register()
