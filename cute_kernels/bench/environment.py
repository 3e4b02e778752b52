"""What a result records about where it ran: device name and software versions."""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import subprocess
from typing import Any


def device_name(device: str) -> str:
    """torch's name for the CUDA device ('NVIDIA H200'), or 'cpu'."""
    if device == "cpu":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _module_version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", None)
    except Exception:
        return None


def driver_version() -> str | None:
    """The NVIDIA driver version from nvidia-smi, None where it is absent."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[0] if lines else None


def versions(device: str) -> dict[str, Any]:
    """torch, CUDA, the DSL, the driver, triton and each peer (None where absent), and the
    `runtime.unverified` paths the run turned on (None for none): a figure measured with a path
    that is not yet the default says so in its record."""
    import torch

    import cute_kernels
    from cute_kernels.runtime import unverified

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device != "cpu" else None,
        "driver": driver_version() if device != "cpu" else None,
        "cute_kernels": cute_kernels.__version__,
        "nvidia-cutlass-dsl": _dist_version("nvidia-cutlass-dsl") or _module_version("cutlass"),
        "triton": _dist_version("triton"),
        "quack-kernels": _dist_version("quack-kernels") or _module_version("quack"),
        "flash-attn-4": _dist_version("flash-attn-4", "fa4"),
        "cute_kernels_unverified": ",".join(sorted(unverified.ENABLED)) or None,
    }
