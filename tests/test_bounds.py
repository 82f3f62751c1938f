"""kfc.ir.bounds: a tile kernel leaves out the bounds tests its IR makes true, and only those.
What the GPU computes with them left out is checked on the GPU machine (tests/gpu/test_kda_gpu.py,
tests/gpu/test_final_ir_gpu.py)."""

import re

from kfc.compile import compile_op
from kfc.frontend import load_kfc, parse_kfc
from kfc.model.target import parse_target

# b and h from one linear CTA index m over 0..B*H: h = m rem H lies in [0, H), b = m div H is
# nonnegative but not known below B; r comes from memory, so nothing is known of it
GATHERED = """
op gathered(x: f32[R, 16, 32], idx: i64[B], s: f32[H]) -> (y: f32[B, H, 16, 32]) {
  parallel b in 0..B, h in 0..H {
    r = idx[b]
    y[b, h, :, :] = cumsum(x[r, :, :], axis=0) * s[h]
  }
}
check {
  inputs = {idx: randint(0, 5)}
  shapes = [{R: 5, B: 3, H: 2}]
}
"""


def test_an_index_the_loop_bounds_is_not_tested_and_one_from_memory_is():
    r = compile_op(parse_kfc(GATHERED), parse_target("sm_90a"), shape={"R": 5})
    cu = r.kernel.cu
    assert "p_s[(long long)(v" in cu and "< dim_H" not in cu  # s[h], y[b, h]: h in [0, H) by construction
    assert "< dim_B" in cu and not re.search(r"\(long long\)\(v\d+\) >= 0 && \(long long\)\(v\d+\) < dim_B", cu)
    assert re.search(r"\(long long\)\(v\d+\) >= 0 && \(long long\)\(v\d+\) < 5LL", cu)  # x[r]: both kept


def test_kdas_kernels_test_their_rows_but_not_their_head():
    shape = {"T": 4096, "K": 128, "V": 128}
    prepare = compile_op(load_kfc("kernels/kda_prepare_flashkda.kfc", {"C": "16"}), parse_target("sm_90a"),
                         shape=shape).kernel.cu
    recurrence = compile_op(load_kfc("kernels/kda_recurrence.kfc", {"C": "16", "SD": "f32", "WD": "f32"}),
                            parse_target("sm_90a"), shape=shape).kernel.cu
    for cu in (prepare, recurrence):
        assert "< dim_H" not in cu  # the head: m rem H of the linear CTA index m over 0..(...) * H
        assert re.search(r"\) < \(long long\)\((v|kfc_c)\d+\)", cu)  # a row against its sequence's end: kept
    assert "< dim_T" in prepare and "< 4096LL" in recurrence  # and against the tensor's rows
