"""An integer floor division or remainder by a constant power of two is written as an arithmetic
shift or a mask (kfc.codegen.elementwise_rules): the floor for negative values too, as the
interpreter's `//` and `%`. Other divisors keep kfc_floordiv. What the GPU computes is checked
against the interpreter by tests/gpu/test_final_ir_gpu.py (`divisions`, negative values included)."""

import re

from kfc.ir.multiples import power_of_two
from kfc.compile import compile_op
from kfc.frontend import parse_kfc
from kfc.model.target import parse_target

DIVISIONS = """
op divisions(x: i32[M, N], s: i64[M]) -> (y: i32[M, N], z: i64[M]) {
  parallel m in 0..M {
    y[m, :] = x[m, :] // 16 + x[m, :] % 8 - x[m, :] // 12 + x[m, :] % 1
    z[m] = s[m] // 4 + s[m] % 1099511627776 + s[m] // 1
  }
}
"""


def test_powers_of_two_and_only_they_are_found():
    assert [power_of_two(n) for n in (1, 2, 16, 1 << 40)] == [0, 1, 4, 40]
    assert [power_of_two(n) for n in (None, 0, -16, 12, 3)] == [None] * 5


def test_a_division_by_a_power_of_two_is_a_shift_and_its_remainder_a_mask():
    cu = compile_op(parse_kfc(DIVISIONS), parse_target("sm_90a"), shape={"N": 4096}).kernel.cu
    for written in (r">> 4\)", r"& 7\)", r">> 2\)", r"& 1099511627775LL\)", r">> 0\)", r"& 0\)"):
        assert re.search(written, cu), written
    assert len(re.findall(r"kfc_floordiv\(v", cu)) == 1  # x // 12 alone
    assert not re.search(r"kfc_floormod\(v", cu)
