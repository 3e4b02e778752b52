"""Cross-check against the CuTe DSL's own layout algebra (``cutlass.cute``), evaluated at trace time.

One ``@cute.jit`` trace per operation evaluates hundreds of seeded random cases; each DSL result
is printed by the DSL, parsed back with our parser and compared structurally with ours. A case
agrees when both give the same layout, or both refuse it, or we refuse it as inexact
(:class:`InexactCompositionError`) and the DSL's layout is shown not to compute the composition.
No GPU is needed.

Besides each operation's ordinary cases, ``<op>_edge`` draws the same arguments with size-1 and
stride-0 leaves added, and ``<op>_beyond`` pairs whose right operand reaches past the left
operand: there the default ``semantics="dsl"`` must be exactly the DSL's.
"""

from __future__ import annotations

import pytest

from cute_kernels import layouts as L
from cute_kernels.layouts.composition import InexactCompositionError

from ._cases import N_CASES, N_EDGE_CASES, cases

pytestmark = pytest.mark.compile


def _dsl():
    import cutlass.cute as cute

    return cute


def _to_dsl(x):
    cute = _dsl()
    if isinstance(x, L.Layout):
        return cute.make_layout(x.shape, stride=x.stride)
    if isinstance(x, tuple):
        return tuple(_to_dsl(t) for t in x)
    return x


def _dsl_ops():
    cute = _dsl()
    lay = _to_dsl
    return {
        "composition": (L.composition, lambda a, b: cute.composition(lay(a), lay(b))),
        "composition_int": (L.composition, lambda a, n: cute.composition(lay(a), n)),
        "composition_by_mode": (L.composition, lambda a, t: cute.composition(lay(a), lay(t))),
        "complement": (L.complement, lambda a, c: cute.complement(lay(a), c)),
        "coalesce": (L.coalesce, lambda a: cute.coalesce(lay(a))),
        "coalesce_profile": (L.coalesce, lambda a, p: cute.coalesce(lay(a), target_profile=p)),
        "filter": (L.filter, lambda a: cute.filter(lay(a))),
        "right_inverse": (L.right_inverse, lambda a: cute.right_inverse(lay(a))),
        "left_inverse": (L.left_inverse, lambda a: cute.left_inverse(lay(a))),
        "nullspace": (L.nullspace, lambda a: cute.nullspace(lay(a))),
        "logical_divide": (L.logical_divide, lambda a, t: cute.logical_divide(lay(a), lay(t))),
        "zipped_divide": (L.zipped_divide, lambda a, t: cute.zipped_divide(lay(a), lay(t))),
        "tiled_divide": (L.tiled_divide, lambda a, t: cute.tiled_divide(lay(a), lay(t))),
        "flat_divide": (L.flat_divide, lambda a, t: cute.flat_divide(lay(a), lay(t))),
        "logical_product": (L.logical_product, lambda a, b: cute.logical_product(lay(a), lay(b))),
        "zipped_product": (L.zipped_product, lambda a, b: cute.zipped_product(lay(a), lay(b))),
        "tiled_product": (L.tiled_product, lambda a, b: cute.tiled_product(lay(a), lay(b))),
        "flat_product": (L.flat_product, lambda a, b: cute.flat_product(lay(a), lay(b))),
        "blocked_product": (L.blocked_product, lambda a, b: cute.blocked_product(lay(a), lay(b))),
        "raked_product": (L.raked_product, lambda a, b: cute.raked_product(lay(a), lay(b))),
        "max_common_vector": (L.max_common_vector, lambda a, b: cute.max_common_vector(lay(a), lay(b))),
        "max_common_layout": (L.max_common_layout, lambda a, b: cute.max_common_layout(lay(a), lay(b))),
        "tile_to_shape": (L.tile_to_shape, lambda a, s, o: cute.tile_to_shape(lay(a), s, o)),
        "make_ordered_layout": (L.make_ordered_layout, lambda s, o: cute.make_ordered_layout(s, o)),
        "recast_layout": (L.recast_layout, lambda a, old, new: cute.recast_layout(new, old, lay(a))),
        "swizzle_composition": (
            lambda sw, a, t: L.composition(L.ComposedLayout(sw, 0, a), t),
            lambda sw, a, t: cute.composition(
                cute.make_composed_layout(cute.make_swizzle(sw.bits, sw.base, sw.shift), 0, lay(a)), t
            ),
        ),
        "identity": (L.make_identity_layout, lambda s: cute.make_identity_layout(s)),
        "identity_composition": (
            lambda s, b: L.composition(L.make_identity_layout(s), b),
            lambda s, b: cute.composition(cute.make_identity_layout(s), lay(b)),
        ),
        "complement_shape": (L.complement, lambda a, c: cute.complement(lay(a), c)),
        "evaluate": (lambda a, c: a(c), lambda a, c: cute.crd2idx(c, lay(a))),
        "slice": (lambda a, c: a(c), lambda a, c: cute.slice_(lay(a), c)),
    }


def _trace(fn_pairs):
    """Evaluate ``theirs(*args)`` for every case inside one DSL trace; refusals become None."""
    cute = _dsl()
    results = []

    def evaluate_all():
        for theirs, args in fn_pairs:
            try:
                out = theirs(*args)
                results.append(out if isinstance(out, int) else str(out))
            except Exception as exc:  # the DSL refuses an inadmissible case by raising
                results.append(("refused", type(exc).__name__))

    @cute.jit
    def trace():
        evaluate_all()

    cute.compile(trace)
    return results


def _normalize(x, mine=None):
    """A DSL result as one of ours: ints stay ints, printed layouts are parsed back.

    The DSL prints every B=0 swizzle (the identity) as ``S<0,4,3>``; it is compared as ours.
    """
    if not isinstance(x, str):
        return x
    if x.lstrip("-").isdigit():
        return int(x)
    out = L.parse_layout(x)
    if (isinstance(out, L.ComposedLayout) and isinstance(mine, L.ComposedLayout)
            and isinstance(out.outer, L.Swizzle) and out.outer.bits == 0 == getattr(mine.outer, "bits", None)):
        out = L.ComposedLayout(mine.outer, out.offset, out.inner)
    return out


OPS = [
    "composition", "composition_int", "composition_by_mode", "complement", "coalesce", "coalesce_profile",
    "filter", "right_inverse", "left_inverse", "nullspace", "logical_divide", "zipped_divide", "tiled_divide",
    "flat_divide", "logical_product", "zipped_product", "tiled_product", "flat_product", "blocked_product",
    "raked_product", "max_common_vector", "max_common_layout", "tile_to_shape", "make_ordered_layout",
    "recast_layout", "swizzle_composition", "identity", "identity_composition", "complement_shape",
    "evaluate", "slice",
]
EDGE_OPS = [op + "_edge" for op in OPS if op not in ("identity", "make_ordered_layout", "identity_composition")]
BEYOND_OPS = ["composition_beyond", "logical_divide_beyond", "zipped_divide_beyond", "tiled_divide_beyond",
              "flat_divide_beyond"]


def _base(op: str) -> str:
    for suffix in ("_edge", "_beyond"):
        if op.endswith(suffix):
            return op[: -len(suffix)]
    return op


def _true_function(op: str, args):
    """``i -> value`` of what an inexact composition or divide should have computed, and its size."""
    a, b = args[0], args[1]
    if op == "composition":
        return (lambda i: a(b(i))), b.size()
    if op in ("logical_divide", "zipped_divide", "tiled_divide", "flat_divide") and isinstance(b, L.Layout):
        complete = L.make_layout(b, L.complement(b, L.coalesce(a).shape))  # a layout tiler: one function
        return (lambda i: a(complete(i))), complete.size()
    return None


@pytest.mark.parametrize("op", OPS + EDGE_OPS + BEYOND_OPS)
def test_agrees_with_the_cute_dsl(op):
    ours, theirs = _dsl_ops()[_base(op)]
    n = N_CASES if op in OPS else N_EDGE_CASES
    all_cases = cases(op, n, ours=ours)
    results = _trace([(theirs, args) for args in all_cases])
    mismatches, agreed_values, refused_both, dsl_bugs, dsl_inexact = [], 0, 0, 0, 0
    for args, dsl in zip(all_cases, results):
        try:
            mine = ours(*args)
        except InexactCompositionError as exc:
            mine = ("refused", "inexact")
            truth = _true_function(_base(op), args)
            if not isinstance(dsl, tuple) and truth is not None:
                f, size = truth
                wrong = L.parse_layout(dsl)
                if wrong.size() != size or any(wrong(i) != f(i) for i in range(size)):
                    dsl_inexact += 1  # CuTe computes a layout here, and it is not the composition
                    continue
        except L.LayoutError as exc:
            mine = ("refused", type(exc).__name__)
        if isinstance(dsl, tuple) or isinstance(mine, tuple):
            if isinstance(dsl, tuple) and isinstance(mine, tuple):
                refused_both += 1
                continue
            if _base(op) == "nullspace" and isinstance(dsl, tuple) and dsl[1] == "TypeError":
                dsl_bugs += 1  # DSL 4.8.1 bug: nullspace of an int-shaped layout raises TypeError
                continue
            mismatches.append((args, mine, dsl))
            continue
        if _normalize(dsl, mine) != mine:
            mismatches.append((args, mine, dsl))
        else:
            agreed_values += 1
    assert mismatches == [], f"{len(mismatches)} of {len(all_cases)} differ, e.g. {mismatches[:3]}"
    assert agreed_values + dsl_bugs >= n and dsl_bugs <= n // 20, (agreed_values, refused_both, dsl_bugs)


def test_random_compositions_agree_or_are_refused_for_a_reason():
    """On arbitrary (often inadmissible) pairs: where we compute, the DSL computes the same; where
    CuTe refuses, we refuse; where we refuse but CuTe computes (InexactCompositionError), CuTe's
    layout is not the composition: some index maps differently from A(B(i))."""
    ours, theirs = L.composition, _dsl_ops()["composition"][1]
    all_cases = cases("composition_random", 2 * N_CASES)
    results = _trace([(theirs, args) for args in all_cases])
    inexact_seen = 0
    assert len(all_cases) == 2 * N_CASES
    for (a, b), dsl in zip(all_cases, results):
        try:
            mine = ours(a, b)
        except InexactCompositionError:
            assert not isinstance(dsl, tuple), (a, b)
            wrong = L.parse_layout(dsl)
            assert any(wrong(i) != a(b(i)) for i in range(b.size())), (a, b, dsl)
            inexact_seen += 1
            continue
        except L.LayoutError:
            assert isinstance(dsl, tuple), (a, b, dsl)
            continue
        assert not isinstance(dsl, tuple) and L.parse_layout(dsl) == mine, (a, b, mine, dsl)
        assert all(mine(i) == a(b(i)) for i in range(b.size()))
    assert inexact_seen > 0


def test_recast_rounding_is_refused():
    """Where a stride and the widening ratio do not divide one another, the DSL 4.8.1 rounds
    ((6,2):(1,6) from 8 to 32 bits gives (2,2):(1,2)); CuTe C++ refuses at compile time, and so do we."""
    ours, theirs = _dsl_ops()["recast_layout"]
    args = (L.Layout((6, 2), (1, 6)), 8, 32)
    (dsl,) = _trace([(theirs, args)])
    assert dsl == "(2,2):(1,2)"
    with pytest.raises(L.LayoutError, match="divisibility"):
        ours(*args)


def test_complement_of_a_non_injective_layout_is_refused():
    """The DSL 4.8.1 returns a layout with a zero shape here (and a logical_divide by this tiler
    then kills the process with SIGFPE, which is why the cross-check draws injective tilers only);
    CuTe's complement requires an injective layout, and we say so."""
    tiler = L.Layout(((2, 4), 3), ((4, 1), 4))
    (dsl,) = _trace([(_dsl_ops()["complement"][1], (tiler, 96))])
    assert dsl == "(0,12):(12,8)"
    with pytest.raises(L.LayoutError, match="not injective"):
        L.complement(tiler, 96)


def test_beyond_cases_exercise_the_rule():
    """The beyond-A cases are where the rules differ: most reach past A, many differ from pycute's rule."""
    from ._cases import canonical

    reach = differ = 0
    for a, b in cases("composition_beyond", N_EDGE_CASES, ours=L.composition):
        try:
            mine, other = L.composition(a, b), L.composition(a, b, semantics="pycute")
        except L.LayoutError:
            continue
        reach += b.cosize() > a.size()
        differ += canonical(mine) != canonical(other)
    assert reach >= N_EDGE_CASES * 3 // 4 and differ >= N_EDGE_CASES // 3, (reach, differ)
