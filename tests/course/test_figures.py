"""The course's figures: cpu ones are regenerated and compared with the committed pages, gpu ones
render a placeholder (and no number) without measurements and a table from measurements."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cute_kernels.course.core import BLOCK, Context, fill_pages, load_figures, load_gpu_data

FIGURES = load_figures()

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path):
    """A copy of docs/ to regenerate into."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def _blocks(path: Path) -> dict[str, str]:
    return {m["name"]: m["body"] for m in BLOCK.finditer(path.read_text())}


def test_cpu_figures_match_the_committed_pages(tree):
    """What `scripts/course_figures.py --cpu --no-compile` makes is what is committed (figures
    drawn from docs/results/ only need to render: a new result file changes them)."""
    names = {n for n, f in FIGURES.items() if f.needs == "cpu"}
    fill_pages(tree, names)
    reads_results = _figures_reading_results(tree, names)
    for page in sorted((ROOT / "docs" / "course").glob("*.md")):
        committed, made = _blocks(page), _blocks(tree / "docs" / "course" / page.name)
        for name in names & set(committed):
            if name in reads_results:
                assert made[name].strip(), f"{name} rendered nothing"
            else:
                assert made[name] == committed[name], (
                    f"{page.name}: block {name!r} differs from what the code makes; run "
                    "`python3 scripts/course_figures.py --cpu --no-compile`")


def _figures_reading_results(tree, names) -> set[str]:
    read = set()
    for name in names:
        ctx = Context(tree, current=name)
        calls = []
        original, every = ctx.results, ctx.all_results
        ctx.results = lambda suite, _o=original, _c=calls: (_c.append(suite), _o(suite))[1]
        ctx.all_results = lambda _o=every, _c=calls: (_c.append("*"), _o())[1]
        FIGURES[name].make(ctx)
        if calls:
            read.add(name)
    return read


def test_gpu_figures_without_measurements_say_so_and_show_no_number(tree):
    ctx = Context(tree, gpu={})
    for name, fig in FIGURES.items():
        if fig.needs != "gpu":
            continue
        ctx.current = name
        text = fig.make(ctx)
        assert "Not measured yet" in text and "--gpu" in text and f"--only {name}" in text
        assert "|" not in text and "![" not in text


# Measurements shaped like each measure()'s result (made-up numbers, used only in this test, to
# exercise the drawing code; nothing of it is written outside tmp_path).
_FAKE = {
    "vector_add_speed": {"n": 1 << 26, "bytes": 3 * 4 << 26, "ms": {"VectorAdd vec=1": 0.2, "torch.add": 0.19}},
    "latency_levels": {"global": [{"bytes": 16 << 10, "cycles": 40.0}, {"bytes": 1 << 30, "cycles": 900.0}],
                       "shared_cycles": 30.0, "clock_mhz": 1900.0, "steps": 4096},
    "bandwidth_levels": {"sms": 132, "levels": [{"level": "HBM", "working_set": 1 << 30, "ms": 0.3, "bytes": 1 << 30}]},
    "strided_reads": {"elements": 1 << 22, "rows": [{"stride": 1, "ms": 0.01}, {"stride": 8, "ms": 0.05}]},
    "vector_widths": {"bytes": 1 << 29, "rows": [{"vector_bytes": 4, "ms": 0.2}, {"vector_bytes": 16, "ms": 0.13}]},
    "transpose_layouts": {"n": 8192, "ms": {"row_major": 0.3, "padded": 0.15, "swizzled": 0.15, "torch": 0.2}},
    "divergence": {"method": 2, "blocks": 1056, "iters": 4096, "chains": 8,
                   "rows": [{"group": 1, "ms": 2.0}, {"group": 32, "ms": 1.0}]},
    "occupancy_sweep": {"memory": [{"blocks_per_sm": 1, "gbps": 900.0}, {"blocks_per_sm": 8, "gbps": 3900.0}],
                        "fma": [{"chains": 1, "blocks_per_sm": 1, "tflops": 3.0},
                                {"chains": 8, "blocks_per_sm": 1, "tflops": 20.0}]},
    "reductions": {"n": 1 << 25, "blocks": 1056, "ms": {"atomic_each": 20.0, "shuffle": 0.05}},
    "dq_atomics": {"shape": [2, 16, 2048, 128], "ms": {"fp32 atomics": 1.0, "deterministic": 1.3},
                   "dq_bitwise_repeatable": False},
    "ilp_throughput": {"rows": [{"chains": 1, "warps_per_sm": 16, "tflops": 5.0},
                                {"chains": 8, "warps_per_sm": 16, "tflops": 40.0}], "spilled_64": 10.0},
    "stream_overlap": {"gemm": 2.0, "h2d_copy": 5.0, "serial": 7.0, "overlapped": 5.1},
    "timing_methods": {"method": 3, "ms": {"wall clock, no synchronize": 0.01},
                       "ncu": {"available": False, "reason": "absent"}},
    "pipeline_stages": {"shape": [8192, 8192, 8192], "tile": [128, 256, 64],
                        "rows": [{"stages": 1, "error": "stages must be at least 2"},
                                 {"stages": 4, "resolved": 4, "tflops": 650.0}]},
    "memory_bound_ops": {"shape": [16384, 4096], "bytes": 2 * 16384 * 4096 * 2, "ms": {"copy": 0.07}},
    "autotune_cost": {"shape": [4096, 4096, 4096], "candidates": 84, "trials": 3, "timed": 3, "seconds": 44.0,
                      "heuristic_ms": 0.2, "winner_ms": 0.19, "dropped": []},
    "graph_replay": {"calls": 100, "rows": [{"size": 256, "eager_us": 15.0, "graph_us": 4.0}]},
}


def test_every_gpu_figure_renders_from_measurements(tree):
    gpu_names = {n for n, f in FIGURES.items() if f.needs == "gpu"}
    assert gpu_names == set(_FAKE), "keep _FAKE in step with the gpu figures"
    data = {"date": "2026-12-01", "device": "NVIDIA H200", "versions": {"torch": "2.11"}, "figures": _FAKE}
    (tree / "docs" / "course" / "data").mkdir(parents=True, exist_ok=True)
    (tree / "docs" / "course" / "data" / "gpu-h200.json").write_text(json.dumps(data))
    assert load_gpu_data(tree)["device"] == "NVIDIA H200"
    made = fill_pages(tree, gpu_names)
    assert sorted(n for names in made.values() for n in names) == sorted(gpu_names)
    for page in (tree / "docs" / "course").glob("*.md"):
        for name, body in _blocks(page).items():
            if name in gpu_names:
                assert "Not measured yet" not in body and "NVIDIA H200, 2026-12-01" in body, name


def test_a_block_without_a_registered_figure_is_an_error(tree):
    page = tree / "docs" / "course" / "99-extra.md"
    page.write_text("<!-- BEGIN GENERATED: course nothing_like_it -->\n<!-- END GENERATED -->\n")
    with pytest.raises(KeyError, match="nothing_like_it"):
        fill_pages(tree, set())


@pytest.mark.compile
def test_probe_sass_figures_match_the_committed_pages(tree):
    """The `compile` figures of the probes (cheap: the compile tier builds these variants anyway)
    are what the committed pages show, for this DSL version."""
    names = {"vector_add_sass", "reduction_sass", "ilp_sass"}
    fill_pages(tree, names)
    for page in ("02-programming-model.md", "06-shared-memory-sync.md", "07-registers-ilp.md"):
        committed, made = _blocks(ROOT / "docs" / "course" / page), _blocks(tree / "docs" / "course" / page)
        for name in names & set(committed):
            assert made[name] == committed[name], f"{page}: {name} is stale; run scripts/course_figures.py --cpu"


def test_a_failed_measurement_is_shown_as_a_failure_not_as_numbers(tree):
    gpu = {"date": "2026-12-01", "device": "NVIDIA H200", "figures": {"divergence": {"error": "AssertionError: off"}}}
    ctx = Context(tree, gpu=gpu, current="divergence")
    text = FIGURES["divergence"].make(ctx)
    assert "The measurement failed" in text and "AssertionError: off" in text and "|" not in text


def test_data_of_an_earlier_probe_method_is_not_drawn(tree):
    """A figure whose probe changed ignores data measured the old way (it shows the placeholder)."""
    for name, old in (("divergence", {k: v for k, v in _FAKE["divergence"].items() if k != "method"}),
                      ("timing_methods", {**_FAKE["timing_methods"], "method": 2})):
        gpu = {"date": "2026-12-01", "device": "NVIDIA H200", "figures": {name: old}}
        assert "Not measured yet" in FIGURES[name].make(Context(tree, gpu=gpu, current=name))
        gpu["figures"][name] = _FAKE[name]
        assert "Not measured yet" not in FIGURES[name].make(Context(tree, gpu=gpu, current=name))
