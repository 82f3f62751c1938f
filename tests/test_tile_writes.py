"""How a tile kernel's phases write tiles (kfc.codegen.tile_writes): four consecutive elements
of a tile's last axis at a time, a load of a tensor's whole last axis one access for them, a
group stored into shared memory or a tensor in one access; elsewhere one element at a time.
What the GPU computes is compared with the interpreter on the GPU machine
(tests/gpu/test_final_ir_gpu.py, tests/gpu/test_kda_gpu.py)."""

import re

import pytest

from kfc.compile import compile_op
from kfc.frontend import parse_kfc
from kfc.model.target import parse_target

SOURCE = """
op scale(x: {x_type}[B, R, N], s: f32[B]) -> (y: {y_type}[B, R, N]) {{
  parallel b in 0..B {{
    t = f32(x[b, :, :]) * s[b]
    y[b, :, :] = {y_type}(t * sum(t))
  }}
}}
"""


def _cu(tmp_path, x_type="f32", y_type="f32", n=128, target="sm_90a"):
    spec = parse_kfc(SOURCE.format(x_type=x_type, y_type=y_type), str(tmp_path / "scale.kfc"))
    r = compile_op(spec, parse_target(target), shape={"B": 3, "R": 16, "N": n})
    assert not r.kernel.report.spills
    return r.kernel.cu


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_a_whole_last_axis_moves_sixteen_bytes_an_access(tmp_path, target):
    cu = _cu(tmp_path, target=target)
    # x is read once per four elements, its bounds tested once for them; y written likewise
    assert len(re.findall(r"reinterpret_cast<const uint4\*>\(p_x \+ ", cu)) == 1 and "p_x[" not in cu
    assert re.search(r"reinterpret_cast<uint4\*>\(&p_y\[", cu) and not re.search(r"\bp_y\[[^;]*\] = ", cu)
    # a quarter as many iterations: 16 x 128 elements in 512 groups, two a thread, no remainder
    assert re.search(r"for \(int (kfc_j\d+) = 0; \1 < 2; \+\+\1\)", cu)


def test_narrow_elements_take_a_narrower_access(tmp_path):
    cu = _cu(tmp_path, x_type="bf16", y_type="bf16")
    # four bf16 are eight bytes
    assert "reinterpret_cast<const uint2*>(p_x + " in cu and "reinterpret_cast<uint2*>(&p_y[" in cu


def test_a_last_axis_four_does_not_divide_moves_an_element_at_a_time(tmp_path):
    cu = _cu(tmp_path, n=7)
    assert "uint4" not in cu and "uint2" not in cu and "p_x[" in cu and "p_y[" in cu


def test_a_slice_of_the_last_axis_is_read_an_element_at_a_time(tmp_path):
    """A slice may start anywhere: its groups are not known to be aligned."""
    spec = parse_kfc("""
op window(x: f32[B, 16, 64], a: i32[B]) -> (y: f32[B, 16, 16]) {
  parallel b in 0..B {
    t = x[b, :, a[b]:a[b] + 16]
    y[b, :, :] = t * sum(t)
  }
}
""", str(tmp_path / "window.kfc"))
    cu = compile_op(spec, parse_target("sm_90a"), shape={"B": 2}).kernel.cu
    assert "p_x[" in cu and "reinterpret_cast<const uint4*>(p_x" not in cu
    # y's own last axis is whole: its groups are stored in one access
    assert "reinterpret_cast<uint4*>(&p_y[" in cu


COLUMNS = """
op columns(x: f32[B, 16, 100]) -> (y: f32[B, 16, 100]) {{
  parallel b in 0..B, c in 0..4 {{
    c0 = c * 32{shift}
    t = x[b, :, c0:c0+32 limit {limit}]
    y[b, :, c0:c0+32 limit {limit}] = exp(t) + cumsum(t, axis=0)
  }}
}}
"""


@pytest.mark.parametrize("shift, limit, grouped", [("", "100", True), (" + 2", "100", False), ("", "99", False)])
def test_a_slice_of_the_last_axis_known_aligned_moves_a_group_an_access(tmp_path, shift, limit, grouped):
    """A block of columns whose start and limit are multiples of four (c0 = c * 32, the limit
    100) takes the whole axis's group accesses: each group lies wholly inside the tensor and
    the limit or wholly outside. Started two past, or limited at 99, it goes an element at a
    time."""
    spec = parse_kfc(COLUMNS.format(shift=shift, limit=limit), str(tmp_path / "columns.kfc"))
    cu = compile_op(spec, parse_target("sm_90a"), shape={"B": 2}).kernel.cu
    assert ("reinterpret_cast<const uint4*>(p_x + " in cu) == grouped and ("p_x[" in cu) != grouped
    assert ("reinterpret_cast<uint4*>(&p_y[" in cu) == grouped
