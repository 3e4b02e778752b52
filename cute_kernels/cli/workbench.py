"""``cute-kernels layout | atom | conflicts``: the layout workbench on the command line.

Pure Python (no torch, no DSL). Text goes to stdout; ``--svg FILE``, ``--html FILE`` and
``--latex FILE`` write pictures as well.

    cute-kernels layout "(4,(2,2)):(2,(1,8))"
    cute-kernels layout "Sw<3,4,3> o 0 o (8,64):(64,1)" --dtype bf16 --svg sw128.svg
    cute-kernels atom SM80_16x8x16_F32BF16BF16F32_TN
    cute-kernels atom "GMMA::Layout_K_SW128_Atom<bf16>" --html atom.html
    cute-kernels atom --list SM90_64x
    cute-kernels conflicts --smem "Sw<3,4,3> o 0 o (8,64):(64,1)" --dtype bf16 --access ldmatrix_x4
    cute-kernels conflicts --gmem "(64,64):(64,1)" --dtype bf16 --access vec128
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

GRID_CELL_LIMIT = 4096  # larger atoms print their records only, unless --grid


def parse_layout_arg(text: str) -> Any:
    """A layout from CuTe's printed notation; a bare shape ``(8,64)`` means the compact
    column-major layout of that shape; ``GMMA::Layout_..._Atom<T>`` names a GMMA smem atom."""
    from cute_kernels.layouts.errors import LayoutError
    from cute_kernels.layouts.layout import Layout
    from cute_kernels.layouts.parse import parse_int_tuple, parse_layout

    text = text.strip()
    if "Layout_" in text and "_Atom<" in text:
        from cute_kernels.layouts.smem_atoms import smem_atom

        return smem_atom(text)
    try:
        return parse_layout(text)
    except LayoutError:
        if ":" in text or "Sw" in text:
            raise
        return Layout(parse_int_tuple(text))


def _write(path: str | None, content: str, what: str) -> None:
    if not path:
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(content)
    print(f"wrote {what} to {path}")


def _pictures(args: argparse.Namespace, obj: Any, dtype: Any = None) -> None:
    from cute_kernels.layouts import render

    if args.svg:
        _write(args.svg, render.to_svg(obj, dtype), "SVG")
    if args.html:
        _write(args.html, render.html_page(obj, dtype), "HTML")
    if args.latex:
        _write(args.latex, render.to_latex(obj, dtype), "TikZ")


def _add_picture_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--svg", metavar="FILE", help="also write an SVG picture")
    p.add_argument("--html", metavar="FILE", help="also write an HTML page (text and SVG)")
    p.add_argument("--latex", metavar="FILE", help="also write a standalone TikZ document")


def cmd_layout(args: argparse.Namespace) -> int:
    from cute_kernels.layouts import render
    from cute_kernels.layouts.analysis import vector_width

    obj = parse_layout_arg(args.layout)
    dtype = args.dtype or getattr(obj, "dtype", None)
    print(render.to_text(obj, dtype))
    if dtype is not None:
        print(f"\nsize {obj.size()}, widest vector access: {vector_width(obj, dtype)}")
    _pictures(args, obj, dtype)
    return 0


def cmd_atom(args: argparse.Namespace) -> int:
    from cute_kernels.layouts import render
    from cute_kernels.layouts.atoms import atom, atom_names

    if args.list is not None or not args.name:
        prefix = args.list or args.name or ""
        for n in atom_names():
            if n.startswith(prefix):
                print(n)
        return 0
    if "Layout_" in args.name and "_Atom<" in args.name:
        obj = parse_layout_arg(args.name)
        print(render.to_text(obj))
        _pictures(args, obj)
        return 0
    obj = atom(args.name)
    if obj.kind == "mma":
        m, n, k = obj.shape_mnk
        cells = m * n + m * k + n * k
    else:
        cells = obj.src_layout.cosize()
    if args.grid or cells <= GRID_CELL_LIMIT:
        print(render.to_text(obj))
    else:
        print(obj)
        print(f"\n(grids omitted: {cells} cells; pass --grid to print them)")
    _pictures(args, obj)
    return 0


def cmd_conflicts(args: argparse.Namespace) -> int:
    from cute_kernels.layouts.analysis import bank_conflicts, coalescing, vector_width

    if bool(args.smem) == bool(args.gmem):
        print("conflicts: give exactly one of --smem LAYOUT (bank conflicts) or --gmem LAYOUT (coalescing)", file=sys.stderr)
        return 2
    text = args.smem or args.gmem
    layout = parse_layout_arg(text)
    dtype = args.dtype
    if args.smem:
        print(f"shared-memory tile {layout}")
        print(bank_conflicts(layout, args.access, dtype, swizzle_unit=args.swizzle_unit))
    else:
        print(f"global-memory tile {layout}")
        print(coalescing(layout, dtype, args.access, base=args.base))
    print(f"widest vector access: {vector_width(layout, dtype, swizzle_unit=args.swizzle_unit)}")
    _pictures(args, layout, dtype)
    return 0


def _guard(func):
    """Print a layout error as one line on stderr and exit 2, instead of a traceback."""

    def run(args: argparse.Namespace) -> int:
        from cute_kernels.layouts.errors import LayoutError

        try:
            return func(args)
        except LayoutError as err:
            print(f"cute-kernels {args.command}: {err}", file=sys.stderr)
            return 2

    return run


def add_parser(subparsers: Any) -> None:
    """Register ``layout``, ``atom`` and ``conflicts`` on the ``cute-kernels`` dispatcher."""
    p = subparsers.add_parser("layout", help="print (and draw) a layout, as CuTe's print_layout")
    p.add_argument("layout", help='a layout in CuTe notation, e.g. "(4,(2,2)):(2,(1,8))" or "Sw<3,4,3> o 0 o (8,64):(64,1)"')
    p.add_argument("--dtype", help="element type (bf16, f16, f32, e4m3...): colour by bank, apply swizzles to byte addresses")
    _add_picture_flags(p)
    p.set_defaults(func=_guard(cmd_layout))

    p = subparsers.add_parser("atom", help="show an MMA/copy atom's TV layouts, or a GMMA smem atom")
    p.add_argument("name", nargs="?", help="CuTe's name, e.g. SM80_16x8x16_F32BF16BF16F32_TN or GMMA::Layout_K_SW128_Atom<bf16>")
    p.add_argument("--list", nargs="?", const="", metavar="PREFIX", help="list atom names (starting with PREFIX)")
    p.add_argument("--grid", action="store_true", help="print the TV grids even for large atoms")
    _add_picture_flags(p)
    p.set_defaults(func=_guard(cmd_atom))

    p = subparsers.add_parser("conflicts", help="bank conflicts (--smem) or coalescing (--gmem) of a warp access")
    p.add_argument("--smem", metavar="LAYOUT", help="shared-memory tile layout (swizzles act on byte addresses)")
    p.add_argument("--gmem", metavar="LAYOUT", help="global-memory tile layout")
    p.add_argument("--dtype", default="bf16", help="element type (default bf16)")
    p.add_argument(
        "--access",
        default="vec128",
        help="ldmatrix_x1|x2|x4[_trans], stmatrix_x1|x2|x4[_trans], vec32|vec64|vec128, scalar, cp_async (default vec128)",
    )
    p.add_argument("--swizzle-unit", dest="swizzle_unit", choices=("bytes", "elements"), default="bytes",
                   help="what an outer swizzle permutes: byte addresses (CuTe smem convention, default) or element offsets")
    p.add_argument("--base", type=int, default=0, help="byte offset of the global tile from a 128-byte boundary")
    _add_picture_flags(p)
    p.set_defaults(func=_guard(cmd_conflicts))
