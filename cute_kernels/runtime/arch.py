"""Which GPU architecture kernels compile for, and whether a CUDA device is present.

`target_arch()` is the DSL's arch string ("sm_90a" style). With a CUDA device visible to
torch it is the device's compute capability; Hopper and later get the "a" suffix because
our kernels use arch-specific instructions (wgmma, setmaxnreg) that exist only in the
"a" targets. Without a device, the environment variable CUTE_DSL_ARCH names the target,
which is what lets CI compile every kernel for sm_90a on a CPU-only machine.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys

_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


@functools.cache
def has_cuda() -> bool:
    """True when a CUDA device is visible.

    Asks torch when torch is already imported (the answer the kernels' callers see);
    otherwise asks the CUDA driver through cuda-python, which costs milliseconds where
    importing torch costs a second (the CLI and compile-only processes never need torch).
    """
    if "torch" in sys.modules:
        return bool(sys.modules["torch"].cuda.is_available())
    count = _driver_device_count()
    if count is not None:
        return count > 0
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def _driver_device_count() -> int | None:
    """Devices the CUDA driver sees (0 without a driver), or None without cuda-python."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
        return count if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # noqa: BLE001 - a missing libcuda means no device
        return 0


def arch_from_capability(major: int, minor: int) -> str:
    """The DSL arch string for compute capability (major, minor): 9.0 -> "sm_90a".

    Architectures from Hopper on carry the "a" suffix (arch-specific features); earlier
    ones do not have such a variant.
    """
    if major < 0 or minor < 0:
        raise ValueError(f"compute capability must be non-negative, got ({major}, {minor})")
    suffix = "a" if major >= 9 else ""
    return f"sm_{major}{minor}{suffix}"


def normalize_arch(arch: str) -> str:
    """Validate an arch string such as "sm_90a" and return it stripped and lower-cased."""
    text = arch.strip().lower()
    if not _ARCH_RE.match(text):
        raise ValueError(f"not an arch string like 'sm_90a': {arch!r}")
    return text


def arch_capability(arch: str) -> tuple[int, int]:
    """(major, minor) of an arch string: "sm_90a" -> (9, 0), "sm_100a" -> (10, 0)."""
    digits = _ARCH_RE.match(normalize_arch(arch)).group(1)
    return int(digits[:-1]), int(digits[-1])


@functools.cache
def _device_arch(index: int) -> str:
    torch = sys.modules.get("torch")
    if torch is not None:
        major, minor = torch.cuda.get_device_capability(index)
        return arch_from_capability(major, minor)
    from cuda.bindings import driver

    attr = driver.CUdevice_attribute
    _, device = driver.cuDeviceGet(index)
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
    return arch_from_capability(major, minor)


def target_arch() -> str:
    """The arch kernels compile for, e.g. "sm_90a".

    From torch's current CUDA device when one is visible, else from CUTE_DSL_ARCH.
    Raises RuntimeError when neither is available.
    """
    if has_cuda():
        torch = sys.modules.get("torch")
        return _device_arch(torch.cuda.current_device() if torch is not None else 0)
    env = os.environ.get("CUTE_DSL_ARCH", "").strip()
    if not env:
        raise RuntimeError(
            "no CUDA device is visible and CUTE_DSL_ARCH is not set: set CUTE_DSL_ARCH=sm_90a "
            "to compile for Hopper without a GPU"
        )
    return normalize_arch(env)


@functools.cache
def dsl_version() -> str:
    """The installed nvidia-cutlass-dsl version (part of every compile-cache key)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-cutlass-dsl")
    except PackageNotFoundError:
        import cutlass

        return str(getattr(cutlass, "__version__", "unknown"))


def sm_count(device=None) -> int:
    """The SM count of a CUDA device (a torch.device, an index, or None: the current one),
    asked of the driver once per device (the warm paths that size grids by it read a dict)."""
    import torch

    index = device if isinstance(device, int) else getattr(device, "index", None)
    return _sm_count_of(torch.cuda.current_device() if index is None else index)


@functools.cache
def _sm_count_of(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count
