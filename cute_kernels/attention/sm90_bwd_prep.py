"""The attention backward's pre-processing pass: per query row, D and the base-2 lse.

For rows r of every (batch, head), with Sq rows padded to `padded` (a multiple of the backward's
Q block):

    D[r]    = sum_d dO[r, d] * O[r, d]          (fp32, products and sum in fp32)
    lse2[r] = lse[r] * log2(e), or +inf where lse[r] = -inf (a row that saw no key)
    rows Sq <= r < padded:  D = 0, lse2 = +inf  (so the backward's P is 0 there)

written to flat fp32 buffers of B * H * padded entries, (batch, head)-major; and the backward's
fp32 dQ accumulator set to 0 (it is added to with atomics / bulk reduce-adds), so that no separate
memset runs: B * H * `acc_rows` rows of D, acc_rows = Sq (row-major, converted to dQ in one
contiguous pass) or `padded` (`dq_writer`'s whole Q-block tiles). One CTA of 128
threads covers 128 / R rows, R = D / 8 rounded up to a power of two: each of a row's first D / 8
threads reads 8 contiguous elements of dO and of O (one 16-byte load each) and zeroes 8 floats of
the row's dQ accumulator (two 16-byte stores), the rest of its R (D = 96: 4 of 16) add 0, and the
R threads sum with butterfly shuffles. dO and O are (B, H, Sq, D) with any strides
that are multiples of 8 elements (so each thread's 8 elements are one aligned 16-byte load: the
(B, S, H, D) storage that attention outputs and their gradients have is read in place, not
copied first); lse is taken flat (contiguous (B, H, Sq)).

Host side (`preprocess`, `preprocess_flat`): D, lse2 and the accumulator are one allocation;
with TVM-FFI the kernel is built once per (head dim, dtype) from fake tensors and takes the
torch tensors on torch's current stream, else each tensor is wrapped with `from_torch`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cute_kernels.runtime.plan_cache import WarmCache, memo

from .problem_checks import rows_aligned
from .softmax import LOG2_E

__all__ = ["BwdPrep", "THREADS", "preprocess", "preprocess_flat"]

THREADS = 128
_VEC = 8  # 16-bit elements per 16-byte load


class BwdPrep:
    """D and lse2 (see the module docstring) for head dim `head_dim` (a multiple of 8 from 16 to
    256; a row's threads are the aligned power-of-two group of lanes above D / 8) and 16-bit
    `dtype`."""

    def __init__(self, head_dim: int, dtype):
        if head_dim % _VEC or not 16 <= head_dim <= 256:
            raise ValueError(f"BwdPrep.head_dim must be a multiple of {_VEC} in [16, 256] (16-byte loads), "
                             f"got {head_dim}")
        self.head_dim = head_dim
        self.dtype = dtype
        self.active_threads = head_dim // _VEC  # of a row's threads, those holding 8 of its elements
        self.row_threads = 1 << (self.active_threads - 1).bit_length()
        self.rows_per_cta = THREADS // self.row_threads
        self.shuffle_offsets = tuple(self.row_threads >> k for k in range(1, self.row_threads.bit_length()))

    @cute.jit
    def __call__(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mDrow: cute.Tensor,
                 mLSE2: cute.Tensor, mdQacc: cute.Tensor, seqlen_q: cutlass.Int32, padded: cutlass.Int32,
                 acc_rows: cutlass.Int32, stream):
        """mdO, mO: (B, H, Sq, D), unit head-dim stride; mLSE: flat (B * H * Sq,); mDrow, mLSE2:
        flat (B * H * padded,) outputs; mdQacc: flat (B * H * acc_rows * D,) fp32, zeroed
        (acc_rows: Sq or padded)."""
        grid = (cute.ceil_div(mDrow.shape[0], self.rows_per_cta), 1, 1)
        self.kernel(mdO, mO, mLSE, mDrow, mLSE2, mdQacc, seqlen_q, padded, acc_rows).launch(
            grid=grid, block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mDrow: cute.Tensor, mLSE2: cute.Tensor,
               mdQacc: cute.Tensor, seqlen_q: cutlass.Int32, padded: cutlass.Int32, acc_rows: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        t = tidx % self.row_threads
        prow = bidx * self.rows_per_cta + tidx // self.row_threads  # padded row index
        total = mDrow.shape[0]
        bh = prow // padded
        s = prow - bh * padded
        acc = cutlass.Float32(0.0)
        lse2 = cutlass.Float32.inf
        if prow < total and s < acc_rows and t < self.active_threads:
            g_dq = cute.local_tile(cute.local_tile(mdQacc, (self.head_dim,), (bh * acc_rows + s,)), (_VEC,), (t,))
            r_zero = cute.make_rmem_tensor((_VEC,), cutlass.Float32)
            r_zero.fill(0.0)
            cute.autovec_copy(r_zero, g_dq)
        if prow < total and s < seqlen_q and t < self.active_threads:
            row = bh * seqlen_q + s
            b = bh // mdO.shape[1]
            h = bh - b * mdO.shape[1]
            # the row's (D,) slice, then this thread's 8 elements: strides divisible by 8 and
            # the offset 8 t make the 16-byte alignment provable
            g_do = cute.local_tile(mdO[b, h, s, None], (_VEC,), (t,))
            g_o = cute.local_tile(mO[b, h, s, None], (_VEC,), (t,))
            r_do = cute.make_rmem_tensor((_VEC,), self.dtype)
            r_o = cute.make_rmem_tensor((_VEC,), self.dtype)
            cute.autovec_copy(g_do, r_do)
            cute.autovec_copy(g_o, r_o)
            f_do = r_do.load().to(cutlass.Float32)
            f_o = r_o.load().to(cutlass.Float32)
            for i in cutlass.range_constexpr(_VEC):
                acc = acc + f_do[i] * f_o[i]
            lse = mLSE[row]
            if lse != -cutlass.Float32.inf:
                lse2 = lse * LOG2_E
        # The row's threads are consecutive lanes (row_threads divides 32): butterfly sum.
        offsets = self.shuffle_offsets
        for i in cutlass.range_constexpr(len(offsets)):
            acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=offsets[i])
        if t == 0 and prow < total:
            mDrow[prow] = acc
            mLSE2[prow] = lse2


# The warm path's caches (`runtime.plan_cache`): kernel objects and TVM-FFI functions per (head
# dim, dtype).
_KERNELS = WarmCache("attention.sm90_bwd_prep.kernels")
_COMPILED = WarmCache("attention.sm90_bwd_prep.tvm_ffi")
_CUTLASS = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


def _kernel_for(head_dim: int, dtype: str) -> BwdPrep:
    return memo(_KERNELS, (head_dim, dtype), BwdPrep, head_dim, _CUTLASS[dtype])


def _compile_tvm_ffi(head_dim: int, dtype: str):
    """Compile (or load) the TVM-FFI `BwdPrep` for (head_dim, dtype) ("float16" | "bfloat16")
    from fake tensors (`preprocess` keeps it in `_COMPILED` per (head dim, torch dtype)).

    The fake tensors: dO and O 4-D with the head dim contiguous, other strides multiples of 8
    (16-byte aligned), flat fp32 lse (4-byte aligned), flat fp32 D, lse2 and dQ accumulator
    (16-byte aligned). The function takes torch tensors and Python ints and launches on torch's
    current stream."""
    from cute_kernels.runtime import TVM_FFI_OPTION, compile_kernel, fake_stream, fake_tensor

    t = _CUTLASS[dtype]
    do, o = [fake_tensor(t, 4, leading_dim=3, assumed_align=16, stride_divisibility=_VEC) for _ in range(2)]
    lse = fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=4)
    d_rows, lse2, dq_acc = [fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=16) for _ in range(3)]
    fn = compile_kernel(_kernel_for(head_dim, dtype), do, o, lse, d_rows, lse2, dq_acc, cutlass.Int32(1),
                        cutlass.Int32(64), cutlass.Int32(1), fake_stream(tvm_ffi_env_stream=True),
                        key=("attention.sm90_bwd_prep", "tvm_ffi", 2, head_dim, dtype), options=TVM_FFI_OPTION)
    return fn


def preprocess(dout, out, lse, block_m: int, *, tvm_ffi: bool | None = None):
    """(D, lse2, dq_acc): D and lse2 as flat fp32 tensors of B * H * padded entries (padded = Sq
    rounded up to `block_m`) and the zeroed fp32 dQ accumulator (B, H, Sq, D), from dout,
    out (B, H, Sq, D) and lse (B, H, Sq), on torch's current stream. The three share one
    allocation (D, then lse2, then dQ; each 16-byte aligned: `block_m` must be a multiple of 4).

    tvm_ffi: launch through the TVM-FFI build (torch tensors in; they must not require grad)
    or wrap each tensor with `from_torch`; None: `runtime.tvm_ffi_available()`."""
    if tvm_ffi is None:
        from cute_kernels.runtime import tvm_ffi_available

        tvm_ffi = tvm_ffi_available()
    d_rows, lse2, _, dq_acc = preprocess_flat(dout, out, lse, block_m, tvm_ffi)
    return d_rows, lse2, dq_acc


def preprocess_flat(dout, out, lse, block_m: int, tvm_ffi: bool, acc_rows: int | None = None):
    """`preprocess`'s (D, lse2, dq_flat, dq_acc), dq_flat the accumulator's flat view: what the
    backward kernel takes, without re-viewing per call. acc_rows: the accumulator's rows per
    (batch, head), at most `padded` (Sq rounded up to `block_m`): None for Sq, `padded` for
    `dq_writer`'s tiles, 0 for none (the packed writer's accumulator is the caller's); dq_acc
    (B, H, acc_rows, D)."""
    if block_m % 4:
        raise ValueError(f"preprocess: block_m must be a multiple of 4 (16-byte aligned buffers), got {block_m}")
    b, h, sq, d = dout.shape
    padded = -(-sq // block_m) * block_m
    lse = lse.contiguous().float()
    if tvm_ffi:
        return run_prepped(prep_function(d, dout.dtype), rows_aligned(dout), rows_aligned(out), lse, padded,
                           acc_rows)
    acc_rows = sq if acc_rows is None else acc_rows
    d_rows, lse2, dq_flat = _buffers(b, h, acc_rows, d, padded, dout.device)
    from cute_kernels.runtime import compile_kernel, current_stream, from_torch

    # without TVM-FFI the wrapped strides carry no divisibility: contiguous rows keep the loads aligned
    flat = lambda t, align: from_torch(t.view(-1), assumed_align=align, leading_dim=0)  # noqa: E731
    rows = lambda t: from_torch(t.contiguous(), assumed_align=16, leading_dim=3)  # noqa: E731
    args = (rows(dout), rows(out), flat(lse, 4), flat(d_rows, 16), flat(lse2, 16),
            flat(dq_flat, 16), cutlass.Int32(sq), cutlass.Int32(padded), cutlass.Int32(acc_rows))
    stream = current_stream()
    kernel = _kernel_for(d, str(dout.dtype).removeprefix("torch."))
    fn = compile_kernel(kernel, *args, stream, key=("attention.sm90_bwd_prep", 4, d, str(dout.dtype)))
    fn(*args, stream)
    return d_rows, lse2, dq_flat, dq_flat[:b * h * acc_rows * d].view(b, h, acc_rows, d)


def _buffers(b: int, h: int, acc_rows: int, d: int, padded: int, device):
    """D, lse2 (B * H * padded each) and the flat dQ accumulator (B * H * acc_rows * D), fp32, in
    one allocation instead of three: the kernel writes all of them."""
    import torch

    n = b * h * padded
    # (acc_rows 0: a 4-float stand-in, so no launch argument is an empty tensor)
    buf = torch.empty(2 * n + (b * h * acc_rows * d or 4), dtype=torch.float32, device=device)
    return buf[:n], buf[n:2 * n], buf[2 * n:]


def prep_function(head_dim: int, dtype):
    """The TVM-FFI build of the pass for (head dim, torch dtype), compiled on first use."""
    key = (head_dim, dtype)
    fn = _COMPILED.get(key)
    if fn is None:
        fn = _COMPILED[key] = _compile_tvm_ffi(head_dim, str(dtype).removeprefix("torch."))
    return fn


def run_prepped(fn, dout, out, lse, padded: int, acc_rows: int | None = None):
    """`preprocess_flat`'s TVM-FFI launch with `fn` (`prep_function`) on dout and out whose rows
    are aligned as they are (`rows_aligned` returns them) and a contiguous fp32 lse, padding Sq
    to `padded` rows (the accumulator's `acc_rows` as `preprocess_flat`'s): what a warm
    backward replays with its decisions already made."""
    b, h, sq, d = dout.shape
    acc_rows = sq if acc_rows is None else acc_rows
    d_rows, lse2, dq_flat = _buffers(b, h, acc_rows, d, padded, dout.device)
    fn(dout, out, lse.view(-1), d_rows, lse2, dq_flat, sq, padded, acc_rows)
    return d_rows, lse2, dq_flat, dq_flat[:b * h * acc_rows * d].view(b, h, acc_rows, d)


# ---- compile-only variants ------------------------------------------------------------------------


def build_variant(head_dim: int = 128, dtype: str = "bfloat16"):
    """A CompileJob for `BwdPrep` over fake tensors with symbolic sizes (dO and O 4-D with
    strides divisible by 8, as the TVM-FFI build takes them)."""
    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    t = _CUTLASS[dtype]
    do, o = [fake_tensor(t, 4, leading_dim=3, assumed_align=16, stride_divisibility=_VEC) for _ in range(2)]
    lse = fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=4)
    d_rows, lse2, dq_acc = [fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=16) for _ in range(3)]
    args = (do, o, lse, d_rows, lse2, dq_acc, cutlass.Int32(1), cutlass.Int32(64), cutlass.Int32(1), fake_stream())
    return CompileJob(BwdPrep(head_dim, t), args, ("attention.sm90_bwd_prep", 5, head_dim, dtype))


VARIANT_CONFIGS = {"d64_float16": {"head_dim": 64, "dtype": "float16"},
                   "d96_bfloat16": {"head_dim": 96, "dtype": "bfloat16"},
                   "d128_bfloat16": {"head_dim": 128, "dtype": "bfloat16"},
                   "d192_bfloat16": {"head_dim": 192, "dtype": "bfloat16"},
                   "d256_float16": {"head_dim": 256, "dtype": "float16"}}


def _register() -> None:
    from cute_kernels.runtime import register_variant

    # 16-byte loads of dO and O (strided rows read in place), and the shuffle sum.
    register_variant("attention.sm90_bwd_prep", build_variant, configs=VARIANT_CONFIGS, requires={"SHFL", "LDG.E.128"})


_register()
