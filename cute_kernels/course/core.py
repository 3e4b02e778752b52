"""The registry of course figures, the generated blocks of the pages, and the render context."""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["Figure", "FIGURES", "figure", "Context", "fill_pages", "md_table", "PLACEHOLDER", "NEEDS",
           "page_blocks", "GPU_COMMAND", "load_figures", "load_gpu_data"]

NEEDS = ("cpu", "compile", "gpu")
GPU_COMMAND = "python3 scripts/course_figures.py --gpu"
BLOCK = re.compile(
    r"(?P<begin><!-- BEGIN GENERATED: course (?P<name>[\w-]+) -->\n)(?P<body>.*?)(?P<end><!-- END GENERATED -->)",
    re.DOTALL,
)
PLACEHOLDER = (
    "!!! note \"Not measured yet\"\n"
    "    This {what} is measured on a Hopper GPU by `{command}`, which stores its numbers in\n"
    "    `docs/course/data/gpu-<device>.json`; `python3 scripts/course_figures.py --cpu --only {name}`\n"
    "    then draws it here. No number is shown until that has run.\n"
)


@dataclass(frozen=True)
class Figure:
    """One generated block: `make(ctx)` returns its Markdown; `measure()` (gpu figures only)
    returns the JSON-able numbers `make` renders, measured on the GPU."""

    name: str
    page: str
    needs: str
    make: Callable[["Context"], str]
    measure: Callable[[], Any] | None = None
    what: str = "table"


FIGURES: dict[str, Figure] = {}


def figure(name: str, page: str, needs: str = "cpu", *, measure: Callable[[], Any] | None = None,
           what: str = "table"):
    """Register the decorated `make(ctx)` as figure `name` of docs/course/`page`."""
    if needs not in NEEDS:
        raise ValueError(f"figure {name!r}: needs must be one of {NEEDS}, got {needs!r}")
    if (needs == "gpu") != (measure is not None):
        raise ValueError(f"figure {name!r}: a gpu figure has a measure(), others none")

    def register(make):
        if name in FIGURES and FIGURES[name].make.__qualname__ != make.__qualname__:
            raise ValueError(f"figure {name!r} is registered twice")
        FIGURES[name] = Figure(name, page, needs, make, measure, what)
        return make

    return register


@dataclass
class Context:
    """What a figure's `make` renders from, and where it writes."""

    root: Path
    gpu: dict = field(default_factory=dict)  # the GPU data file's content ({} when none)
    current: str = ""  # the figure being made

    @property
    def docs(self) -> Path:
        return self.root / "docs"

    @property
    def img_dir(self) -> Path:
        return self.docs / "course" / "img"

    def image(self, name: str, suffix: str = ".png") -> Path:
        self.img_dir.mkdir(parents=True, exist_ok=True)
        return self.img_dir / f"{name}{suffix}"

    def img_link(self, name: str, alt: str, suffix: str = ".png") -> str:
        """The Markdown of image `name` as seen from a page of docs/course/."""
        return f"![{alt}](img/{name}{suffix})"

    def results(self, suite: str):
        """The newest committed result of benchmark `suite` (a BenchResult), or None."""
        from cute_kernels.bench.docs_tables import newest_result
        from cute_kernels.bench.records import load_result

        path = newest_result(self.docs / "results", suite)
        return None if path is None else load_result(path)

    def all_results(self) -> list:
        """Every committed result file's BenchResult, in file-name order (date, then suite)."""
        from cute_kernels.bench.records import load_result

        return [load_result(path) for path in sorted((self.docs / "results").glob("*.json*"))]

    def result_link(self, suite: str) -> str:
        from cute_kernels.bench.docs_tables import newest_result

        path = newest_result(self.docs / "results", suite)
        return f"[{path.name}](../results/{path.name})" if path else "(no result committed)"

    def measured(self, name: str | None = None, *, method: int | None = None):
        """The stored GPU numbers of figure `name` (default: the current one); None when there
        are none, when its measurement failed (`placeholder()` then says why), or when `method`
        is given and the numbers were measured by another one (a probe that changed: its old
        numbers describe a different experiment)."""
        data = (self.gpu.get("figures") or {}).get(name or self.current)
        if isinstance(data, dict) and ("error" in data or (method is not None and data.get("method") != method)):
            return None
        return data

    def gpu_source(self) -> str:
        g = self.gpu
        versions = ", ".join(f"{k} {v}" for k, v in sorted((g.get("versions") or {}).items()) if v)
        return f"Measured by `{GPU_COMMAND}` on {g.get('device')}, {g.get('date')}; {versions}."

    def placeholder(self) -> str:
        fig = FIGURES[self.current]
        data = (self.gpu.get("figures") or {}).get(self.current)
        if isinstance(data, dict) and "error" in data:
            return (f"!!! failure \"The measurement failed\"\n    `{GPU_COMMAND}` on {self.gpu.get('device')}, "
                    f"{self.gpu.get('date')}, stopped with: `{data['error'].splitlines()[0][:300]}`\n")
        return PLACEHOLDER.format(what=fig.what, command=GPU_COMMAND, name=fig.name)


def md_table(headers, rows, align: str | None = None) -> str:
    """A Markdown table; `align` has one letter per column ('l' or 'r', default: numbers right)."""
    rows = [[str(c) for c in r] for r in rows]
    if align is None:
        align = "".join("r" if rows and all(_numeric(r[i]) for r in rows) else "l" for i in range(len(headers)))
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _numeric(cell: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d.,]+(e[-+]?\d+)?\s*[x%×]?|-", cell.strip()))


def page_blocks(text: str) -> list[str]:
    """The names of the course blocks in a page's text, in order."""
    return [m["name"] for m in BLOCK.finditer(text)]


def load_figures() -> dict[str, Figure]:
    """FIGURES, after importing the modules that register them (none of them imports the DSL
    or torch at import time)."""
    import importlib

    for module in ("figures_cpu", "figures_gpu", "figures_gpu_ops", "figures_sass"):
        importlib.import_module(f"{__package__}.{module}")
    return FIGURES


def load_gpu_data(root: Path) -> dict:
    """The newest docs/course/data/gpu-*.json (by its date), or {}."""
    files = sorted((root / "docs" / "course" / "data").glob("gpu-*.json"))
    best: dict = {}
    for f in files:
        d = json.loads(f.read_text())
        if d.get("date", "") >= best.get("date", ""):
            best = d
    return best


def fill_pages(root: Path, names: set[str] | None = None, *, gpu: dict | None = None) -> dict[str, list[str]]:
    """Re-make the blocks `names` (default: all) of every course page in place; returns
    {page: [names made]}. Raises KeyError for a block no figure is registered for."""
    load_figures()
    ctx = Context(root, load_gpu_data(root) if gpu is None else gpu)
    made: dict[str, list[str]] = {}
    for page in sorted((root / "docs" / "course").glob("*.md")):
        text = page.read_text()

        def replace(m: re.Match) -> str:
            name = m["name"]
            if name not in FIGURES:
                raise KeyError(f"{page.name}: no course figure is registered as {name!r}")
            if names is not None and name not in names:
                return m.group(0)
            ctx.current = name
            body = FIGURES[name].make(ctx).rstrip("\n")
            made.setdefault(page.name, []).append(name)
            return f"{m['begin']}\n{body}\n\n{m['end']}"

        new = BLOCK.sub(replace, text)
        if new != text:
            page.write_text(new)
    return made


def today() -> str:
    return _dt.date.today().isoformat()
