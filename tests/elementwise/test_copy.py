"""cute_kernels.elementwise.copy: argument checks (CPU), the thread-value layout (pure Python),
and bit-exact copies of every supported dtype on the GPU."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from cute_kernels.elementwise import copy  # noqa: E402

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the CuTe DSL")


# ---- argument checks: raised before any launch, so they run on CPU ------------------------

def test_cpu_tensor_is_rejected_naming_the_device():
    with pytest.raises(ValueError, match="device 'cpu'.*CUDA"):
        copy(torch.randn(8))


def test_meta_tensor_is_rejected_naming_the_device():
    with pytest.raises(ValueError, match="device 'meta'"):
        copy(torch.empty(8, device="meta"), torch.empty(8, device="meta"))


def test_non_contiguous_is_rejected():
    x = torch.randn(8, 8, device="meta").t()
    with pytest.raises(ValueError, match="not contiguous"):
        copy(x, torch.empty(8, 8, device="meta"))


def test_dtype_and_shape_mismatch_are_rejected():
    a = torch.empty(8, device="meta")
    with pytest.raises(TypeError, match="dtype"):
        copy(a, torch.empty(8, device="meta", dtype=torch.float16))
    with pytest.raises(ValueError, match="shape"):
        copy(a, torch.empty(9, device="meta"))


def test_non_tensor_is_rejected():
    with pytest.raises(TypeError, match="torch tensors"):
        copy([1.0, 2.0])


# ---- the layout the kernel runs ------------------------------------------------------------

@needs_dsl
@pytest.mark.parametrize("element_bytes", [1, 2, 4, 8])
def test_tv_layout_is_a_coalesced_vectorized_bijection(element_bytes):
    from cute_kernels.elementwise import CopyConfig, copy_tv_layout

    config = CopyConfig(threads=64, vector_bytes=16, vectors_per_thread=3)
    tv = copy_tv_layout(config, element_bytes)
    vec = 16 // element_bytes
    offsets = [tv((t, (v, r))) for t in range(64) for v in range(vec) for r in range(3)]
    assert sorted(offsets) == list(range(64 * vec * 3))  # every element exactly once
    for t in range(64):
        for r in range(3):
            first = tv((t, (0, r)))
            assert first % vec == 0  # each vector starts 16-byte aligned
            assert [tv((t, (v, r))) for v in range(vec)] == list(range(first, first + vec))
            if t + 1 < 64:
                assert tv((t + 1, (0, r))) == first + vec  # neighbours' vectors are adjacent


@needs_dsl
def test_config_validation():
    from cute_kernels.elementwise import CopyConfig

    with pytest.raises(ValueError, match="threads"):
        CopyConfig(threads=100).validate()
    with pytest.raises(ValueError, match="vector_bytes"):
        CopyConfig(vector_bytes=12).validate()
    with pytest.raises(ValueError, match="multiple"):
        CopyConfig(vector_bytes=4).validate(element_bytes=8)
    with pytest.raises(ValueError, match="vectors_per_thread"):
        CopyConfig(vectors_per_thread=0).validate()


# ---- on the GPU: bit-exact --------------------------------------------------------------------

_DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
]
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _random_bits(n: int, dtype, offset: int = 0):
    """n elements of `dtype` (starting `offset` elements into their allocation) with random bit
    patterns (NaNs, infinities and denormals included); bool gets 0/1 bytes."""
    size = torch.tensor([], dtype=dtype).element_size()
    if dtype == torch.bool:
        raw = torch.randint(0, 2, (n + offset,), dtype=torch.int8, device="cuda").view(torch.bool)
    else:
        info = torch.iinfo(_BITS[size])
        raw = torch.randint(info.min, info.max, (n + offset,), dtype=_BITS[size], device="cuda").view(dtype)
    return raw[offset:]


def _poisoned_like(x, offset: int = 0):
    size = x.element_size()
    buf = torch.full((x.numel() + offset,), -1, dtype=_BITS[size], device="cuda")
    return buf[offset:].view(x.dtype).view(x.shape)


def _same_bits(x, y) -> bool:
    bits = _BITS[x.element_size()]
    return torch.equal(x.reshape(-1).view(bits), y.reshape(-1).view(bits))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 7, 1000003, 3 * 2**20 + 5])
def test_copy_is_bit_exact(dtype, n):
    src = _random_bits(n, dtype)
    dst = _poisoned_like(src)
    out = copy(src, dst)
    torch.cuda.synchronize()
    assert out is dst
    assert _same_bits(dst, src)


@pytest.mark.gpu
def test_copy_allocates_dst_and_keeps_shape():
    src = torch.randn(33, 65, 7, device="cuda")
    out = copy(src)
    assert out.shape == src.shape and out.dtype == src.dtype and out.data_ptr() != src.data_ptr()
    assert _same_bits(out, src)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_copy_of_misaligned_views(offset):
    # Storage offsets break 16-byte alignment: the copy narrows its vectors instead of failing.
    src = _random_bits(100_003, torch.float16, offset=offset)
    dst = _poisoned_like(src, offset=(offset + 1) % 4)
    copy(src, dst)
    torch.cuda.synchronize()
    assert _same_bits(dst, src)


@pytest.mark.gpu
def test_copy_leaves_bytes_past_the_end_untouched():
    buf = _poisoned_like(torch.empty(1000 + 64, device="cuda"))
    src = torch.randn(1000, device="cuda")
    copy(src, buf[:1000])
    torch.cuda.synchronize()
    assert _same_bits(buf[:1000], src)
    assert torch.all(buf[1000:].view(torch.int32) == -1)


@pytest.mark.gpu
def test_copy_of_empty_tensor():
    src = torch.empty(0, device="cuda")
    assert copy(src).numel() == 0


# ---- the launch path (CPU: the compiler replaced by a recorder) ------------------------------

@pytest.fixture
def recorded_tvm_ffi(monkeypatch):
    """copy's TVM-FFI path with the build recorded, and the device check (tested above) off."""
    from cute_kernels.elementwise import api

    state = api._state or api._init()
    builds, launches = [], []

    def build(vc, config, element_bytes):
        builds.append((config, element_bytes))
        return lambda *args: launches.append(args)

    monkeypatch.setitem(state, "tvm_ffi", True)
    monkeypatch.setattr(api, "_compiled", {})
    monkeypatch.setattr(api, "_compile_tvm_ffi", build)
    monkeypatch.setattr(api, "_check", lambda src, dst, torch: None)
    return builds, launches


@needs_dsl
def test_tvm_ffi_copy_passes_flat_integer_views_and_builds_once(recorded_tvm_ffi):
    from cute_kernels.elementwise import CopyConfig

    builds, launches = recorded_tvm_ffi
    src, dst = torch.randn(33, 65, 7), torch.empty(33, 65, 7)
    assert copy(src, dst) is dst
    copy(torch.randn(1000), torch.empty(1000))  # another size: the same build
    assert builds == [(CopyConfig(vector_bytes=16), 4)]
    s, d = launches[0]
    assert s.dtype == torch.int32 and s.shape == (33 * 65 * 7,) and s.data_ptr() == src.data_ptr()
    assert d.dtype == torch.int32 and d.data_ptr() == dst.data_ptr()
    assert len(launches) == 2


@needs_dsl
def test_tvm_ffi_copy_builds_per_alignment_element_size_and_config(recorded_tvm_ffi):
    from cute_kernels.elementwise import CopyConfig

    builds, _ = recorded_tvm_ffi
    buf = torch.empty(1024, dtype=torch.float16)
    copy(buf[1:101], torch.empty(100, dtype=torch.float16))  # 2-byte aligned source
    copy(buf[2:102], torch.empty(100, dtype=torch.float16))  # 4-byte aligned
    copy(torch.empty(100, dtype=torch.bool), torch.empty(100, dtype=torch.bool))
    copy(torch.empty(100), torch.empty(100), config=CopyConfig(threads=128, vectors_per_thread=2))
    assert builds == [
        (CopyConfig(vector_bytes=2), 2),
        (CopyConfig(vector_bytes=4), 2),
        (CopyConfig(vector_bytes=16), 1),
        (CopyConfig(threads=128, vector_bytes=16, vectors_per_thread=2), 4),
    ]
    with pytest.raises(ValueError, match="threads"):
        copy(torch.empty(100), torch.empty(100), config=CopyConfig(threads=100))


@pytest.mark.compile
@needs_dsl
@pytest.mark.skipif(importlib.util.find_spec("tvm_ffi") is None, reason="needs apache-tvm-ffi")
def test_tvm_ffi_copy_build_takes_torch_tensors_and_no_stream(monkeypatch, tmp_path):
    from cute_kernels.elementwise import CopyConfig, api, vector_copy

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    fn = api._compile_tvm_ffi(vector_copy, CopyConfig(), 4)
    x = torch.zeros(100, dtype=torch.int32)
    with pytest.raises(TypeError, match="Expects 2 parameters"):
        fn(x)
    with pytest.raises(ValueError, match=r"argument #0.*expected device_type=cuda"):
        fn(x, x)


# ---- on the GPU: the launch paths ---------------------------------------------------------------

@pytest.mark.gpu
def test_copy_runs_on_the_current_stream():
    # A busy side stream fills src, then copies: a copy launched anywhere else (e.g. the default
    # stream, which does not wait for a non-blocking side stream) would read src before the fill.
    src = torch.zeros(1 << 22, device="cuda")
    dst = torch.full_like(src, float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        src.fill_(7.0)
        copy(src, dst)
    side.synchronize()
    assert torch.all(dst == 7.0)


@pytest.mark.gpu
def test_copy_through_dsl_tensors_without_tvm_ffi(monkeypatch):
    from cute_kernels.elementwise import api

    state = api._state or api._init()
    monkeypatch.setitem(state, "tvm_ffi", False)
    for dtype, n, offset in [(torch.float32, 1000003, 0), (torch.float16, 100_003, 1), (torch.int64, 7, 0)]:
        src = _random_bits(n, dtype, offset=offset)
        dst = _poisoned_like(src)
        assert copy(src, dst) is dst
        torch.cuda.synchronize()
        assert _same_bits(dst, src)


@pytest.mark.gpu
def test_warm_copy_call_never_waits_for_the_gpu(enqueue_only):
    """A warm copy only enqueues (a wait for the device raises under `enqueue_only`) and copies
    every bit. Its host time (the DSL-tensor path cost ~116 us per call on the H200 host against
    6.6 us for torch's copy) is printed; the `overhead` bench is where host time is measured."""
    src = torch.randn(1 << 20, device="cuda")
    dst = torch.empty_like(src)
    us = enqueue_only(lambda: copy(src, dst), 201)
    print(f"\nwarm copy host time (4 MB): {us:.1f} us")
    assert _same_bits(dst, src)
