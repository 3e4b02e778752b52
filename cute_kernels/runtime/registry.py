"""The inspection registry: every kernel variant the project checks at the SASS level.

A kernel module registers, at import, a builder that turns a configuration into a
`CompileJob` made of fake tensors, so that the variant compiles for sm_90a on a machine
without a GPU. `compile_variant` compiles it with the SASS kept and returns a `SassReport`;
CI asserts each variant's `requires` opcodes are present and `forbids` opcodes absent.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .sass_report import SassReport, build_report

# Packages whose modules register variants; imported (with their submodules) on listing.
KERNEL_PACKAGES = ("cute_kernels.elementwise", "cute_kernels.gemm", "cute_kernels.attention", "cute_kernels.fused",
                   "cute_kernels.probes")


@dataclass(frozen=True)
class CompileJob:
    """Everything `cute.compile` needs for one variant.

    `args` are the jit function's arguments (fake tensors, `fake_stream()`, scalars);
    `key` identifies the variant in the compile cache; `options` are extra `cute.compile`
    options; `dynamic_smem` (bytes) overrides the dynamic shared memory read from the host
    code, for kernels whose size is not a compile-time constant.
    """

    jit_fn: Callable
    args: tuple
    key: tuple
    options: str | None = None
    dynamic_smem: int | None = None


@dataclass(frozen=True)
class Variant:
    """A registered kernel variant: how to build it and what its SASS must (not) contain."""

    name: str
    build: Callable[..., CompileJob]
    configs: Mapping[str, dict]
    requires: frozenset
    forbids: frozenset = field(default_factory=lambda: frozenset({"LDL", "STL"}))

    def config(self, config: str | Mapping | None = None, **overrides) -> dict:
        """The configuration dict for a config name (default "default", else the first
        registered) or an explicit dict, with `overrides` applied."""
        if config is None:
            config = "default" if "default" in self.configs else next(iter(self.configs))
        if isinstance(config, str):
            if config not in self.configs:
                raise KeyError(f"variant {self.name!r} has no config {config!r}; it has {sorted(self.configs)}")
            resolved = dict(self.configs[config])
        else:
            resolved = dict(config)
        resolved.update(overrides)
        return resolved


_VARIANTS: dict[str, Variant] = {}
_REPORTS: dict[tuple, SassReport] = {}
_LOADED = False


def register_variant(
    name: str,
    build: Callable[..., CompileJob],
    *,
    configs: Mapping[str, dict],
    requires: set[str] | frozenset = frozenset(),
    forbids: set[str] | frozenset = frozenset({"LDL", "STL"}),
) -> Variant:
    """Register variant `name`: `build(**configs[c])` must return a `CompileJob`.

    Registering the same name again with a builder of the same qualified name replaces
    the entry (a module re-import); a different builder under a taken name is an error.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"variant name must be a non-empty string, got {name!r}")
    if not callable(build):
        raise TypeError(f"build for variant {name!r} must be callable")
    if not configs or not all(isinstance(k, str) and isinstance(v, Mapping) for k, v in configs.items()):
        raise ValueError(f"configs for variant {name!r} must be a non-empty dict of name -> dict of build kwargs")
    requires, forbids = frozenset(requires), frozenset(forbids)
    if requires & forbids:
        raise ValueError(f"variant {name!r} both requires and forbids {sorted(requires & forbids)}")
    old = _VARIANTS.get(name)
    if old is not None and _qualname(old.build) != _qualname(build):
        raise ValueError(f"variant {name!r} is already registered by {_qualname(old.build)}")
    variant = Variant(name, build, {k: dict(v) for k, v in configs.items()}, requires, forbids)
    _VARIANTS[name] = variant
    for memo in [m for m in _REPORTS if m[0] == name]:
        del _REPORTS[memo]
    return variant


def unregister_variant(name: str) -> None:
    """Remove a variant (tests use this to clean up)."""
    _VARIANTS.pop(name, None)
    for memo in [m for m in _REPORTS if m[0] == name]:
        del _REPORTS[memo]


def _qualname(fn) -> str:
    fn = getattr(fn, "__func__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def load_kernel_modules() -> None:
    """Import every module of the kernel packages so their variants register.

    A package that is absent is skipped; a module that fails to import raises ImportError
    naming it.
    """
    global _LOADED
    if _LOADED:
        return
    for package_name in KERNEL_PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except ModuleNotFoundError as err:
            if err.name == package_name:
                continue
            raise
        for info in pkgutil.walk_packages(getattr(package, "__path__", []), prefix=package_name + "."):
            if info.name.rsplit(".", 1)[-1].startswith("_"):
                continue
            try:
                importlib.import_module(info.name)
            except Exception as err:  # noqa: BLE001 - re-raised with the module named
                raise ImportError(f"importing kernel module {info.name} failed: {err}") from err
    _LOADED = True


def list_variants(*, load: bool = True) -> list[Variant]:
    """Every registered variant, sorted by name (importing the kernel packages first)."""
    if load:
        load_kernel_modules()
    return [_VARIANTS[k] for k in sorted(_VARIANTS)]


def get_variant(name: str, *, load: bool = True) -> Variant:
    if name not in _VARIANTS and load:
        load_kernel_modules()
    try:
        return _VARIANTS[name]
    except KeyError:
        raise KeyError(f"no variant named {name!r}; registered: {sorted(_VARIANTS)}") from None


def compile_variant(name: str, config: str | Mapping | None = None, *, arch: str | None = None,
                    **overrides: Any) -> SassReport:
    """Compile variant `name` with `config` (a config name or a dict of build kwargs, plus
    `overrides`) for `arch` (default `target_arch()`), keeping PTX, cubin and SASS, and
    report on it. Reports are memoized per (name, config, arch) in this process; the
    artifacts go to a temporary directory that is removed afterwards (never the cwd).
    """
    from .arch import normalize_arch, target_arch
    from .cache import compile_now

    variant = get_variant(name)
    resolved = variant.config(config, **overrides)
    arch = normalize_arch(arch) if arch else target_arch()
    memo = (name, repr(sorted(resolved.items())), arch)
    if memo in _REPORTS:
        return _REPORTS[memo]
    job = variant.build(**resolved)
    if not isinstance(job, CompileJob):
        raise TypeError(f"build for variant {name!r} returned {type(job).__name__}, not CompileJob")
    dump_dir = tempfile.mkdtemp(prefix="cute_kernels_sass_")
    try:
        options = f"{job.options or ''} --keep-sass --keep-ptx --dump-dir {dump_dir}".strip()
        with _quiet_nvdisasm():
            compiled = compile_now(job.jit_fn, *job.args, options=options, arch=arch)
        artifacts = compiled.artifacts
        if artifacts is None or not artifacts.CUBIN or not artifacts.SASS:
            raise RuntimeError(
                f"compiling {name!r} produced no cubin/SASS; is nvidia-cuda-nvdisasm installed?"
            )
        with _quiet_nvdisasm():
            sass = _sass_text(artifacts, dump_dir)
        host_ir = str(compiled.ir_module) if getattr(compiled, "ir_module", None) is not None else None
        report = build_report(name, resolved, arch, artifacts.CUBIN, sass, host_ir,
                              ptx=_artifact_text(artifacts.PTX), dynamic_smem=job.dynamic_smem)
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)
    _REPORTS[memo] = report
    return report


def _artifact_text(value):
    """A kept artifact's text: the DSL hands back either the text or the path of its file."""
    if isinstance(value, str) and "\n" not in value and os.path.isfile(value):
        with open(value) as f:
            return f.read()
    return value


def _sass_text(artifacts, dump_dir: str) -> str:
    """The SASS of the compiled cubin. When CUTE_DSL_ARCH was unset as the DSL was imported, the
    DSL skips its own disassembly and hands back only the path it meant to write; then the
    cubin is disassembled here with the same tool."""
    sass = _artifact_text(artifacts.SASS)
    if "\n" in sass:
        return sass
    from cutlass.base_dsl.env_manager import dump_sass

    cubin_path = os.path.join(dump_dir, "kernel.cubin")
    with open(cubin_path, "wb") as f:
        f.write(artifacts.CUBIN)
    sass_path = os.path.join(dump_dir, "kernel.sass")
    dump_sass(cubin_path, sass_path, "")
    with open(sass_path) as f:
        return f.read()


# nvdisasm 13.x warns on every cubin the cu12 toolchain emits; the SASS is complete regardless.
_NVDISASM_NOISE = ("nvdisasm warning : Disassembling Std Elf", "nvdisasm warning : Dataflow analysis disabled")


@contextlib.contextmanager
def _quiet_nvdisasm():
    """Drop nvdisasm's known warnings from the process's stderr; pass everything else on."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by something without an fd
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not line.startswith(_NVDISASM_NOISE)]
            if kept:
                sys.stderr.write("".join(kept))


def check_variant(report: SassReport, variant: Variant) -> list[str]:
    """Violations of `variant`'s requires/forbids in `report` (empty when it passes)."""
    problems = [f"required {op} is absent" for op in sorted(variant.requires) if not report.has(op)]
    problems += [
        f"forbidden {op} is present ({report.histogram.get(op, 0)}x)" for op in sorted(variant.forbids) if report.has(op)
    ]
    return problems
