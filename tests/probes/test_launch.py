"""probes._launch: a probe's job carries what `run` needs (the alignment of each fake tensor)."""

import pytest

pytestmark = pytest.mark.compile


def test_run_reads_each_fake_tensors_alignment():
    from cute_kernels.probes._launch import assumed_align
    from cute_kernels.probes.memory import build_chase
    from cute_kernels.probes.vector_add import build

    chase = build_chase("global")
    assert [assumed_align(a) for a in chase.args[:2]] == [4, 8]
    assert [assumed_align(a) for a in build(vec=4).args[:3]] == [16, 16, 16]
    with pytest.raises(TypeError, match="alignment"):
        assumed_align(object())
