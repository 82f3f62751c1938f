"""A loop's carried tile in registers, a warp to 16 of its columns (kfc.codegen.tile_columns):
the fragment mapping it rests on, which loops take it, and what KDA's recurrence then builds to
for Hopper and Blackwell. The GPU computing what the final IR computes with it is checked on the
GPU machine (tests/gpu/test_final_ir_gpu.py::test_column_registers_compute_what_the_final_ir_computes)."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from kfc.codegen import cuda, tile_prefetch
from kfc.codegen.tile_columns import A_FROM_SLOTS, COLUMNS, STEP, TileColumns, column_loop, slot_column, slot_row
from kfc.codegen.toolchain import disassemble
from kfc.compile import compile_op
from kfc.frontend import load_kfc, parse_kfc
from kfc.ir.tile_ops import DotOp, ForOp
from kfc.model.target import parse_target
from kfc.proof import lower_stages

SHAPE = {"T": 4096, "K": 128, "V": 128}


def mma_m16n8k8(a, b, c):
    """mma.sync.m16n8k8 .row.col on one warp's fragments, as the PTX ISA lays them out
    (g = lane / 4, t = lane % 4): A's a0..a3 are rows g, g + 8 at column t, then at t + 4; B's
    b0, b1 rows t, t + 4 at column g; C's c0..c3 row g at columns 2t, 2t + 1, then row g + 8."""
    A, B = np.zeros((16, 8)), np.zeros((8, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = a[lane]
        B[t, g], B[t + 4, g] = b[lane]
    D = A @ B
    out = [list(c[lane]) for lane in range(32)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        out[lane] = [out[lane][0] + D[g, 2 * t], out[lane][1] + D[g, 2 * t + 1],
                     out[lane][2] + D[g + 8, 2 * t], out[lane][3] + D[g + 8, 2 * t + 1]]
    return out


def test_a_column_tiles_accumulators_are_the_a_fragments_of_its_transposed_product():
    """dot(A, X) computed as X^T A^T: X's slots (its accumulators) fed as A's registers in
    A_FROM_SLOTS order, A's elements as B at the slot rows of the same step, sum the product
    exactly, the contraction permuted alike on both sides."""
    rng = np.random.default_rng(0)
    rows, m = 24, 16  # X [rows, 16 columns] (one warp's), A [m, rows]
    X, A = rng.standard_normal((rows, COLUMNS)), rng.standard_normal((m, rows))
    slots = {(lane, j, e): X[slot_row(j, e, lane % 4), slot_column(e, lane // 4)]
             for lane in range(32) for j in range(rows // STEP) for e in range(4)}
    acc = {mj: [[0.0] * 4 for _ in range(32)] for mj in range(m // STEP)}
    for kk in range(rows // STEP):
        a = [[slots[(lane, kk, s)] for s in A_FROM_SLOTS] for lane in range(32)]
        for mj in range(m // STEP):
            b = [[A[STEP * mj + lane // 4, slot_row(kk, e, lane % 4)] for e in (0, 1)] for lane in range(32)]
            acc[mj] = mma_m16n8k8(a, b, acc[mj])
    want = A @ X  # [m, 16]: the result's slots hold it as X's hold X
    for mj in range(m // STEP):
        for lane in range(32):
            for e in range(4):
                assert acc[mj][lane][e] == pytest.approx(want[slot_row(mj, e, lane % 4), slot_column(e, lane // 4)])


def final_loop(spec, shape: dict) -> ForOp:
    final = lower_stages(spec, parse_target("sm_90a"), None, shape).stages[-1][1]
    return next(op for op in final.walk() if isinstance(op, ForOp))


def test_kdas_recurrence_keeps_its_state_in_registers_with_two_products_summed_onto_earlier_tiles():
    loop = final_loop(load_kfc("kernels/kda_recurrence.kfc", {"C": "16", "SD": "f32", "WD": "f32"}), SHAPE)
    plan = column_loop(loop)
    assert plan is not None and plan.columns == 128 and plan.warps == 8
    dots = [op for op in loop.body.ops if isinstance(op, DotOp)]
    assert all(op.result in plan.values for op in dots) and len(dots) == 4
    # o = qg S + aqk U and S = e^Gend * S + kg^T U: the second product of each starts from the first term
    assert sorted(str(d.ttype.shape) for d in plan.sums) == ["(128, 128)", "(16, 128)"]
    assert all(plan.carried is not d for d in plan.sums)


MIXING = """
op mixing(x: f32[T, 32], a: f32[T, 16], s0: f32[16, 32]) -> (y: f32[16, 32]) {{
  parallel i in 0..1 {{
    S = s0[:, :]
    for t in 0..T step 16 carry (S) {{
      S = {update}
    }}
    y[:, :] = S
  }}
}}
check {{
  tolerance = {{f32: 5e-3}}
}}
"""


@pytest.mark.parametrize("update, why", [
    ("S + dot(a[t:t+16, :], S) * 0.5", None),  # columns apart: taken
    ("S + dot(S, x[t:t+32, :])", "a product reading S as its A mixes S's columns"),
    ("S * sum(S, axis=1)[:, None]", "a reduction along a row mixes the columns"),
    ("S + cumsum(S, axis=1)", "a scan along a row mixes the columns"),
])
def test_loops_whose_columns_mix_are_not_taken(update, why):
    loop = final_loop(parse_kfc(MIXING.format(update=update), "mixing.kfc"), {"T": 64})
    assert (column_loop(loop) is None) == (why is not None), why


def chunk_loop(cu: str) -> str:
    """The body of the kernel's loop over the chunks (at the kernel body's indent)."""
    return cu.split("\n  for (long long", 1)[1].split("\n  }\n", 1)[0]


def with_columns(monkeypatch, build):
    monkeypatch.setattr(cuda, "TILE_COLUMN_REGISTERS", True)
    return build()


def recurrence(target="sm_90a", bind=None, path="kernels/kda_recurrence.kfc", shape=SHAPE):
    return compile_op(load_kfc(path, {"C": "16", "SD": "f32", "WD": "f32", **(bind or {})}), parse_target(target),
                      shape=shape)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_kdas_recurrence_with_its_state_in_registers_waits_only_for_its_loads(target, monkeypatch):
    monkeypatch.setattr(cuda, "TILE_COLUMN_REGISTERS", False)
    plain = recurrence(target)
    r = with_columns(monkeypatch, lambda: recurrence(target))
    cu = r.kernel.cu
    loop = chunk_loop(cu)
    # one barrier after the chunk's loads are stored, one before the next chunk's overwrite them
    assert loop.count("__syncthreads();") == 2 < chunk_loop(plain.kernel.cu).count("__syncthreads();")
    assert re.search(r"float kfc_x\d+\[16\]\[4\];", cu)  # the state: 16 slot groups of four a lane
    assert "float2" in loop and "kfc_mma_tf32" in loop
    # S's A fragments made once a step for w S and qg S together (16 steps of its 128 rows), U's
    # for aqk U and for the update (2 steps of its 16 rows each)
    assert loop.count("const unsigned kfc_a") == 16 + 2 + 2
    assert loop.count("kfc_mma_tf32(") == 16 * 2 * 2 + 2 * 2 + 2 * 16
    assert not r.kernel.report.spills
    assert r.plan.smem_dynamic < plain.plan.smem_dynamic
    if target == "sm_90a":
        assert "HMMA.1688.F32.TF32" in disassemble(r.kernel.cubin)


def test_columns_split_over_fewer_warps_leave_the_others_out_of_the_products(monkeypatch):
    r = with_columns(monkeypatch, lambda: recurrence(path="kernels/kda_recurrence_split.kfc", bind={"VB": "64"},
                                                      shape={"T": 4096, "K": 128}))
    cu = r.kernel.cu
    assert re.search(r"if \(kfc_w\d+ < 4\) \{", cu)  # four warps hold the 64 columns
    assert not r.kernel.report.spills


def test_bf16_workspaces_widened_as_stored_keep_the_two_barriers(monkeypatch):
    """With bf16 workspaces, the loads only products read are stored widened to f32 where they are
    stored (TILE_WIDEN_PREFETCHED): the column products read them two at a time as with f32."""
    monkeypatch.setattr(cuda, "TILE_WIDEN_PREFETCHED", True)
    r = with_columns(monkeypatch, lambda: recurrence(bind={"WD": "bf16"}))
    loop = chunk_loop(r.kernel.cu)
    assert loop.count("__syncthreads();") == 2 and "const float2 kfc_p" in loop
    assert not r.kernel.report.spills


def test_two_copies_of_the_loads_leave_one_barrier_a_chunk(monkeypatch):
    """TILE_DOUBLE_BUFFER: each chunk stores its loads into the copy the last chunk did not read,
    so only the barrier after the store remains; one after the loop guards the bytes the final
    state's buffer may share with them."""
    monkeypatch.setattr(cuda, "TILE_DOUBLE_BUFFER", True)
    r = with_columns(monkeypatch, lambda: recurrence())
    cu = r.kernel.cu
    loop = chunk_loop(cu)
    assert loop.count("__syncthreads();") == 1
    flips = re.findall(r"(kfc_s\d+) = \1_base \+ (kfc_h\d+) \* (\d+);", loop)
    assert len(flips) == 6 and len({h for _, h, _ in flips}) == 1  # w, u, qg, kg, aqk, gend
    assert re.search(rf"{flips[0][1]} \^= 1;", loop)
    after = cu.split("\n  for (long long", 1)[1].split("\n  }\n", 1)[1]
    # the pointers back at the first copies (a loop run again starts there), then the barrier
    resets = re.findall(r"(kfc_s\d+) = \1_base;", after.split("__syncthreads();", 1)[0])
    assert sorted(resets) == sorted(name for name, _, _ in flips) and "__syncthreads();" in after
    assert not r.kernel.report.spills
    # a loop whose loads are not all prefetched (their registers over the allowance) keeps one
    # copy and its two barriers
    monkeypatch.setattr(tile_prefetch, "PREFETCH_REGISTERS", 16)
    few = with_columns(monkeypatch, lambda: recurrence())
    assert "_base" not in few.kernel.cu and chunk_loop(few.kernel.cu).count("__syncthreads();") == 2


def test_the_emitted_slot_indices_are_the_slots_the_products_assume():
    """The C indices the emitter gives slot (j, e) of a lane, evaluated for every lane and warp,
    name the element slot_row and slot_column say it holds (what A_FROM_SLOTS relies on)."""
    em = SimpleNamespace(column_lanes=("w", "g", "t"), column_slots={})
    for j in range(3):
        for e in range(4):
            row, col = TileColumns.slot_index(em, j, e)
            for w in range(8):
                for lane in range(32):
                    at = {"w": w, "g": lane // 4, "t": lane % 4}
                    assert eval(row, {}, at) == slot_row(j, e, lane % 4)
                    assert eval(col, {}, at) == COLUMNS * w + slot_column(e, lane // 4)


def staged_recurrence(monkeypatch, name="kda_recurrence", bind=None, shape=SHAPE):
    monkeypatch.setattr(cuda, "TILE_STAGED_STORES", True)
    return compile_op(load_kfc(f"kernels/{name}.kfc", bind or {"C": "16", "SD": "f32", "WD": "f32"}),
                      parse_target("sm_90a"), shape=shape)


def test_a_staged_store_puts_every_slot_at_its_element(monkeypatch):
    """With TILE_STAGED_STORES, o's slots go through the warp's rows in shared memory: the
    emitted C, evaluated for every lane of every warp, writes slot (j, e) at its element's place
    there, and the lanes' 16-byte reads then store each element of the warp's 16 columns of each
    row exactly once, at that element's column of o."""
    cu = staged_recurrence(monkeypatch).kernel.cu
    writes = re.findall(r"(kfc_s\d+)\[(.+)\] = kfc_x\d+\[(\d)\]\[(\d)\];", cu)
    stage = writes[0][0]
    writes = [(index, int(j), int(e)) for buf, index, j, e in writes if buf == stage]
    read = re.search(r"p_o\[.*\* 128LL \+ \(long long\)\((.+?)\)\)\]\) = \*reinterpret_cast<const uint4\*>"
                     rf"\(&{stage}\[(.+?)\]\);", cu)
    assert len(writes) == 8 and read and cu.count("__syncwarp();") == 2
    column, index = (re.sub(r"kfc_([wgt])\d+", r"\1", x).replace("threadIdx.x", "x") for x in read.groups())
    rows_of = {}
    for w in range(8):
        held = {}
        for lane in range(32):
            at = {"w": w, "g": lane // 4, "t": lane % 4, "x": 32 * w + lane}
            for text, j, e in writes:
                place = eval(re.sub(r"kfc_([wgt])\d+", r"\1", text), {}, at)
                assert place not in held
                held[place] = (slot_row(j, e, lane % 4), COLUMNS * w + slot_column(e, lane // 4))
        for lane in range(32):
            at = {"w": w, "g": lane // 4, "t": lane % 4, "x": 32 * w + lane}
            start, col = eval(index, {}, at), eval(column, {}, at)
            for i in range(8):
                row, want = held[start + i]
                assert want == col + i and rows_of.setdefault((row, col + i), w) == w
    assert len(rows_of) == 16 * 128  # every element of o's [16, 128] chunk, once


def test_staged_stores_take_o_out_in_16_bytes_a_lane(monkeypatch):
    """The recurrence's o in one 16-byte store a lane a chunk (C = 16; two at C = 32), not eight
    2-byte ones, for sm_90a; fewer instructions and no spills. The split form's block of columns
    (a slice from a multiple of 64) takes it too."""
    monkeypatch.setattr(cuda, "TILE_STAGED_STORES", False)
    plain = compile_op(load_kfc("kernels/kda_recurrence.kfc", {"C": "16", "SD": "f32", "WD": "f32"}),
                       parse_target("sm_90a"), shape=SHAPE)
    built = {}
    for C, stores in (("16", 1), ("32", 2)):
        r = built[C] = staged_recurrence(monkeypatch, bind={"C": C, "SD": "f32", "WD": "f32"})
        assert r.kernel.cu.count("*reinterpret_cast<uint4*>(&p_o[") == stores
        assert not re.search(r"p_o\[[^\n]*\] = kfc_x", r.kernel.cu) and r.kernel.report.spills == 0
    sass = lambda r: len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", disassemble(r.kernel.cubin), re.M))  # noqa: E731
    assert sass(built["16"]) < sass(plain) - 50
    split = staged_recurrence(monkeypatch, "kda_recurrence_split",
                              {"C": "16", "SD": "f32", "WD": "f32", "V": "128", "VB": "64"}, {"T": 4096, "K": 128})
    assert split.kernel.cu.count("*reinterpret_cast<uint4*>(&p_o[") == 1
