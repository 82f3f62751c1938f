"""The check runner catches wrong, partial and non-finite results, and draws honest inputs."""

import math

import numpy as np
import pytest

from kfc.check.generators import GENERATORS
from kfc.check.runner import check_op, compare, scale_down
from kfc.diagnostics import KfcError
from kfc.frontend import load_kfc, parse_kfc
from kfc.ir.dtypes import DType
from kfc.ir.types import TensorType

ROWS = """
op scale(x: f32[M, N]) -> (y: f32[M, N]) {
  parallel m in 0..M {
    y[m, BODY] = x[m, BODY] * 2.0
  }
}
check {
  reference = "REF"
  shapes = [{M: 3, N: 70}]
  seeds = [0]
}
"""


def _spec(body=":", ref="x * 2"):
    return parse_kfc(ROWS.replace("BODY", body).replace("REF", ref), "t.kfc")


def test_a_correct_op_passes():
    assert all(r.ok for r in check_op(_spec()))


def test_a_wrong_reference_fails():
    results = check_op(_spec(ref="x * 2.001"))
    assert not any(r.ok for r in results)


def test_a_partly_written_output_fails_as_unwritten():
    results = check_op(_spec(body="0:64"))
    assert not any(r.ok for r in results)
    assert all("unwritten" in r.note for r in results)


SIZED = """
op scaled<C: 4 | 8>(x: f32[N, M]) -> (y: f32[N, M]) {
  y = x * f32(C)
}
check {
  reference = "REF"
  shapes = [{N: 3, M: 5}]
  seeds = [0]
}
"""


def scaled_by_chunk(x, *, C):
    """A reference function naming the size parameter C besides its input."""
    return x * C


@pytest.mark.parametrize("ref", ["x * C", "tests.test_check_runner:scaled_by_chunk"])
@pytest.mark.parametrize("size", ["4", "8"])
def test_a_reference_sees_the_size_parameters_bound(ref, size):
    """An expression names a bound size parameter as it names a dim; a function receives it
    where its signature names it (kfc.reference.kda's per-chunk references take C so)."""
    spec = parse_kfc(SIZED.replace("REF", ref), "t.kfc", {"C": size})
    assert all(r.ok for r in check_op(spec))


def test_compare_rules():
    ref = np.linspace(-2, 2, 101)
    assert compare(ref.astype(np.float32), ref, 1e-5)[2]
    bad = ref.copy()
    bad[7] = np.nan
    max_abs, rel, ok, note = compare(bad, ref, 1e-2)
    assert not ok and math.isinf(max_abs) and "first at [7]" in note
    off = ref.copy()
    off[3] += 0.5  # one element far off, RMSE still small
    assert not compare(off, ref, 1e-1)[2]
    assert compare(np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0]), 0.0)[2]
    assert not compare(np.array([1, 2, 4]), np.array([1.0, 2.0, 3.0]), 0.0)[2]
    assert not compare(np.zeros((2, 3)), np.zeros((3, 2)), 1e-2)[2]


def test_scale_down_keeps_small_cases_and_shrinks_huge_ones():
    spec = load_kfc("kernels/rmsnorm.kfc")
    assert scale_down(spec, {"M": 1, "N": 7}, 1 << 20) == {"M": 1, "N": 7}
    small = scale_down(spec, {"M": 32768, "N": 4096}, 1 << 20)
    assert small["M"] * small["N"] * 2 + small["N"] <= 1 << 20


@pytest.mark.parametrize("name", sorted(set(GENERATORS) - {"offsets", "randint"}))
def test_float_generators_never_give_zeros(name):
    rng = np.random.default_rng(0)
    x = GENERATORS[name].draw(rng, (64, 32), DType.F32, {}, ())
    assert x.dtype == np.float32 and np.count_nonzero(x) == x.size and np.isfinite(x).all()


def test_generator_ranges():
    rng = np.random.default_rng(1)
    assert (GENERATORS["logsigmoid"].draw(rng, (1000,), DType.F32, {}, ()) <= 0).all()
    s = GENERATORS["sigmoid"].draw(rng, (1000,), DType.F32, {}, ())
    assert ((s > 0) & (s < 1)).all()
    u = GENERATORS["unit"].draw(rng, (10, 16), DType.F32, {}, ())
    assert np.allclose(np.linalg.norm(u, axis=-1), 1, atol=1e-6)
    r = GENERATORS["logsigmoid_resets"].draw(rng, (10000,), DType.F32, {}, (3, 1, 0.05, -1e5))
    assert (r <= 0).all() and 0.03 < np.mean(r == -1e5) < 0.07 and (r[r != -1e5] > -20).all()
    g = GENERATORS["logsigmoid_resets"]
    assert "fraction p in [0, 1], got 2" in g.check_args((0, 1, 2), TensorType(DType.F32, (4,)), set())
    assert "<= 0, not 5" in g.check_args((0, 1, 0.1, 5), TensorType(DType.F32, (4,)), set())


@pytest.mark.parametrize("n,total", [(1, 100), (3, 300), (5, 5), (4, 2)])
def test_offsets_are_valid_cu_seqlens(n, total):
    o = GENERATORS["offsets"].draw(np.random.default_rng(n), (n + 1,), DType.I32, {"T": total}, ("T",))
    assert o[0] == 0 and o[-1] == total and (np.diff(o) >= 0).all() and len(o) == n + 1
    if total >= n:
        assert (np.diff(o) > 0).all()


def test_missing_reference_is_a_clear_error():
    spec = parse_kfc("op f(x: f32[N]) -> (y: f32[N]) { y = x }\ncheck { shapes = [{N: 3}] }", "t.kfc")
    with pytest.raises(KfcError, match="no reference"):
        check_op(spec)


def test_reference_errors_point_at_the_reference():
    spec = parse_kfc('op f(x: f32[N]) -> (y: f32[N]) { y = x }\ncheck { reference = "x + nope" shapes = [{N: 3}] }',
                     "t.kfc")
    with pytest.raises(KfcError) as e:
        check_op(spec)
    assert "NameError" in e.value.message and e.value.span.line == 2


def test_unimportable_reference_module():
    spec = parse_kfc('op f(x: f32[N]) -> (y: f32[N]) { y = x }\ncheck { reference = "no.such:fn" shapes = [{N: 3}] }',
                     "t.kfc")
    with pytest.raises(KfcError, match="cannot import"):
        check_op(spec)


def test_the_gates_device_generator_draws_reset_gates_as_the_check_does():
    import torch

    from kfc.factory.problem import _draw

    gen = torch.Generator().manual_seed(0)
    x = _draw("logsigmoid_resets", (3, 1, 0.25, -1e5), (4000,), torch.float32, {}, gen, 1.0, "cpu")
    assert x.dtype == torch.float32 and (x <= 0).all() and 0.2 < float((x == -1e5).float().mean()) < 0.3


def test_check_cases_that_differ_only_in_rows_share_one_lowering(monkeypatch):
    import kfc.proof as proof
    from kfc.model.target import parse_target

    lowered = []
    real = proof.lower_stages
    monkeypatch.setattr(proof, "lower_stages", lambda spec, t, p, dims: lowered.append(dict(dims)) or real(spec, t, p, dims))
    spec = _spec()
    at = proof.stages_by_shape(spec, parse_target("sm_90a"), None)
    shapes = [{"M": 3, "N": 70}, {"M": 1, "N": 70}, {"M": 300, "N": 70}, {"M": 3, "N": 8}]
    results = check_op(spec, seeds=[0], shapes=shapes, stages_at=at)
    assert lowered == [{"M": 3, "N": 70}, {"M": 3, "N": 8}]  # the rows are the run-time dim
    assert len(results) == 2 * len(shapes) and all(r.ok for r in results)  # the source's and the final IR's
    assert at({"M": 5, "N": 70}) is at({"M": 3, "N": 70})
