"""Products: reproduce a block layout over the elements of a tiler layout."""

from __future__ import annotations

from typing import Any

from .complement import complement
from .composition import composition
from .divide import _composed, _unpack, tile_unzip
from .errors import LayoutError
from .int_tuple import ceil_div, is_int, is_tuple, product
from .layout import Layout, append, make_layout, make_ordered_layout
from .semantics import with_semantics
from .trace import note, tracing

__all__ = [
    "logical_product",
    "zipped_product",
    "tiled_product",
    "flat_product",
    "blocked_product",
    "raked_product",
    "tile_to_shape",
]


def _modes(layout: Layout) -> list[Layout]:
    return list(layout) if is_tuple(layout.shape) else [layout]


@with_semantics
def logical_product(block: Any, tiler: Any) -> Any:
    """CuTe's ``logical_product``: ``make_layout(block, composition(complement(block, size(block) * cosize(tiler)), tiler))``.

    Rank 2, ``(block, tiler')``: mode 0 is ``block`` unchanged; mode 1 repeats it, with the
    ``i``-th copy starting at ``complement(block)(tiler(i))``. A tuple tiler multiplies mode by mode
    (modes beyond it pass through); an int ``n`` means ``n:1``.

    Post-conditions: ``result[0] == block``; ``size(result) == size(block) * size(tiler)``;
    ``result[1]`` is compatible with ``tiler``. If ``block`` and ``tiler`` are injective, so is the result.

    Note: pycute (nvidia-cutlass 4.2) computes ``logical_product(A, <int>)`` wrongly (it treats the
    int as a full shape without its complement); this function follows CuTe C++ and the DSL.

    ``semantics`` (``"dsl"``, ``"cpp"``, ``"pycute"``; see :mod:`~cute_kernels.layouts.semantics`)
    is the composition's rule for a tiler reaching past the complement. The complement is taken
    to ``size(block) * cosize(tiler)``, so the tiler stays inside it and the rules agree (a
    property test checks this); the argument exists so that a ``layout_semantics`` block and an
    explicit argument mean the same everywhere. It applies to every product below.
    """
    composed = _composed(block, logical_product, tiler)
    if composed is not None:
        return composed
    if not isinstance(block, Layout):
        raise LayoutError(f"logical_product: expected a Layout, got {type(block).__name__}")
    if tiler is None:
        return block
    if is_tuple(tiler):
        modes = _modes(block)
        if len(tiler) > len(modes):
            raise LayoutError(f"logical_product: tiler {tiler} has more modes than {block}")
        return make_layout(*(logical_product(m, t) for m, t in zip(modes, tiler)), *modes[len(tiler):])
    if is_int(tiler):
        tiler = Layout(tiler)
    if not isinstance(tiler, Layout):
        raise LayoutError(f"logical_product: tiler must be a Layout, int, None or tuple, got {type(tiler).__name__}")
    rest = complement(block, block.size() * tiler.cosize())
    if tracing():
        note("tile", f"the block {block} is repeated where its complement to {block.size() * tiler.cosize()} "
             f"({rest}) sends the tiler {tiler}: the product is ({block}, {rest} o {tiler})", block=block, rest=rest)
    return make_layout(block, composition(rest, tiler))


@with_semantics
def zipped_product(block: Any, tiler: Any) -> Any:
    """CuTe's ``zipped_product``: :func:`logical_product` gathered as ``((block modes...), (tiler modes...))``.

    Post-conditions: rank 2; for a layout tiler, equal to the logical product; for a tuple tiler, the
    same offsets as the logical product with the ``(block_i, repeat_i)`` pairs regrouped.
    ``semantics``: as for :func:`logical_product`.
    """
    composed = _composed(block, zipped_product, tiler)
    if composed is not None:
        return composed
    return tile_unzip(logical_product(block, tiler), tiler)


@with_semantics
def tiled_product(block: Any, tiler: Any) -> Any:
    """CuTe's ``tiled_product``: ``zipped_product`` with the tiler modes unpacked: ``((block...), t0, t1, ...)``.

    Post-condition: the same function of the index as the zipped product, ``result[0] == zipped[0]``.
    ``semantics``: as for :func:`logical_product`.
    """
    composed = _composed(block, tiled_product, tiler)
    if composed is not None:
        return composed
    return _unpack(zipped_product(block, tiler), False, True)


@with_semantics
def flat_product(block: Any, tiler: Any) -> Any:
    """CuTe's ``flat_product``: ``zipped_product`` with both modes unpacked: ``(b0, b1, ..., t0, t1, ...)``.

    Post-condition: the same function of the index as the zipped product.
    ``semantics``: as for :func:`logical_product`.
    """
    composed = _composed(block, flat_product, tiler)
    if composed is not None:
        return composed
    return _unpack(zipped_product(block, tiler), True, True)


def _padded(layout: Layout, r: int) -> Layout:
    """CuTe's ``append<R>``: pad with ``1:0`` modes to rank ``r`` (an int-shaped layout is first wrapped);
    at ``r == 1`` the layout is unchanged."""
    if r == 1:
        return layout
    if not is_tuple(layout.shape):
        layout = make_layout(layout)
    return append(layout, Layout(1, 0), r) if r > len(layout) else layout


def _zip_tuples(a: Any, b: Any) -> Any:
    """CuTe's ``zip(a, b)``: transpose ``(a, b)`` by the modes of ``a``; if ``a`` is an int, wrap: ``((a, b))``."""
    if not is_tuple(a):
        return ((a, b),)
    if not is_tuple(b):
        raise LayoutError(
            f"product of rank-1 layouts: cannot zip the tuple mode {a} with the int mode {b}; "
            "make both operands int-shaped or both tuples"
        )
    return tuple((x, b[i] if is_tuple(b) else b) for i, x in enumerate(a))


def _zip(a: Layout, b: Layout) -> Layout:
    """CuTe's ``zip(layoutA, layoutB)``: pair up the modes, ``((a0, b0), (a1, b1), ...)``."""
    if is_tuple(a.shape) and is_tuple(b.shape) and len(a.shape) != len(b.shape):
        raise LayoutError(
            f"product of rank-1 layouts: cannot zip {a} with {b}, their ranks differ (the repeated block "
            "was split into more modes than the block has)"
        )
    return Layout(_zip_tuples(a.shape, b.shape), _zip_tuples(a.stride, b.stride))


def _rank_product(block: Any, tiler: Any, raked: bool) -> Any:
    if is_int(tiler):
        tiler = Layout(tiler)
    if not isinstance(block, Layout) or not isinstance(tiler, Layout):
        raise LayoutError("blocked_product/raked_product take two Layouts")
    r = max(len(block), len(tiler))
    product_ = logical_product(_padded(block, r), _padded(tiler, r))
    if not raked:
        return _zip(product_[0], product_[1])
    # CuTe coalesces each mode of a raked product: interleaved copies often merge with the block.
    from .coalesce import coalesce

    return coalesce(_zip(product_[1], product_[0]), (1,) * r)


@with_semantics
def blocked_product(block: Any, tiler: Any) -> Any:
    """CuTe's ``blocked_product``: ``tiler`` copies of ``block``, each block contiguous in the result.

    Definition: pad both to the larger rank ``R`` with ``1:0`` modes, take ``logical_product`` and
    zip its two modes: mode ``i`` of the result is ``(block_i, tiler_i')``. For ``R == 1`` the
    result has the single mode ``(block, tiler')`` (so ``blocked_product(2:1, 3:1)`` is ``((2,3)):((1,2))``).
    Like the CuTe DSL, a rank-1 tuple block with an int-shaped tiler is rejected (:class:`LayoutError`).
    Post-conditions: ``rank(result) == max(rank(block), rank(tiler))``; ``size(result) ==
    size(block) * size(tiler)``; ``result[i].shape[0] == block[i].shape``.
    ``semantics``: as for :func:`logical_product`.
    """
    composed = _composed(block, blocked_product, tiler)
    if composed is not None:
        return composed
    return _rank_product(block, tiler, raked=False)


@with_semantics
def raked_product(block: Any, tiler: Any) -> Any:
    """CuTe's ``raked_product``: like :func:`blocked_product` but the copies are interleaved.

    Mode ``i`` of the result is ``(tiler_i', block_i)``, coalesced (as the CuTe DSL does):
    consecutive coordinates step through the copies first. Post-conditions as for
    :func:`blocked_product` (the function, not the exact mode structure, since modes may merge).
    ``semantics``: as for :func:`logical_product`.
    """
    composed = _composed(block, raked_product, tiler)
    if composed is not None:
        return composed
    return _rank_product(block, tiler, raked=True)


@with_semantics
def tile_to_shape(block: Any, target_shape: Any, order: Any = None) -> Any:
    """CuTe's ``tile_to_shape``: repeat ``block`` (``blocked_product``) until it has ``target_shape``.

    ``order`` (default column-major) is the order in which the modes of the target are tiled,
    as in :func:`make_ordered_layout`. Requires ``rank(block) <= rank(target_shape)`` and each
    mode size of ``block`` to divide the corresponding target size (:class:`LayoutError` otherwise).
    Post-conditions: ``compatible(target_shape, result.shape)`` by mode sizes, i.e.
    ``size(result[i]) == size(target_shape[i])``; ``result`` restricted to the first block is ``block``.
    A :class:`ComposedLayout` tiles its inner layout. ``semantics``: as for :func:`logical_product`.
    """
    composed = _composed(block, lambda b, t: tile_to_shape(b, t, order), target_shape)
    if composed is not None:
        return composed
    if not isinstance(block, Layout):
        raise LayoutError(f"tile_to_shape: expected a Layout, got {type(block).__name__}")
    trg = target_shape if is_tuple(target_shape) else (target_shape,)
    r = len(trg)
    if len(block) > r:
        raise LayoutError(f"tile_to_shape: rank of {block} exceeds the rank of target shape {target_shape}")
    padded = _padded(block, r) if (r > 1 or is_tuple(target_shape)) else block
    block_sizes = tuple(product(m.shape) for m in _modes(padded))
    target_sizes = tuple(product(t) for t in trg)
    for b, t in zip(block_sizes, target_sizes):
        if t % b != 0:
            raise LayoutError(f"tile_to_shape: block shape {block_sizes} does not divide the target shape {target_sizes}")
    product_shape = tuple(ceil_div(t, b) for t, b in zip(target_sizes, block_sizes))
    if not is_tuple(target_shape):
        product_shape = product_shape[0]
    return blocked_product(padded, make_ordered_layout(product_shape, order))
