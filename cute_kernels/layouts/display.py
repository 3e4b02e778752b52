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


class Report:
    """A result that reads well wherever it is shown: ``repr`` (the prompt) and ``str`` are the
    text the docs show, IPython's pretty printer uses it too, and Jupyter gets an HTML table of
    the same figures (``_repr_html_``) with an optional picture below it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def table(self) -> list[tuple[str, str]]:
        """The figures as (label, value) rows: what the HTML table shows."""
        raise NotImplementedError

    def picture_svg(self) -> str | None:
        """An SVG to show under the table, or None."""
        return None

    def _repr_html_(self) -> str:
        from xml.sax.saxutils import escape

        head = escape(str(self).splitlines()[0])
        rows = "".join(f"<tr><th style='text-align:left'>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in self.table())
        svg = self.picture_svg() or ""
        return f"<div><b>{head}</b><table>{rows}</table>{svg}</div>"
