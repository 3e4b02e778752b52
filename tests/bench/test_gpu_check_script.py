"""scripts/gpu_check.sh: argument handling, the step summary and the packed results (on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_syntax_and_usage():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    bad = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert bad.returncode == 2 and "OUTDIR" in bad.stderr
    bad = subprocess.run(["bash", str(SCRIPT), "/tmp/x", "--frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown option --frobnicate" in bad.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="uses GNU timeout and tar")
def test_cpu_run_logs_a_summary_and_packs_results(tmp_path):
    env = dict(os.environ, BENCH_ARGS="--device cpu --cases 1MiB --rounds 2 --impl torch_copy")
    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "--tar", "--skip", "tests,sanitize",
                          "--suites", "copy"], env=env, capture_output=True, text=True, timeout=240)
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert run.returncode == 0, log
    assert "=== summary" in log and "bench copy" in log and "gpu_check: all steps passed" in log
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu_check.log", "results.tar.gz"]
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        names = sorted(Path(n).name for n in tar.getnames() if n not in (".", "./"))
        assert len(names) == 2 and names[0].endswith("-copy-cpu.json") and names[1].endswith("-copy-cpu.png")
        data = json.load(tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith(".json"))))
    assert data["suite"] == "copy" and data["records"][0]["impl"] == "torch_copy" and data["records"][0]["rel_err"] == 0.0
