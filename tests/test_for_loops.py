"""Sequential `for` loops inside a row kernel, on the CPU: each op of examples/
compiles for sm_90a and sm_100a with the interpreter checking every pass (--verify-each), with
no spills; the generated code keeps every chunk's access inside its tensor (a chunk past the
end, a start read from memory, a limit), alternates the reduction slots per iteration, and
refuses what it cannot run (a cluster or several rows a CTA, a step of 0)."""

import re

import pytest

from kfc.compile import compile_op
from kfc.diagnostics import KfcError
from kfc.frontend import parse_kfc
from kfc.passes import ROW_PIPELINE
from kfc.model.target import parse_target
from tests.example_ops import CHUNKED, OPS

SHAPES = {"rowsum_chunked": [{"N": 4096}, {"N": 1000}, {"N": 7}],
          "rmsnorm_chunked": [{"N": 4096}, {"N": 1000}, {"N": 65537}],
          "fold": [{"N": 4096}, {"N": 1000}, {"N": 7}],
          "segsum": [{"T": 1000}, {"T": 7}],
          "group_max_sum": [{"N": 16384}, {"N": 5000}, {"N": 7}]}


def compile_text(tmp_path, name, text, target="sm_90a", dtypes=None, pipeline=None, verify_each=True, **shape):
    """Compiled as kfc compile does; --verify-each runs the interpreter at the check block's shapes."""
    spec = parse_kfc(text, str(tmp_path / f"{name}.kfc"), dtypes)
    return compile_op(spec, parse_target(target), pipeline=pipeline, shape=shape, verify_each=verify_each)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name", CHUNKED)
def test_chunked_ops_compile_under_verify_each(tmp_path, name, target):
    for shape in SHAPES[name]:
        r = compile_text(tmp_path, name, OPS[name], target, **shape)
        assert r.kernel.report.spills == 0, (name, shape)
        assert re.search(r"for \(long long kfc_k\d+ = ", r.kernel.cu), "the for loop is a loop in the kernel"
        assert r.plan.rows_per_cta == 1 and r.plan.cluster == 1


def test_every_chunk_access_is_bounded_by_its_tensor(tmp_path):
    r = compile_text(tmp_path, "rmsnorm_chunked", OPS["rmsnorm_chunked"], N=1000)
    accesses = [line for line in r.kernel.cu.splitlines() if "ld.global" in line or "st.global" in line]
    sliced = [a for a in accesses if "kfc_k" in a]
    # x in each loop, w (f32: two accesses of 16 bytes a chunk of 8), y
    assert len(sliced) == 5, accesses
    for line in sliced:
        # the chunk's start plus the element, unsigned, below the tensor's last dim
        assert re.search(r"\(unsigned long long\)\(\(long long\)\(kfc_k\d+\) \+ .*\) < \(unsigned long long\)\(1000LL\)",
                         line), line
    # vectors never straddle the end: 1000 = 8 x 125 bf16, an access of 8 elements at most
    assert r.plan and "ld.global.cs.v4.b32" in r.kernel.cu


def test_segments_with_loaded_bounds_and_a_limit(tmp_path):
    r = compile_text(tmp_path, "segsum", OPS["segsum"], T=1000)
    (load,) = [line for line in r.kernel.cu.splitlines() if "ld.global" in line and "p_x" in line]
    assert "< (unsigned long long)(1000LL)" in load and re.search(r"< \(long long\)\(v\d+\)", load), load
    assert ".v4" not in load and ".v2" not in load, "an unaligned start reads one element at a time"


def test_reduction_slots_alternate_per_iteration(tmp_path):
    r = compile_text(tmp_path, "rmsnorm_chunked", OPS["rmsnorm_chunked"], N=4096)
    cu = r.kernel.cu
    loop = cu[cu.index("for (long long kfc_k"):]
    body = loop[:loop.index("\n    }\n")]
    assert "bar.sync" in body and "kfc_phase ^= 1;" in body


def test_a_step_read_from_memory_is_checked_before_the_loop(tmp_path):
    text = """
op dynstep(x: f32[M, N], s: i32[1]) -> (y: f32[M]) {
  parallel m in 0..M {
    acc = 0.0
    for k in 0..N step s[0] carry (acc) {
      acc = acc + sum(x[m, k:k+256])
    }
    y[m] = acc
  }
}
"""
    r = compile_text(tmp_path, "dynstep", text, verify_each=False, N=1024)
    assert "<= 0) __trap();" in r.kernel.cu


@pytest.mark.parametrize("opts, message", [("cluster=2", "a chunked row runs in one CTA"),
                                           ("rows=4", "each CTA runs one row's iterations")])
def test_a_tile_the_loop_cannot_run_is_refused(tmp_path, opts, message):
    pipe = ROW_PIPELINE.replace("tile", f"tile{{{opts}}}", 1)
    with pytest.raises(KfcError, match=re.escape(message)):
        compile_text(tmp_path, "rowsum_chunked", OPS["rowsum_chunked"], pipeline=pipe, N=4096)


def test_a_for_loop_inside_a_for_loop_runs_from_the_outer_index(tmp_path):
    """The inner loop starts at the outer one's index: its chunks are aligned as the outer
    steps are (vectors of 8), and each loop is a loop in the kernel."""
    r = compile_text(tmp_path, "group_max_sum", OPS["group_max_sum"], N=16384)
    cu = r.kernel.cu
    outer, inner = re.findall(r"for \(long long (kfc_k\d+) = \(long long\)\((\w+)\)", cu)[:2]
    assert inner[1] == outer[0], "the inner loop starts at the outer loop's index"
    assert "ld.global.cs.v4.b32" in cu


SYNCED_IN_LOOP = """
op capped(x: f32[M, N]) -> (y: f32[M]) {
  parallel m in 0..M {
    acc = 0.0
    for k in 0..N step 8192 carry (acc) {
      s = sum(x[m, k:k+8192])
      acc = acc + s
    }
    y[m] = acc
  }
}
"""


@pytest.mark.parametrize("persistent", [False, True])
def test_a_loop_that_synchronises_ends_with_a_barrier(tmp_path, persistent):
    """The loop's reduction alternates its slots per iteration, but the next row (a persistent
    CTA's) or the enclosing loop's next iteration starts in a phase fixed by how many times the
    loop ran: the barrier after the loop ends every read of the slots before any is written again."""
    pipe = ROW_PIPELINE.replace("tile", "tile{persistent=true}", 1) if persistent else None
    r = compile_text(tmp_path, "capped", SYNCED_IN_LOOP, pipeline=pipe, verify_each=False, N=65536)
    cu = r.kernel.cu
    assert r.plan.block >= 64, "a CTA step, through shared slots"
    start = cu.index("for (long long kfc_k")
    end = cu.index("\n    }\n", start)
    assert "kfc_phase ^= 1;" in cu[start:end]
    assert cu[end:].lstrip("\n }").startswith('asm volatile("bar.sync 0;"')


def test_verify_each_without_a_check_block_samples_a_few_rows(tmp_path):
    """No check block and no --shape for the row count: the interpreter runs on 3 rows."""
    text = OPS["rowsum_chunked"].split("check {")[0]
    r = compile_text(tmp_path, "rowsum_nocheck", text, N=1000)
    assert r.kernel.report.spills == 0
