"""records: the result JSON schema (write, read back, validate) and the file naming."""

from __future__ import annotations

import json
import math

import pytest

from cute_kernels.bench.records import (BenchResult, Record, device_slug, load_result, merge_results, result_stem,
                                        validate_result)


def _result(records=None) -> BenchResult:
    if records is None:
        records = [
            Record("4096x4096x4096", "cublas", "bf16", tflops=700.5, ms=0.196, rel_err=2.1e-3, spread=0.012,
                   gbps=300.0, pct_ceiling=93.2, ratio_to_best_peer=1.0),
            Record("4096x4096x4096", "sm90_persistent", "bf16", tflops=None, ms=None, rel_err=0.7, ok=False,
                   kind="ours", error="rel_err 0.7 above tolerance 0.01"),
            Record("4096x4096x4096", "naive", "bf16", tflops=None, ms=None, rel_err=float("nan"), ok=False,
                   kind="ours", error="output holds NaN", extra={"note": "poisoned"}),
        ]
    return BenchResult(date="2026-11-30", device="NVIDIA H200", versions={"torch": "2.11"}, suite="gemm",
                       records=records, ceilings={"bf16": 752.0, "hbm_gbps": 4310.0})


def test_write_read_back_round_trips(tmp_path):
    path = _result().write(tmp_path / "r.json")
    text = path.read_text()
    def reject(token):
        raise AssertionError(f"non-strict JSON token {token}")

    data = json.loads(text, parse_constant=reject)  # strict JSON: no NaN/Infinity
    assert set(data) >= {"date", "device", "versions", "suite", "records"}
    lines = text.splitlines()
    start = lines.index(' "records": [')
    assert [json.loads(line.rstrip(",")) for line in lines[start + 1:start + 4]] == data["records"]  # one a line
    assert lines[start + 4:] == [" ]", "}"]
    assert data["device_slug"] == "h200"
    back = load_result(path)
    assert back.suite == "gemm" and back.device == "NVIDIA H200" and back.ceilings["bf16"] == 752.0
    assert [r.key for r in back.records] == [r.key for r in _result().records]
    first = back.records[0]
    assert (first.tflops, first.ms, first.rel_err, first.spread) == (700.5, 0.196, 2.1e-3, 0.012)
    assert first.timed and not back.records[1].timed
    assert back.records[1].rel_err == 0.7 and back.records[1].kind == "ours"
    # NaN is written as null, extras survive in `extra`
    assert back.records[2].rel_err is None and back.records[2].extra == {"note": "poisoned"}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("suite"), "lacks keys"),
        (lambda d: d.__setitem__("date", "30/11/2026"), "YYYY-MM-DD"),
        (lambda d: d["records"][0].pop("rel_err"), "lacks keys"),
        (lambda d: d["records"][0].__setitem__("ms", -1.0), "positive"),
        (lambda d: d["records"][0].__setitem__("tflops", None), "tflops"),
        (lambda d: d["records"][0].__setitem__("ms", float("inf")), "finite"),
        (lambda d: d["records"][0].__setitem__("kind", "theirs"), "kind"),
        (lambda d: d["records"].append(dict(d["records"][0])), "duplicate"),
        (lambda d: d.__setitem__("versions", "2.11"), "versions"),
    ],
)
def test_validate_rejects_with_a_named_problem(mutate, message):
    data = _result().to_dict()
    validate_result(data)
    mutate(data)
    with pytest.raises(ValueError, match=message):
        validate_result(data)


def test_load_names_the_file_on_bad_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load_result(bad)


@pytest.mark.parametrize(
    "name, slug",
    [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("cpu", "cpu"), ("NVIDIA GeForce RTX 4090", "4090")],
)
def test_device_slug(name, slug):
    assert device_slug(name) == slug


def test_result_stem_follows_docs_results_naming():
    assert result_stem("2026-11-30", "attention", "NVIDIA H200") == "2026-11-30-attention-h200"


def test_record_to_dict_keeps_required_nulls():
    d = Record("c", "i", "bf16", tflops=None, ms=None, rel_err=math.nan, ok=False).to_dict()
    assert d["tflops"] is None and d["ms"] is None and d["rel_err"] is None and d["ok"] is False


def _models_run(date, cases, device="NVIDIA H200", suite="models"):
    records = [Record(c, impl, "bf16", tflops=0.0, ms=ms, rel_err=1e-3, kind=kind)
               for c, (stock_ms, ours_ms) in cases.items()
               for impl, kind, ms in (("stock", "peer", stock_ms), ("cute_kernels", "ours", ours_ms))]
    return BenchResult(date=date, device=device, versions={"torch": date}, suite=suite, records=records,
                       timestamp=f"{date}T00:00:00Z")


def test_merge_keeps_the_cases_a_partial_rerun_left_out_whole():
    older = _models_run("2026-11-01", {"vit/train": (20.0, 24.0), "llama/train": (40.0, 35.0)})
    newer = _models_run("2026-12-01", {"vit/train": (21.0, 22.0)})
    merged = merge_results(newer, older)
    by = {(r.case, r.impl): r for r in merged.records}
    assert set(by) == {(c, i) for c in ("vit/train", "llama/train") for i in ("stock", "cute_kernels")}
    # the re-run case is the new run's, both sides; the other comes whole from the old run, dated
    assert by["vit/train", "stock"].ms == 21.0 and by["vit/train", "cute_kernels"].ms == 22.0
    assert "measured" not in by["vit/train", "cute_kernels"].extra
    assert by["llama/train", "stock"].ms == 40.0 and by["llama/train", "cute_kernels"].ms == 35.0
    assert {by["llama/train", i].extra["measured"] for i in ("stock", "cute_kernels")} == {"2026-11-01T00:00:00Z"}
    assert merged.date == "2026-12-01" and merged.versions == {"torch": "2026-12-01"}
    assert merged.settings["merged"] == [{"date": "2026-11-01", "timestamp": "2026-11-01T00:00:00Z",
                                          "versions": {"torch": "2026-11-01"}, "cases": 1}]
    validate_result(merged.to_dict())
    # merging once more keeps the first date of a carried record
    again = merge_results(_models_run("2026-12-02", {"vit/train": (21.0, 21.5)}), merged)
    assert {r.extra.get("measured") for r in again.records if r.case == "llama/train"} == {"2026-11-01T00:00:00Z"}
    assert {r.extra.get("measured") for r in again.records if r.case == "vit/train"} == {None}


def test_merge_refuses_another_suite_or_device():
    newer = _models_run("2026-12-01", {"a": (1.0, 1.0)})
    with pytest.raises(ValueError, match="'gemm' result into a 'models'"):
        merge_results(newer, _models_run("2026-11-01", {"b": (1.0, 1.0)}, suite="gemm"))
    with pytest.raises(ValueError, match="H100"):
        merge_results(newer, _models_run("2026-11-01", {"b": (1.0, 1.0)}, device="NVIDIA H100 80GB HBM3"))


def test_a_large_result_is_stored_compressed_and_read_back(tmp_path):
    from cute_kernels.bench.docs_tables import newest_result
    from cute_kernels.bench.records import dumps_result, plot_path, result_path

    small = _result()
    assert result_path(tmp_path, small).name == "2026-11-30-gemm-h200.json"
    many = [Record(f"{m}x4096x4096", impl, "bf16", tflops=600.0 + m, ms=0.2, rel_err=1e-3, ratio_to_best_peer=1.0)
            for m in range(1, 200) for impl in ("auto", "cublas")]
    big = _result(many)
    path = result_path(tmp_path, big)
    assert path.name == "2026-11-30-gemm-h200.json.gz"
    big.write(path)
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and 3 * len(raw) < len(dumps_result(big.to_dict()))  # gzip, threefold
    assert big.write(tmp_path / "again.json.gz").read_bytes() == raw  # the same result, the same bytes
    back = load_result(path)
    assert [(r.case, r.impl, r.tflops) for r in back.records] == [(r.case, r.impl, r.tflops) for r in many]
    assert plot_path(path).name == "2026-11-30-gemm-h200.png"
    assert plot_path(tmp_path / "x.json").name == "x.png"
    small.write(tmp_path / "2026-11-29-gemm-h200.json")
    assert newest_result(tmp_path, "gemm") == path  # the compressed file counts as the suite's newest


def test_a_result_growing_past_the_threshold_leaves_one_file(tmp_path):
    """A run writes its result after every case: when it grows past GZIP_ABOVE its file becomes
    .json.gz, and the .json written before goes (and the other way round)."""
    from cute_kernels.bench.records import result_path

    small = _result()
    first = small.write(result_path(tmp_path, small))
    many = [Record(f"{m}x64x64", "auto", "bf16", tflops=1.0, ms=0.2, rel_err=1e-3) for m in range(1, 400)]
    big = _result(many)
    second = big.write(result_path(tmp_path, big))
    assert first.name + ".gz" == second.name
    assert sorted(p.name for p in tmp_path.iterdir()) == [second.name]
    small.write(first)
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]
    (tmp_path / "notes.gz").write_bytes(b"")
    small.write(tmp_path / "notes")  # not a results file name: its neighbour stays
    assert (tmp_path / "notes.gz").exists()

