"""``cute-kernels layout | atom | conflicts``: the layout workbench on the command line.

Pure Python (no torch, no DSL). Text goes to stdout, a large grid as its corner (``--max-cells``);
``--svg FILE``, ``--html FILE`` and ``--latex FILE`` write pictures as well (for ``layout`` and
``conflicts``, ``--html`` is the interactive page: hover a cell for its coordinate, index, bank
and the thread of ``--access`` that reads it; edit the layout in place).

    cute-kernels layout "(4,(2,2)):(2,(1,8))"
    cute-kernels layout "Sw<3,4,3> o 0 o (8,64):(64,1)" --dtype bf16 --svg sw128.svg
    cute-kernels layout "Sw<3,4,3> o 0 o (8,64):(64,1)" --dtype bf16 --access ldmatrix_x4 --html sw128.html
    cute-kernels atom SM80_16x8x16_F32BF16BF16F32_TN
    cute-kernels atom "GMMA::Layout_K_SW128_Atom<bf16>" --html atom.html
    cute-kernels atom --list SM90_64x
    cute-kernels conflicts --smem "Sw<3,4,3> o 0 o (8,64):(64,1)" --dtype bf16 --access ldmatrix_x4
    cute-kernels conflicts --smem "(8,64):(64,1)" --access SM75_U32x4_LDSM_N    # a copy atom, or a TV layout
    cute-kernels conflicts --gmem "(64,64):(64,1)" --dtype bf16 --access vec128
"""

from __future__ import annotations

import argparse
from typing import Any

from .errors import CliError

GRID_CELL_LIMIT = 4096  # larger atoms print their records only, unless --grid


def parse_layout_arg(text: str) -> Any:
    """A layout from the command line: CuTe's notation, a bare shape ``(8,64)`` (the compact
    column-major layout of that shape) or a GMMA smem atom name (see ``layouts.parse.as_layout``)."""
    from cute_kernels.layouts.parse import as_layout

    return as_layout(text)


def _pictures(args: argparse.Namespace, obj: Any, dtype: Any = None, access: Any = None) -> None:
    from cute_kernels.layouts import render

    from .errors import write_file

    cells = getattr(args, "max_cells", None)
    picture_cells = max(cells or 0, render.budget.PICTURE_CELLS)
    if args.svg:
        write_file(args.svg, render.to_svg(obj, dtype, max_cells=picture_cells), "SVG")
    if args.html:
        if args.command == "atom":  # atoms: the text and the SVG
            write_file(args.html, render.html_page(obj, dtype), "HTML")
        else:  # a layout: the interactive page (hover for coordinates, banks, threads; editable)
            from cute_kernels.layouts.html import layout_page

            write_file(args.html, layout_page(obj, dtype, access, max_cells=picture_cells), "HTML page")
    if args.latex:
        write_file(args.latex, render.to_latex(obj, dtype, max_cells=picture_cells), "TikZ")


def _add_picture_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--svg", metavar="FILE", help="also write an SVG picture")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page (for a layout: hover a cell for "
                                                  "its coordinate, index, bank and thread; edit the layout in place)")
    p.add_argument("--latex", metavar="FILE", help="also write a standalone TikZ document")


def cmd_layout(args: argparse.Namespace) -> int:
    from cute_kernels.layouts import render
    from cute_kernels.layouts.analysis import vector_width

    obj = parse_layout_arg(args.layout)
    dtype = args.dtype or getattr(obj, "dtype", None)
    if args.access and dtype is None:
        raise CliError("--access needs --dtype (the banks depend on the element width)")
    print(render.to_text(obj, dtype, max_cells=args.max_cells))
    if dtype is not None:
        print(f"\nsize {obj.size()}, widest vector access: {vector_width(obj, dtype)}")
    if args.access:
        from cute_kernels.layouts.analysis import bank_conflicts

        print(bank_conflicts(obj, args.access, dtype))
    _pictures(args, obj, dtype, args.access)
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
        print(render.to_text(obj, max_cells=max(cells, GRID_CELL_LIMIT)))
    else:
        print(obj)
        print(f"\n(grids omitted: {cells} cells; pass --grid to print them)")
    _pictures(args, obj)
    return 0


def cmd_conflicts(args: argparse.Namespace) -> int:
    from cute_kernels.layouts.analysis import bank_conflicts, coalescing, vector_width

    if bool(args.smem) == bool(args.gmem):
        raise CliError("give exactly one of --smem LAYOUT (bank conflicts) or --gmem LAYOUT (coalescing)")
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
    _pictures(args, layout, dtype, args.access if args.smem else None)
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_parser(subparsers: Any) -> None:
    """Register ``layout``, ``atom`` and ``conflicts`` on the ``cute-kernels`` dispatcher."""
    p = subparsers.add_parser("layout", help="print (and draw) a layout, as CuTe's print_layout")
    p.add_argument("layout", help='a layout in CuTe notation, e.g. "(4,(2,2)):(2,(1,8))" or "Sw<3,4,3> o 0 o (8,64):(64,1)"')
    p.add_argument("--dtype", help="element type (bf16, f16, f32, e4m3...): colour by bank, apply swizzles to byte addresses")
    p.add_argument("--max-cells", dest="max_cells", type=_positive, default=4096, metavar="N",
                   help="print at most N cells of the grid (default 4096: a 64x64 corner of a larger layout)")
    p.add_argument("--access", help="a warp access (as for `conflicts --access`): print its bank conflicts, and on the "
                                    "--html page show which thread reads each cell")
    _add_picture_flags(p)
    p.set_defaults(func=cmd_layout)

    p = subparsers.add_parser("atom", help="show an MMA/copy atom's TV layouts, or a GMMA smem atom")
    p.add_argument("name", nargs="?", help="CuTe's name, e.g. SM80_16x8x16_F32BF16BF16F32_TN or GMMA::Layout_K_SW128_Atom<bf16>")
    p.add_argument("--list", nargs="?", const="", metavar="PREFIX", help="list atom names (starting with PREFIX)")
    p.add_argument("--grid", action="store_true", help="print the TV grids even for large atoms")
    _add_picture_flags(p)
    p.set_defaults(func=cmd_atom)

    p = subparsers.add_parser("conflicts", help="bank conflicts (--smem) or coalescing (--gmem) of a warp access")
    p.add_argument("--smem", metavar="LAYOUT", help="shared-memory tile layout (swizzles act on byte addresses)")
    p.add_argument("--gmem", metavar="LAYOUT", help="global-memory tile layout")
    p.add_argument("--dtype", default="bf16", help="element type (default bf16)")
    p.add_argument(
        "--access",
        default="vec128",
        help="ldmatrix_x1|x2|x4[_trans], stmatrix_x1|x2|x4[_trans], vec32|vec64|vec128, scalar, cp_async, "
             "a copy atom's name (SM75_U32x4_LDSM_N, SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>...) or a TV layout "
             "(thread, value) -> tile index such as '((8,4),8):((1,64),8)' (default vec128)",
    )
    p.add_argument("--swizzle-unit", dest="swizzle_unit", choices=("bytes", "elements"), default="bytes",
                   help="what an outer swizzle permutes: byte addresses (CuTe smem convention, default) or element offsets")
    p.add_argument("--base", type=int, default=0, help="byte offset of the global tile from a 128-byte boundary")
    _add_picture_flags(p)
    p.set_defaults(func=cmd_conflicts)
