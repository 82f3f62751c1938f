"""`if` in a row kernel, on the CPU: the front end's rules for the names a branch assigns, the
tile.if op (verification, the interpreter, IR text that reads back), and the code generator
(both targets under --verify-each; a branch that reduces gets a CTA per row)."""

import re

import numpy as np
import pytest

from kfc.compile import compile_op
from kfc.diagnostics import KfcError, VerifyError
from kfc.frontend import parse_kfc
from kfc.ir import parse_ir, print_ir, verify
from kfc.ir.interpreter import run
from kfc.ir.tile_ops import IfOp
from kfc.passes import ROW_PIPELINE
from kfc.model.target import parse_target
from tests.example_ops import OPS


def lower(tmp_path, text, dtypes=None):
    return parse_kfc(text, str(tmp_path / "op.kfc"), dtypes)


def ifs(func) -> list:
    return [op for op in func.walk() if isinstance(op, IfOp)]


def test_an_outer_name_assigned_in_one_branch_keeps_its_value_in_the_other(tmp_path):
    spec = lower(tmp_path, OPS["clipnorm"], {"T": "f32"})
    (op,) = ifs(spec.func)
    assert [r.name for r in op.results] == ["s", "flag"]
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32) * np.array([[0.1], [10], [1], [5]],
                                                                                            dtype=np.float32)
    out = run(spec.func, {"x": x, "limit": np.float32(8.0)})
    n = np.sqrt((x.astype(np.float64) ** 2).sum(-1))
    np.testing.assert_array_equal(out["scaled"], (n > 8.0).astype(np.int32))
    want = x * np.where(n > 8.0, 8.0 / n, 1.0)[:, None]
    np.testing.assert_allclose(out["y"], want, rtol=1e-5)


def test_names_a_branch_alone_makes_stay_in_it(tmp_path):
    text = """
op f(x: f32[N]) -> (y: f32[N]) {
  s = sum(x)
  if s > 0.0 {
    t = x * 2.0
  }
  y = t
}
"""
    with pytest.raises(KfcError, match="'t'") as info:
        lower(tmp_path, text)
    assert info.value.span.line == 7


def test_a_name_both_branches_make_lives_on(tmp_path):
    text = """
op f(x: f32[N]) -> (y: f32[N]) {
  if sum(x) > 0.0 {
    t = x * 2.0
  } else {
    t = x
  }
  y = t
}
"""
    spec = lower(tmp_path, text)
    x = np.array([1.0, -3.0], np.float32)
    np.testing.assert_array_equal(run(spec.func, {"x": x})["y"], x)
    np.testing.assert_array_equal(run(spec.func, {"x": -x})["y"], -2 * x)


@pytest.mark.parametrize("body, message", [
    ("if x[0] { y = x }", "an if's condition is a scalar bool"),
    ("t = x\n  if sum(x) > 0.0 { t = i32(x) }\n  y = x", "'t' is i32[N] after one branch and f32[N] after the other"),
])
def test_branches_that_do_not_agree_are_refused_at_the_if(tmp_path, body, message):
    text = f"op f(x: f32[N]) -> (y: f32[N]) {{\n  {body}\n}}\n"
    with pytest.raises(KfcError, match=re.escape(message)) as info:
        lower(tmp_path, text)
    assert info.value.span is not None


def test_a_sum_across_rows_inside_an_if_is_refused(tmp_path):
    text = """
op f(x: f32[M, N]) -> (dw: f32[N]) {
  parallel m in 0..M {
    if x[m, 0] > 0.0 {
      dw[:] += x[m, :]
    }
  }
}
"""
    with pytest.raises(KfcError, match="'dw \\+=' inside an if"):
        lower(tmp_path, text)


def test_a_condition_known_while_lowering_keeps_only_its_branch(tmp_path):
    text = "op f(x: f32[N]) -> (y: f32[N]) {\n  if true { y = x * 2.0 } else { y = x }\n}\n"
    spec = lower(tmp_path, text)
    assert not ifs(spec.func)


def test_tile_if_reads_back_and_its_regions_are_verified(tmp_path):
    spec = lower(tmp_path, OPS["maybe_center"])
    text = print_ir(spec.func)
    assert print_ir(parse_ir(text)) == text
    broken = re.sub(r"tile\.yield (%\S+) : \((\S+)\) -> \(\)", r"tile.yield \1, \1 : (\2, \2) -> ()", text, count=1)
    assert broken != text
    with pytest.raises(VerifyError, match="yields 2 value"):
        verify(parse_ir(broken))


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name, n", [("clipnorm", 7), ("clipnorm", 4096), ("clipnorm", 65536), ("maybe_center", 7),
                                     ("maybe_center", 4096)])
def test_branches_compile_under_verify_each(tmp_path, target, name, n):
    spec = lower(tmp_path, OPS[name], {"T": "bf16"} if "<T:" in OPS[name] else None)
    r = compile_op(spec, parse_target(target), shape={"N": n}, verify_each=True)
    assert r.kernel.report.spills == 0
    assert re.search(r"if \(v\d+\) \{", r.kernel.cu) and "} else {" in r.kernel.cu
    if name == "maybe_center":  # the branch reduces: one row a CTA, one CTA a row, whole warps
        assert r.plan.rows_per_cta == 1 and r.plan.cluster == 1 and r.plan.block >= 32


def test_a_branch_that_reduces_is_not_split_across_a_cluster(tmp_path):
    spec = lower(tmp_path, OPS["maybe_center"])
    with pytest.raises(KfcError, match="a branch that synchronises runs in one CTA"):
        compile_op(spec, parse_target("sm_90a"), pipeline=ROW_PIPELINE.replace("tile", "tile{cluster=2}", 1),
                   shape={"N": 4096})
