"""Sums across a parallel loop (`dw[:] += ...`, rmsnorm_bwd's weight gradient): the front end's
rules, the IR's (results of tile.parallel and gpu.launch), the interpreter's semantics, the row
passes under --verify-each, a planted broken pass, the two-kernel launch contract with its
workspace, and the generated code of both kernels."""

import re
import uuid
from typing import ClassVar

import attrs
import numpy as np
import pytest

from kfc.compile import compile_op
from kfc.diagnostics import KfcError, VerifyError
from kfc.frontend import parse_kfc
from kfc.ir import verify
from kfc.ir.gpu_ops import LaunchOp
from kfc.ir.interpreter import run
from kfc.ir.tile_ops import ParallelOp, StoreOp, YieldOp

from kfc.passes import PASSES, ROW_PIPELINE, PassError, VerifyEach
from kfc.passes.base import Pass, register_pass
from kfc.runtime import contract
from kfc.model.target import parse_target
from tests.pipelines import kernel, ops_of, run_pipeline

COLSUM = """
op colsum(x: f32[M, N]) -> (s: f32[N], y: f32[M, N]) {
  parallel m in 0..M {
    xr = x[m, :]
    y[m, :] = xr * 2.0
    s[:] += xr
    s += xr * xr
  }
}
"""


def lower(text, dtypes=None):
    return parse_kfc(text, "t.kfc", dtypes).func


def test_plus_equals_makes_a_loop_result_stored_after_the_loop():
    f = lower(COLSUM)
    (loop,) = [op for op in f.body.ops if isinstance(op, ParallelOp)]
    assert loop.reduce == ("sum",) and len(loop.results) == 1  # two += into s add up in the body
    assert isinstance(loop.body.ops[-1], YieldOp)
    store = f.body.ops[-1]
    assert isinstance(store, StoreOp) and store.operands[0] is loop.results[0]
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    out = run(f, {"x": x}, {"M": 5, "N": 7})
    np.testing.assert_allclose(out["s"], (x + x * x).sum(0), rtol=1e-5)
    np.testing.assert_allclose(out["y"], 2 * x)


@pytest.mark.parametrize("body, message", [
    ("s[:] += x[0, :]", "outside a parallel loop"),
    ("parallel m in 0..M { for i in 0..2 { s[:] += x[m, :] } }", "inside a for loop"),
    ("parallel m in 0..M { x[:, :] += x }", "'x' is not an output"),
    ("parallel m in 0..M { s[0:4] += x[m, 0:4] }", "index it with ':' in every dim"),
    ("parallel m in 0..M { s[:] += 1.0 }", "sums f32 values, not a number"),
    ("parallel m in 0..M { s[:] += i32(x[m, :]) }", "sums f32 values, not i32"),
])
def test_plus_equals_errors_say_what_and_where(body, message):
    text = f"op bad(x: f32[M, N]) -> (s: f32[N]) {{\n  {body}\n}}\n"
    with pytest.raises(KfcError, match=re.escape(message)) as info:
        lower(text)
    assert info.value.span is not None and info.value.span.line == 2


def test_a_lower_precision_output_takes_the_f32_sum_cast_once():
    text = "op cs<T: bf16 | f32>(x: T[M, N]) -> (s: T[N]) {\n parallel m in 0..M { s[:] += f32(x[m, :]) }\n}\n"
    f = lower(text, {"T": "bf16"})
    assert [op.NAME for op in f.body.ops[-2:]] == ["tile.cast", "tile.store"]


def _loop(f):
    return next(op for op in f.body.ops if isinstance(op, (ParallelOp, LaunchOp)))


def test_the_verifier_checks_loop_results():
    f = lower(COLSUM)
    loop = _loop(f)

    def with_loop(new):
        return attrs.evolve(f, regions=(attrs.evolve(f.body, ops=tuple(new if o is loop else o for o in f.body.ops)),))

    with pytest.raises(VerifyError, match="as many reduce kinds"):
        verify(with_loop(attrs.evolve(loop, reduce=())))
    with pytest.raises(VerifyError, match="is not one of sum"):
        verify(with_loop(attrs.evolve(loop, reduce=("mean",))))
    no_yield = attrs.evolve(loop.body, ops=loop.body.ops[:-1])
    with pytest.raises(VerifyError, match="ends with a tile.yield"):
        verify(with_loop(attrs.evolve(loop, regions=(no_yield,))))


def test_a_launch_that_sums_across_rows_is_persistent():
    spec, f = kernel("rmsnorm_bwd", 4096)
    g, _ = run_pipeline(f, "canonicalize,tile", check=spec.check)
    launch = _loop(g)
    assert launch.persistent and launch.results and launch.sums_in == "registers"
    bad = attrs.evolve(launch, persistent=False)
    with pytest.raises(VerifyError, match="must be persistent"):
        verify(attrs.evolve(g, regions=(attrs.evolve(g.body, ops=tuple(bad if o is launch else o
                                                                         for o in g.body.ops)),)))


@pytest.mark.parametrize("n", [7, 4096, 65536])
def test_the_row_pipeline_keeps_the_sums_under_verify_each(n):
    spec, f = kernel("rmsnorm_bwd", n, "f32")
    ve = VerifyEach({"N": n, "M": 5}, spec.check)
    g, _ = run_pipeline(f, ROW_PIPELINE, check=spec.check, verify_each=ve)
    (launch,) = ops_of(g, LaunchOp)
    assert launch.results and isinstance(launch.body.ops[-1], YieldOp)


def test_a_pass_that_drops_a_row_from_the_sum_is_caught_by_verify_each():
    """Well formed but wrong: the contribution of each row is halved."""
    from kfc.ir.core import Value
    from kfc.ir.dtypes import DType
    from kfc.ir.tile_ops import BINARY_CLASSES, BroadcastOp, ConstOp
    from kfc.ir.types import TensorType

    name = f"test-broken-sums-{uuid.uuid4().hex[:8]}"

    @attrs.frozen
    class Broken(Pass):
        NAME: ClassVar[str] = name
        SUMMARY: ClassVar[str] = "halve what each row adds to the sums"

        def run(self, func, ctx):
            loop = _loop(func)
            *ops, y = loop.body.ops
            half = ConstOp(results=(Value(TensorType(DType.F32), "half"),), value=0.5)
            t = y.operands[0].type
            scaled = Value(t, "scaled")
            b = Value(t, "b")
            ops += [half, BroadcastOp(operands=(half.result,), results=(b,)),
                    BINARY_CLASSES["mul"](operands=(y.operands[0], b), results=(scaled,)),
                    attrs.evolve(y, operands=(scaled,))]
            new = attrs.evolve(loop, regions=(attrs.evolve(loop.body, ops=tuple(ops)),))
            return attrs.evolve(func, regions=(attrs.evolve(func.body, ops=tuple(new if o is loop else o
                                                                                   for o in func.body.ops)),))

    register_pass(Broken)
    try:
        spec, f = kernel("rmsnorm_bwd", 256, "f32")
        verify(run_pipeline(f, f"canonicalize,{name}", check=spec.check)[0])  # it verifies
        ve = VerifyEach({"N": 256, "M": 3}, spec.check)
        with pytest.raises(PassError, match=f"pass {name} changed the results"):
            run_pipeline(f, f"canonicalize,{name}", check=spec.check, verify_each=ve)
    finally:
        PASSES.pop(name, None)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_rmsnorm_bwd_compiles_to_a_row_kernel_and_a_sums_kernel(target):
    from kfc.frontend import load_kfc

    spec = load_kfc("kernels/rmsnorm_bwd.kfc")
    result = compile_op(spec, parse_target(target), shape={"N": 4096}, verify_each=True)
    first, sums = result.report["kernels"]
    ws = [p for p in first["params"] if p["kind"] == "workspace"]
    assert ws == [p for p in sums["params"] if p["kind"] == "workspace"]
    assert ws[0]["shape"] == ["kfc_groups", "4096"] and first["persistent"]
    assert [p["name"] for p in sums["params"]] == ["kfc_ws0", "dw", "kfc_groups"]
    dims = contract.defined_dims(first, {"M": 100}, grid_x=264)
    assert dims["kfc_groups"] == 264 and contract.workspace_shape(ws[0], dims) == (264, 4096)
    assert contract.evaluate(sums["grid"][0], dims) == 128
    assert result.kernel.report.spills == 0
    cu = result.kernel.cu
    assert f"{first['name']}(" in cu and f"{sums['name']}(" in cu
    # each row slot writes its partial; the partials are added in an order fixed by their count
    assert "kfc_ws0[kfc_group * 4096LL +" in cu
    assert re.search(r"for \(long long g = kfc_q; g < dim_kfc_groups; g \+= 8\)", cu)
    assert "atomic" not in cu
    with pytest.raises(KfcError, match="compiles to 2 kernels"):
        contract.single_kernel(result.report, "rmsnorm_bwd")


def test_rows_held_in_registers_keep_long_sums_in_shared_memory():
    """262143 bf16 elements are not a 16-byte multiple: the rows stay in registers, and the
    sums move to shared memory so that nothing spills."""
    from kfc.frontend import load_kfc

    result = compile_op(load_kfc("kernels/rmsnorm_bwd.kfc"), parse_target("sm_90a"), shape={"N": 262143})
    assert "cp.async.bulk" not in result.kernel.cu and "kfc_sums[" in result.kernel.cu
    assert result.kernel.report.spills == 0 and result.plan.smem_dynamic > 0


def test_ptxas_reports_of_several_kernels_add_their_spills():
    from kfc.codegen.toolchain import parse_ptxas_report

    log = ("ptxas info    : Function properties for a\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 24 registers, used 1 barriers, 1024 bytes smem\n"
           "ptxas info    : Function properties for b\n    8 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 80 registers, used 1 barriers, 128 bytes smem\n")
    rep = parse_ptxas_report(log)
    assert (rep.registers, rep.spill_stores, rep.spill_loads, rep.smem_bytes, rep.stack_bytes) == (80, 12, 8, 1024, 8)



def test_kfc_compile_says_the_op_launches_a_second_kernel(tmp_path, capsys):
    from kfc.cli import main

    assert main(["compile", "kernels/rmsnorm_bwd.kfc", "--target", "sm_90a", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "persistent" in out and "then      kfc_kernel_rmsnorm_bwd_sums: " in out


@pytest.mark.parametrize("body, message", [
    ("parallel m in 0..M { s[:] += x[m, :]\n s[:] = x[m, :] }", "is summed across a parallel loop by +="),
    ("parallel m in 0..M { s[:] = x[m, :]\n s[:] += x[m, :] }", "is read or stored at"),
    ("parallel m in 0..M { s[:] += x[m, :]\n t = s[0] }", "is summed across a parallel loop by +="),
    ("parallel m in 0..M { s[:] += x[m, :] }\n parallel m in 0..M { s[:] += x[m, :] }",
     "already summed by += in another parallel loop"),
])
def test_an_output_summed_by_plus_equals_is_used_nowhere_else(body, message):
    with pytest.raises(KfcError, match=re.escape(message)):
        lower(f"op bad(x: f32[M, N]) -> (s: f32[N]) {{\n  {body}\n}}\n")


def test_plus_equals_into_an_integer_output_is_refused():
    with pytest.raises(KfcError, match="sums into a floating-point output; 's' is i32"):
        lower("op bad(x: f32[M, N]) -> (s: i32[N]) {\n parallel m in 0..M { s[:] += x[m, :] }\n}\n")


def test_sums_survive_linearize_over_several_indices():
    text = ("op hs(x: f32[T, H, D]) -> (y: f32[T, H, D], s: f32[D]) {\n"
            "  parallel t in 0..T, h in 0..H {\n    y[t, h, :] = x[t, h, :] * 2.0\n    s[:] += x[t, h, :]\n  }\n}\n")
    f = lower(text)
    from kfc.passes.linearize import Linearize

    g, _ = run_pipeline(f, Linearize.NAME)
    (loop,) = [op for op in g.body.ops if isinstance(op, ParallelOp)]
    assert loop.rank == 1 and loop.reduce == ("sum",)
    x = np.random.default_rng(1).standard_normal((3, 2, 5)).astype(np.float32)
    out = run(g, {"x": x}, {"T": 3, "H": 2, "D": 5})
    np.testing.assert_allclose(out["s"], x.sum((0, 1)), rtol=1e-5)


def test_ops_after_a_launch_without_sums_still_reach_the_code_generator():
    """A whole-tensor store after the row loop is not silently dropped."""
    from kfc.codegen.cuda import CodegenError

    text = ("op n(x: f32[M, N], w: f32[N]) -> (y: f32[M, N], z: f32[N]) {\n"
            "  parallel m in 0..M { y[m, :] = x[m, :] * 2.0 }\n  z[:] = w * 2.0\n}\n")
    spec = parse_kfc(text, "n.kfc")
    with pytest.raises(CodegenError, match="tile.load after the row loop") as info:
        compile_op(spec, parse_target("sm_90a"), shape={"N": 64})
    assert info.value.span is not None and info.value.span.line == 3


def test_the_runtime_prepares_both_kernels_and_their_workspace(monkeypatch):
    """KfcKernel.prepare on the CPU, the driver stood in for: the row kernel's persistent grid
    (a wave of 132 SMs x 3 CTAs) fixes the number of partials, the workspace and the second
    kernel's dim; both launches get their slots."""
    import types

    import torch

    from kfc.frontend import load_kfc
    from kfc.runtime import kernel as runtime_kernel
    from kfc.runtime import launcher

    spec = load_kfc("kernels/rmsnorm_bwd.kfc", {"T": "bf16"})
    report = compile_op(spec, parse_target("sm_90a"), shape={"N": 4096}).report
    calls = []

    class Function:
        function = 1

        def __init__(self, name):
            self.name = name

        def allow_dynamic_smem(self, nbytes):
            calls.append((self.name, "smem", nbytes))

        def max_active_blocks(self, block, smem):
            calls.append((self.name, "occupancy", block, smem))
            return 3

        def allow_large_clusters(self):
            calls.append((self.name, "clusters"))

        def sibling(self, name):
            return Function(name)

    class Launch:
        def __init__(self, function, context, grid, block, cluster, smem, slot_types, device_index, name):
            self.grid, self.name, self.slots = grid, name, launcher.ArgSlots(slot_types)

    monkeypatch.setattr(launcher, "PreparedLaunch", Launch)
    monkeypatch.setattr(launcher, "primary_context", lambda index: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(multi_processor_count=132))
    k = runtime_kernel.KfcKernel(spec)
    x = torch.zeros(1000, 4096, dtype=torch.bfloat16)
    bound = {"x": x, "w": torch.zeros(4096), "dout": x, "rstd": torch.zeros(1000)}
    first, second = report["kernels"]
    call = k.prepare(Function(first["name"]), report, bound, {"M": 1000, "N": 4096}, 0, False)
    assert call.launch.grid == (396, 1, 1) and [s.launch.grid for s in call.followers] == [(128, 1, 1)]
    assert call.workspaces == {"kfc_ws0": ((396, 4096), torch.float32)}
    (stage,) = call.followers
    assert stage.launch.name == second["name"] and stage.workspaces == [("kfc_ws0", 0)]
    assert stage.outputs == [("dw", 1)] and stage.fixed == {2: 396}
    assert (first["name"], "occupancy", 256, first["smem_dynamic_bytes"]) in calls
    assert not call.can_be_native((x, x, x, x), None)
