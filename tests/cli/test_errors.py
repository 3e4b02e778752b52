"""Every subcommand fails with one line on stderr and a non-zero exit: bad input, unwritable files,
unknown names, and a base install without the optional extras (simulated in a subprocess whose
import system cannot see torch, the CuTe DSL, cuda-python, triton or matplotlib)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cute_kernels.cli import main
from cute_kernels.cli.errors import CliError, missing_extra, run_guarded

# Hide the optional packages from every finder, as in an environment where they were never installed.
BASE_INSTALL = """
import sys
BLOCKED = {'torch', 'cutlass', 'cuda', 'triton', 'tvm_ffi', 'numpy', 'matplotlib', 'quack', 'flash_attn'}
class _Hide:
    def __init__(self, finder): self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            return None
        find = getattr(self.finder, 'find_spec', None)
        return find(name, path, target) if find else None
    def __getattr__(self, attr): return getattr(self.finder, attr)
sys.meta_path[:] = [_Hide(f) for f in sys.meta_path]
from cute_kernels.cli import main
sys.exit(main(sys.argv[1:]))
"""


def base_install(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BASE_INSTALL, *argv], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv, needs", [
    (("sass", "--list"), "the CuTe DSL (nvidia-cutlass-dsl)"),
    (("sass", "gemm.naive"), "the CuTe DSL (nvidia-cutlass-dsl)"),
    (("bench", "gemm", "--device", "cpu", "--cases", "16x16x16"), "PyTorch"),
    (("demo", "--kernel", "naive"), "PyTorch and the CuTe DSL"),
])
def test_base_install_names_the_extra(argv, needs):
    r = base_install(*argv)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert needs in r.stderr and "pip install 'cute-kernels[gpu]'" in r.stderr


def test_base_install_demo_tours_the_layouts_and_names_the_extra():
    r = base_install("demo")
    assert r.returncode == 0, r.stderr
    assert "(4,(2,2)):(2,(1,8))" in r.stdout and "8-way bank conflict" in r.stdout
    assert r.stderr.strip() == ("cute-kernels demo: the SASS and GEMM parts need PyTorch and the CuTe DSL, not "
                                "installed here; install them with: pip install 'cute-kernels[gpu]'")


def test_base_install_layout_commands_work():
    r = base_install("conflicts", "--smem", "(8,64):(64,1)", "--access", "SM75_U32x4_LDSM_N")
    assert r.returncode == 0 and "8-way bank conflict" in r.stdout, r.stderr


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_unwritable_output_is_one_line(capsys, tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "x.svg"
    rc, _, err = run(capsys, "layout", "(4,4):(4,1)", "--svg", str(target))
    assert rc == 2 and err == f"cute-kernels layout: cannot write the SVG to {target}: No such file or directory\n"


def test_huge_layouts_print_bounded(capsys):
    rc, out, _ = run(capsys, "layout", "(100000,100000):(1,100000)")
    assert rc == 0 and len(out) < 200_000 and "showing rows 0-63 and columns 0-63" in out
    rc, out, _ = run(capsys, "layout", "(4096,4096):(1,4096)", "--dtype", "bf16")
    assert rc == 0 and len(out) < 200_000 and out.rstrip().endswith("widest vector access: 128-bit vectors (8 elements)")
    rc, out, _ = run(capsys, "layout", "(16,16):(16,1)", "--max-cells", "16")
    assert "showing rows 0-3 and columns 0-3" in out
    rc, _, err = run(capsys, "conflicts", "--smem", "(4096,4096):(4096,1)", "--access", "ldmatrix_x4")
    assert rc == 2 and "more than the budget of 1048576" in err and err.count("\n") == 1


def test_conflicts_takes_copy_atoms_and_tv_layouts(capsys):
    rc, out, _ = run(capsys, "conflicts", "--smem", "Sw<3,4,3> o 0 o (8,64):(64,1)", "--access", "SM75_U32x4_LDSM_N")
    assert rc == 0 and "ldmatrix_x4 on bf16" in out and "conflict-free" in out
    rc, out, _ = run(capsys, "conflicts", "--smem", "(8,64):(64,1)", "--access", "((8,4),8):((1,64),8)")
    assert rc == 0 and "tv ((8,4),8):((1,64),8) on bf16" in out and "8-way" in out
    rc, _, err = run(capsys, "conflicts", "--smem", "(8,64):(64,1)", "--access", "nope")
    assert rc == 2 and err.startswith("cute-kernels conflicts: unknown access 'nope'; use ldmatrix_x1") and "TV layout" in err


def test_demo_rejects_an_unknown_kernel_before_running(capsys):
    pytest.importorskip("torch")
    rc, out, err = run(capsys, "demo", "--kernel", "nope")
    assert rc == 2 and out == ""
    assert err.startswith("cute-kernels demo: unknown GEMM kernel 'nope'; the rungs are: naive, simt_smem")


def test_run_guarded_maps_errors():
    def fails(exc):
        def f(args):
            raise exc
        return f

    assert run_guarded("x", fails(CliError("bad", code=5)), None) == 5
    assert run_guarded("x", fails(FileNotFoundError(2, "No such file or directory", "nvdisasm")), None) == 2
    with pytest.raises(ImportError):  # a missing module that is no optional extra is a bug: re-raised
        run_guarded("x", fails(ModuleNotFoundError("No module named 'cute_kernels.nope'", name="cute_kernels.nope")), None)
    wrapped = ImportError("importing kernel module cute_kernels.gemm.naive failed")
    wrapped.__cause__ = ModuleNotFoundError("No module named 'cutlass'", name="cutlass")
    assert missing_extra(wrapped, "sass").endswith("pip install 'cute-kernels[gpu]'")
    with pytest.raises(ValueError):  # anything else keeps its traceback
        run_guarded("x", fails(ValueError("a bug")), None)
