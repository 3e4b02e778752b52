"""``import cute_kernels.layouts`` must stay pure Python: no torch, no CuTe DSL, no hypothesis."""

import subprocess
import sys


def test_import_pulls_in_no_heavy_modules():
    code = (
        "import sys, cute_kernels.layouts as L; "
        "heavy = [m for m in ('torch', 'cutlass', 'hypothesis', 'numpy', 'pycute') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_api_is_flat():
    import cute_kernels.layouts as L

    for name in L.__all__:
        assert hasattr(L, name), name
    for name in ("Layout", "composition", "complement", "coalesce", "logical_divide", "zipped_divide",
                 "right_inverse", "left_inverse", "make_ordered_layout", "make_identity_layout",
                 "tile_to_shape", "blocked_product", "raked_product", "Swizzle", "ComposedLayout",
                 "recast_layout", "LayoutError", "size", "cosize", "rank", "depth", "make_layout"):
        assert name in L.__all__, name
    from cute_kernels.layouts import int_tuple

    for name in ("product", "flatten", "prefix_product", "shape_div", "crd2idx", "idx2crd"):
        assert callable(getattr(int_tuple, name)), name


def test_public_functions_have_docstrings():
    import inspect

    import cute_kernels.layouts as L

    missing = [n for n in L.__all__ if (inspect.isfunction(getattr(L, n)) or inspect.isclass(getattr(L, n)))
               and not (getattr(L, n).__doc__ or "").strip()]
    assert missing == []


def test_layout_error_is_a_value_error():
    from cute_kernels.layouts import LayoutError

    assert issubclass(LayoutError, ValueError)
