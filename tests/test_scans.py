"""Scans along a row in a row kernel, on the CPU: the op of examples/scans.kfc compiles for
sm_90a and sm_100a under --verify-each at short, odd and longer rows without spills, through a
segmented shuffle scan (and shared memory across warps); kernels without scans keep their
prelude; what codegen cannot scan is a clear error."""

import re

import pytest

from kfc.compile import compile_op
from kfc.diagnostics import KfcError
from kfc.frontend import load_kfc, parse_kfc
from kfc.passes import ROW_PIPELINE
from kfc.model.target import parse_target
from tests.example_ops import OPS


def compile_scan(tmp_path, text=OPS["scans"], target="sm_90a", pipeline=None, verify_each=True, **shape):
    spec = parse_kfc(text, str(tmp_path / "scans.kfc"), {"T": "bf16"} if "<T:" in text else None)
    return compile_op(spec, parse_target(target), pipeline=pipeline, shape=shape, verify_each=verify_each)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", [7, 1000, 4096, 16384])
def test_scans_compile_under_verify_each(tmp_path, target, n):
    r = compile_scan(tmp_path, target=target, N=n)
    assert r.kernel.report.spills == 0 and r.plan.cluster == 1
    cu = r.kernel.cu
    assert "shfl.sync.up.b32" in cu and cu.count("kfc_shfl_up_") > 3
    if r.plan.block // r.plan.rows_per_cta > 32:  # more than a warp a row: the warps' totals cross shared memory
        assert re.search(r"__shared__ (float|int) kfc_scan\d+_w\[2\]", cu)


def test_rows_of_fewer_than_32_threads_scan_in_segments(tmp_path):
    r = compile_scan(tmp_path, N=7)
    threads = r.plan.block // r.plan.rows_per_cta
    assert threads < 32
    assert f", {(32 - threads) << 8})" in r.kernel.cu, "shfl.up's segment mask keeps each row's lanes apart"


def test_kernels_without_scans_do_not_carry_the_scan_shuffles():
    r = compile_op(load_kfc("kernels/rmsnorm.kfc"), parse_target("sm_90a"), shape={"N": 4096})
    assert "kfc_shfl_up_" not in r.kernel.cu


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", [7, 1000, 4095, 4096, 16384])
def test_suffix_scans_compile_under_verify_each(tmp_path, target, n):
    """Reverse scans meet the elements past the row's end first: those read as the identity
    (a guard per element where the row does not split evenly). Rows of 16384 (three scans of
    32 elements a thread) build without spills: the warps' totals are read a few at a time."""
    spec = parse_kfc(OPS["suffix_scans"], str(tmp_path / "suffix.kfc"))
    r = compile_op(spec, parse_target(target), shape={"N": n}, verify_each=True)
    assert r.kernel.report.spills == 0
    assert "shfl.sync.down.b32" in r.kernel.cu and "for (int e = " in r.kernel.cu
    masked = re.search(r"\? v\d+\[e \* \d+ \+ k\] : \((float|int)\)", r.kernel.cu)
    assert bool(masked) == (n not in (4096, 16384)), "these split evenly over the tile; the others end inside a chunk"


def test_a_scan_of_16_bit_floats_asks_for_a_cast(tmp_path):
    text = """
op halfscan(x: bf16[M, N]) -> (y: bf16[M, N]) {
  parallel m in 0..M {
    y[m, :] = cumsum(x[m, :])
  }
}
"""
    with pytest.raises(KfcError, match="codegen scans f32 or i32 rows, not bf16") as info:
        compile_scan(tmp_path, text, verify_each=False, N=1000)
    assert "cumsum(f32(x))" in info.value.hint


def test_a_scanned_row_is_not_split_across_a_cluster(tmp_path):
    pipe = ROW_PIPELINE.replace("tile", "tile{cluster=2}", 1)
    with pytest.raises(KfcError, match="a scanned row runs in one CTA"):
        compile_scan(tmp_path, pipeline=pipe, N=4096)


def test_a_scanned_row_too_long_for_one_cta_says_how_to_read_it(tmp_path):
    whole = ROW_PIPELINE.replace("chunk-rows,", "")  # the default reads such a row in chunks
    with pytest.raises(KfcError, match="at most 128 fit in registers") as info:
        compile_scan(tmp_path, pipeline=whole, verify_each=False, N=200000)
    assert "stays in one CTA" in info.value.hint and "for loop" in info.value.hint
    assert "chunk-rows" in info.value.hint
