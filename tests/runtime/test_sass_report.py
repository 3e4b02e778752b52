"""SassReport on kernels with known resources: registers, shared memory, spills, block size,
occupancy and the opcode histogram; and the parsers on hand-written inputs."""

import pytest

from cute_kernels.runtime.cubin import CubinError, kernel_resources
from cute_kernels.runtime.sass_report import launch_configs, parse_sass

SASS_SNIPPET = """
//--------------------- .text.kernel_a --------------------------
        .section        .text.kernel_a,"ax",@progbits
kernel_a:
.text.kernel_a:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 HGMMA.64x128x16.F32.BF16 gdesc[UR8], RZ, !UPT ;
        /*0020*/                   STL.64 [R1], R2 ;
        /*0030*/                   STL.128 [R1+0x10], R4 ;
        /*0040*/               @P1 LDL R2, [R1] ;
        /*0050*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0060*/                   EXIT ;
//--------------------- .text.kernel_b --------------------------
        .section        .text.kernel_b,"ax",@progbits
kernel_b:
.text.kernel_b:
        /*0000*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0010*/                   EXIT ;
"""


def test_parse_sass_counts_opcodes_per_kernel():
    a, b = parse_sass(SASS_SNIPPET)
    assert a.name == "kernel_a" and b.name == "kernel_b"
    assert a.opcodes["HGMMA.64x128x16.F32.BF16"] == 1
    assert a.histogram == {"LDC": 1, "HGMMA": 1, "STL": 2, "LDL": 1, "UTMALDG": 1, "EXIT": 1}
    assert a.local_bytes("STL") == 8 + 16
    assert a.local_bytes("LDL") == 4
    assert b.histogram == {"LDSM": 1, "EXIT": 1}


def test_launch_configs_from_host_code():
    host = """
    llvm.func @host(%arg0: i32) {
      %5 = llvm.mlir.constant(2024 : i64) : i64
      %7 = llvm.mlir.constant(1 : i32) : i32
      %8 = llvm.mlir.constant(256 : i32) : i32
      %9 = llvm.alloca %7 x !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)> : (i32) -> !llvm.ptr
      %12 = llvm.getelementptr %9[0, 1, 0] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
      llvm.store %8, %12 : i32, !llvm.ptr
      %13 = llvm.getelementptr %9[0, 1, 1] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
      llvm.store %7, %13 : i32, !llvm.ptr
      %14 = llvm.getelementptr %9[0, 1, 2] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
      llvm.store %7, %14 : i32, !llvm.ptr
      %15 = llvm.getelementptr %9[0, 2] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
      llvm.store %5, %15 : i64, !llvm.ptr
      %76 = llvm.mlir.addressof @kernels_kernel_x : !llvm.ptr
    }
    llvm.func @host2(%arg0: i32) {
      %9 = llvm.alloca %7 x !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)> : (i32) -> !llvm.ptr
      %15 = llvm.getelementptr %9[0, 2] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
      llvm.store %arg0, %15 : i64, !llvm.ptr
      %76 = llvm.mlir.addressof @kernels_kernel_y : !llvm.ptr
    }
    """
    configs = launch_configs(host)
    assert configs["kernel_x"].block == (256, 1, 1)
    assert configs["kernel_x"].dynamic_smem == 2024
    # A runtime-dependent size is reported as unknown, not guessed.
    assert configs["kernel_y"].dynamic_smem is None and configs["kernel_y"].block is None


def test_cubin_parser_rejects_non_elf():
    with pytest.raises(CubinError):
        kernel_resources(b"definitely not an ELF file")


# ---- compiled kernels --------------------------------------------------------------------


@pytest.fixture(scope="module")
def variants():
    pytest.importorskip("cutlass")
    import runtime_test_kernels as K

    from cute_kernels.runtime import register_variant, unregister_variant

    register_variant("test.smem", K.smem_job, configs={"default": {}, "big": {"threads": 256, "smem_bytes": 100_000},
                                                       "auto": {"smem_bytes": None}},
                     requires={"STS", "LDS", "BAR"})
    register_variant("test.local_array", K.local_array_job, configs={"default": {}}, requires={"STL", "LDL"},
                     forbids=set())
    yield
    unregister_variant("test.smem")
    unregister_variant("test.local_array")


@pytest.mark.compile
def test_smem_kernel_report(variants):
    from cute_kernels.runtime import check_variant, compile_variant, get_variant

    report = compile_variant("test.smem", "default")
    assert report.arch == "sm_90a"
    assert report.threads_per_block == 128
    assert report.dynamic_smem == 4096
    assert 0 < report.registers <= 32
    assert report.spill_store_bytes == 0 and report.spill_load_bytes == 0 and report.local_memory == 0
    assert report.histogram["STS"] >= 1 and report.histogram["LDS"] >= 1 and report.histogram["BAR"] >= 1
    assert check_variant(report, get_variant("test.smem")) == []
    # (static + 4096 + 1 KiB reserved) per block; 4 warps per block: warps allow 16 blocks.
    per_block = -(-(report.static_smem + 4096) // 128) * 128 + 1024
    assert report.occupancy.limits_by["shared memory"] == 228 * 1024 // per_block
    assert report.occupancy.blocks_per_sm == 16 and report.occupancy.limiter == "warps"
    assert "registers/thread" in report.summary() and "STS" in report.summary()


@pytest.mark.compile
def test_big_smem_limits_occupancy(variants):
    from cute_kernels.runtime import compile_variant

    report = compile_variant("test.smem", "big")
    assert report.threads_per_block == 256 and report.dynamic_smem == 100_000
    assert report.occupancy.blocks_per_sm == 2 and report.occupancy.limiter == "shared memory"
    assert report.occupancy.warps_per_sm == 16


@pytest.mark.compile
def test_inferred_dynamic_smem(variants):
    from cute_kernels.runtime import compile_variant

    report = compile_variant("test.smem", "auto")
    assert report.dynamic_smem == 128 * 4  # the allocator's 128 floats


@pytest.mark.compile
def test_spills_are_reported_and_forbidden_by_default(variants):
    from cute_kernels.runtime import Variant, check_variant, compile_variant

    report = compile_variant("test.local_array")
    assert report.registers <= 32  # the launch bounds' cap
    assert report.primary.resources.max_registers == 32
    assert report.spill_store_bytes > 0 and report.spill_load_bytes > 0
    assert report.local_memory >= report.spill_store_bytes // 4
    # Each STL/LDL moves 4 to 16 bytes.
    assert 4 * report.histogram["STL"] <= report.spill_store_bytes <= 16 * report.histogram["STL"]
    assert 4 * report.histogram["LDL"] <= report.spill_load_bytes <= 16 * report.histogram["LDL"]
    strict = Variant("strict", None, {"default": {}}, frozenset({"HGMMA"}), frozenset({"LDL", "STL"}))
    problems = check_variant(report, strict)
    assert "required HGMMA is absent" in problems
    assert any(p.startswith("forbidden LDL") for p in problems) and any(p.startswith("forbidden STL") for p in problems)


@pytest.mark.compile
def test_reports_are_memoized_and_overrides_apply(variants):
    from cute_kernels.runtime import compile_variant

    first = compile_variant("test.smem", "default")
    assert compile_variant("test.smem", "default") is first
    overridden = compile_variant("test.smem", "default", smem_bytes=8192)
    assert overridden.dynamic_smem == 8192 and overridden.config["smem_bytes"] == 8192


def test_registry_rejects_bad_registrations():
    from cute_kernels.runtime import compile_variant, get_variant, register_variant, unregister_variant

    with pytest.raises(ValueError, match="configs"):
        register_variant("bad", lambda: None, configs={})
    with pytest.raises(ValueError, match="both requires and forbids"):
        register_variant("bad", lambda: None, configs={"default": {}}, requires={"STL"})
    register_variant("dup", lambda: None, configs={"default": {}})
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_variant("dup", print, configs={"default": {}})
        with pytest.raises(KeyError, match="no config"):
            get_variant("dup").config("missing")
        with pytest.raises(TypeError, match="not CompileJob"):
            compile_variant("dup", arch="sm_90a")
    finally:
        unregister_variant("dup")
    with pytest.raises(KeyError, match="no variant named"):
        get_variant("no-such-variant", load=False)


@pytest.mark.compile
def test_report_holds_sass_when_the_arch_comes_only_as_an_argument():
    # With CUTE_DSL_ARCH unset when the DSL is imported, the DSL keeps no SASS of its own (it
    # hands back a path it never wrote): the report must disassemble the cubin itself.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CUTE_DSL_ARCH"}
    code = ("from cute_kernels.runtime import registry\n"
            "r = registry.compile_variant('gemm.naive', arch='sm_90a')\n"
            "print(r.has('FFMA'), r.has('LDG'), sum(r.histogram.values()))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    has_ffma, has_ldg, count = out.stdout.split()[-3:]
    assert has_ffma == "True" and has_ldg == "True" and int(count) > 50
