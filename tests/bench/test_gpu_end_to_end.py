"""On the device: a tiny suite end to end through the real timer, peers and file outputs."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytestmark = pytest.mark.gpu


def test_tiny_gemm_suite_end_to_end(tmp_path):
    from cute_kernels.cli import main

    rc = main(["bench", "gemm", "--cases", "512x384x256", "--impl", "ours,cublas", "--rounds", "2",
               "--warmup-ms", "2", "--rep-ms", "5", "--no-ceilings", "--out-dir", str(tmp_path)])
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[0].endswith(".json")
    if importlib.util.find_spec("matplotlib") is not None:  # else the plot is drawn later, off the device
        assert files == [files[0], files[0][:-5] + ".png"]
    assert "-gemm-" in files[0]
    data = json.loads((tmp_path / files[0]).read_text())
    recs = {r["impl"]: r for r in data["records"]}
    assert recs["cublas"]["ok"] and recs["cublas"]["rel_err"] < 1e-2 and recs["cublas"]["tflops"] > 0.1
    ours = [r for r in data["records"] if r["kind"] == "ours"]
    assert rc == (1 if any(not r["ok"] for r in ours) else 0)


def test_tiny_attention_and_copy_suites():
    from cute_kernels.bench.runner import RunSettings, run_suite
    from cute_kernels.bench.suites import SUITES, select_impls
    from cute_kernels.bench.timing import make_gpu_timer

    timer = make_gpu_timer(2.0, 5.0)
    # The JIT-compiled peers (quack, fa4) are exercised by the bench steps of gpu_check.sh.
    for name, cases, impls in (("attention", "B1_H4_S256_D64_causal", "ours,sdpa_flash,sdpa_cudnn"),
                               ("copy", "8MiB", "all")):
        suite = SUITES[name]
        result = run_suite(name, suite.parse_cases(cases), select_impls(suite.impls(), impls, suite.default),
                           timer=timer, settings=RunSettings(rounds=2), ceilings={"hbm_gbps": 4000.0},
                           log=lambda s: None)
        peers = [r for r in result.records if r.kind == "peer"]
        assert peers and all(r.ok and r.ms > 0 for r in peers), [r.to_dict() for r in result.records]
        if name == "copy":
            assert all(r.rel_err == 0.0 for r in result.records if r.ok)


def test_overhead_on_device():
    import torch

    from cute_kernels.bench.overhead import cuda_busy_probe, make_host_timer, overhead_impls, run_overhead

    timer = make_host_timer(calls=50, warmup=5, busy=cuda_busy_probe(), sync=torch.cuda.synchronize)
    impls = {case: {n: i for n, i in by_name.items() if n not in ("quack", "fa4")}  # JIT peers: in gpu_check
             for case, by_name in overhead_impls().items()}
    records, _ = run_overhead(impls, timer=timer, rounds=2, log=lambda s: None)
    cublas = [r for r in records if r.impl == "cublas"][0]
    assert cublas.ok and 0.0005 < cublas.ms < 1.0  # between 0.5 us and 1 ms of host time per call


def test_sanitize_entry_runs_every_registered_kernel():
    from cute_kernels.bench.sanitize import kernel_names, main

    assert main(["--list"]) == 0
    names = kernel_names()
    if not names:
        pytest.skip("no kernels registered")
    assert main(names) == 0  # every registered kernel ran its small case correctly
