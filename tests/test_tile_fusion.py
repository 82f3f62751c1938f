"""kfc.codegen.tile_fusion: a phase's CTA-wide loops of one count become one loop, reads first,
writes last, and nothing is lost or reordered that another loop reads. What the GPU computes
with it is checked against the interpreter on the GPU machine (tests/gpu/test_final_ir_gpu.py,
tests/gpu/test_kda_gpu.py)."""

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from kfc.codegen import cuda
from kfc.codegen.tile_fusion import FUSED_AT_MOST, CtaLoop, fuse_loops, runs
from kfc.compile import compile_op
from kfc.frontend import load_kfc
from kfc.model.target import parse_target


def loop(lines: list[str], j: str, count: int, reads: list[str], writes: list[str]) -> CtaLoop:
    """Append one loop as TileWrites.cta_loop writes it; its record."""
    start = len(lines)
    lines += ["  #pragma unroll", f"  for (int {j} = 0; {j} < {count}; ++{j}) {{",
              f"    const int e_{j} = threadIdx.x + {j} * 256;"]
    lines += [f"    {x}" for x in reads] + [f"    {x}" for x in writes] + ["  }"]
    return CtaLoop(start, len(lines), len(writes))


def test_independent_loops_become_one_with_every_write_after_every_read():
    lines: list[str] = []
    a = loop(lines, "kfc_j1", 2, ["float a = kfc_s7[e_kfc_j1];"], ["kfc_s8[e_kfc_j1] = a;"])
    b = loop(lines, "kfc_j2", 2, ["float b = kfc_s7[e_kfc_j2] * 2.0f;"], ["p_y[e_kfc_j2] = b;"])
    out = fuse_loops(lines, [a, b])
    body = [x.strip() for x in out]
    assert body.count("#pragma unroll") == 1 and body[-1] == "}"
    assert "const int kfc_j2 = kfc_j1;" in body
    assert max(body.index("float a = kfc_s7[e_kfc_j1];"), body.index("float b = kfc_s7[e_kfc_j2] * 2.0f;")) \
        < min(body.index("kfc_s8[e_kfc_j1] = a;"), body.index("p_y[e_kfc_j2] = b;"))


def test_a_loop_reading_what_an_earlier_one_writes_stays_apart():
    lines: list[str] = []
    a = loop(lines, "kfc_j1", 2, ["float a = kfc_s7[e_kfc_j1];"], ["kfc_s8[e_kfc_j1] = a;"])
    b = loop(lines, "kfc_j2", 2, ["float b = kfc_s8[e_kfc_j2];"], ["p_y[e_kfc_j2] = b;"])
    c = loop(lines, "kfc_j3", 2, ["float c = kfc_s7[e_kfc_j3];"], ["p_z[e_kfc_j3] = c;"])
    assert runs(lines, [a, b, c]) == [[b, c]]  # b reads kfc_s8, which a writes; c reads neither's


def test_a_loop_refilling_registers_an_earlier_loops_writes_read_stays_apart():
    # the stores of a prefetch's registers, then the loads of the next iteration into them
    lines: list[str] = []
    a = loop(lines, "kfc_j1", 1, [], ["kfc_s8[e_kfc_j1] = kfc_pf3[kfc_j1][0];"])
    b = loop(lines, "kfc_j2", 1, ["kfc_pf3[kfc_j2][0] = p_u[e_kfc_j2];"], [])
    assert runs(lines, [a, b]) == []


def test_loops_of_other_counts_or_not_next_to_each_other_stay_apart():
    lines: list[str] = []
    a = loop(lines, "kfc_j1", 2, ["float a = kfc_s7[e_kfc_j1];"], ["p_y[e_kfc_j1] = a;"])
    b = loop(lines, "kfc_j2", 1, ["float b = kfc_s7[e_kfc_j2];"], ["p_z[e_kfc_j2] = b;"])
    lines.append("  __syncthreads();")
    c = loop(lines, "kfc_j3", 1, ["float c = kfc_s7[e_kfc_j3];"], ["p_w[e_kfc_j3] = c;"])
    assert runs(lines, [a, b, c]) == []
    assert fuse_loops(lines, [a, b, c]) == lines


def test_at_most_so_many_loops_become_one():
    lines: list[str] = []
    loops = [loop(lines, f"kfc_j{i}", 2, [f"float x{i} = kfc_s7[e_kfc_j{i}];"], [f"p_y{i}[e_kfc_j{i}] = x{i};"])
             for i in range(FUSED_AT_MOST + 1)]
    assert [len(r) for r in runs(lines, loops)] == [FUSED_AT_MOST]


def statements(cu: str) -> Counter:
    """The kernel's statements but its loops' headers, closing braces and the fused loops'
    variables (named as the first loop's)."""
    out = Counter()
    for line in cu.splitlines():
        s = line.strip()
        if s in ("#pragma unroll", "}") or s.startswith("for (int kfc_j") or \
                (s.startswith("const int kfc_j") and s.count("kfc_j") == 2):
            continue
        out[s] += 1
    return out


@pytest.mark.parametrize("path, bound, fewer", [
    ("kernels/kda_prepare_flashkda.kfc", {"C": "16", "WD": "f32"}, 4),  # decayed operands; u, qg and kg
    ("kernels/kda_prepare_flashkda.kfc", {"C": "16", "WD": "bf16"}, 4),
    # the next chunk's loads into registers (reads only), and their stores into shared memory
    ("kernels/kda_recurrence.kfc", {"C": "16", "SD": "f32", "WD": "f32"}, 4),
])
def test_kdas_kernels_write_a_phases_tiles_in_fewer_loops_with_the_same_statements(monkeypatch, path, bound, fewer):
    def build(fuse: bool) -> str:
        monkeypatch.setattr(cuda, "TILE_FUSE_LOOPS", fuse)
        spec = load_kfc(path, bound)
        return compile_op(spec, parse_target("sm_90a"), shape={"T": 4096, "K": 128, "V": 128}).kernel.cu

    apart, fused = build(False), build(True)
    assert fused.count("#pragma unroll\n") <= apart.count("#pragma unroll\n") - fewer
    assert statements(fused) == statements(apart)  # the same statements, none lost or doubled
    assert fused.count("__syncthreads();") == apart.count("__syncthreads();")


# --- soundness over random runs of loops ------------------------------------------------------
BUFFERS = ("kfc_s1", "kfc_s2", "kfc_s3", "p_x", "p_y")
REGISTERS = ("kfc_pf1", "kfc_pf2")  # arrays declared before the loops, filled and read in them


@st.composite
def loop_programs(draw):
    """Lines of adjacent loops (some with a barrier before them), each reading and writing a few
    random buffers, and their records."""
    lines: list[str] = []
    loops = []
    for i in range(draw(st.integers(1, 7))):
        if draw(st.booleans()) and lines:
            lines.append("  __syncthreads();")
        count = draw(st.sampled_from([1, 2]))
        reads = [f"float r{i}_{k} = {b}[e_kfc_j{i}];" for k, b in enumerate(draw(st.lists(st.sampled_from(BUFFERS),
                                                                                        max_size=3)))]
        reads += [f"{r}[kfc_j{i}][{k}] = {b}[e_kfc_j{i}];" for k, (r, b) in enumerate(draw(st.lists(
            st.tuples(st.sampled_from(REGISTERS), st.sampled_from(BUFFERS)), max_size=1)))]
        values = draw(st.lists(st.sampled_from(["", *REGISTERS]), min_size=2, max_size=2))
        writes = [f"{b}[e_kfc_j{i}] = {values[k] + '[0][0] + ' if values[k] else ''}{i}.{k}f;"
                  for k, b in enumerate(draw(st.lists(st.sampled_from(BUFFERS), max_size=2)))]
        loops.append(loop(lines, f"kfc_j{i}", count, reads, writes))
    return lines, loops


@given(loop_programs())
@settings(max_examples=300, deadline=None)
def test_no_read_moves_above_a_write_of_what_it_reads_and_nothing_is_lost(program):
    lines, loops = program
    out = [x.strip() for x in fuse_loops(lines, loops)]
    assert statements("\n".join(out)) == statements("\n".join(lines))
    assert out.count("__syncthreads();") == lines.count("  __syncthreads();")
    # two statements naming one buffer, tensor or register array of which either assigns it keep their order
    names = set(BUFFERS) | set(REGISTERS)
    body = [x.strip() for x in lines if "=" in x and not x.strip().startswith(("const", "for"))]
    for i, before in enumerate(body):
        for after in body[i + 1:]:
            lhs = {n for n in names if n + "[" in before.partition(" = ")[0] or n + "[" in after.partition(" = ")[0]}
            if any(n + "[" in before and n + "[" in after for n in lhs):
                assert out.index(before) < out.index(after), (before, after)
