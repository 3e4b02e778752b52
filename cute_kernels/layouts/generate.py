"""Random layouts and admissible operand pairs, built from any integer source.

Each builder takes ``draw(lo, hi)`` returning an int in ``[lo, hi]`` (inclusive). The hypothesis
strategies in :mod:`cute_kernels.layouts.strategies` pass ``hypothesis`` draws (so examples
shrink); cross-checks pass ``random.Random(seed).randint`` to make hundreds of cases cheaply.
Pairs are built to be admissible by construction (the divisibility conditions hold), not filtered.
"""

from __future__ import annotations

from typing import Any, Callable

from .coalesce import coalesce, coalesce_x
from .complement import complement
from .int_tuple import flatten, is_tuple
from .layout import Layout, make_layout
from .swizzle import Swizzle

__all__ = [
    "Draw",
    "gen_shape",
    "gen_layout",
    "gen_compact_layout",
    "gen_injective_layout",
    "gen_composable_pair",
    "gen_divide_pair",
    "gen_product_pair",
    "gen_swizzle",
    "gen_edge_layout",
    "with_edges",
    "gen_beyond_pair",
    "gen_beyond_divide_pair",
    "gen_f2_layout",
    "gen_f2_swizzle",
    "nest",
]

Draw = Callable[[int, int], int]


def _choice(draw: Draw, items: list) -> Any:
    return items[draw(0, len(items) - 1)]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def nest(draw: Draw, leaves: list, max_depth: int = 2) -> Any:
    """Group a flat list of leaves into a random nested tuple (depth <= max_depth), keeping order.

    A single leaf may stay bare (an int-shaped, rank-1 layout).
    """
    if len(leaves) == 1 and (max_depth == 0 or draw(0, 2) > 0):
        return leaves[0]
    if max_depth == 0:
        return tuple(leaves)
    out, i = [], 0
    while i < len(leaves):
        j = draw(i + 1, len(leaves))
        chunk = leaves[i:j]
        out.append(nest(draw, chunk, max_depth - 1) if len(chunk) > 1 or draw(0, 3) == 0 else chunk[0])
        i = j
    return tuple(out)


def _nest_pairs(draw: Draw, pairs: list[tuple[int, Any]], max_depth: int) -> Layout:
    """Nest (shape, stride) leaves with one profile for both."""
    profile = nest(draw, list(range(len(pairs))), max_depth)

    def build(p: Any, k: int) -> Any:
        return tuple(build(x, k) for x in p) if is_tuple(p) else pairs[p][k]

    return Layout(build(profile, 0), build(profile, 1))


def gen_shape(draw: Draw, max_leaves: int = 4, max_leaf: int = 6, max_size: int = 256, max_depth: int = 2) -> Any:
    """A random hierarchical shape with leaves in ``[1, max_leaf]`` and size <= ``max_size``."""
    n = draw(1, max_leaves)
    leaves, total = [], 1
    for _ in range(n):
        s = draw(1, max(1, min(max_leaf, max_size // total)))
        leaves.append(s)
        total *= s
    return nest(draw, leaves, max_depth)


def gen_layout(draw: Draw, max_leaves: int = 4, max_leaf: int = 6, max_stride: int = 64, max_depth: int = 2,
               allow_zero: bool = True) -> Layout:
    """A random layout: random shape, random non-negative strides (zero allowed unless ``allow_zero=False``)."""
    shape = gen_shape(draw, max_leaves, max_leaf, max_depth=max_depth)
    lo = 0 if allow_zero else 1
    return Layout(shape, _like(shape, [draw(lo, max_stride) for _ in flatten(shape)]))


def _like(shape: Any, flat: list) -> Any:
    it_ = iter(flat)

    def build(s: Any) -> Any:
        return tuple(build(x) for x in s) if is_tuple(s) else next(it_)

    return build(shape)


def _refine(draw: Draw, chain: list[int]) -> list[int]:
    """Split each entry of ``chain`` into a random ordered factorization."""
    out = []
    for c in chain:
        while c > 1:
            f = _choice(draw, _divisors(c)[1:])
            out.append(f)
            c //= f
            if draw(0, 2) == 0:
                break
        if c > 1:
            out.append(c)
    return out


def gen_compact_layout(draw: Draw, max_leaves: int = 4, max_leaf: int = 6, max_depth: int = 2) -> Layout:
    """A compact layout: a bijection from ``[0, size)`` onto ``[0, size)`` (any mode order)."""
    shape = gen_shape(draw, max_leaves, max_leaf, max_depth=max_depth)
    flat = flatten(shape)
    order = list(range(len(flat)))
    for i in range(len(order) - 1, 0, -1):
        j = draw(0, i)
        order[i], order[j] = order[j], order[i]
    strides, cur = [0] * len(flat), 1
    for k in order:
        strides[k] = cur if flat[k] != 1 else 0  # CuTe's compact layouts give size-1 modes stride 0
        cur *= flat[k]
    return Layout(shape, _like(shape, strides))


def _sub_grid(draw: Draw, chain: list[int], min_modes: int = 1) -> tuple[list[tuple[int, int]], int]:
    """Pick modes of a refinement of the compact chain: injective leaves with prefix-product strides."""
    factors = _refine(draw, chain) or [1]
    prefix = [1]
    for f in factors:
        prefix.append(prefix[-1] * f)
    picks = [i for i in range(len(factors)) if draw(0, 1)]
    if len(picks) < min_modes:
        picks = [draw(0, len(factors) - 1)]
    for i in range(len(picks) - 1, 0, -1):
        j = draw(0, i)
        picks[i], picks[j] = picks[j], picks[i]
    return [(factors[i], prefix[i]) for i in picks], prefix[-1]


def gen_injective_layout(draw: Draw, max_leaves: int = 4, max_leaf: int = 6, max_depth: int = 2,
                         max_scale: int = 3) -> Layout:
    """An injective layout whose sorted strides satisfy complement's divisibility condition.

    Built by refining a random chain into factors, keeping a random subset of the factors in a
    random order with their prefix-product strides, and scaling all strides by a common factor.
    """
    chain = [draw(1, max_leaf) for _ in range(draw(1, max_leaves))]
    leaves, _ = _sub_grid(draw, chain)
    scale = draw(1, max_scale)
    return _nest_pairs(draw, [(s, d * scale) for s, d in leaves], max_depth)


def _chain_leaf(draw: Draw, chain: list[int], max_size: int) -> tuple[int, int]:
    """A (shape, stride) leaf admissible as the right operand of a composition with a layout of this
    coalesced flat shape (the last entry of ``chain`` is unbounded)."""
    n = len(chain)
    k = draw(0, n - 1)
    prefix = 1
    for c in chain[:k]:
        prefix *= c
    if k == n - 1:
        t = draw(1, 4)
        return draw(1, 6), prefix * t
    t = _choice(draw, _divisors(chain[k]))
    span = chain[k] // t
    if draw(0, 1) or span == 1:
        s = draw(1, max(1, span))
        return s, prefix * t
    s = span
    for m in range(k + 1, n):
        if m == n - 1:
            s *= draw(1, 4)
            break
        if draw(0, 1):
            s *= draw(1, chain[m])
            break
        s *= chain[m]
        if s > max_size:
            break
    return s, prefix * t


def gen_composable_pair(draw: Draw, max_leaves: int = 4, max_depth: int = 2) -> tuple[Layout, Layout]:
    """``(A, B)`` with ``composition(A, B)`` admissible: B's leaves respect A's coalesced mode
    boundaries (divisibility) and their images do not overlap in A's coordinates (no carries)."""
    from .composition import composition
    from .errors import LayoutError

    a = gen_layout(draw, max_leaves=max_leaves, max_depth=max_depth)
    chain = list(flatten(coalesce_x(a).shape))
    for attempt in range(4):
        leaves = []
        for _ in range(draw(1, 3) if attempt < 3 else 1):
            if draw(0, 7) == 0:
                leaves.append((draw(1, 4), 0))
            else:
                leaves.append(_chain_leaf(draw, chain, 512))
        b = _nest_pairs(draw, leaves, max_depth)
        try:
            composition(a, b)
        except LayoutError:
            continue
        return a, b
    return a, b


def _tiler_for(draw: Draw, layout: Layout) -> Layout:
    chain = list(flatten(coalesce(layout).shape))
    leaves, _ = _sub_grid(draw, chain)
    return _nest_pairs(draw, leaves, 1)


def gen_divide_pair(draw: Draw, by_mode: bool | None = None, max_leaves: int = 4) -> tuple[Layout, Any]:
    """``(layout, tiler)`` admissible for ``logical_divide``.

    The tiler is a layout (or, by mode, a tuple of layouts / ints / ``None``) picking modes of a
    refinement of the layout's coalesced shape, so its complement and the composition exist.
    """
    layout = gen_layout(draw, max_leaves=max_leaves)
    if by_mode is None:
        by_mode = bool(draw(0, 1)) and is_tuple(layout.shape)
    if not by_mode:
        return layout, _tiler_for(draw, layout)
    if not is_tuple(layout.shape):
        layout = make_layout(layout)
    tiler = []
    for m in list(layout)[: draw(1, len(layout))]:
        kind = draw(0, 3)
        if kind == 0:
            tiler.append(None)
        elif kind == 1:
            chain = list(flatten(coalesce(m).shape))
            tiler.append(_choice(draw, _divisors(chain[0])) if len(chain) > 1 else _choice(draw, _divisors(m.size())))
        else:
            tiler.append(_tiler_for(draw, m))
    return layout, tuple(tiler)


def gen_product_pair(draw: Draw, max_leaves: int = 3) -> tuple[Layout, Layout]:
    """``(block, tiler)`` admissible for ``logical_product``: an injective block and a tiler that
    composes with the block's complement."""
    block = gen_injective_layout(draw, max_leaves=max_leaves, max_depth=1)
    # With a large cotarget the complement ends in its "rest" mode, which composition treats as unbounded.
    comp = complement(block, block.cosize() * 64)
    chain = list(flatten(comp.shape))[:-1] + [1]
    from .errors import LayoutError
    from .product import logical_product

    for attempt in range(4):
        leaves = [_chain_leaf(draw, chain, 64) for _ in range(draw(1, 2) if attempt < 3 else 1)]
        tiler = _nest_pairs(draw, leaves, 1)
        try:
            logical_product(block, tiler)
        except LayoutError:
            continue
        break
    return block, tiler


def gen_swizzle(draw: Draw, max_bits: int = 3, max_base: int = 4, allow_negative: bool = True) -> Swizzle:
    """A valid ``Swizzle(B, M, S)`` with ``|S| >= B``."""
    b = draw(0, max_bits)
    m = draw(0, max_base)
    s = draw(max(b, 1), max_bits + 2)
    if allow_negative and draw(0, 3) == 0:
        s = -s
    return Swizzle(b, m, s)



def with_edges(draw: Draw, layout: Layout, zero: bool = True, max_stride: int = 40) -> Layout:
    """``layout`` with edge-case leaves added: size-1 leaves anywhere (inner and trailing, with
    arbitrary strides, which never change the function inside the domain) and, with ``zero``,
    a stride-0 (broadcast) leaf; the leaves are nested afresh."""
    flat = list(zip(flatten(layout.shape), flatten(layout.stride)))
    for _ in range(draw(0, 2)):
        flat.insert(draw(0, len(flat)), (1, draw(0, max_stride)))
    if zero and draw(0, 3) == 0:
        flat.insert(draw(0, len(flat)), (draw(2, 4), 0))
    if draw(0, 2) == 0:
        flat.append((1, draw(0, max_stride)))  # a trailing size-1 mode: where the semantics differ
    return _nest_pairs(draw, flat, 2)


def gen_edge_layout(draw: Draw, max_leaves: int = 4, max_stride: int = 40) -> Layout:
    """A random layout biased to the edges (see :func:`with_edges`), and now and then a layout
    all of whose leaves have size 1."""
    if draw(0, 15) == 0:
        return _nest_pairs(draw, [(1, draw(0, max_stride)) for _ in range(draw(1, 3))], 2)
    return with_edges(draw, gen_layout(draw, max_leaves=max_leaves, max_stride=max_stride, max_depth=1),
                      max_stride=max_stride)


def gen_beyond_pair(draw: Draw, rule: str = "dsl") -> tuple[Layout, Layout]:
    """``(A, B)`` with ``composition(A, B)`` admissible under ``rule`` and B's image reaching past
    ``size(A)``: A from :func:`gen_edge_layout`, B's leaves walking A's coalesced modes (the
    flat form each rule extends) with the unbounded last mode used often. May return a pair whose
    B stays inside A when none was found in a few attempts."""
    from .composition import composition
    from .errors import LayoutError
    from .semantics import layout_semantics

    a = gen_edge_layout(draw)
    flat = coalesce_x(a) if rule == "dsl" else coalesce(a)
    chain = list(flatten(flat.shape))
    b = Layout(1, 0)
    for _ in range(6):
        leaves = []
        for _ in range(draw(1, 3)):
            if draw(0, 7) == 0:
                leaves.append((draw(1, 4), 0))
            elif draw(0, 1):
                # walk onto the last (unbounded) mode: past the end of A
                prefix = 1
                for c in chain[:-1]:
                    prefix *= c
                leaves.append((draw(2, 6), prefix * draw(1, 3)))
            else:
                leaves.append(_chain_leaf(draw, chain, 512))
        b = _nest_pairs(draw, leaves, 2)
        try:
            with layout_semantics(rule):
                composition(a, b)
        except LayoutError:
            continue
        if b.cosize() > a.size():
            return a, b
    return a, b


def gen_beyond_divide_pair(draw: Draw) -> tuple[Layout, Layout]:
    """``(layout, tiler)`` where the tiler does not divide the layout (its size does not divide
    ``size(layout)``, or it reaches past it), so ``make_layout(tiler, complement)`` reaches
    beyond the layout: the regime where the divides of the two semantics can differ."""
    layout = gen_edge_layout(draw)
    chain = list(flatten(coalesce(layout).shape))
    chain[-1] *= draw(1, 3)
    if draw(0, 1):
        chain.append(draw(2, 4))
    leaves, _ = _sub_grid(draw, chain)
    if draw(0, 2) == 0:  # one more mode past everything the tiler covers (it stays injective)
        leaves.append((draw(2, 5), max(s * d for s, d in leaves)))
    return layout, _nest_pairs(draw, leaves, 1)


def gen_f2_layout(draw: Draw, max_bits: int = 8, compact: bool = False, zeros: bool = True,
                  bits: int | None = None) -> Layout:
    """A layout that is linear over F2: power-of-two leaves whose images are disjoint runs of
    output bits, in a random order. ``compact``: the runs tile ``[0, 2**n)`` (a bijection onto it);
    otherwise some runs are skipped (gaps), and with ``zeros`` stride-0 and size-1 leaves appear.
    ``bits`` fixes ``n``, the number of output bits."""
    n = bits if bits is not None else draw(1, max_bits)
    cuts = sorted({draw(1, n - 1) for _ in range(draw(0, min(3, n - 1)))}) if n > 1 else []
    runs = [(a, b) for a, b in zip([0] + cuts, cuts + [n])]
    leaves = [(1 << (b - a), 1 << a) for a, b in runs if compact or draw(0, 3) > 0]
    if not leaves:
        leaves = [(1 << (runs[0][1] - runs[0][0]), 1)]
    if not compact and zeros:
        if draw(0, 3) == 0:
            leaves.append((1 << draw(1, 2), 0))
        if draw(0, 3) == 0:
            leaves.append((1, (1 << draw(0, 4)) if draw(0, 1) else 0))  # size-1: any stride, powers of two divide
    for i in range(len(leaves) - 1, 0, -1):
        j = draw(0, i)
        leaves[i], leaves[j] = leaves[j], leaves[i]
    return _nest_pairs(draw, leaves, 2)


def gen_f2_swizzle(draw: Draw, bits: int) -> Swizzle:
    """A swizzle acting within the low ``bits`` bits (``M + B + |S| <= bits``), at least 2 bits wide."""
    b = draw(1, max(1, bits // 2))
    s = draw(b, max(b, bits - b))
    m = draw(0, max(0, bits - b - s))
    return Swizzle(b, m, s if draw(0, 2) else -s)
