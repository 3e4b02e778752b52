"""Drawing helpers of the course's figures: number formats and small palette PNGs."""

from __future__ import annotations

import math

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30


def fmt(v, spec=".1f") -> str:
    """`v` formatted, or '-' for None and non-finite values."""
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def size(nbytes: int) -> str:
    for unit, scale in (("GiB", GB), ("MiB", MB), ("KiB", KB)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def plot(ctx, name: str, draw, *, size=(6.4, 3.2)):
    """Draw with `draw(fig)` into docs/course/img/NAME.png (a palette PNG under 60 KB) and return
    the Markdown that shows it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cute_kernels.bench.plot import save_png

    fig = plt.figure(figsize=size)
    draw(fig)
    fig.tight_layout()
    save_png(fig, ctx.image(name), max_bytes=60_000, dpis=(80, 64, 50))
    return ctx.img_link(name, name.replace("_", " "))
