"""Which tiling (and so which compiled kernel) each fused kernel uses for a row width and dtypes.

Pure Python: the heuristics that `cute_kernels.fused`'s host code and the workbench share. Every
function returns a validated `tiling.RowTiling`, or raises NotImplementedError naming the limit
when a row is too wide for the kernel's register-resident form.
"""

from __future__ import annotations

import os

from .tiling import MAX_STASH_BYTES, RowTiling, chunked_tiling, row_tiling

__all__ = ["norm_tiling", "max_norm_width", "softmax_tiling", "stash_chunks_for", "STASH_THREADS",
           "cross_entropy_tiling", "rope_tiling", "swiglu_tiling", "chunk_values"]

_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


# Threads of a streaming CTA that stashes its row: with the stash, one CTA fills an SM's shared
# memory, so it needs the threads to keep enough loads in flight on its own (the chunks past the
# stash are read a chunk a thread at a time). Measured on the H200 (scripts/fused_sweep.py, bf16,
# 32 values a thread, the stash as full as fits): softmax 2048 x 128256 at 84.6% of the copy
# bandwidth with 1024 threads (three 64 KiB chunks), 80.9% with 512 (seven 32 KiB chunks), 80.9%
# with 512 threads of 64 values (three 64 KiB chunks); the fused cross-entropy 8192 x 128256 at
# 84.0%, 77.7% and 78.1%.
STASH_THREADS = 1024


def chunk_values() -> int:
    """Values a thread loads per chunk in the streaming kernels (softmax past the registers,
    cross-entropy over large vocabularies): 32 (four 16-byte vectors of a 16-bit dtype), or
    $CUTE_KERNELS_FUSED_CHUNK_VALUES (16, 32 or 64) for tuning runs; each value is its own
    compiled kernel."""
    value = int(os.environ.get("CUTE_KERNELS_FUSED_CHUNK_VALUES", "32"))
    if value not in (16, 32, 64):
        raise ValueError(f"CUTE_KERNELS_FUSED_CHUNK_VALUES must be 16, 32 or 64, got {value}")
    return value


def _vec(width: int, dtypes, vec: int | None) -> int:
    narrow = min(_BYTES[d] for d in dtypes if d)
    if vec is None:
        vec = 16 // narrow
        while vec > 1 and width % vec:
            vec //= 2
    return vec


def _norm_arrays(dtype: str, weight_dtype: str | None, bias: bool, backward: bool, residual: bool) -> float:
    """Row-sized arrays a norm kernel's thread keeps live, in fp32-register units (a 16-bit
    array is 0.5): the forward holds s in fp32, the raw weight and bias, and x (and residual)
    while it converts them; the backward holds raw x, dy (and dsum) and weight, the fp32 dw
    (and db) accumulators across its loop over rows, and fp32 temporaries (calibrated on the
    compiled kernels: the compile tests check the widest tilings spill nothing)."""
    x = _BYTES[dtype] / 4
    w = _BYTES[weight_dtype] / 4 if weight_dtype else 0.0
    if not backward:
        return 1.0 + x * (2 if residual else 1) + w * (2 if bias else 1)
    # LayerNorm's backward keeps two partial sums and db besides: more temporaries.
    temporaries = (3.0 + (0.5 if residual else 0.0)) if bias else 1.0
    return _backward_raw_rows(dtype, residual) + w + (1.0 if weight_dtype else 0.0) + temporaries


def _backward_raw_rows(dtype: str, residual: bool) -> float:
    """The norm backward's raw row-sized inputs of one row block, in fp32-register units: x and
    dy (and dsum with a residual)."""
    return _BYTES[dtype] / 4 * (3 if residual else 2)


def norm_tiling(width: int, dtype: str, weight_dtype: str | None = None, *, bias: bool = False,
                residual: bool = False, backward: bool = False, vec: int | None = None) -> RowTiling:
    """The row tiling of RMSNorm / LayerNorm over rows of `width` elements of `dtype`.

    vec: the vector width in elements (default: the widest 16-byte vector dividing `width`;
    the host lowers it for strides and pointers that are less aligned). Raises
    NotImplementedError when a row does not fit one CTA's registers.
    """
    vec = _vec(width, (dtype, weight_dtype), vec)
    tiling = row_tiling(width, vec, arrays=_norm_arrays(dtype, weight_dtype, bias, backward, residual))
    if tiling is None:
        raise NotImplementedError(
            f"norm {'backward' if backward else 'forward'}: rows of {width} {dtype} elements (vectors of {vec}) "
            "do not fit one CTA's registers; the widest supported row is "
            f"{max_norm_width(dtype, weight_dtype, bias=bias, residual=residual, backward=backward, vec=vec)} "
            "elements")
    return tiling


def norm_backward_prefetch(tiling: RowTiling, dtype: str, weight_dtype: str | None = None, *, bias: bool = False,
                           residual: bool = False) -> bool:
    """Whether the norm backward of `tiling` (`norm_tiling(..., backward=True)`) can hold the next
    row block's raw x, dy (and dsum) beside the current one's (`norms.NormConfig.prefetch`)
    without a wider tiling: the row's values, with those arrays added, still fit the budget."""
    arrays = _norm_arrays(dtype, weight_dtype, bias, True, residual) + _backward_raw_rows(dtype, residual)
    return row_tiling(tiling.capacity, tiling.vec, arrays=arrays) == tiling


def max_norm_width(dtype: str, weight_dtype: str | None = None, *, bias: bool = False, residual: bool = False,
                   backward: bool = False, vec: int | None = None) -> int:
    """The widest row (a power of two times vec) `norm_tiling` serves."""
    vec = vec or 16 // min(_BYTES[d] for d in (dtype, weight_dtype) if d)
    arrays = _norm_arrays(dtype, weight_dtype, bias, backward, residual)
    width = vec
    while row_tiling(width * 2, vec, arrays=arrays) is not None:
        width *= 2
    return width


def softmax_tiling(width: int, dtype: str, *, backward: bool = False, out_dtype: str | None = None,
                   vec: int | None = None) -> tuple[RowTiling, bool]:
    """(tiling, streaming) of softmax over rows of `width`: the register-resident tiling when the
    row fits (x as fp32 plus its raw copy; y and dy raw for the backward), else the streaming
    tile (one row a CTA, `chunk_values()` values a thread a chunk; the forward, which stashes its
    row in shared memory, with `STASH_THREADS` threads, the backward with 256)."""
    vec = _vec(width, (dtype, out_dtype), vec)
    x, y = _BYTES[dtype] / 4, _BYTES[out_dtype or dtype] / 4
    arrays = (1.0 + x) if not backward else (x + y + 1.0)
    tiling = row_tiling(width, vec, arrays=arrays)
    if tiling is not None:
        return tiling, False
    return chunked_tiling(vec, threads=256 if backward else STASH_THREADS, values=chunk_values()), True


def stash_chunks_for(width: int, tiling: RowTiling, dtype: str) -> int:
    """Chunks of a streaming kernel's row kept in shared memory between its two passes
    (`rowkit.RowStash`: the softmax forward, the fused cross-entropy): as many as the row has, up
    to `tiling.MAX_STASH_BYTES`; none for vectors under the 4 bytes cp.async copies (odd widths)."""
    if tiling.vec * _BYTES[dtype] < 4:
        return 0
    chunk_bytes = tiling.capacity * _BYTES[dtype]
    return max(0, min(-(-width // tiling.capacity), MAX_STASH_BYTES // chunk_bytes))


def cross_entropy_tiling(width: int, dtype: str, *, vec: int | None = None, fused: bool = False) -> RowTiling:
    """The cross-entropy tile: a whole row in one chunk for vocabularies up to 8192 (several rows
    a CTA when narrow), else one row a CTA walking `chunk_values()` values a thread a chunk, with
    256 threads, or `STASH_THREADS` in the fused mode (loss and gradient in one launch), which
    stashes its row in shared memory."""
    vec = _vec(width, (dtype,), vec)
    if width <= 8192:
        tiling = row_tiling(width, vec, arrays=1.0 + _BYTES[dtype] / 4)
        if tiling is not None:
            return tiling
    return chunked_tiling(vec, threads=STASH_THREADS if fused else 256, values=chunk_values())


def _widest_vec(width: int, element_bytes: int, max_bytes: int = 16) -> int:
    vec = max(1, max_bytes // element_bytes)
    while vec > 1 and width % vec:
        vec //= 2
    return vec


def rope_tiling(rotary_dim: int, dtype: str, table_dtype: str = "float32", *, interleaved: bool = False,
                vec: int | None = None) -> RowTiling:
    """RoPE's tiling over the R/2 pairs of a head, tokens as rows: vec pairs a vector, 16 bytes of
    each half in the half-split form (two 16-byte accesses of interleaved pairs otherwise)."""
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    half = rotary_dim // 2
    if vec is None:
        vec = _widest_vec(half, _BYTES[dtype])
    return row_tiling(half, vec)


def swiglu_tiling(width: int, dtype: str, *, interleaved: bool = False, backward: bool = False,
                  vec: int | None = None) -> RowTiling:
    """SwiGLU's tile over (rows, I): 16-byte vectors of gate (interleaved: two 16-byte accesses
    of gate/up pairs), 16 values a thread, up to 128 threads across the columns and 256 threads
    a CTA. Measured on the H200 at 16384 x 14336 bf16 (scripts/fused_sweep.py): the forward at
    16 values a thread moves 99.8% of the copy bandwidth, at 32 values 78% (twice the registers,
    half the CTAs in flight)."""
    if vec is None:
        vec = _widest_vec(width, _BYTES[dtype])
    nvec = -(-width // vec)
    most = max(1, 16 // vec)
    tpr = min(128, _next_pow2(-(-nvec // most)))
    vpt = min(most, _next_pow2(-(-nvec // tpr)))
    return RowTiling(vec, tpr, max(1, 256 // tpr), vpt).validate()


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
