"""`cute-kernels sass`: listing, the report, JSON, overrides and errors."""

import json

import pytest

pytestmark = pytest.mark.compile


@pytest.fixture(autouse=True)
def scale_variant(monkeypatch, tmp_path):
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    from cute_kernels.runtime import registry
    from cute_kernels.runtime.scale import register_variant_for_tests

    # Listing must not depend on other kernel packages here.
    monkeypatch.setattr(registry, "_LOADED", True)
    register_variant_for_tests()


def run(capsys, *argv):
    from cute_kernels.cli import main

    rc = main(["sass", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_list(capsys):
    rc, out, _ = run(capsys, "--list")
    assert rc == 0
    line = next(line for line in out.splitlines() if line.startswith("runtime.scale:"))
    assert "default, fp16" in line and "LDG" in line and "STL" in line


def test_report(capsys):
    rc, out, _ = run(capsys, "runtime.scale")
    assert rc == 0
    assert "registers/thread:" in out and "threads/block: 128" in out
    assert "occupancy (H100/H200): 16 block(s)/SM, 64 warps/SM" in out
    assert "limited by warps" in out
    assert "spills: 0 B stored, 0 B loaded" in out
    assert "CHECK FAILED" not in out
    histogram = out.split("instructions:")[1]
    assert "LDG" in histogram and "STG" in histogram and "FMUL" in histogram


def test_json_config_and_set(capsys):
    rc, out, _ = run(capsys, "runtime.scale", "--config", "fp16", "--set", "threads=512", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["config"] == {"dtype": "float16", "threads": 512}
    assert data["threads_per_block"] == 512
    assert data["occupancy"]["blocks_per_sm"] == 4 and data["occupancy"]["warps_per_sm"] == 64
    assert data["spill_store_bytes"] == 0 and data["problems"] == []
    assert data["histogram"]["STG"] >= 1


def test_show_sass(capsys):
    rc, out, _ = run(capsys, "runtime.scale", "--show-sass")
    assert rc == 0 and "EXIT" in out and ".text." in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (("no.such.kernel",), "no variant named"),
        (("runtime.scale", "--config", "nope"), "no config"),
        (("runtime.scale", "--set", "not an assignment"), "KEY=VALUE"),
        (("runtime.scale", "--set", "nope=3"), "unknown --set key(s) nope for runtime.scale; its build arguments:"),
        (("runtime.scale", "--arch", "sm_75"), "unsupported --arch sm_75; the CuTe DSL compiles for sm_80,"),
        (("runtime.scale", "--arch", "banana"), "not an arch string like 'sm_90a'"),
        ((), "--list"),
    ],
)
def test_errors(capsys, argv, message):
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
