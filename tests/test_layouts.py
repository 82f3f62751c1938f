"""The layout core (kfc.ir.layouts): one arithmetic for where a row's elements live, shared by
the interpreter (numpy), codegen (C expressions) and the verifier; checked against each other
on random layouts and row lengths."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kfc.ir import layouts
from kfc.ir.dtypes import DType
from kfc.ir.types import Layout, MemSpace, TensorType

pow2 = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128])


def c_value(expr: str, **env) -> int:
    """A C integer expression of non-negative ints, in Python (C's / and % are Python's // and
    % there, its || and && Python's or and and)."""
    text = expr.replace("/", "//").replace("||", " or ").replace("&&", " and ")
    return int(eval(text, {}, env))  # noqa: S307 - test-only, our own text


@settings(max_examples=200, deadline=None, derandomize=True)
@given(t=pow2, v=st.sampled_from([1, 2, 4, 8]), c=st.sampled_from([1, 2, 4]), n=st.integers(1, 3000))
def test_numpy_and_c_agree_on_where_each_element_lives(t, v, c, n):
    row = layouts.Blocked1D(t, v, c)
    assert row.as_layout() == Layout("row", (("threads", t), ("vec", v), ("cluster", c)))
    placed = row.per_lane(np.arange(n, dtype=np.float32), -1.0)
    e = row.chunks(n)
    assert placed.shape == (t * c, e * v)
    seen = placed[placed >= 0].astype(int)
    assert sorted(seen.tolist()) == list(range(n)), "every element lives in exactly one register"
    for lane in {0, t * c - 1, (t * c) // 2}:
        for reg in {0, e * v - 1, v}:
            if reg >= e * v:
                continue
            j = row.element(reg // v, lane, reg % v)
            assert placed[lane, reg] == (j if j < n else -1)
            assert c_value(row.register_in_row_c("i", "g", n), i=reg, g=lane) == (j < n)
            # an expression for the register, as a scan passes it: parenthesised by the caller
            e_, k_ = divmod(reg, v)
            assert c_value(row.register_in_row_c(f"(e * {v} + k)", "g", n), e=e_, k=k_, g=lane) == (j < n)
            start = c_value(row.chunk_start_c("e", "g"), e=reg // v, g=lane)
            assert start == row.element(reg // v, lane)
            assert c_value(row.in_row_c("e", "g", n), e=reg // v, g=lane) == (start < n)
            assert c_value(row.register_element_c("i", "g"), i=reg, g=lane) == j
            # a staged row: CTA `rank` copies span e (threads·vec elements from cta_span_start)
            # to e·span in its buffer; thread t reads its chunk at cta_offset: the same element
            rank, thread, k = lane // t, lane % t, reg % v
            span_start = c_value(row.cta_span_start_c("e", "r"), e=reg // v, r=rank)
            at = c_value(row.cta_offset_c("e", "t"), e=reg // v, t=thread) + k
            assert span_start + (at - (reg // v) * row.span) == j
            assert 0 <= at - (reg // v) * row.span < row.span
    assert row.exact(n) == bool((placed >= 0).all())


def test_lanes_per_cta():
    lanes = layouts.Lanes(64, 2)
    x = np.arange(128)
    assert lanes.per_cta(x)[1, 0] == 64 and lanes.as_layout().kind == "lanes"


def test_of_reads_layouts_and_refuses_the_unknown():
    assert layouts.of(None) is None
    assert layouts.of(Layout("row", (("threads", 32), ("vec", 8), ("cluster", 1)))) == layouts.Blocked1D(32, 8, 1)
    with pytest.raises(ValueError, match="no layout kind #swizzled"):
        layouts.of(Layout("swizzled", ()))
    with pytest.raises(ValueError, match="#row takes threads, vec, cluster"):
        layouts.of(Layout("row", (("threads", 32),)))


def test_disagreement_names_the_parameter():
    row = layouts.Blocked1D(256, 8, 1).as_layout()
    assert layouts.disagreement(row, 256, 8, 1) is None
    assert layouts.disagreement(row, 128, 8, 1) == "threads = 256, but the gpu.launch it is in has threads = 128"
    assert "vec = 8" in layouts.disagreement(row, 256, 4, 1)
    assert layouts.disagreement(layouts.Lanes(256, 1).as_layout(), 256, 4, 1) is None  # lanes have no vec


# --- the layouts of shared memory, warpgroup MMA and tensor memory -----------------------------
def test_the_wgmma_accumulator_places_each_element_once_as_the_ptx_fragment_does():
    for g, n in [(1, 8), (1, 64), (2, 256)]:
        acc = layouts.WgmmaAccumulator(g)
        x = np.arange(64 * g * n).reshape(64 * g, n)
        held = acc.per_thread(x)
        assert held.shape == (128 * g, n // 2)
        assert sorted(held.ravel().tolist()) == list(range(x.size))
        t, r = np.meshgrid(np.arange(128 * g), np.arange(n // 2), indexing="ij")
        back_t, back_r = acc.owner(*acc.element(t, r))
        assert (back_t == t).all() and (back_r == r).all()
    acc = layouts.WgmmaAccumulator(1)
    # thread 0: rows 0 and 8, columns 0, 1 then 8, 9 (the m16n8 C fragment, d0..d5)
    assert [acc.element(0, r) for r in range(6)] == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9)]
    assert acc.element(5, 0) == (1, 2) and acc.element(32, 0) == (16, 0) and acc.element(127, 3) == (63, 7)


def test_the_wgmma_a_operand_follows_the_m16n8k16_a_fragment():
    a = layouts.WgmmaOperandA(1)
    assert [a.element(0, r) for r in range(8)] == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
    assert a.element(6, 8) == (1, 20)  # lane 6: row 1, columns 4.. of the second 16-column step
    x = np.arange(128 * 48).reshape(128, 48)
    held = layouts.WgmmaOperandA(2).per_thread(x)
    assert held.shape == (256, 24) and sorted(held.ravel().tolist()) == list(range(x.size))
    for row, col in [(0, 0), (77, 31), (127, 47)]:
        t, r = layouts.WgmmaOperandA(2).owner(row, col)
        assert layouts.WgmmaOperandA(2).element(t, r) == (row, col)


def test_swizzled_shared_tiles_permute_chunks_and_spread_a_column_over_all_banks():
    for s in (32, 64, 128):
        sw = layouts.SharedTile(s)
        cols = s // 2  # bf16 rows of s bytes
        rows = 8  # one period: 8 rows of s bytes
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        off = sw.offset(r, c, cols, 2)
        assert sorted(off.ravel().tolist()) == list(range(0, rows * s, 2)), "a permutation of the period"
        assert off.max() < sw.alignment
        for chunk in range(s // 16):  # eight rows' 16 bytes at one column: eight distinct 16-byte bank groups
            groups = {(sw.offset(rr, chunk * 8, cols, 2) % 128) // 16 for rr in range(8)}
            assert len(groups) == 8, (s, chunk, groups)
    assert layouts.SharedTile(128).offset(1, 0, 64, 2) == 144  # row 1's first chunk trades with its second
    assert layouts.SharedTile(64).offset(2, 0, 32, 2) == 144
    assert layouts.SharedTile(32).offset(4, 0, 16, 2) == 144
    plain = layouts.SharedTile(0)
    assert len({(plain.offset(rr, 0, 64, 2) % 128) // 16 for rr in range(8)}) == 1  # unswizzled rows collide


def test_tensor_memory_maps_rows_to_lanes_and_warps_to_quarters():
    tm = layouts.TensorMemory()
    assert tm.address(5, 7, base=0x20) == (5 << 16) + 7 + 0x20
    assert [tm.reader(i) for i in (0, 31, 32, 127)] == [(0, 0), (0, 31), (1, 0), (3, 31)]


def test_c_expressions_of_the_mma_shared_and_tmem_layouts_compute_what_numpy_does(tmp_path):
    """Compile the C expressions with the host compiler and compare every value with numpy's."""
    import shutil
    import subprocess

    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed (nvcc needs one too)"
    acc, a, tm = layouts.WgmmaAccumulator(2), layouts.WgmmaOperandA(2), layouts.TensorMemory()
    lines = ["#include <cstdio>", "int main() {"]
    lines.append("for (int t = 0; t < 256; ++t) for (int r = 0; r < 32; ++r) "
                 f'printf("%d %d %d %d\\n", {acc.row_c("r", "t")}, {acc.col_c("r", "t")}, {a.row_c("r", "t")}, '
                 f'{a.col_c("r", "t")});')
    for s in (0, 32, 64, 128):
        cols = max(s, 128) // 2
        lines.append(f"for (int i = 0; i < 16; ++i) for (int j = 0; j < {cols}; ++j) "
                     f'printf("%d\\n", {layouts.SharedTile(s).offset_c("i", "j", cols, 2)});')
    lines.append("for (int w = 0; w < 8; ++w) for (int l = 0; l < 32; ++l) "
                 f'printf("%u %d\\n", {tm.address_c(tm.lane_c("w", "l"), "l + 3", "64u")}, {tm.lane_c("w", "l")});')
    lines.append("return 0; }")
    src = tmp_path / "layouts.cpp"
    src.write_text("\n".join(lines))
    subprocess.run([cxx, "-O0", str(src), "-o", str(tmp_path / "layouts")], check=True)
    ran = subprocess.run([str(tmp_path / "layouts")], capture_output=True, text=True, check=True)
    out = iter(ran.stdout.split("\n"))
    for t in range(256):
        for r in range(32):
            assert list(map(int, next(out).split())) == [*acc.element(t, r), *a.element(t, r)], (t, r)
    for s in (0, 32, 64, 128):
        cols = max(s, 128) // 2
        for i in range(16):
            for j in range(cols):
                assert int(next(out)) == layouts.SharedTile(s).offset(i, j, cols, 2), (s, i, j)
    for w in range(8):
        for lane in range(32):
            assert list(map(int, next(out).split())) == [tm.address((w % 4) * 32 + lane, lane + 3, 64),
                                                         (w % 4) * 32 + lane]
            assert tm.reader((w % 4) * 32 + lane) == (w % 4, lane)


@pytest.mark.parametrize("layout, ttype, message", [
    (Layout("wgmma_acc", (("warpgroups", 1),)), "f32[64, 12]", "multiple of 8 from 8 to 256"),
    (Layout("wgmma_acc", (("warpgroups", 2),)), "f32[64, 16]", "2 warpgroup(s) hold 128 rows, not 64"),
    (Layout("wgmma_acc", (("warpgroups", 1),)), "f32[64, 16] @shared", "lives @reg, not @shared"),
    (Layout("wgmma_a", (("warpgroups", 1),)), "bf16[64, 24]", "not a multiple of 16"),
    (Layout("shared", (("swizzle", 128),)), "bf16[8, 32] @shared", "64 bytes; a 128-byte swizzle takes rows of 128"),
    (Layout("shared", (("swizzle", 48),)), "bf16[8, 24] @shared", "the modes are 0, 32, 64, 128"),
    (Layout("shared", (("swizzle", 128),)), "bf16[8, 64]", "lives @shared, not @reg"),
    (Layout("tmem", ()), "f32[64, 32] @tmem", "128 lanes"),
    (Layout("tmem", ()), "bf16[128, 32] @tmem", "32-bit cells"),
    (Layout("tmem", ()), "f32[128, 1024] @tmem", "512 columns"),
])
def test_a_layout_that_does_not_fit_its_type_says_why(layout, ttype, message):
    name, rest = ttype.split("[")
    shape, _, space = rest.partition("]")
    t = TensorType(DType(name), tuple(int(d) for d in shape.split(",")), MemSpace(space.strip(" @") or "reg"), layout)
    assert message in layouts.misfit(t)


def test_mma_layouts_ask_whole_warpgroups_of_their_launch():
    acc = layouts.WgmmaAccumulator(2).as_layout()
    assert layouts.disagreement(acc, 256, 8, 1) is None and layouts.disagreement(acc, 384, 8, 1) is None
    problem = layouts.disagreement(acc, 128, 8, 1)
    assert "need 256 threads in whole warpgroups; the gpu.launch it is in has 128" in problem
    assert "has 160" in layouts.disagreement(acc, 160, 8, 1)
    assert "whole warpgroups" in layouts.disagreement(layouts.TensorMemory().as_layout(), 96, 8, 1)
    assert layouts.disagreement(layouts.SharedTile(128).as_layout(), 32, 8, 1) is None


def test_the_verifier_reports_a_misfit_layout_at_its_op(tmp_path):
    from kfc.ir import parse_ir, print_ir, verify
    from kfc.diagnostics import KfcError

    good = ("kfc.func @f(%s: bf16[8, 64] @shared #shared<swizzle = 128>, %t: f32[128, 256] @tmem #tmem) -> "
            "(%y: f32[8] @global) {\n}\n")
    assert print_ir(verify(parse_ir(good, "f.kir"))) == good
    bad = good.replace("bf16[8, 64]", "bf16[8, 32]")
    with pytest.raises(KfcError, match=r"f\.kir:1:\d+: .*argument %s type .*a 128-byte swizzle takes rows of 128"):
        verify(parse_ir(bad, "f.kir"))
