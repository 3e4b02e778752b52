"""Device tensors a cache keeps for the life of the process, made outside any CUDA graph pool.

    lasting(device, build, *args, **kwargs)   build(...) for `device`, its allocations kept out
                                             of a CUDA graph's private pool

A few of our caches hold device tensors across calls: the GEMM's stand-in operand and split-K
counters, the paged decode's error buffer, the dense decode's block tables. torch.compile's
CUDA graph trees (`mode="reduce-overhead"`) run each graph's warm-up and capture with every
allocation of the calling thread routed to the graph's private pool, and after recording
refuse a pool that holds a live tensor the graph did not return ("Detected 1 tensor(s) in the
cudagraph pool not tracked as outputs"). A tensor a cache keeps would be exactly that.

The routing is per thread (`_cuda_beginAllocateCurrentThreadToPool`), so `lasting` runs the
build on a helper thread when the caller may be routed to a pool: any stream other than the
device's default one (graph trees warm up and capture on a side stream), while nothing is
being captured. The helper runs on the caller's stream, so the build's kernels (a zeroing) are
ordered before whatever the caller launches next, and a freed tensor returns to the allocator
on that stream, as one made by the caller would. On the default stream, and during a capture
(a build there is captured with the graph, as the decode's tables must be, and a helper
thread's allocation could break a global-mode capture), the caller builds in place. A helper
thread is started only on a cache miss, never on a warm call.
"""

from __future__ import annotations

import threading

__all__ = ["lasting"]


def lasting(device, build, /, *args, **kwargs):
    """`build(*args, **kwargs)`, which allocates on `device` the tensors a cache keeps, run so
    that none of its allocations lands in a CUDA graph's private pool. Returns what `build`
    returns; raises what it raises."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return build(*args, **kwargs)
    stream = torch.cuda.current_stream(device)
    if stream == torch.cuda.default_stream(device):
        return build(*args, **kwargs)
    out: list = []

    def run():
        try:
            with torch.cuda.stream(stream):
                out.append((True, build(*args, **kwargs)))
        except BaseException as err:  # noqa: BLE001 - raised again on the caller's thread
            out.append((False, err))

    helper = threading.Thread(target=run, name="cute_kernels.lasting", daemon=True)
    helper.start()
    helper.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value
