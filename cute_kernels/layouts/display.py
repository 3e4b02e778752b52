"""How layouts show themselves in Jupyter and export pictures; drawing lives in render.py,
imported only when a picture is asked for."""

from __future__ import annotations


class Drawable:
    """Jupyter hooks (`_repr_svg_`, `_repr_html_`) and `to_svg` / `to_latex` for a layout."""

    __slots__ = ()

    def _repr_svg_(self):
        from .render import repr_svg

        return repr_svg(self)

    def _repr_html_(self):
        from .render import repr_html

        return repr_html(self)

    def to_svg(self, dtype=None) -> str:
        """This layout drawn as an SVG grid (swizzled layouts coloured by bank)."""
        from .render import to_svg

        return to_svg(self, dtype)

    def to_latex(self, dtype=None) -> str:
        """This layout as a TikZ picture."""
        from .render import to_latex

        return to_latex(self, dtype)
