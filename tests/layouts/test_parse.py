import pytest

from cute_kernels.layouts import ComposedLayout, Layout, LayoutError, Swizzle, parse_int_tuple, parse_layout


@pytest.mark.parametrize(
    "text, expected",
    [
        ("(4,(2,2)):(2,(1,8))", Layout((4, (2, 2)), (2, (1, 8)))),
        ("8:1", Layout(8, 1)),
        ("(8):(1)", Layout((8,), (1,))),
        ("( 4 , 2 ) : ( 1 , 4 )", Layout((4, 2), (1, 4))),
        ("(_4,_2):(_1,_4)", Layout((4, 2), (1, 4))),          # CuTe's static-int spelling
        ("(4,2):(-1,4)", Layout((4, 2), (-1, 4))),
        ("Sw<3,4,3>", Swizzle(3, 4, 3)),
        ("S<2,0,-3>", Swizzle(2, 0, -3)),                      # the CuTe DSL's spelling
        ("Sw<3,4,3> o 0 o (8,64):(64,1)", ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 64), (64, 1)))),
        ("(64,8):(8,1) o -4 o Sw<3,4,3>", ComposedLayout(Layout((64, 8), (8, 1)), -4, Swizzle(3, 4, 3))),
        ("S<2,0,-3 o 0 o 8:1", ComposedLayout(Swizzle(2, 0, -3), 0, Layout(8, 1))),  # DSL 4.8 drops the '>'
        ("():()", Layout((), ())),
    ],
)
def test_parse(text, expected):
    assert parse_layout(text) == expected


@pytest.mark.parametrize("bad", ["", "(4,2)", "(4,2):(1)", "(4,2):(1,2", "4:1 o", "Sw<3,4>", "4:1 junk", "(4,0):(1,1)"])
def test_malformed_text_raises(bad):
    with pytest.raises(LayoutError):
        parse_layout(bad)


def test_parse_int_tuple():
    assert parse_int_tuple("(4,(2,2))") == (4, (2, 2))
    assert parse_int_tuple("8") == 8
