"""linearize: a parallel loop over several indices runs over one (row-major), checked by the
interpreter against the loop it came from (--verify-each), and such ops compile as row
programs whose indices' dims stay run-time arguments."""

import pytest

from kfc.check.runner import check_op
from kfc.compile import compile_op, row_dims
from kfc.frontend import instantiate, parse_kfc
from kfc.ir import print_ir
from kfc.ir.tile_ops import ParallelOp
from kfc.passes import PassContext, PassManager, VerifyEach, parse_pipeline
from kfc.runtime import contract
from kfc.model.target import parse_target
from tests.multi_index_ops import BTH, HEADNORM


@pytest.mark.parametrize("text,dims", [(HEADNORM, {"T": 5, "H": 3, "D": 16}),
                                       (BTH, {"B": 2, "S": 3, "H": 4, "D": 8})])
def test_the_linearised_loop_computes_what_the_loop_did(tmp_path, text, dims):
    spec = parse_kfc(text, str(tmp_path / "op.kfc"))
    if spec.type_params:
        spec = instantiate(spec, {"T": "f32"})
    ctx = PassContext(parse_target("sm_90a"), check=spec.check, verify_each=VerifyEach(dims, spec.check))
    out = PassManager(parse_pipeline("linearize"), ctx).run(spec.func)  # verify-each compares both
    (loop,) = [op for op in out.body.ops if isinstance(op, ParallelOp)]
    assert loop.rank == 1 and "tile.rem" in print_ir(out) and "tile.div" in print_ir(out)


@pytest.mark.parametrize("text", [HEADNORM, BTH])
def test_multi_index_ops_pass_their_check(tmp_path, text):
    results = check_op(parse_kfc(text, str(tmp_path / "op.kfc")))
    assert results and all(r.ok for r in results)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_a_norm_per_token_and_head_compiles_with_tokens_and_heads_free(tmp_path, target):
    spec = parse_kfc(HEADNORM, str(tmp_path / "headnorm.kfc"))
    assert row_dims(spec.func) == ["T", "H"]
    result = compile_op(spec, parse_target(target), shape={"D": 128}, verify_each=True)
    assert result.dims == {"D": 128} and set(result.dynamic_dims) == {"T", "H"}
    (k,) = result.report["kernels"]
    r = result.plan.rows_per_cta
    assert contract.grid(k, {"T": 7, "H": 3, "D": 128}) == (-(-21 // r), 1, 1)
    assert [p["name"] for p in k["params"] if p["kind"] == "dim"] == ["T", "H"]


def test_three_indices_compile(tmp_path):
    spec = instantiate(parse_kfc(BTH, str(tmp_path / "bth.kfc")), {"T": "bf16"})
    result = compile_op(spec, parse_target("sm_90a"), shape={"D": 64}, verify_each=True)
    assert set(result.dynamic_dims) == {"B", "S", "H"}


def test_a_loop_not_from_zero_is_left_alone(tmp_path):
    text = HEADNORM.replace("parallel t in 0..T, h in 0..H", "parallel t in 1..T, h in 0..H").split("check")[0]
    spec = parse_kfc(text, str(tmp_path / "off.kfc"))
    ctx = PassContext(parse_target("sm_90a"))
    out = PassManager(parse_pipeline("linearize"), ctx).run(spec.func)
    assert print_ir(out) == print_ir(spec.func)
