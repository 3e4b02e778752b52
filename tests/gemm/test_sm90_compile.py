"""Every sm90 rung variant compiles for sm_90a without a GPU; its SASS holds the instructions
the design relies on (HGMMA, UTMALDG, UTMASTG) and no local-memory spills (LDL/STL)."""

import collections
import os
import re
import shutil
import subprocess
import tempfile

import pytest

pytestmark = pytest.mark.compile


def _nvdisasm():
    try:
        import nvidia

        for root in nvidia.__path__:
            for sub in ("cu13", "cu12", "cuda_nvdisasm"):
                p = os.path.join(root, sub, "bin", "nvdisasm")
                if os.path.exists(p):
                    return p
    except ImportError:
        pass
    return shutil.which("nvdisasm")


def _opcodes(cubin: bytes) -> collections.Counter:
    tool = _nvdisasm()
    if tool is None:
        pytest.skip("nvdisasm not found")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def _cases():
    from cute_kernels.gemm import sm90_persistent, sm90_tma_wgmma, sm90_warp_specialized

    for mod, cls in ((sm90_persistent, "Sm90PersistentGemm"), (sm90_tma_wgmma, "Sm90TmaWgmmaGemm"),
                     (sm90_warp_specialized, "Sm90WarpSpecializedGemm")):
        for name in mod.VARIANTS:
            yield pytest.param(mod, cls, name, id=f"{mod.__name__.rsplit('.', 1)[1]}-{name}")


@pytest.mark.parametrize("mod,cls,variant", list(_cases()) if os.environ.get("CUTE_DSL_ARCH", "sm_90a") else [])
def test_variant_sass(mod, cls, variant, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cutlass
    import cutlass.cute as cute
    from cutlass.runtime import make_fake_stream

    from cute_kernels.gemm.sm90_config import Sm90GemmConfig
    from cute_kernels.gemm.sm90_rung import fake_gemm_args

    cfg = dict(mod.VARIANTS[variant])
    ops = {k: cfg.pop(k) for k in ("in_dtype", "out_dtype", "a_major", "b_major", "c_major") if k in cfg}
    kernel = getattr(mod, cls)(Sm90GemmConfig(**cfg))
    fn = cute.compile(kernel, *fake_gemm_args(**ops), cutlass.Float32(1.0), 66, make_fake_stream(),
                      options="--keep-cubin")
    h = _opcodes(fn.artifacts.CUBIN)
    for op in ("HGMMA", "UTMALDG", "UTMASTG"):
        assert h[op] > 0, f"{op} missing from SASS: {dict(h.most_common(20))}"
    assert h["LDL"] == 0 and h["STL"] == 0, f"local memory traffic: LDL={h['LDL']} STL={h['STL']}"
