"""Compile-ahead on the GPU: a fresh process with an empty compile cache whose workers made a
patched model's predicted calls (`nn.ahead.predict`, what its first layer call submits) computes
exactly what the same process computes without compile-ahead, loading the kernels the workers
compiled instead of compiling them itself. (How the cold step's time changes is the models
suite's `cold_*_ahead` records: there the workers race the model.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, sys, time, torch
import cute_kernels.nn as cnn
from cute_kernels.runtime import cache, compile_ahead

torch.manual_seed(0)
width, hidden = 1024, 2816
layers = []
for _ in range(3):
    layers += [torch.nn.RMSNorm(width), torch.nn.Linear(width, hidden, bias=False), torch.nn.SiLU(),
               torch.nn.Linear(hidden, width, bias=False), torch.nn.LayerNorm(width)]
model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 4000)).cuda().to(torch.bfloat16)
cnn.patch(model)
x = torch.randn(4, 1000, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
if compile_ahead.active():
    # What the first layer call would submit, submitted and waited for here: the counts below
    # then say what the predictions covered, not how fast the workers started.
    from cute_kernels.nn import ahead

    ahead.disarm(model)
    compile_ahead.submit(ahead.predict(model, x))
    compile_ahead.wait(timeout=600)
t0 = time.perf_counter()
out = model(x)
out.float().square().mean().backward()
torch.cuda.synchronize()
seconds = time.perf_counter() - t0
compile_ahead.wait(timeout=600)
grads = [out.float()] + [p.grad.float() for p in model.parameters()] + [x.grad.float()]
torch.save([g.cpu() for g in grads], sys.argv[1])
print(json.dumps({"seconds": seconds, "compiled": cache.stats["compiled"], "loaded": cache.stats["disk_loaded"],
                  "waited": cache.stats["waited"], "ahead": compile_ahead.counts()}))
"""


def _child(tmp_path: Path, name: str, ahead: bool) -> tuple[dict, list]:
    import torch

    env = {**os.environ, "CUTE_KERNELS_CACHE_DIR": str(tmp_path / f"cache_{name}"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    from cute_kernels.runtime import unverified

    env["CUTE_KERNELS_UNVERIFIED"] = ",".join(sorted(unverified.ENABLED - {"compile_ahead"} | (
        {"compile_ahead"} if ahead else set())))
    out = tmp_path / f"{name}.pt"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(out)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    return report, torch.load(out)


def test_a_cold_step_with_compile_ahead_computes_what_it_computes_without(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    plain, expected = _child(tmp_path, "plain", ahead=False)
    ahead, got = _child(tmp_path, "ahead", ahead=True)
    print(f"cold step: {plain['seconds']:.1f} s compiling {plain['compiled']} kernels; with compile-ahead "
          f"{ahead['seconds']:.1f} s ({ahead['compiled']} compiled here, {ahead['loaded']} loaded, "
          f"{ahead['waited']} waited; workers {ahead['ahead']})")
    assert plain["ahead"] == {} and plain["compiled"] > 0
    assert ahead["ahead"]["failed"] == 0 and ahead["ahead"]["compiled"] > 0, ahead
    # the layers' forwards and backwards were predicted: the program loads what the workers compiled
    assert ahead["compiled"] < plain["compiled"] and ahead["loaded"] > 0, (plain, ahead)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):  # the same kernels, whoever compiled them: the same bits
        assert torch.equal(g, e)
