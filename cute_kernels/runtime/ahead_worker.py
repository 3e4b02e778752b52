"""A compile-ahead worker (`runtime.compile_ahead`):
`python -m cute_kernels.runtime.ahead_worker FD [MODULE ...]`.

Imports the MODULEs (what the calls will need, so that the imports overlap the program's start),
then reads calls (length-prefixed pickles) from stdin until it closes or a None arrives (or the
process that started it is gone), makes each in dry-run mode
(every kernel it meets is compiled into the disk cache unless there already or claimed by
another process; nothing launches) and writes one result dict per call to file descriptor FD:
{"ok", "error", and the dry run's counts for that call}.
"""

from __future__ import annotations

import importlib
import os
import sys


def _resolve(target):
    if isinstance(target, str):
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)
    return target


def run(call) -> bool:
    """Make `call` (a `compile_ahead.Call`) in this process; dry-run mode is the caller's. False
    when it was skipped: on a CUDA device without the memory to spare (`compile_ahead.fits`)."""
    import torch

    from .compile_ahead import TensorSpec, fits, leaves, map_leaves

    specs = [s for s in leaves((call.args, call.kwargs)) if isinstance(s, TensorSpec)]
    device = torch.device(call.device or specs[0].device) if (call.device or specs) else None
    if device is not None and device.type == "cuda" and not fits(call, *torch.cuda.mem_get_info(device)):
        return False
    for name in call.imports:
        importlib.import_module(name)
    target = _resolve(call.target)
    if isinstance(target, torch.nn.Module):
        target = target.to_empty(device=call.device).train(call.training)
    args, kwargs = map_leaves(lambda a: a.make() if isinstance(a, TensorSpec) else a, (call.args, call.kwargs))
    with torch.set_grad_enabled(call.grad):
        out = target(*args, **kwargs)
        if call.backward:
            roots = [t for t in leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
            if roots:
                torch.autograd.backward(roots, [torch.empty_like(t) for t in roots])
    return True


def _exit_with_parent() -> None:
    """Exit when the program that started this worker is gone. Its end of stdin may outlive it:
    a process it forked (a DataLoader worker) holds a copy of the pipe, so EOF is not enough."""
    import threading
    import time

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str]) -> int:
    from . import cache
    from .compile_ahead import WORKER_ENV, _receive, _send

    _exit_with_parent()
    out = os.fdopen(int(argv[1]), "wb")
    os.environ[WORKER_ENV] = "1"
    cache._DRY_RUN.on = True
    import torch

    for name in argv[2:]:
        importlib.import_module(name)
    if torch.cuda.is_available():
        torch.cuda.init()
    _send(out, {"ready": True})
    counts = cache._DRY_RUN.counts
    while True:
        try:
            call = _receive(sys.stdin.buffer)
        except EOFError:
            return 0
        if call is None:  # the pool stops this worker
            return 0
        before = dict(counts)
        result = {"ok": True, "error": None}
        try:
            result["skipped"] = 0 if run(call) else 1
        except Exception as err:  # noqa: BLE001 - reported; the program compiles what this missed
            result = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        result.update({k: counts[k] - before.get(k, 0) for k in counts})
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _send(out, result)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
