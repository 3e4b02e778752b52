"""Seeded random cases shared by the pycute and CuTe-DSL cross-checks (hundreds per operation).

``cases(op)`` draws the arguments of one operation. Two families aim at the edges:

* ``<op>_edge`` (for any op below): the same draws with every generated layout given edge leaves
  (size-1 leaves inside and at the end with arbitrary strides, a stride-0 leaf now and then:
  ``generate.with_edges``);
* ``<op>_beyond`` (composition and the divides): a right operand that reaches past the left
  operand's size, the regime where the DSL's and pycute's composition rules differ.
"""

from __future__ import annotations

import random

from cute_kernels.layouts import Layout
from cute_kernels.layouts import generate as _gen
from cute_kernels.layouts.generate import (
    gen_beyond_divide_pair, gen_beyond_pair, gen_composable_pair, gen_divide_pair, gen_product_pair,
    gen_shape, gen_swizzle, with_edges,
)
from cute_kernels.layouts.int_tuple import flatten, is_tuple, product

N_CASES = 500
N_EDGE_CASES = 200  # per <op>_edge / <op>_beyond family


class _Plain:
    gen_layout = staticmethod(_gen.gen_layout)
    gen_injective_layout = staticmethod(_gen.gen_injective_layout)
    gen_compact_layout = staticmethod(_gen.gen_compact_layout)


class _Edges:
    """The layout generators with edge leaves added (compact layouts keep no stride-0 leaf)."""

    @staticmethod
    def gen_layout(d, *a, **k):
        return with_edges(d, _gen.gen_layout(d, *a, **k))

    @staticmethod
    def gen_injective_layout(d, *a, **k):
        return with_edges(d, _gen.gen_injective_layout(d, *a, **k))

    @staticmethod
    def gen_compact_layout(d, *a, **k):
        return with_edges(d, _gen.gen_compact_layout(d, *a, **k), zero=False)


def _rng(name: str) -> random.Random:
    return random.Random(f"cute-kernels-{name}")


def cases(op: str, n: int = N_CASES, ours=None, keep=None) -> list[tuple]:
    """Argument tuples for operation ``op``, the same on every run.

    With ``ours`` (our implementation of ``op``), generation continues until ``n`` cases are
    accepted by it; the cases it refuses along the way are kept too (they are cross-checked as
    refusals). Without it, exactly ``n`` cases. ``keep`` filters cases out before anything else.
    """
    from cute_kernels.layouts import LayoutError

    rng = _rng(op)
    d = rng.randint
    base, g = (op[: -len("_edge")], _Edges) if op.endswith("_edge") else (op, _Plain)
    out, accepted = [], 0
    while accepted < n:
        args = _one(base, d, rng, g)
        if keep is not None and not keep(*args):
            continue
        out.append(args)
        if ours is None:
            accepted += 1
            continue
        try:
            ours(*args)
            accepted += 1
        except LayoutError:
            pass
    return out


def _one(op: str, d, rng, g=_Plain) -> tuple:
    gen_layout, gen_injective_layout, gen_compact_layout = g.gen_layout, g.gen_injective_layout, g.gen_compact_layout
    if op == "composition_beyond":
        return gen_beyond_pair(d, "dsl")
    if op == "composition_beyond_pycute":
        return gen_beyond_pair(d, "pycute")
    if op in ("logical_divide_beyond", "zipped_divide_beyond", "tiled_divide_beyond", "flat_divide_beyond"):
        return gen_beyond_divide_pair(d)
    if op in ("composition",):
        if g is _Edges:
            a = gen_layout(d)
            from cute_kernels.layouts.coalesce import coalesce_x
            from cute_kernels.layouts.generate import _chain_leaf, _nest_pairs

            chain = list(flatten(coalesce_x(a).shape))
            return a, _nest_pairs(d, [_chain_leaf(d, chain, 512) for _ in range(d(1, 3))], 2)
        return gen_composable_pair(d)
    if op == "composition_random":
        return gen_layout(d), gen_layout(d, max_leaves=3, max_stride=12)
    if op == "composition_int":
        A = gen_layout(d)
        return A, rng.choice([k for k in range(1, A.size() + 1) if A.size() % k == 0])
    if op == "composition_by_mode":
        L, T = gen_divide_pair(d, by_mode=True)
        return (_edged_pair(d, L, T) if g is _Edges else (L, T))
    if op == "complement":
        A = gen_injective_layout(d)
        return A, A.cosize() * d(1, 4)
    if op in ("coalesce", "filter", "right_inverse", "nullspace"):
        return (gen_layout(d),)
    if op == "coalesce_profile":
        A = gen_layout(d)
        r = len(A) if is_tuple(A.shape) else 1
        return A, (1,) * d(1, r) if r > 1 else 1
    if op == "left_inverse":
        return (gen_injective_layout(d),)
    if op in ("logical_divide", "zipped_divide", "tiled_divide", "flat_divide"):
        L, T = gen_divide_pair(d)
        if op != "logical_divide" and is_tuple(T) and any(t is None for t in T):
            T = tuple(t if t is not None else 1 for t in T)
        return (_edged_pair(d, L, T) if g is _Edges else (L, T))
    if op in ("logical_product", "zipped_product", "tiled_product", "flat_product", "blocked_product", "raked_product"):
        block, tiler = gen_product_pair(d)
        return (_edged_pair(d, block, tiler) if g is _Edges else (block, tiler))
    if op in ("max_common_vector", "max_common_layout"):
        A = gen_compact_layout(d)
        return (A, gen_compact_layout(d)) if d(0, 1) else (gen_layout(d), A)
    if op == "tile_to_shape":
        block = gen_compact_layout(d, max_leaves=2, max_depth=1)
        modes = list(block) if is_tuple(block.shape) else [block]
        r = len(modes) + d(0, 1)
        target = tuple((m.size() if i < len(modes) else 1) * d(1, 3) for i, m in enumerate(modes + [None] * (r - len(modes))))
        order = tuple(rng.sample(range(r), r))
        return block, target, order
    if op == "make_ordered_layout":
        shape = gen_shape(d)
        flat = flatten(shape)
        order = tuple(rng.sample(range(len(flat)), len(flat)))
        from cute_kernels.layouts.int_tuple import unflatten

        return shape, (unflatten(order, shape) if is_tuple(shape) else order[0])
    if op == "recast_layout":
        # Strides are multiples of the widening ratio (or divide it), which upcast requires; the
        # CuTe DSL rounds the others silently (see test_recast_rounding_is_refused).
        old, new = rng.choice([(16, 32), (32, 16), (8, 16), (16, 8), (8, 32), (32, 8), (16, 64), (16, 24)])
        from math import gcd

        num = new // gcd(old, new)
        shape = list(flatten(gen_compact_layout(d, max_leaves=3).shape))
        shape[0] *= num  # the contiguous mode holds whole wide elements
        rest = list(range(1, len(shape)))
        rng.shuffle(rest)
        from cute_kernels.layouts import make_ordered_layout

        L = make_ordered_layout(tuple(shape), tuple([0] + sorted(range(1, len(shape)), key=rest.index)))
        return L, old, new
    if op == "swizzle_composition":
        sw = gen_swizzle(d, allow_negative=True)
        L = gen_compact_layout(d, max_leaves=3)
        tiler = tuple(rng.choice([k for k in range(1, m.size() + 1) if m.size() % k == 0])
                      for m in (list(L) if is_tuple(L.shape) else [L]))
        return sw, L, tiler
    if op == "identity":
        return (gen_shape(d),)
    if op == "identity_composition":
        from cute_kernels.layouts import make_identity_layout
        from cute_kernels.layouts.coalesce import coalesce_x
        from cute_kernels.layouts.generate import _chain_leaf, _nest_pairs

        from cute_kernels.layouts import LayoutError, composition

        shape = gen_shape(d)
        identity = make_identity_layout(shape)
        chain = list(flatten(coalesce_x(identity).shape))
        for attempt in range(4):  # leaves drawn independently may overlap (carry); draw again
            b = _nest_pairs(d, [_chain_leaf(d, chain, 256) for _ in range(d(1, 2) if attempt < 3 else 1)], 1)
            try:
                composition(identity, b)
                break
            except LayoutError:
                continue
        return shape, b
    if op == "complement_shape":
        A = gen_injective_layout(d)
        return A, tuple(d(1, 6) for _ in range(d(1, 3)))
    if op == "evaluate":
        from cute_kernels.layouts.int_tuple import idx2crd

        A = gen_layout(d)
        i = d(0, A.size() - 1)
        return A, (i if d(0, 1) else idx2crd(i, A.shape))
    if op == "slice":
        A = gen_layout(d)
        if not is_tuple(A.shape):
            return A, None
        crd = [None if d(0, 1) else d(0, product(m) - 1) for m in A.shape]
        crd[d(0, len(crd) - 1)] = None  # at least one mode is kept
        return A, tuple(crd)
    raise KeyError(op)


def _edged_pair(d, layout, tiler):
    """Size-1 leaves added to both operands of a divide or product (no stride-0 leaf: that would
    change the function the tiler was drawn for); a tuple tiler gets them mode by mode."""
    from cute_kernels.layouts import make_layout

    if is_tuple(tiler):  # keep the modes the tiler names; add edges inside them
        layout = make_layout(*(with_edges(d, m, zero=False) if d(0, 1) else m for m in layout))
    else:
        layout = with_edges(d, layout, zero=False)
    if isinstance(tiler, Layout):
        tiler = with_edges(d, tiler, zero=False)
    elif is_tuple(tiler):
        tiler = tuple(with_edges(d, t, zero=False) if isinstance(t, Layout) and d(0, 1) else t for t in tiler)
    return layout, tiler


def canonical(layout: Layout) -> tuple:
    """Shape and stride with the strides of size-1 leaves set to 0 (they never contribute)."""

    def zero(s, t):
        if is_tuple(s):
            return tuple(zero(x, y) for x, y in zip(s, t))
        return 0 if s == 1 else t

    return layout.shape, zero(layout.shape, layout.stride)


def function_values(layout) -> list:
    return [layout(i) for i in range(product(layout.shape))]
