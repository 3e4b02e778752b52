"""Cross-check against pycute (NVIDIA's Python reference, from the nvidia-cutlass package).

pycute predates parts of today's CuTe, so a few differences are expected and pinned here:

* ``logical_product(A, <int>)``: pycute drops the complement and returns ``(n,1):(d,0)``-like
  layouts; CuTe (and we) compute ``(A, complement(A, size(A)*n) o n:1)``.
* size-1 modes: CuTe's ``make_layout(1)`` is ``1:0``, pycute's ``1:1``; strides of size-1 modes
  never affect the function, so results are compared with those strides zeroed.
* composition past the left operand's domain: CuTe keeps a trailing size-1 mode (``coalesce_x``),
  pycute drops it; compared on pairs where ``cosize(B) <= size(A)``.
* ``right_inverse`` stops at the first stride-0 mode in pycute (CuTe skips it); compared on
  layouts without stride-0 modes.
* ``left_inverse`` is only defined on the image of the layout; compared there, as functions.
* ``zipped_divide`` / ``tiled_divide`` with ``None`` in the tiler: pycute accepts, CuTe refuses.
"""

from __future__ import annotations

import pytest

from cute_kernels import layouts as L
from cute_kernels.layouts.int_tuple import flatten

from ._cases import N_CASES, canonical, cases

pycute = pytest.importorskip("pycute")


def _p(x):
    if isinstance(x, L.Layout):
        return pycute.Layout(x.shape, x.stride)
    if isinstance(x, tuple):
        return tuple(_p(t) for t in x)
    return x


def _canon(x):
    return canonical(L.Layout(x.shape, x.stride))


def _check(op, ours, theirs, keep=None, compare=None):
    agreed = 0
    mismatches = []
    for args in cases(op, ours=ours, keep=keep):
        try:
            mine = ours(*args)
        except L.LayoutError:
            continue  # inadmissible for CuTe; pycute often asserts or returns a non-layout
        ref = theirs(*[_p(a) for a in args])
        same = compare(mine, ref, *args) if compare else _canon(mine) == _canon(ref)
        if same:
            agreed += 1
        else:
            mismatches.append((args, str(mine), str(ref)))
    assert mismatches == [], f"{len(mismatches)} differ, e.g. {mismatches[:3]}"
    return agreed


def _no_zero_strides(a, *rest):
    return all(d != 0 for s, d in zip(flatten(a.shape), flatten(a.stride)) if s != 1)


@pytest.mark.parametrize(
    "op, ours, theirs, keep",
    [
        ("composition", L.composition, pycute.composition, lambda a, b: b.cosize() <= a.size()),
        ("complement", L.complement, pycute.complement, lambda *a: True),
        ("coalesce", L.coalesce, pycute.coalesce, lambda *a: True),
        ("right_inverse", L.right_inverse, pycute.right_inverse, _no_zero_strides),
        ("logical_divide", L.logical_divide, pycute.logical_divide, lambda *a: True),
        ("zipped_divide", L.zipped_divide, pycute.zipped_divide, lambda *a: True),
        ("tiled_divide", L.tiled_divide, pycute.tiled_divide, lambda *a: True),
        ("logical_product", L.logical_product, pycute.logical_product, lambda *a: True),
        ("zipped_product", L.zipped_product, pycute.zipped_product, lambda *a: True),
        ("tiled_product", L.tiled_product, pycute.tiled_product, lambda *a: True),
    ],
)
def test_agrees_with_pycute(op, ours, theirs, keep):
    assert _check(op, ours, theirs, keep) >= N_CASES


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
