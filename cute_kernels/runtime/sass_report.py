"""What a compiled kernel became: registers, shared memory, local memory, occupancy on an
H100/H200, and an instruction histogram of its SASS.

Sources, each chosen to be independent of log formats: the cubin's ELF attributes
(`cubin.kernel_resources`), the SASS text nvdisasm produced (opcodes, local-memory
instructions), and the host code the DSL generated, where the launch configuration (block
size, dynamic shared memory) is stored into the CUDA launch-config struct as constants.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from .cubin import KernelResources, kernel_resources
from .occupancy import Occupancy, occupancy

# `/*0f30*/  @!P0 HGMMA.64x128x16.F32.BF16 gdesc[UR8], RZ, !UPT ;`
_INSTR_RE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")
_KERNEL_RE = re.compile(r"^\s*\.text\.(\S+?):?\s*$|^//-+ \.text\.(\S+) -+$")
_LOCAL_WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}


def _local_bytes(full_opcode: str) -> int:
    for part in full_opcode.split(".")[1:]:
        if part in _LOCAL_WIDTH:
            return _LOCAL_WIDTH[part]
    return 4


@dataclass(frozen=True)
class KernelSass:
    """One kernel's SASS: full opcodes (with modifiers) and their counts."""

    name: str
    opcodes: Counter  # full opcode, e.g. "HGMMA.64x128x16.F32.BF16" -> static count

    @property
    def histogram(self) -> Counter:
        """Counts by base opcode (the mnemonic before the first '.'), e.g. "HGMMA"."""
        base = Counter()
        for op, n in self.opcodes.items():
            base[op.split(".", 1)[0]] += n
        return base

    def local_bytes(self, mnemonic: str) -> int:
        return sum(_local_bytes(op) * n for op, n in self.opcodes.items() if op.split(".", 1)[0] == mnemonic)


def parse_sass(text: str) -> list[KernelSass]:
    """Per-kernel opcode counts of nvdisasm output (NOPs included; they pad the code)."""
    kernels: list[KernelSass] = []
    current: Counter | None = None
    for line in text.splitlines():
        m = _KERNEL_RE.match(line)
        if m:
            name = m.group(1) or m.group(2)
            if not kernels or kernels[-1].name != name:
                current = Counter()
                kernels.append(KernelSass(name, current))
            continue
        if current is None:
            continue
        m = _INSTR_RE.match(line)
        if m:
            current[m.group(1)] += 1
    return kernels


# ---- launch configuration from the host code --------------------------------------------

_CONST_RE = re.compile(r"(%\w+) = llvm\.mlir\.constant\((-?\d+) : i\d+\)")
_LAUNCH_STRUCT = "struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>"
_GEP_RE = re.compile(r"(%\w+) = llvm\.getelementptr %\w+\[0, (\d)(?:, (\d))?\]")
_STORE_RE = re.compile(r"llvm\.store (%\w+), (%\w+) :")
_KERNEL_REF_RE = re.compile(r"llvm\.mlir\.addressof @kernels_(\w+)")


@dataclass(frozen=True)
class LaunchConfig:
    """Block size and dynamic shared memory of one launch; None where not a constant."""

    block: tuple | None
    dynamic_smem: int | None


def launch_configs(host_ir: str) -> dict[str, LaunchConfig]:
    """Kernel name -> the launch configuration the host code builds for it."""
    found: dict[str, LaunchConfig] = {}
    for body in host_ir.split("llvm.func @")[1:]:
        consts: dict[str, int] = {}
        fields: dict[str, tuple] = {}
        values: dict[tuple, int | None] = {}
        for line in body.splitlines():
            if m := _CONST_RE.search(line):
                consts[m.group(1)] = int(m.group(2))
            elif _LAUNCH_STRUCT in line and (m := _GEP_RE.search(line)):
                fields[m.group(1)] = (int(m.group(2)), None if m.group(3) is None else int(m.group(3)))
            elif (m := _STORE_RE.search(line)) and m.group(2) in fields:
                values[fields[m.group(2)]] = consts.get(m.group(1))
            elif m := _KERNEL_REF_RE.search(line):
                block = tuple(values.get((1, k)) for k in range(3))
                found[m.group(1)] = LaunchConfig(
                    block=None if None in block else block,
                    dynamic_smem=values.get((2, None)),
                )
    return found


def _squash(name: str) -> str:
    return re.sub(r"_+", "_", name)


# ---- the report ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelReport:
    """Resources, launch configuration and SASS of one kernel."""

    name: str
    resources: KernelResources
    sass: KernelSass
    block_dim: tuple | None
    dynamic_smem: int | None

    @property
    def threads_per_block(self) -> int | None:
        if self.block_dim is None:
            return None
        x, y, z = self.block_dim
        return x * y * z

    @property
    def smem_per_block(self) -> int:
        return self.resources.static_smem + (self.dynamic_smem or 0)

    @property
    def occupancy(self) -> Occupancy | None:
        if not self.threads_per_block:
            return None
        return occupancy(self.threads_per_block, self.resources.registers, self.smem_per_block)


@dataclass(frozen=True)
class SassReport:
    """The inspection result for one compiled variant.

    The scalar fields describe the primary kernel (the one with the most instructions);
    `kernels` lists every kernel of the module. Spill bytes are the static bytes moved by
    STL/LDL instructions (spills and local arrays alike; zero for a kernel that keeps
    everything in registers).
    """

    variant: str
    config: dict
    arch: str
    kernels: tuple[KernelReport, ...]
    sass: str = field(repr=False)
    ptx: str | None = field(default=None, repr=False)

    @property
    def primary(self) -> KernelReport:
        if not self.kernels:
            raise ValueError(f"{self.variant}: the compiled module contains no kernel")
        return max(self.kernels, key=lambda k: sum(k.sass.opcodes.values()))

    @property
    def registers(self) -> int:
        return self.primary.resources.registers

    @property
    def static_smem(self) -> int:
        return self.primary.resources.static_smem

    @property
    def dynamic_smem(self) -> int | None:
        return self.primary.dynamic_smem

    @property
    def local_memory(self) -> int:
        """Bytes of stack frame (local memory) per thread."""
        return self.primary.resources.frame_size

    @property
    def spill_store_bytes(self) -> int:
        return self.primary.sass.local_bytes("STL")

    @property
    def spill_load_bytes(self) -> int:
        return self.primary.sass.local_bytes("LDL")

    @property
    def threads_per_block(self) -> int | None:
        return self.primary.threads_per_block

    @property
    def histogram(self) -> Counter:
        """Base-opcode counts summed over every kernel of the module."""
        total = Counter()
        for k in self.kernels:
            total.update(k.sass.histogram)
        return total

    @property
    def opcodes(self) -> Counter:
        total = Counter()
        for k in self.kernels:
            total.update(k.sass.opcodes)
        return total

    @property
    def occupancy(self) -> Occupancy | None:
        return self.primary.occupancy

    def has(self, opcode: str) -> bool:
        """True when some instruction's mnemonic is `opcode`, or its full opcode is
        `opcode` or starts with `opcode` + "." (so "HGMMA.64x128x16" matches a variant)."""
        if self.histogram.get(opcode):
            return True
        return any(op == opcode or op.startswith(opcode + ".") for op in self.opcodes)

    def summary(self) -> str:
        """A human-readable multi-line summary (what `cute-kernels sass` prints)."""
        k = self.primary
        lines = [
            f"{self.variant} {self.config} for {self.arch}",
            f"kernel: {k.name}",
            f"registers/thread: {self.registers}"
            + (f" (cap {k.resources.max_registers})" if k.resources.max_registers not in (None, 255) else ""),
            f"shared memory/block: {self.static_smem} B static + "
            + (f"{self.dynamic_smem} B dynamic" if self.dynamic_smem is not None else "unknown dynamic"),
            f"local memory: {self.local_memory} B/thread frame; spills: {self.spill_store_bytes} B stored, "
            f"{self.spill_load_bytes} B loaded",
            f"threads/block: {self.threads_per_block if self.threads_per_block else 'unknown'}",
        ]
        occ = self.occupancy
        lines.append("occupancy (H100/H200): " + (occ.describe() if occ else "unknown (block size not constant)"))
        lines.append("instructions:")
        hist = self.histogram
        width = max((len(op) for op in hist), default=0)
        for op, n in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {op:<{width}}  {n}")
        if len(self.kernels) > 1:
            lines.append(f"({len(self.kernels)} kernels in the module; figures above are for the largest)")
        return "\n".join(lines)


def build_report(variant: str, config: dict, arch: str, cubin: bytes, sass: str, host_ir: str | None,
                 ptx: str | None = None, dynamic_smem: int | None = None) -> SassReport:
    """Assemble a `SassReport` from a compiled function's artifacts.

    `dynamic_smem`, when given, overrides what the host code shows (for kernels whose
    dynamic shared memory size is not a compile-time constant).
    """
    resources = {r.name: r for r in kernel_resources(cubin)}
    sass_kernels = {k.name: k for k in parse_sass(sass)}
    launches = launch_configs(host_ir) if host_ir else {}
    squashed = {_squash(name): cfg for name, cfg in launches.items()}
    kernels = []
    for name, res in resources.items():
        cfg = launches.get(name) or squashed.get(_squash(name))
        if cfg is None and len(launches) == 1 and len(resources) == 1:
            cfg = next(iter(launches.values()))
        block = res.block_dim or (cfg.block if cfg else None)
        dyn = dynamic_smem if dynamic_smem is not None else (cfg.dynamic_smem if cfg else None)
        kernels.append(KernelReport(name, res, sass_kernels.get(name, KernelSass(name, Counter())), block, dyn))
    return SassReport(variant=variant, config=dict(config), arch=arch, kernels=tuple(kernels), sass=sass, ptx=ptx)
