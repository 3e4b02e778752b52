"""fake_tensor and from_torch have one structure: dynamic sizes and strides, static unit
stride; so a function compiled for fake tensors accepts any real tensor of that dtype/rank."""

import re

import pytest

pytestmark = pytest.mark.compile

torch = pytest.importorskip("torch")
cutlass = pytest.importorskip("cutlass")
cute = pytest.importorskip("cutlass.cute")

from cute_kernels.runtime import fake_tensor, from_torch  # noqa: E402
from cute_kernels.runtime.tensors import leading_dim_of  # noqa: E402


def _layout_type(arg) -> str:
    """The layout part of the DSL's type for a jit argument, e.g. '(?,?):(?{i64},1)'."""
    seen = []

    @cute.jit
    def trace(t: cute.Tensor):
        seen.append(str(t.type))

    cute.compile(trace, arg)  # fake tensors exist only for cute.compile
    text = seen[-1]
    match = re.search(r'"(.*)"', text)
    assert match, text
    # Divisibility annotations are promises the fake side may add; compare the structure.
    return re.sub(r"\{i64 div=\d+\}", "{i64}", match.group(1)), text


@pytest.mark.parametrize(
    "shape, permute, leading",
    [((64, 32), None, 1), ((64, 32), (1, 0), 0), ((3, 64, 32), None, 2), ((8,), None, 0)],
)
def test_fake_and_real_tensors_share_a_layout_type(shape, permute, leading):
    real = torch.randn(*shape)
    if permute is not None:
        real = real.permute(*permute)
    real_layout, _ = _layout_type(from_torch(real))
    fake_layout, fake_text = _layout_type(fake_tensor(torch.float32, real.dim(), leading_dim=leading))
    assert real_layout == fake_layout
    # Every size dynamic, the leading stride the static 1, others dynamic 64-bit.
    shape_part, stride_part = fake_layout.split(":")
    assert shape_part.count("?") == real.dim()
    strides = stride_part.strip("()").split(",")
    assert strides[leading] == "1"
    assert all(s == "?{i64}" for i, s in enumerate(strides) if i != leading)
    assert "align<16>" in fake_text


def test_fake_tensor_options():
    _, text = _layout_type(fake_tensor(cutlass.Float16, 2, stride_divisibility=8, assumed_align=32))
    assert "f16" in text and "align<32>" in text and "div=8" in text
    _, text = _layout_type(fake_tensor(torch.bfloat16, 2, shape=(128, None)))
    assert '"(128,?)' in text


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"ndim": 0}, "ndim"),
        ({"ndim": 2, "leading_dim": 2}, "leading_dim"),
        ({"ndim": 2, "assumed_align": 3}, "assumed_align"),
        ({"ndim": 2, "stride_divisibility": 0}, "stride_divisibility"),
        ({"ndim": 2, "shape": (1, 2, 3)}, "modes"),
    ],
)
def test_fake_tensor_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fake_tensor(torch.float32, **kwargs)


def test_from_torch_checks_alignment_and_unit_stride():
    x = torch.randn(1024)
    with pytest.raises(ValueError, match="aligned"):
        from_torch(x[1:])  # 4-byte offset from a 16-byte aligned base
    from_torch(x[1:], assumed_align=4)
    with pytest.raises(ValueError, match="unit-stride"):
        from_torch(torch.randn(8, 8)[:, ::2][::2])
    with pytest.raises(ValueError, match="stride 8"):
        from_torch(torch.randn(8, 8), leading_dim=0)


def test_leading_dim_deduction():
    assert leading_dim_of((4, 8), (8, 1)) == 1
    assert leading_dim_of((4, 8), (1, 4)) == 0
    # A size-1 mode with stride 1 does not hide the real contiguous mode.
    assert leading_dim_of((1, 8), (1, 1)) == 1
    assert leading_dim_of((8, 1), (1, 1)) == 0
    assert leading_dim_of((1, 1), (1, 1)) == 1
    with pytest.raises(ValueError):
        leading_dim_of((4, 4), (8, 2))


def test_current_stream_needs_a_device():
    from cute_kernels.runtime import current_stream, has_cuda

    if has_cuda():
        pytest.skip("a CUDA device is present")
    with pytest.raises(RuntimeError, match="fake_stream"):
        current_stream()


def test_from_torch_views_a_tensor_that_requires_grad():
    # Kernels run inside autograd functions, whose inputs still require grad; DLPack alone
    # would refuse them.
    x = torch.randn(64, 32, requires_grad=True)
    view = from_torch(x)
    assert (view.shape, view.stride) == ((64, 32), (32, 1))
    assert f"{x.data_ptr():016x}" in str(view.iterator)  # the same storage, not a copy
    assert x.requires_grad and x.grad_fn is None
