"""A tile loop's next loads issued before its work (kfc.codegen.tile_prefetch): which loops take
it, what the kernel then holds, and that it builds for Hopper and Blackwell without spills. The
GPU computing what the final IR computes with it is checked on the GPU machine
(tests/gpu/test_final_ir_gpu.py: kda_recurrence, linear_attention)."""

import re

import pytest

from kfc.codegen import cuda
from kfc.compile import compile_op
from kfc.frontend import load_kfc, parse_kfc
from kfc.model.target import parse_target

SHAPE = {"T": 4096, "K": 128, "V": 128}


def recurrence(chunk: str, target: str = "sm_90a", shape=SHAPE):
    return compile_op(load_kfc("kernels/kda_recurrence.kfc", {"C": chunk, "SD": "f32"}), parse_target(target),
                      shape=shape)


def without_prefetch(monkeypatch, build):
    monkeypatch.setattr(cuda, "TILE_PREFETCH", False)
    try:
        return build()
    finally:
        monkeypatch.setattr(cuda, "TILE_PREFETCH", True)


def barriers_per_iteration(cu: str) -> int:
    return cu.split("for (long long", 1)[1].count("__syncthreads();")


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_kdas_recurrence_issues_the_next_chunks_loads_before_this_chunks_products(target, monkeypatch):
    r = recurrence("16", target)
    cu = r.kernel.cu
    # six tiles of chunk t in registers: w, u, qg, kg [16, 128] two groups of four a thread,
    # aqk [16, 16] and gend [128] one (u, read only where U is written, stored beside them)
    regs = re.findall(r"alignas\(16\) float (kfc_pf\d+)\[(\d)\]\[4\];", cu)
    assert sorted(n for _, n in regs) == ["1", "1", "2", "2", "2", "2"]
    head, loop = cu.split("for (long long", 1)
    prologue = head[head.rindex("][4];"):]  # after the registers' declarations
    assert re.search(r"if \(v\d+ < v\d+\) \{", prologue) and "p_w +" in prologue  # the first chunk's, where the loop runs
    iv, step = re.match(r" (v\d+) = v\d+; v\d+ < v\d+; v\d+ \+= (v\d+)\)", loop).groups()
    first_phase, rest = loop.split("__syncthreads();", 1)
    # the first phase stores the registers; the next chunk's loads follow it, before any product
    assert all(f"{name}[" in first_phase for name, _ in regs) and "p_w +" not in first_phase
    issue = rest.split("kfc_mma_tf32", 1)[0]
    assert f"if ({iv} + {step} < " in issue and all(f"reinterpret_cast<uint4*>({name}[" in issue for name, _ in regs)
    assert f"(long long)(({iv} + {step}))" in issue  # read at t + step
    assert not r.kernel.report.spills
    # the same phases an iteration as without
    plain = without_prefetch(monkeypatch, lambda: recurrence("16", target))
    assert "kfc_pf" not in plain.kernel.cu
    assert barriers_per_iteration(cu) == barriers_per_iteration(plain.kernel.cu)


def test_loads_that_would_not_fit_in_registers_are_not_prefetched(monkeypatch):
    """At a chunk of 64 the iteration's tiles would take 116 registers a thread: the kernel is
    the one written without."""
    cu = recurrence("64").kernel.cu
    assert "kfc_pf" not in cu
    assert cu == without_prefetch(monkeypatch, lambda: recurrence("64")).kernel.cu


LOOP = """
op chunked_sum(x: f32[N, T, D], y: f32[N, T, D]) -> (o: f32[N, D]) {{
  parallel n in 0..N {{
    acc = zeros([D], dtype=f32)
    for t in 0..T step 16 carry (acc) {{
      a = x[n, {rows}, :]
      b = y[n, {rows}, :]
      acc = acc + sum(a * b + a, axis=0)
    }}
    o[n, :] = acc
  }}
}}
"""


def test_a_load_at_an_index_computed_in_the_loop_is_not_prefetched():
    def cu(rows):
        spec = parse_kfc(LOOP.format(rows=rows), "chunked_sum.kfc")
        return compile_op(spec, parse_target("sm_90a"), shape={"T": 256, "D": 64}).kernel.cu
    assert "kfc_pf" in cu("t:t+16")
    assert "kfc_pf" not in cu("t+t%16:t+t%16+16")


def test_narrow_loads_are_prefetched_in_their_own_width():
    """bf16 workspaces: each group of four is one 8-byte access into registers of the load's
    dtype, stored into a bf16 buffer (converted where a product reads it)."""
    r = compile_op(load_kfc("kernels/kda_recurrence.kfc", {"C": "16", "SD": "f32", "WD": "bf16"}),
                   parse_target("sm_90a"), shape=SHAPE)
    cu = r.kernel.cu
    regs = re.findall(r"alignas\(16\) kfc_bf16 (kfc_pf\d+)\[(\d)\]\[4\];", cu)
    assert len(regs) == 5 and cu.count("alignas(16) float kfc_pf") == 1  # w, u, qg, kg, aqk; gend in f32
    assert all(f"reinterpret_cast<uint2*>({name}[" in cu for name, _ in regs)
    assert not r.kernel.report.spills


def test_a_block_of_columns_is_prefetched_and_moved_a_group_an_access(shared_memory_form):
    """KDA's recurrence over blocks of 64 of V's 128 columns (kernels/kda_recurrence_split.kfc):
    u's and o's blocks start at multiples of 64, so their groups of four are whole accesses, and
    u's block is issued an iteration early like the whole rows of w, qg, kg, aqk and gend."""
    r = compile_op(load_kfc("kernels/kda_recurrence_split.kfc", {"C": "16", "VB": "64"}), parse_target("sm_90a"),
                   shape={"T": 4096, "K": 128})
    cu = r.kernel.cu
    assert r.plan.grid[0] == "((N * H) * 2)" and "__launch_bounds__(256, 2)" in cu and not r.kernel.report.spills
    regs = re.findall(r"alignas\(16\) float (kfc_pf\d+)\[(\d)\]\[4\];", cu)
    assert sorted(n for _, n in regs) == ["1", "1", "1", "2", "2", "2"]  # u [16, 64]: one group a thread
    assert "reinterpret_cast<uint4*>(kfc_pf" in cu and "p_u[" not in cu
    assert re.search(r"reinterpret_cast<uint2\*>\(&p_o\[", cu) and "p_o[" not in re.sub(r"&p_o\[", "", cu)


def test_a_prefetched_bf16_load_only_products_read_is_stored_widened_in_the_loads_phase(monkeypatch):
    """TILE_WIDEN_PREFETCHED: the recurrence with bf16 workspaces stores the f32 (TF32-rounded)
    tiles its products read straight from the prefetched registers, in the loads' one phase,
    and so takes the f32 workspaces' barriers; the f32 kernel is unchanged."""
    def build(wd):
        return compile_op(load_kfc("kernels/kda_recurrence.kfc", {"C": "16", "SD": "f32", "WD": wd}),
                          parse_target("sm_90a"), shape=SHAPE).kernel.cu

    plain, f32 = build("bf16"), build("f32")
    monkeypatch.setattr(cuda, "TILE_WIDEN_PREFETCHED", True)
    widened, f32_widened = build("bf16"), build("f32")
    assert f32_widened == f32
    assert widened.count("__syncthreads();") == f32.count("__syncthreads();") < plain.count("__syncthreads();")
    # the registers (bf16) widened and rounded as they are stored
    assert re.search(r"kfc_round_tf32\(kfc_bf16_to_f32\(kfc_pf\d+\[", widened)
    assert not re.search(r"kfc_round_tf32\(kfc_bf16_to_f32\(kfc_pf\d+\[", plain)
