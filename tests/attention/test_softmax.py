"""softmax: the blockwise online recurrence equals the direct softmax (float64 reference)."""

from __future__ import annotations

import numpy as np
import pytest

from cute_kernels.attention.softmax import reference_online_softmax


def direct(scores, values, scale):
    s = scores * scale
    m = s.max(axis=1, keepdims=True)
    finite = np.isfinite(m)
    e = np.exp(np.where(finite, s - np.where(finite, m, 0), -np.inf))
    l_ = e.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(l_ == 0, 0.0, (e @ values) / l_)
        lse = np.where(l_[:, 0] == 0, -np.inf, np.log(l_[:, 0]) + np.where(finite[:, 0], m[:, 0], 0))
    return out, lse


@pytest.mark.parametrize("block", [1, 3, 16, 64])
def test_online_equals_direct(block):
    rng = np.random.default_rng(block)
    s = rng.standard_normal((12, 50)) * 4
    v = rng.standard_normal((50, 8))
    s[3, :] = -np.inf            # a fully masked row
    s[5, 20:] = -np.inf          # a row whose later blocks are masked
    s[7, :30] = -np.inf          # a row whose first blocks are masked
    out, lse = reference_online_softmax(s, v, 0.3, block)
    ref_out, ref_lse = direct(s, v, 0.3)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
    assert np.all(out[3] == 0) and lse[3] == -np.inf


def test_nan_propagates_to_its_row_only():
    rng = np.random.default_rng(0)
    s = rng.standard_normal((4, 20))
    v = rng.standard_normal((20, 3))
    s[2, 7] = np.nan
    out, lse = reference_online_softmax(s, v, 1.0, 8)
    assert np.isnan(out[2]).all() and np.isnan(lse[2])
    assert np.isfinite(np.delete(out, 2, axis=0)).all()
