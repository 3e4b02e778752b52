"""Resource usage of the kernels in a cubin, read from its ELF sections.

ptxas records, per kernel: the register count (EIATTR_REGCOUNT in the `.nv.info`
section, or in older cubins the top byte of the `.text.<kernel>` section's sh_info), the
stack frame (EIATTR_FRAME_SIZE; local memory per thread, spills included), the block size
the kernel was compiled for (EIATTR_REQNTID / EIATTR_MAX_THREADS), and static shared memory
as the size of the `.nv.shared.<kernel>` section. Reading these is independent of any tool
output format.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# EIATTR codes (CUDA's ELF .nv.info attribute ids).
EIATTR_MAX_THREADS = 0x05
EIATTR_REQNTID = 0x10
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_MAXREG_COUNT = 0x1B
EIATTR_REGCOUNT = 0x2F

# .nv.info record formats: no value, byte, half-word, sized payload. Every record is
# `format, attribute` followed by 2 value bytes (or a 2-byte size and that many bytes).
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4


@dataclass(frozen=True)
class KernelResources:
    """What one kernel of a cubin needs per thread and per block."""

    name: str
    registers: int
    static_smem: int
    frame_size: int  # bytes of local memory (stack) per thread
    min_stack_size: int
    max_registers: int | None  # the cap ptxas honoured (launch bounds / maxnreg), if any
    block_dim: tuple[int, int, int] | None  # required block size, if the kernel declares it


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    info: int


class CubinError(ValueError):
    """The bytes are not a CUDA ELF image this module can read."""


def _sections(data: bytes) -> list[_Section]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF image")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = raw[shstrndx][4]

    def name_at(offset: int) -> str:
        start = strtab_off + offset
        return data[start : data.index(b"\0", start)].decode()

    return [_Section(name_at(r[0]), r[1], r[4], r[5], r[7]) for r in raw]


def _symbols(data: bytes, sections: list[_Section]) -> list[str]:
    """Symbol names by symbol-table index."""
    symtab = next((s for s in sections if s.type == 2), None)
    if symtab is None:
        return []
    strtab = sections[struct.unpack_from("<I", data, _section_header_offset(data, sections.index(symtab)) + 0x28)[0]]
    names = []
    for i in range(symtab.size // 24):
        (name_off,) = struct.unpack_from("<I", data, symtab.offset + 24 * i)
        start = strtab.offset + name_off
        names.append(data[start : data.index(b"\0", start)].decode())
    return names


def _section_header_offset(data: bytes, index: int) -> int:
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    (shentsize,) = struct.unpack_from("<H", data, 0x3A)
    return shoff + index * shentsize


def _records(payload: bytes):
    """(attribute, value bytes) for each record of an .nv.info section."""
    i = 0
    while i + 2 <= len(payload):
        fmt, attr = payload[i], payload[i + 1]
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", payload, i + 2)
            yield attr, payload[i + 4 : i + 4 + size]
            i += 4 + size
        elif fmt == _EIFMT_HVAL:
            yield attr, payload[i + 2 : i + 4]
            i += 4
        elif fmt == _EIFMT_BVAL:
            yield attr, payload[i + 2 : i + 3]
            i += 4  # records keep 4-byte alignment: the byte value is padded
        elif fmt == _EIFMT_NVAL:
            yield attr, b""
            i += 4  # likewise, two bytes of padding
        else:
            raise CubinError(f"unknown .nv.info record format {fmt}")


def kernel_resources(cubin: bytes) -> list[KernelResources]:
    """One `KernelResources` per kernel (`.text.<name>` section) in `cubin`."""
    data = bytes(cubin)
    sections = _sections(data)
    symbols = _symbols(data, sections)
    by_name = {s.name: s for s in sections}

    # Global .nv.info holds per-symbol (symbol index, value) pairs.
    per_symbol: dict[int, dict[int, int]] = {}
    nv_info = by_name.get(".nv.info")
    if nv_info is not None:
        for attr, value in _records(data[nv_info.offset : nv_info.offset + nv_info.size]):
            if len(value) == 8:
                sym, val = struct.unpack("<II", value)
                per_symbol.setdefault(sym, {})[attr] = val

    kernels = []
    for sec in sections:
        if not sec.name.startswith(".text."):
            continue
        name = sec.name[len(".text.") :]
        sym_index = sec.info & 0xFFFFFF
        attrs = per_symbol.get(sym_index)
        if attrs is None and name in symbols:
            attrs = per_symbol.get(symbols.index(name), {})
        attrs = attrs or {}
        registers = attrs.get(EIATTR_REGCOUNT, sec.info >> 24)
        shared = by_name.get(f".nv.shared.{name}")
        max_registers = None
        block_dim = None
        info = by_name.get(f".nv.info.{name}")
        if info is not None:
            for attr, value in _records(data[info.offset : info.offset + info.size]):
                if attr == EIATTR_MAXREG_COUNT and len(value) == 2:
                    max_registers = struct.unpack("<H", value)[0]
                elif attr in (EIATTR_REQNTID, EIATTR_MAX_THREADS) and len(value) == 12:
                    dims = struct.unpack("<III", value)
                    if attr == EIATTR_REQNTID or block_dim is None:
                        block_dim = dims
        kernels.append(
            KernelResources(
                name=name,
                registers=registers,
                static_smem=shared.size if shared is not None else 0,
                frame_size=attrs.get(EIATTR_FRAME_SIZE, 0),
                min_stack_size=attrs.get(EIATTR_MIN_STACK_SIZE, 0),
                max_registers=max_registers,
                block_dim=block_dim,
            )
        )
    return kernels
