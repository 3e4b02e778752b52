"""bench.timeline: GPU idle gaps in a profiler trace, charged to the launch that ended each."""

from __future__ import annotations

from cute_kernels.bench.timeline import format_gaps, gpu_gaps


def _x(cat, name, ts, dur, tid=1, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 0}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def _trace():
    return {"traceEvents": [
        # host: an autograd node holding two launches, then a Python frame holding a third and a sync
        _x("cpu_op", "autograd::engine::evaluate_function: LinearBackward", 0, 50),
        _x("cpu_op", "aten::mm", 5, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 8, 3, corr=1),
        _x("cuda_runtime", "cudaLaunchKernel", 30, 3, corr=2),
        _x("python_function", "cute_kernels/ops/eager_attention.py(60): backward", 60, 200),
        _x("python_function", "cute_kernels/attention/sm90_flash_bwd.py(466): backward", 70, 100),
        _x("cuda_driver", "cuLaunchKernelEx", 150, 4, corr=3),
        _x("cuda_runtime", "cudaStreamSynchronize", 200, 40),
        # GPU: k1 [10, 20), k2 queued early, starts at 20 (no gap), k3 after an idle 100 us
        _x("kernel", "k1", 10, 10, tid=7, corr=1),
        _x("kernel", "k2", 20, 30, tid=7, corr=2),
        _x("kernel", "k3", 150 + 5, 20, tid=7, corr=3),
        # a second stream overlapping k2 counts once in the busy time
        _x("kernel", "side", 25, 10, tid=8),
    ]}


def test_gaps_are_charged_to_the_launch_that_ended_them():
    r = gpu_gaps(_trace())
    assert r.span_us == 165 and r.busy_us == 60  # [10, 50) and [155, 175)
    assert len(r.gaps) == 1
    g = r.gaps[0]
    assert (g.start_us, g.us, g.kernel) == (50, 105, "k3")
    assert g.late  # launched at 150, after the GPU went idle at 50: the host was behind
    assert g.op == "-" and g.py == "cute_kernels/attention/sm90_flash_bwd.py(466): backward"  # innermost frame
    assert r.idle_us == 105
    assert r.by_launcher() == [("- | cute_kernels/attention/sm90_flash_bwd.py(466): backward", 105, 1)]
    assert r.syncs == [("cudaStreamSynchronize", 40, "-")]
    text = format_gaps(r)
    assert "idle 0.105 ms in 1 gaps (0.105 ms host-bound" in text and "sync cudaStreamSynchronize" in text


def test_small_gaps_and_early_launches():
    trace = {"traceEvents": [
        _x("cpu_op", "aten::add", 0, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 1, 2, corr=1),
        _x("cuda_runtime", "cudaLaunchKernel", 4, 2, corr=2),
        _x("kernel", "a", 10, 5, tid=7, corr=1),
        _x("kernel", "b", 16, 5, tid=7, corr=2),  # 1 us apart: under the threshold
        _x("kernel", "c", 40, 5, tid=7, corr=9),  # its launch is not in the trace
    ]}
    r = gpu_gaps(trace, min_gap_us=2.0)
    assert [(g.kernel, g.us, g.op, g.late) for g in r.gaps] == [("c", 19, "-", False)]
    assert gpu_gaps({"traceEvents": []}).gaps == []
