"""How every ``cute-kernels`` subcommand fails: one line on stderr and a non-zero exit, never a
traceback for a user's mistake or a missing optional dependency.

* :class:`CliError`: raised by a subcommand for bad input it detected (an unknown kernel, an
  unwritable file); printed as ``cute-kernels COMMAND: message``, exit status 2.
* A :class:`~cute_kernels.layouts.errors.LayoutError` (an inadmissible layout, a bad access) is
  printed the same way.
* A missing optional dependency (torch, the CuTe DSL, cuda-python, matplotlib, triton) names the
  extra that installs it: ``pip install 'cute-kernels[gpu]'``.
* An ``OSError`` (a file that cannot be written, a tool that is not installed) prints its message.

``CUTE_KERNELS_TRACEBACK=1`` re-raises instead, for debugging. :func:`run_guarded` is applied to
every subcommand by :func:`cute_kernels.cli.main`, so a new subcommand gets all of this for free.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

__all__ = ["CliError", "EXTRAS", "missing_extra", "run_guarded", "write_file"]

# top-level module -> (what it is, the extra that installs it)
EXTRAS = {
    "torch": ("PyTorch", "gpu"),
    "cutlass": ("the CuTe DSL (nvidia-cutlass-dsl)", "gpu"),
    "cuda": ("cuda-python", "gpu"),
    "tvm_ffi": ("apache-tvm-ffi", "gpu"),
    "numpy": ("numpy", "gpu"),
    "matplotlib": ("matplotlib", "bench"),
    "triton": ("triton", "bench"),
    "hypothesis": ("hypothesis", "test"),
}


class CliError(Exception):
    """A mistake in a command's input, reported as one line with exit status ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _missing_module(err: BaseException) -> str | None:
    """The optional top-level module whose absence caused ``err`` (following ``raise ... from``)."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, ModuleNotFoundError) and err.name:
            root = err.name.split(".")[0]
            if root in EXTRAS:
                return root
        err = err.__cause__ or err.__context__
        seen += 1
    return None


def missing_extra(err: BaseException, command: str) -> str | None:
    """The one-line message for an ImportError caused by a missing optional dependency, or None."""
    root = _missing_module(err)
    if root is None:
        return None
    what, extra = EXTRAS[root]
    return (f"cute-kernels {command}: needs {what}, which is not installed here; "
            f"install it with: pip install 'cute-kernels[{extra}]'")


def write_file(path: str, content: str, what: str) -> None:
    """Write a text file the user asked for, or fail with one line naming the path."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    except OSError as err:
        raise CliError(f"cannot write the {what} to {path}: {err.strerror or err}") from err
    print(f"wrote {what} to {path}")


def run_guarded(command: str, func: Callable[[Any], int], args: Any) -> int:
    """``func(args)``, with the failures of the module docstring turned into one line and an exit code."""
    from cute_kernels.layouts.errors import LayoutError

    if os.environ.get("CUTE_KERNELS_TRACEBACK"):
        return int(func(args) or 0)
    try:
        return int(func(args) or 0)
    except CliError as err:
        print(f"cute-kernels {command}: {err}", file=sys.stderr)
        return err.code
    except LayoutError as err:
        print(f"cute-kernels {command}: {err}", file=sys.stderr)
        return 2
    except ImportError as err:
        message = missing_extra(err, command)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2
    except OSError as err:
        where = f": {err.filename}" if getattr(err, "filename", None) else ""
        print(f"cute-kernels {command}: {err.strerror or err}{where}", file=sys.stderr)
        return 2
