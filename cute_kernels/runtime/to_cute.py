"""Our layouts as the DSL's: the one place cute_kernels.layouts meets the CuTe DSL.

Kernels compute every layout they use with `cute_kernels.layouts` (so the workbench can print
and check it) and convert it here while tracing. The result is static: shapes and strides
become compile-time constants of the generated code.
"""

from __future__ import annotations


def _static(value, what: str):
    """A nested tuple of Python ints, checked (a ScaledBasis or symbol cannot be static)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} contains a bool {value!r}, not an int")
    if isinstance(value, int):
        return value
    if isinstance(value, tuple):
        return tuple(_static(v, what) for v in value)
    raise TypeError(f"{what} entry {value!r} ({type(value).__name__}) has no static DSL form; to_cute handles ints")


def to_cute(obj):
    """The DSL object equal to `obj`, for use inside `@cute.jit` / `@cute.kernel` code.

    - `Layout(shape, stride)` -> `cute.make_layout(shape, stride=stride)`;
    - `Swizzle(B, M, S)` -> `cute.make_swizzle(B, M, S)`;
    - `ComposedLayout(outer, offset, inner)`, which evaluates `outer(offset + inner(c))`,
      -> `cute.make_composed_layout(outer', offset, inner')` (the DSL names its arguments
      the other way round: its `inner` is applied last).

    Post-condition: for every index i in the domain, the result evaluated at i equals
    `obj(i)`. Raises TypeError for anything else (including a stride of basis elements).
    """
    import cutlass.cute as cute

    from cute_kernels.layouts.composed import ComposedLayout
    from cute_kernels.layouts.layout import Layout
    from cute_kernels.layouts.swizzle import Swizzle

    if isinstance(obj, Layout):
        return cute.make_layout(_static(obj.shape, "layout shape"), stride=_static(obj.stride, "layout stride"))
    if isinstance(obj, Swizzle):
        return cute.make_swizzle(obj.bits, obj.base, obj.shift)
    if isinstance(obj, ComposedLayout):
        return cute.make_composed_layout(to_cute(obj.outer), int(obj.offset), to_cute(obj.inner))
    raise TypeError(
        f"to_cute converts cute_kernels.layouts Layout, Swizzle and ComposedLayout, got {type(obj).__name__}"
    )
