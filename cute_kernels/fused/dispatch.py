"""Which tiling (and so which compiled kernel) each fused kernel uses for a row width and dtypes.

Pure Python: the heuristics that `cute_kernels.fused`'s host code and the workbench share. Every
function returns a validated `tiling.RowTiling`, or raises NotImplementedError naming the limit
when a row is too wide for the kernel's register-resident form.
"""

from __future__ import annotations

from .tiling import RowTiling, row_tiling

__all__ = ["norm_tiling", "max_norm_width"]

_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


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
    return x * (3 if residual else 2) + w + (1.0 if weight_dtype else 0.0) + temporaries


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


def max_norm_width(dtype: str, weight_dtype: str | None = None, *, bias: bool = False, residual: bool = False,
                   backward: bool = False, vec: int | None = None) -> int:
    """The widest row (a power of two times vec) `norm_tiling` serves."""
    vec = vec or 16 // min(_BYTES[d] for d in (dtype, weight_dtype) if d)
    arrays = _norm_arrays(dtype, weight_dtype, bias, backward, residual)
    width = vec
    while row_tiling(width * 2, vec, arrays=arrays) is not None:
        width *= 2
    return width
