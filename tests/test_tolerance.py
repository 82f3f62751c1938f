"""The one tolerance rule: the same verdict on numpy arrays and torch tensors, and each way an
output can fail it."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kfc.check.tolerance import compare_arrays


def both(out, ref, tol):
    a = compare_arrays(np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64), tol)
    b = compare_arrays(torch.tensor(out, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64), tol)
    assert (a.ok, a.unwritten, a.special_mismatch, a.beyond, a.first_bad) == \
        (b.ok, b.unwritten, b.special_mismatch, b.beyond, b.first_bad)
    for x, y in ((a.max_abs, b.max_abs), (a.rel_rmse, b.rel_rmse), (a.worst, b.worst)):
        assert x == pytest.approx(y, rel=1e-12) or (math.isinf(x) and math.isinf(y))
    return a


def test_each_way_to_fail():
    ref = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]])
    assert both(ref, ref, 1e-3).ok
    c = both(np.where(np.arange(6).reshape(2, 3) == 4, np.nan, ref), ref, 1e-3)
    assert not c.ok and c.unwritten == 1 and c.first_bad == (1, 1) and math.isinf(c.rel_rmse)
    off = ref.copy()
    off[0, 2] += 0.5
    c = both(off, ref, 1e-2)
    assert not c.ok and c.beyond == 1 and c.first_bad == (0, 2)
    spread = ref * (1 + 0.009 * np.array([[1, -1, 1], [-1, 1, -1]]))  # every element just inside, RMSE too
    assert both(spread, ref, 1e-2).ok
    special = np.array([1.0, np.inf, np.nan])
    assert both(special, special, 1e-3).ok
    c = both(np.array([1.0, 5.0, np.nan]), special, 1e-3)
    assert not c.ok and c.special_mismatch == 1 and c.first_bad == (1,)
    assert both(np.array([1.0, 2.0]), np.array([1.0, 2.0]), 0.0).ok
    assert not both(np.array([1.0, 3.0]), np.array([1.0, 2.0]), 0.0).ok
    assert compare_arrays(np.zeros((2, 3)), np.zeros((3, 2)), 1e-2).shape_mismatch


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40), st.floats(0.0, 0.2),
       st.sampled_from([0.0, 1e-3, 1e-2]), st.integers(0, 3))
def test_numpy_and_torch_agree(values, noise, tol, specials):
    rng = np.random.default_rng(len(values))
    ref = np.array(values)
    out = ref * (1 + noise * rng.standard_normal(ref.shape))
    for i in range(min(specials, len(values))):
        [lambda: out.__setitem__(i, np.nan), lambda: ref.__setitem__(i, np.inf),
         lambda: out.__setitem__(i, -np.inf)][i % 3]()
    both(out, ref, tol)
