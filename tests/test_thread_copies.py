"""Staged rows copied by the threads (stage-rows{copy=threads}, gpu.copy_async_arrive): each
thread copies its chunks with cp.async and the copy's landing is an arrival on the row's
mbarrier. Its semantics and protocol checks, the pass under --verify-each, a planted broken
barrier caught, the generated code (cp.async, not the bulk copy engine, in the SASS for sm_90a
and sm_100a), and the factory's choice between the two copies."""

import re

import attrs
import numpy as np
import pytest

from kfc.codegen.cuda import CodegenError, generate_cuda
from kfc.codegen.toolchain import compile_cuda, disassemble
from kfc.diagnostics import VerifyError
from kfc.ir import parse_ir, print_ir, verify
from kfc.ir.func import FuncOp
from kfc.ir.interpreter import run
from kfc.ir.smem_ops import CopyAsyncArriveOp, CopyAsyncOp, ExpectTxOp, HazardError, MbarrierAllocOp, SmemAllocOp
from kfc.passes import ROW_PIPELINE, VerifyEach
from kfc.model.target import parse_target
from tests.pipelines import kernel, ops_of, run_pipeline
from tests.test_stage_rows import COPY, EXPECT, STAGED, WAIT, interpret_unverified, x_rows

ARRIVE = COPY.replace("gpu.copy_async ", "gpu.copy_async_arrive ")
THREADS = ROW_PIPELINE.replace("stage-rows", "stage-rows{min_bytes=0,copy=threads,heavy=stage}")


def program(expect="", copy=ARRIVE, wait=WAIT, arrivals=1):
    text = STAGED.replace("EXPECT", expect).replace("COPY", copy).replace("WAIT", wait)
    if arrivals != 1:
        text = text.replace("gpu.mbarrier_alloc :", f"gpu.mbarrier_alloc {{arrivals = {arrivals}}} :")
    return parse_ir(text)


def test_a_copy_by_the_threads_is_its_own_arrival():
    f = verify(program())
    assert print_ir(parse_ir(print_ir(f))) == print_ir(f)
    x = x_rows()
    np.testing.assert_array_equal(run(f, {"x": x})["y"], 2 * x)


@pytest.mark.parametrize("case, kwargs, message", [
    ("announced as well", dict(expect=EXPECT), "%bar already counted its 1 arrival(s) in this phase"),
    ("an arrival short", dict(arrivals=2), "deadlock: waits on %bar, which counts 2 arrival(s), but 1 arrive"),
    ("bytes with no copy of bytes", dict(expect=EXPECT, arrivals=2), "announced 256 byte(s) but its copies carry 0"),
])
def test_the_arrivals_of_copies_by_the_threads_are_checked_statically_and_dynamically(case, kwargs, message):
    f = program(**kwargs)
    with pytest.raises(VerifyError, match=re.escape(message)):
        verify(f)
    with pytest.raises(HazardError, match=re.escape(message.split(" in this phase")[0])):
        interpret_unverified(f, x_rows())


@pytest.mark.parametrize("name, rows", [("rmsnorm", 1), ("softmax", 1), ("layernorm", 1), ("rmsnorm_residual", 2),
                                        ("layernorm_bwd_dx", 2)])
def test_stage_rows_copy_threads_keeps_the_results(name, rows):
    spec, f = kernel(name, 512)
    ve = VerifyEach({"N": 512, "M": 3}, spec.check, seeds=(0, 1))
    g, _ = run_pipeline(f, THREADS, check=spec.check, verify_each=ve)
    copies = ops_of(g, CopyAsyncOp)
    assert len(copies) == rows == len(ops_of(g, SmemAllocOp)) and all(isinstance(c, CopyAsyncArriveOp) for c in copies)
    assert not ops_of(g, ExpectTxOp)
    (bar,) = ops_of(g, MbarrierAllocOp)
    assert bar.arrivals == rows


def test_a_barrier_that_counts_one_arrival_for_two_copies_is_caught():
    """A planted broken staging: two rows copied by the threads on a barrier of one arrival."""
    spec, f = kernel("rmsnorm_residual", 512)
    g, _ = run_pipeline(f, "canonicalize,cse,dce,stage-rows{min_bytes=0,copy=threads,heavy=stage}", check=spec.check)

    def one_arrival(block):
        ops = []
        for op in block.ops:
            if isinstance(op, MbarrierAllocOp):
                op = attrs.evolve(op, arrivals=1)
            if op.regions:
                op = attrs.evolve(op, regions=tuple(attrs.evolve(r, ops=one_arrival(r)) for r in op.regions))
            ops.append(op)
        return tuple(ops)

    broken = attrs.evolve(g, regions=(attrs.evolve(g.body, ops=one_arrival(g.body)),))
    assert isinstance(broken, FuncOp)
    with pytest.raises(VerifyError, match=r"already counted its 1 arrival\(s\)"):
        verify(broken)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name, n, copies", [("softmax", 65536, 1), ("rmsnorm_residual", 65544, 2)])
def test_copies_by_the_threads_compile_to_cp_async_on_the_mbarrier(name, n, copies, target):
    spec, f = kernel(name, n)
    g, _ = run_pipeline(f, THREADS.replace("stage-rows{min_bytes=0,", "stage-rows{"), target=parse_target(target),
                        check=spec.check)
    code, plan = generate_cuda(g)
    assert "cp.async.cg.shared.global" in code and "cp.async.bulk" not in code
    assert code.count("cp.async.mbarrier.arrive.noinc") == copies
    assert f"mbarrier.init.shared::cta.b64 [%0], {copies * plan.block};" in code
    assert ("if (j < " in code) == (n % (8 * plan.block * plan.cluster) != 0)  # a ragged last chunk is tested
    k = compile_cuda(code, target)
    assert k.report.spills == 0
    sass = disassemble(k.cubin)
    assert "LDGSTS" in sass and "UBLKCP" not in sass


def test_two_stages_copy_the_next_row_by_the_threads():
    spec, f = kernel("rmsnorm_bwd", 1024, "f32")
    pipe = THREADS.replace("tile,", "tile{stages=2,rows=4},")
    ve = VerifyEach({"N": 1024, "M": 5}, spec.check)
    g, _ = run_pipeline(f, pipe, check=spec.check, verify_each=ve)
    assert all(op.stages == 2 for op in ops_of(g, MbarrierAllocOp))
    code, _ = generate_cuda(g)
    assert "kfc_valid0" in code and "kfc_sn = (kfc_s + 1) % 2" in code
    # the first rows' before the loop, the next rows' in it: twice per copy
    assert code.count("cp.async.mbarrier.arrive.noinc") == 2 * len(ops_of(g, CopyAsyncOp))
    assert compile_cuda(code, "sm_90a").report.spills == 0


def test_chunks_cp_async_cannot_move_are_a_clear_error():
    spec, f = kernel("softmax", 65536)
    g, _ = run_pipeline(f, THREADS.replace("tile,", "tile{vec=1,threads=1024,cluster=16},"), check=spec.check)
    with pytest.raises(CodegenError, match=r"cp.async copies 4, 8 or 16 aligned bytes") as info:
        generate_cuda(g)
    assert "stage-rows{copy=bulk}" in str(info.value.hint)


def test_the_factory_chooses_who_copies_a_staged_row():
    from kfc.factory.space import SearchSpace

    space = SearchSpace(65536)
    default = space.default()
    assert default["stage"] and default["copy"] == "bulk"
    threads = dict(default, copy="threads")
    text = space.pipeline(threads)
    assert "stage-rows{min_bytes=0,copy=threads}" in text and space.config_of(text) == threads
    assert space.config_of(ROW_PIPELINE) == default
    assert not space.valid(dict(default, stage=False, copy="threads"))  # nothing copied: one spelling
    assert SearchSpace(4095).choices()["copy"] == ("bulk",)  # rows the copies cannot move
