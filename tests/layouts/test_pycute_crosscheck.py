"""Cross-check against pycute (NVIDIA's Python reference, from the nvidia-cutlass package).

pycute predates parts of today's CuTe, so a few differences are expected and pinned here:

* ``logical_product(A, <int>)``: pycute drops the complement and returns ``(n,1):(d,0)``-like
  layouts; CuTe (and we) compute ``(A, complement(A, size(A)*n) o n:1)``.
* size-1 modes: CuTe's ``make_layout(1)`` is ``1:0``, pycute's ``1:1``; strides of size-1 modes
  never affect the function, so results are compared with those strides zeroed.
* composition past the left operand's domain: CuTe (the DSL and C++) keeps a trailing size-1 mode
  (``coalesce_x``), pycute composes against ``coalesce(A)``: that is ``semantics="pycute"``, and
  every composition and divide is cross-checked under it, including ``<op>_beyond`` pairs that
  reach past A and ``<op>_edge`` cases full of size-1 and stride-0 leaves.
* ``right_inverse`` stops at the first stride-0 mode in pycute (CuTe skips it); compared on
  layouts without stride-0 modes.
* ``left_inverse`` is only defined on the image of the layout; compared there, as functions.
* ``zipped_divide`` / ``tiled_divide`` with ``None`` in the tiler: pycute accepts, CuTe refuses.
* pycute asserts stride divisibility on size-1 modes of a right operand (``1:20`` against a mode
  of 6); CuTe only requires such a stride to be below the mode or a multiple of it, and the stride
  of a size-1 mode never changes the function: compared with those strides zeroed.
"""

from __future__ import annotations

import pytest

from cute_kernels import layouts as L
from cute_kernels.layouts.int_tuple import flatten

from ._cases import N_CASES, N_EDGE_CASES, canonical, cases

pycute = pytest.importorskip("pycute")


def _p(x):
    if isinstance(x, L.Layout):
        return pycute.Layout(x.shape, x.stride)
    if isinstance(x, tuple):
        return tuple(_p(t) for t in x)
    return x


def _canon(x):
    return canonical(L.Layout(x.shape, x.stride))


def _check(op, ours, theirs, keep=None, compare=None, n=N_CASES):
    agreed = 0
    mismatches = []
    for args in cases(op, n, ours=ours, keep=keep):
        try:
            mine = ours(*args)
        except L.LayoutError:
            continue  # inadmissible for CuTe; pycute often asserts or returns a non-layout
        try:
            ref = theirs(*[_p(a) for a in args])
        except AssertionError:
            # pycute asserts stride divisibility even for size-1 modes, whose stride never
            # matters (CuTe checks only that the stride is below the mode or a multiple of it):
            # compare with those strides zeroed.
            ref = theirs(*[_p(_zero_unit_strides(a)) for a in args])
        same = compare(mine, ref, *args) if compare else _canon(mine) == _canon(ref)
        if same:
            agreed += 1
        else:
            mismatches.append((args, str(mine), str(ref)))
    assert mismatches == [], f"{len(mismatches)} differ, e.g. {mismatches[:3]}"
    return agreed


def _zero_unit_strides(x):
    if isinstance(x, L.Layout):
        return L.Layout(*canonical(x))
    if isinstance(x, tuple):
        return tuple(_zero_unit_strides(t) for t in x)
    return x


def _no_zero_strides(a, *rest):
    return all(d != 0 for s, d in zip(flatten(a.shape), flatten(a.stride)) if s != 1)


def _pycute_rule(op):
    """Our operation under ``semantics="pycute"``."""
    return lambda *args: op(*args, semantics="pycute")


@pytest.mark.parametrize(
    "op, ours, theirs, keep",
    [
        ("composition", _pycute_rule(L.composition), pycute.composition, lambda *a: True),
        ("complement", L.complement, pycute.complement, lambda *a: True),
        ("coalesce", L.coalesce, pycute.coalesce, lambda *a: True),
        ("right_inverse", L.right_inverse, pycute.right_inverse, _no_zero_strides),
        ("logical_divide", _pycute_rule(L.logical_divide), pycute.logical_divide, lambda *a: True),
        ("zipped_divide", _pycute_rule(L.zipped_divide), pycute.zipped_divide, lambda *a: True),
        ("tiled_divide", _pycute_rule(L.tiled_divide), pycute.tiled_divide, lambda *a: True),
        ("logical_product", L.logical_product, pycute.logical_product, lambda *a: True),
        ("zipped_product", L.zipped_product, pycute.zipped_product, lambda *a: True),
        ("tiled_product", L.tiled_product, pycute.tiled_product, lambda *a: True),
    ],
)
def test_agrees_with_pycute(op, ours, theirs, keep):
    assert _check(op, ours, theirs, keep) >= N_CASES


EDGE_AND_BEYOND = [
    ("composition_beyond_pycute", _pycute_rule(L.composition), pycute.composition, None),
    ("logical_divide_beyond", _pycute_rule(L.logical_divide), pycute.logical_divide, None),
    ("zipped_divide_beyond", _pycute_rule(L.zipped_divide), pycute.zipped_divide, None),
    ("tiled_divide_beyond", _pycute_rule(L.tiled_divide), pycute.tiled_divide, None),
    ("composition_edge", _pycute_rule(L.composition), pycute.composition, None),
    ("complement_edge", L.complement, pycute.complement, None),
    ("coalesce_edge", L.coalesce, pycute.coalesce, None),
    ("filter_edge", L.filter, pycute.filter, None),
    ("right_inverse_edge", L.right_inverse, pycute.right_inverse, _no_zero_strides),
    ("logical_divide_edge", _pycute_rule(L.logical_divide), pycute.logical_divide, None),
    ("zipped_divide_edge", _pycute_rule(L.zipped_divide), pycute.zipped_divide, None),
    ("tiled_divide_edge", _pycute_rule(L.tiled_divide), pycute.tiled_divide, None),
    ("logical_product_edge", L.logical_product, pycute.logical_product, None),
    ("zipped_product_edge", L.zipped_product, pycute.zipped_product, None),
    ("tiled_product_edge", L.tiled_product, pycute.tiled_product, None),
]


@pytest.mark.parametrize("op, ours, theirs, keep", EDGE_AND_BEYOND, ids=[c[0] for c in EDGE_AND_BEYOND])
def test_edges_and_beyond_agree_with_pycute(op, ours, theirs, keep):
    """Under ``semantics="pycute"`` every random case agrees, including B reaching beyond A."""
    assert _check(op, ours, theirs, keep, n=N_EDGE_CASES) >= N_EDGE_CASES


def test_left_inverse_agrees_with_pycute_on_the_image():
    def same(mine, ref, a):
        return all(mine(a(i)) == ref(a(i)) == i for i in range(a.size()))

    assert _check("left_inverse", L.left_inverse, pycute.left_inverse, compare=same) >= N_CASES


def test_pycute_logical_product_with_an_int_is_wrong():
    """The known pycute bug: logical_product(A, n) with an int n."""
    A = L.Layout(2, 1)
    ours = L.logical_product(A, 4)
    theirs = pycute.logical_product(pycute.Layout(2, 1), 4)
    assert (ours.shape, ours.stride) == ((2, 4), (1, 2))                  # CuTe: 4 copies of A, side by side
    assert (theirs.shape, theirs.stride) == ((4, 1), (1, 0))              # pycute: not even size 8
    # With the int spelled as the layout n:1, pycute agrees with us:
    ref = pycute.logical_product(pycute.Layout(2, 1), pycute.Layout(4, 1))
    assert (ref.shape, ref.stride) == (ours.shape, ours.stride)
    differ = computed = 0
    for A, _ in cases("logical_product", 100):
        n = 3
        try:
            mine = L.logical_product(A, n)
        except L.LayoutError:
            continue
        computed += 1
        as_layout = pycute.logical_product(_p(A), pycute.Layout(n, 1))
        assert _canon(mine) == _canon(as_layout)
        try:
            buggy = pycute.logical_product(_p(A), n)
        except AssertionError:
            differ += 1
            continue
        differ += _canon(mine) != _canon(buggy)
    assert computed >= 50 and differ == computed


def test_zipped_divide_with_none_differs_from_pycute():
    layout = L.Layout((6, 4), (4, 1))
    with pytest.raises(L.LayoutError, match="rank-2"):
        L.zipped_divide(layout, (None, 2))
    pycute.zipped_divide(pycute.Layout((6, 4), (4, 1)), (None, 2))  # pycute returns a layout here


def test_filter_agrees_with_pycute():
    assert _check("filter", L.filter, pycute.filter) >= N_CASES


def test_evaluation_and_slicing_agree_with_pycute():
    evaluated = sliced = 0
    for layout, crd in cases("evaluate"):
        assert layout(crd) == _p(layout)(crd)
        evaluated += 1
    for layout, crd in cases("slice", keep=lambda layout, crd: crd is not None):
        # (slicing an int-shaped layout with None: CuTe returns it as is, pycute wraps it in a tuple)
        mine, off = L.slice_and_offset(crd, layout)
        ref, ref_off = pycute.slice_and_offset(crd, _p(layout))
        assert (_canon(mine), off) == (_canon(ref), ref_off)
        sliced += 1
    assert evaluated >= N_CASES and sliced >= N_CASES


def test_index_coordinate_maps_agree_with_pycute():
    from cute_kernels.layouts.int_tuple import crd2idx, idx2crd

    checked = 0
    for layout, _ in cases("evaluate"):
        for i in range(0, layout.size(), max(1, layout.size() // 7)):
            crd = idx2crd(i, layout.shape)
            assert crd == pycute.idx2crd(i, layout.shape)
            assert crd2idx(crd, layout.shape, layout.stride) == pycute.crd2idx(crd, layout.shape, layout.stride)
            checked += 1
    assert checked >= N_CASES


def test_swizzles_agree_with_pycute():
    import random

    from cute_kernels.layouts.generate import gen_swizzle

    rng = random.Random("swizzle")
    for _ in range(N_CASES):
        sw = gen_swizzle(rng.randint)
        ref = pycute.Swizzle(sw.bits, sw.base, sw.shift)
        for x in (rng.randrange(1 << 16) for _ in range(8)):
            assert sw(x) == ref(x)
