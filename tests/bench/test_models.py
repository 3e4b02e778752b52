"""The models suite's harness on CPU: tiny models (fallback="torch"), records in the schema,
the page and plot drawn from the JSON, the CLI's routing and argument errors."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("transformers")

from cute_kernels.bench import model_specs  # noqa: E402
from cute_kernels.bench.models import DEFAULT_MODES, MODES, ModelsSettings, run_models  # noqa: E402
from cute_kernels.bench.models_report import models_page  # noqa: E402
from cute_kernels.bench.records import BenchResult, validate_result  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::cute_kernels.ops.fallback.FallbackWarning")


def test_every_model_has_default_modes_and_a_tiny_config():
    assert set(DEFAULT_MODES) == set(model_specs.SPECS)
    assert all(set(modes) <= set(MODES) for modes in DEFAULT_MODES.values())
    assert all(spec.tiny and spec.config for spec in model_specs.SPECS.values())


def test_tiny_run_records_in_the_schema_and_the_page_is_drawn_from_them(tmp_path):
    settings = ModelsSettings(models=("llama_gqa_padded",), modes=("train_eager", "generate"), rounds=1, iters=1,
                              warmup=0, prompts=2, prompt_len=5, new_tokens=3, device="cpu", size="tiny",
                              fallback="torch")
    result = run_models(settings, log=lambda line: None)
    data = result.to_dict()
    validate_result(data)
    by = {(r["case"], r["impl"]): r for r in data["records"]}
    assert set(by) == {(f"llama_gqa_padded/{m}", i) for m in ("train_eager", "generate")
                       for i in ("stock", "cute_kernels")}
    ours = by[("llama_gqa_padded/train_eager", "cute_kernels")]
    assert ours["ok"] and ours["kind"] == "ours" and ours["rel_err"] < 1e-5 and ours["ms"] > 0
    assert "rel_err_grad" in ours and ours["ratio_to_best_peer"] > 0
    gen = by[("llama_gqa_padded/generate", "cute_kernels")]
    assert gen["ok"] and gen["token_agreement"] == 1.0 and gen["tokens_per_s"] > 0
    # left-padded prompts are admitted to graph_decode; on CPU its step runs eagerly
    assert gen["decode"] == "graph-eager"
    page = models_page(BenchResult.from_dict(data), "r.json", "r.png")
    assert "| llama_gqa_padded/train_eager |" in page and "r.png" in page and "Geometric mean" in page


def test_generate_records_the_graph_decode_path():
    settings = ModelsSettings(models=("llama_gqa",), modes=("generate",), rounds=1, iters=1, warmup=0, prompts=2,
                              prompt_len=5, new_tokens=4, device="cpu", size="tiny", fallback="torch")
    result = run_models(settings, log=lambda line: None)
    gen = {r.impl: r for r in result.records}["cute_kernels"]
    # on CPU the step runs eagerly on the fixed cache (CUDA graphs need a GPU)
    assert gen.ok and gen.extra["decode"] == "graph-eager" and gen.extra["token_agreement"] == 1.0


def test_fused_mlps_are_checked_gradient_by_gradient():
    """With `fuse_mlps`, ours runs its MLPs on the gated GEMM and every stock gradient, the MLPs'
    gate and up included (split out of the fused one), is compared."""
    from cute_kernels.bench import models

    settings = ModelsSettings(models=("llama_gqa",), modes=("train_eager",), rounds=1, iters=1, warmup=0,
                              device="cpu", size="tiny", fallback="torch", fuse_mlps=True)
    m = models._build("llama_gqa", settings)
    import cute_kernels.nn as cnn

    assert any(isinstance(mod, cnn.GatedMLP) for mod in m.ours.modules())
    result = run_models(settings, log=lambda line: None)
    ours = next(r for r in result.records if r.impl == "cute_kernels")
    assert ours.ok and ours.rel_err < 1e-5, (ours.rel_err, ours.extra)
    stock_grads, our_grads = (models._grads(x) for x in (m.stock, m.ours))
    assert not stock_grads and not our_grads  # no step run on these copies
    loss = models._forward(m.spec, m.ours, m.batch)[0]
    loss.backward()
    names = set(models._grads(m.ours))
    assert {n for n, _ in m.stock.named_parameters()} <= names


def test_cli_routes_bench_models_and_checks_names(capsys):
    from cute_kernels.cli import main

    assert main(["bench", "models", "--list"]) == 0
    assert "llama_gqa" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown model"):
        main(["bench", "models", "--models", "llama_7b"])
    with pytest.raises(SystemExit, match="unknown mode"):
        main(["bench", "models", "--modes", "train_fast"])
    with pytest.raises(SystemExit, match="--batch/--seq go with --config"):
        main(["precompile", "--model", "llama_gqa", "--batch", "2"])


def test_report_merges_an_earlier_run_and_dates_its_rows(tmp_path, monkeypatch):
    from cute_kernels.bench.models_report import main as report_main
    from cute_kernels.bench.records import Record, load_result

    def run(date, cases):
        return BenchResult(date=date, device="NVIDIA H200", versions={"torch": "2.11"}, suite="models",
                           records=[Record(c, impl, "bf16", tflops=0.0, ms=ms, rel_err=1e-3, kind=kind)
                                    for c, (s, o) in cases.items()
                                    for impl, kind, ms in (("stock", "peer", s), ("cute_kernels", "ours", o))])

    old = run("2026-11-01", {"vit_b16/train_eager": (20.0, 25.0), "llama_gqa/train_eager": (40.0, 32.0)}).write(
        tmp_path / "old.json")
    new = run("2026-12-01", {"vit_b16/train_eager": (20.0, 19.0)}).write(tmp_path / "new.json")
    doc = tmp_path / "models.md"
    assert report_main([str(new), "--merge", str(old), "--doc", str(doc), "--no-plot"]) == 0
    merged = load_result(new)
    assert {r.case for r in merged.records} == {"vit_b16/train_eager", "llama_gqa/train_eager"}
    page = doc.read_text()
    vit = next(line for line in page.splitlines() if line.startswith("| vit_b16/train_eager"))
    llama = next(line for line in page.splitlines() if line.startswith("| llama_gqa/train_eager"))
    assert "1.05x" in vit and "measured" not in vit
    assert "1.25x" in llama and "*measured 2026-11-01*" in llama
    assert "earlier run merged in" in page
    with pytest.raises(SystemExit, match="not 'models'|'gemm' result"):
        gemm = run("2026-11-01", {"x": (1.0, 1.0)})
        gemm.suite = "gemm"
        report_main([str(new), "--merge", str(gemm.write(tmp_path / "g.json")), "--doc", str(doc), "--no-plot"])


def test_a_cold_child_reports_what_each_phase_compiled(monkeypatch):
    """The cold-start child (a fresh process in the suite; called in-process here, on CPU, where
    nothing compiles) times the first training step and the first generate and reports, per
    phase, the kernels compiled and loaded and the keys of those compiled."""
    from cute_kernels.bench import models

    out = models._first_step_child("llama_gqa", "cute_kernels", "tiny", "cpu")
    assert out["train_ms"] > 0 and out["generate_ms"] > 0
    assert (out["train_compiled"], out["generate_compiled"], out["train_compiled_keys"]) == (0, 0, [])

    assert out["train_waited"] == 0 and out["train_ahead"] == {}  # no compile-ahead workers ran

    class Counting:  # a cache whose counts move between the phases
        stats = {"compiled": 3, "disk_loaded": 5, "waited": 2}
        compiled_log = ["('a',)", "('b',)", "('c',)"]

    since = {"compiled": 1, "disk_loaded": 5, "waited": 0, "log": 1}
    result = {}
    models._cache_counts(result, "generate", Counting, since)
    assert result == {"generate_compiled": 2, "generate_loaded": 0, "generate_waited": 2,
                      "generate_compiled_keys": ["('b',)", "('c',)"], "generate_ahead": {}}
    assert since == {"compiled": 3, "disk_loaded": 5, "waited": 2, "log": 3}
    assert "compile_ahead" in models._with_compile_ahead()["CUTE_KERNELS_UNVERIFIED"].split(",")


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                    reason="Inductor on CPU needs a C++ compiler")
def test_graph_modes_compile_both_sides_for_cuda_graphs_and_check_them():
    """`train_graphs` compiles each side with mode="reduce-overhead" (on CPU Inductor skips the
    graphs and runs the code) and checks loss, logits and gradients like the compiled mode."""
    settings = ModelsSettings(models=("llama_gqa",), modes=("train_graphs", "infer_graphs"), rounds=1, iters=1,
                              warmup=0, device="cpu", size="tiny", fallback="torch")
    result = run_models(settings, log=lambda line: None)
    by = {(r.case, r.impl): r for r in result.records}
    for mode in ("train_graphs", "infer_graphs"):
        ours = by[(f"llama_gqa/{mode}", "cute_kernels")]
        assert ours.ok and ours.rel_err < 1e-5 and ours.ms > 0, ours
    assert "rel_err_grad" in by[("llama_gqa/train_graphs", "cute_kernels")].extra
