"""Cross-check against CuTe's C++ headers (from nvidia-cutlass), compiled for the host with g++.

The ``<op>_beyond`` cases, where the right operand reaches past the left operand, are written out
as static CuTe layouts (``Int<N>{}``), composed and divided by ``cute::composition`` and
``cute::logical_divide`` in one program, and the printed results parsed back. It shows that the
default ``semantics="dsl"`` is also CuTe C++'s rule (``detail::coalesce_x``), which is why
``semantics="cpp"`` names the same rule. Skips where g++, the CuTe headers or the CUDA headers
they include are missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from cute_kernels import layouts as L
from cute_kernels.layouts.int_tuple import is_tuple

from ._cases import cases

pytestmark = pytest.mark.compile

N_COMPOSITION, N_DIVIDE = 48, 32


def _include_dirs() -> list[str] | None:
    cute = Path(sysconfig.get_paths()["purelib"]) / "cutlass_library" / "source" / "include"
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]
    cuda = next((r for r in roots if r and Path(r, "include", "cuda_runtime_api.h").exists()), None)
    if not (cute / "cute" / "layout.hpp").exists() or cuda is None:
        return None
    dirs = [str(cute), f"{cuda}/include"]
    if Path(cuda, "include", "cccl", "cuda", "std", "utility").exists():
        dirs.append(f"{cuda}/include/cccl")
    return dirs


def _cpp_tuple(t, kind: str) -> str:
    if is_tuple(t):
        return f"make_{kind}(" + ", ".join(_cpp_tuple(x, kind) for x in t) + ")"
    return f"Int<{t}>{{}}"


def _cpp(layout: L.Layout) -> str:
    return f"make_layout({_cpp_tuple(layout.shape, 'shape')}, {_cpp_tuple(layout.stride, 'stride')})"


@pytest.fixture(scope="module")
def cpp_results(tmp_path_factory):
    gxx, includes = shutil.which("g++"), _include_dirs()
    if gxx is None or includes is None:
        pytest.skip("needs g++ and CuTe's C++ headers with the CUDA headers they include")
    calls = [("composition", a, b) for a, b in cases("composition_beyond", N_COMPOSITION, ours=L.composition)]
    calls += [("logical_divide", a, t) for a, t in cases("logical_divide_beyond", N_DIVIDE, ours=L.logical_divide)]
    # CuTe refuses inadmissible cases at compile time: only what we compute is sent.
    admissible = []
    for op, a, b in calls:
        try:
            admissible.append((op, a, b, getattr(L, op)(a, b)))
        except L.LayoutError:
            continue
    pins = [("left_inverse", L.Layout((3, 1), (0, 5)))]
    lines = ["#include <cute/layout.hpp>", "using namespace cute;", "int main() {"]
    lines += [f'  print({op}({_cpp(a)}, {_cpp(b)})); print("\\n");' for op, a, b, _ in admissible]
    lines += [f'  print({op}({_cpp(a)})); print("\\n");' for op, a in pins]
    lines.append("}")
    work = tmp_path_factory.mktemp("cute_cpp")
    (work / "check.cpp").write_text("\n".join(lines))
    cmd = [gxx, "-std=c++17", "-O0", *(f"-I{d}" for d in includes), "check.cpp", "-o", "check"]
    built = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if built.returncode:
        pytest.fail("compiling against CuTe's headers failed:\n" + built.stderr[-3000:])
    out = subprocess.run([str(work / "check")], capture_output=True, text=True, check=True).stdout.split()
    return admissible, out[: len(admissible)], out[len(admissible):]


def test_default_semantics_is_cute_cpp(cpp_results):
    admissible, printed, _ = cpp_results
    assert len(printed) == len(admissible) >= (N_COMPOSITION + N_DIVIDE) * 3 // 4
    mismatches = [(op, str(a), str(b), str(mine), cpp) for (op, a, b, mine), cpp in zip(admissible, printed)
                  if L.parse_layout(cpp) != mine]
    assert mismatches == [], mismatches[:5]
    # and the regime is the one where pycute's rule differs
    differ = sum(getattr(L, op)(a, b, semantics="pycute") != mine for op, a, b, mine in admissible)
    assert differ >= len(admissible) // 3


def test_left_inverse_of_a_constant_layout_differs_from_cpp(cpp_results):
    """Where C++ and the DSL disagree, the default follows the DSL (documented in left_inverse)."""
    _, _, pins = cpp_results
    assert pins == ["_3:_0"]
    assert L.left_inverse(L.Layout((3, 1), (0, 5))) == L.Layout(1, 0)
