"""Regenerate the course's figures and tables.

    python3 scripts/course_figures.py --cpu            # every cpu and compile figure; gpu ones from stored data
    python3 scripts/course_figures.py --cpu --no-compile   # only what needs neither the DSL nor a GPU
    python3 scripts/course_figures.py --gpu [--out DIR]    # measure every gpu figure, store, redraw
    python3 scripts/course_figures.py --cpu --only NAME,NAME   # some blocks (names or needs: cpu, compile, gpu)
    python3 scripts/course_figures.py --list

`--gpu` runs every probe on this GPU (each checked against torch before it is timed) and
writes DIR/gpu-<device>.json (default DIR: docs/course/data); where DIR is that default it then
redraws the gpu blocks of the pages. Bring a file written elsewhere into docs/course/data/ and
run `--cpu --only gpu` to draw from it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from .core import FIGURES, NEEDS, fill_pages, load_figures, load_gpu_data

ROOT = Path(__file__).resolve().parents[2]


def _select(only: str | None, allowed: tuple[str, ...]) -> set[str]:
    load_figures()
    if not only:
        return {n for n, f in FIGURES.items() if f.needs in allowed}
    chosen: set[str] = set()
    for item in only.split(","):
        if item in NEEDS:
            chosen |= {n for n, f in FIGURES.items() if f.needs == item}
        elif item in FIGURES:
            chosen.add(item)
        else:
            raise SystemExit(f"course_figures: no figure or kind named {item!r} (see --list)")
    return chosen


def measure_gpu(names: set[str], out_dir: Path, budget_s: float = 480.0) -> tuple[Path, list[str]]:
    """Run the `measure()` of every gpu figure in `names`; write the data file and return it with
    the figures whose measurement raised (a probe that disagrees with its reference does). No
    figure is started once `budget_s` seconds have passed (those are listed, and a second call
    with `--only` measures them; the file keeps what earlier calls measured)."""
    from cute_kernels.bench.environment import device_name, versions
    from cute_kernels.bench.records import device_slug

    from .core import today

    device = device_name("cuda")
    data = {"date": today(), "device": device, "versions": versions("cuda"), "figures": {}, "seconds": {}}
    path = out_dir / f"gpu-{device_slug(device)}.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    if previous.get("device") == device:  # keep what this run does not re-measure
        data["figures"].update(previous.get("figures", {}))
    start, skipped, failed = time.perf_counter(), [], []
    for name in [n for n in FIGURES if n in names]:  # registration (page) order: the costly ones last
        fig = FIGURES[name]
        if fig.needs != "gpu":
            continue
        if time.perf_counter() - start > budget_s:
            skipped.append(name)
            continue
        t0 = time.perf_counter()
        print(f"measuring {name} ...", flush=True)
        try:
            data["figures"][name] = fig.measure()
        except Exception as err:  # noqa: BLE001 - recorded, shown on the page, and the exit status says so
            traceback.print_exc()
            data["figures"][name] = {"error": f"{type(err).__name__}: {err}"[:600]}
            failed.append(name)
        data["seconds"][name] = round(time.perf_counter() - t0, 1)
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")  # after each: a timeout keeps the rest
    if skipped:
        print(f"budget of {budget_s:g} s spent; not measured: {','.join(skipped)} (run again with --only them)")
    if failed:
        print(f"FAILED (recorded as errors, shown on their pages): {','.join(failed)}")
    return path, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/course_figures.py", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cpu", action="store_true", help="make the cpu and compile figures; draw gpu ones from stored data")
    mode.add_argument("--gpu", action="store_true", help="measure the gpu figures on this GPU, store and draw them")
    mode.add_argument("--list", action="store_true", help="list the figures")
    parser.add_argument("--no-compile", action="store_true", help="with --cpu: skip figures that compile kernels")
    parser.add_argument("--only", help="comma list of figure names or kinds (cpu, compile, gpu)")
    parser.add_argument("--out", type=Path, help="with --gpu: folder for gpu-<device>.json (default docs/course/data)")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="with --gpu: start no figure after this many seconds (default 480)")
    args = parser.parse_args(argv)

    if args.list:
        _select(None, NEEDS)
        for name, f in sorted(FIGURES.items(), key=lambda kv: (kv[1].page, kv[0])):
            print(f"{f.page:<36} {f.needs:<8} {name}")
        return 0
    default_out = ROOT / "docs" / "course" / "data"
    if args.gpu:
        names = _select(args.only, ("gpu",))
        out = (args.out or default_out).resolve()
        path, failed = measure_gpu(names, out, args.budget_s)
        print(f"wrote {path}")
        if out != default_out.resolve():
            return 1 if failed else 0
        draw = {n for n in names if FIGURES[n].needs == "gpu"}
    else:
        draw = _select(args.only, ("cpu", "gpu") if args.no_compile else NEEDS)
        if args.no_compile:
            draw = {n for n in draw if FIGURES[n].needs != "compile"}
    made = fill_pages(ROOT, draw, gpu=load_gpu_data(ROOT))
    for page, names in sorted(made.items()):
        print(f"docs/course/{page}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
