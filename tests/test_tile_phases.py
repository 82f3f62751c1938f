"""Fewer barriers and more CTAs an SM in tile kernels: independent writes share a phase, and a
write reading nothing the last phase wrote continues it (kfc.codegen.tile_phases); the
triangular inverse a lane a row; and __launch_bounds__ follows what shared memory allows
(kfc.codegen.tile_plan.ctas_per_sm). The GPU computing what the final IR computes with both is
checked on the GPU machine (tests/gpu/test_final_ir_gpu.py: kda_prepare_flashkda and the KDA
kernels, linear_attention, chunk_solve)."""

import re

import pytest

from kfc.codegen import cuda
from kfc.codegen.tile_plan import ctas_per_sm
from kfc.compile import compile_op
from kfc.frontend import load_kfc, parse_kfc
from kfc.model.target import parse_target
from kfc.passes import TILE_PIPELINE

SHAPE = {"T": 4096, "K": 128, "V": 128}
# the default without approx-math: expf and sqrtf, which the tests below find phases by
EXACT = TILE_PIPELINE.replace("approx-math,", "")


def prepare(target: str = "sm_90a", pipeline: str | None = None):
    return compile_op(load_kfc("kernels/kda_prepare_flashkda.kfc", {"C": "16"}), parse_target(target), pipeline,
                      shape=SHAPE)


def built_without(monkeypatch, knob: str, value, build):
    old = getattr(cuda, knob)
    monkeypatch.setattr(cuda, knob, value)
    try:
        return build()
    finally:
        monkeypatch.setattr(cuda, knob, old)


def phases(cu: str) -> list[str]:
    return cu.split("__syncthreads();")


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_kdas_prepare_kernel_writes_independent_tiles_and_stores_in_shared_phases(target, monkeypatch):
    cu = built_without(monkeypatch, "TILE_REOPEN_PHASES", False, lambda: prepare(target, EXACT)).kernel.cu
    plain = built_without(monkeypatch, "TILE_JOIN_PHASES", False, lambda: prepare(target, EXACT)).kernel.cu
    # (no barrier after the last phase: tests/test_tile_emitter.py)
    assert cu.count("__syncthreads();") == 16 and plain.count("__syncthreads();") == 24
    # the row norms' reciprocals written by the warp that sums each row: the norm never stored
    norms = re.findall(r"if \(threadIdx\.x % 32 == 0\) kfc_s\d+\[[^\]]+\] = \(1\.0f / sqrtf\(\(kfc_a\d+ \+ 1e-06f\)\)\);", cu)
    assert len(norms) == 2
    # u, qg, kg and aqk stored in one phase
    stores = [p for p in phases(cu) if "&p_u[" in p]
    assert len(stores) == 1 and all(f"&p_{t}[" in stores[0] for t in ("qg", "kg", "aqk"))
    # dt_bias, read before the loop over the sequences but not inside it, loaded beside q and k
    first = phases(cu)[0]
    assert "p_dt_bias +" in first and "p_q +" in first and "p_k +" in first
    # two tiles of which neither reads the other in one phase ([16, 128] k decayed two ways)
    assert any(p.count("reinterpret_cast<uint4*>(&kfc_s") == 2 and "expf" in p for p in phases(cu))



def test_a_write_reading_nothing_the_last_phase_wrote_continues_it():
    cu = prepare(pipeline=EXACT).kernel.cu
    assert cu.count("__syncthreads();") == 9
    ps = phases(cu)
    # the two norms (a warp a row) and the gates (which read dt_bias, loaded before) in one phase
    norms = [p for p in ps if "sqrtf((kfc_a" in p]
    assert len(norms) == 1 and norms[0].count("sqrtf((kfc_a") == 2 and "p_g +" in norms[0]
    # the gates' sum beside their scan, which it does not read; what reads the scan waits
    scan = [p for p in ps if re.search(r"for \(int kfc_t\d+ = 0; kfc_t\d+ < 16; \+\+kfc_t\d+\) \{ kfc_a", p)]
    assert len(scan) == 1 and "[&]() { float" in scan[0] and "kfc_round_tf32" not in scan[0]
    # e^G written beside the triangular inverse, which is a lane a row: shuffles, no loop of rows
    inverse = [p for p in ps if "__shfl_sync(0xffffffffu, kfc_a" in p]
    assert len(inverse) == 1 and "expf(" in inverse[0]


def test_a_state_updated_in_place_continues_a_phase_only_where_that_phase_did_not_read_it(monkeypatch,
                                                                                         shared_memory_form):
    def built(stored: str, reopen: bool = True):
        build = lambda: compile_op(parse_kfc(CARRIED.format(stored=stored), "carried.kfc"),  # noqa: E731
                                   parse_target("sm_90a")).kernel.cu
        cu = build() if reopen else built_without(monkeypatch, "TILE_REOPEN_PHASES", False, build)
        return cu[cu.index("for (long long"):]

    def update_after_store(body: str) -> bool:  # the store of o and the update of S in one phase
        return any("p_o[" in p and "kfc_mma_tf32" in p for p in phases(body))

    # o from another tile: S's update (a product into S in place) continues the store's phase
    assert update_after_store(built("x[i, :, :] * 2.0")) and not update_after_store(built("x[i, :, :] * 2.0", False))
    assert built("x[i, :, :] * 2.0").count("__syncthreads();") == built("x[i, :, :] * 2.0", False).count(
        "__syncthreads();") - 1
    # o from S: every thread must have read S before any writes it, so a barrier stays between
    assert not update_after_store(built("S * 2.0"))


def test_a_tile_alone_reading_a_product_is_written_from_its_accumulators(monkeypatch):
    def built(extra: str) -> str:
        return compile_op(parse_kfc(EPILOGUE.format(extra=extra), "epilogue.kfc"), parse_target("sm_90a"),
                          EXACT).kernel.cu

    # u = exp(c) - d written as d's accumulators are summed: d has no buffer, u no phase of its own
    alone = built("c[i, :, :] * 2.0")
    assert re.search(r"= kfc_round_tf32\(\(expf\(kfc_s\d+\[[^;]*\]\) - kfc_c\d+\[\d+\]\[\d\]\)\);", alone)
    plain = built_without(monkeypatch, "TILE_PRODUCT_EPILOGUES", False, lambda: built("c[i, :, :] * 2.0"))
    assert alone.count("__syncthreads();") == plain.count("__syncthreads();") - 1
    # d read by another tile as well: it keeps its buffer, and u reads it there
    shared = built("d * 2.0")
    assert not re.search(r"\) - kfc_c\d+\[", shared)


EPILOGUE = """
op epilogue(a: f32[B, 16, 32], b: f32[B, 32, 16], c: f32[B, 16, 16]) -> (o: f32[B, 16, 16], p: f32[B, 16, 16]) {{
  parallel i in 0..B {{
    d = dot(a[i, :, :], b[i, :, :])
    u = exp(c[i, :, :]) - d
    o[i, :, :] = dot(u, u)
    p[i, :, :] = {extra}
  }}
}}
check {{
  tolerance = {{f32: 5e-3}}
  shapes = [{{B: 2}}]
}}
"""


CARRIED = """
op carried(x: f32[B, 16, 32], w: f32[B, 16, 16]) -> (o: f32[B, 16, 32]) {{
  parallel i in 0..B {{
    S = x[i, :, :] * 0.0
    for t in 0..4 carry (S) {{
      o[i, :, :] = {stored}
      S = S * 0.5 + dot(w[i, :, :], x[i, :, :])
    }}
  }}
}}
check {{
  tolerance = {{f32: 5e-3}}
  shapes = [{{B: 2}}]
}}
"""


STORES = """
op stores(x: f32[B, 16, 32]) -> (a: f32[B, 16, 32], b: f32[B, 16, 32], e: f32[B, 16, 32]) {
  parallel i in 0..B {
    t = x[i, :, :]
    a[i, :, :] = exp(t)
    b[i, :, :] = t * 2.0
    a[i, 0:8, :] = x[i, 0:8, :] + 1.0
    e[i, :, :] = t * 4.0
  }
}
check {
  shapes = [{B: 3}]
}
"""


def test_stores_share_a_phase_only_into_distinct_tensors():
    cu = compile_op(parse_kfc(STORES, "stores.kfc"), parse_target("sm_90a")).kernel.cu
    writes = [tuple(f"p_{t}[" in p for t in "abe") for p in phases(cu)]
    writes = [w for w in writes if any(w)]
    # a then b share one; a again waits on the barrier after them (its later write must win); e
    # joins that
    assert writes == [(True, True, False), (True, False, True)]


def test_ctas_an_sm_follow_shared_memory_while_threads_keep_48_registers():
    assert ctas_per_sm(45248) == 5 and ctas_per_sm(0) == 5  # registers: 65536 / (256 * 48)
    assert ctas_per_sm(60000) == 3 and ctas_per_sm(122944) == 1 and ctas_per_sm(232448) == 1


def test_kdas_prepare_kernel_is_built_for_as_many_ctas_as_fit_without_spills(monkeypatch):
    r = prepare()
    # its shared memory allows 5 CTAs, and held to 48 registers a thread it does not spill
    assert ctas_per_sm(r.plan.smem_dynamic) == 5
    assert "__launch_bounds__(256, 5)" in r.kernel.cu and r.plan.min_ctas_per_sm == 5
    assert r.kernel.report.registers <= 48 and not r.kernel.report.spills
    assert r.report["kernels"][0]["min_ctas_per_sm"] == 5
    # with w and u written together (TILE_SHARE_A) both products' buffers live at once: 4 fit,
    # and it is built for 4
    shared = built_without(monkeypatch, "TILE_SHARE_A", True, prepare)
    assert ctas_per_sm(shared.plan.smem_dynamic) == 4 and "__launch_bounds__(256, 4)" in shared.kernel.cu
    plain = built_without(monkeypatch, "TILE_WHOLE_GROUPS", False, prepare)
    assert "__launch_bounds__(256, 5)" in plain.kernel.cu and plain.kernel.report.registers <= 48
    assert not plain.kernel.report.spills
    one = built_without(monkeypatch, "TILE_CTAS_PER_SM", 1, prepare)
    assert "__launch_bounds__(256, 1)" in one.kernel.cu and one.kernel.report.registers > 48


def test_a_kernel_whose_shared_memory_allows_one_cta_is_built_for_one(shared_memory_form):
    r = compile_op(load_kfc("kernels/kda_recurrence.kfc", {"C": "16", "SD": "f32"}), parse_target("sm_90a"),
                   shape=SHAPE)
    assert r.plan.smem_dynamic > 116 * 1024 and "__launch_bounds__(256, 1)" in r.kernel.cu


def pitches(cu: str, buffer: str) -> set[int]:
    return {int(p) for p in re.findall(rf"{buffer}\[\(\(kfc_\w+\) \* (\d+) \+", cu)}


def test_tiles_read_along_their_rows_keep_whole_groups_read_and_written_a_group_at_a_time(monkeypatch):
    cu = prepare().kernel.cu
    plain = built_without(monkeypatch, "TILE_WHOLE_GROUPS", False, prepare).kernel.cu
    # q and k (bf16 [16, 128], read along rows and by the products): rows 68 words apart, not 65;
    # each group of four goes in as one 8-byte store
    q = re.search(r"(kfc_s\d+)\[\(\(kfc_\w+\) \* \d+ \+ \(kfc_\w+\)\)\] = kfc_v\d+\[0\];", plain).group(1)
    assert pitches(plain, q) == {130}
    assert re.search(r"\*reinterpret_cast<uint2\*>\(&kfc_s\d+\[\(\(kfc_\w+\) \* 136 \+", cu)
    # G and the gates (f32 [16, 128]): 128 or 132 (fragments) words a row, not 129
    assert "* 129 +" in plain and "* 129 +" not in cu
    # buffers read at a group's own elements: one 16-byte read for the group
    reads = re.findall(r"\*reinterpret_cast<uint4\*>\((kfc_r\d+)\) = \*reinterpret_cast<const uint4\*>\(&kfc_s", cu)
    assert len(reads) >= 9 and not re.search(r"kfc_r\d+\[4\];", plain)


COLUMNS = """
op columns(x: f32[B, 64, 64]) -> (s: f32[B, 64%s], y: f32[B, 64, 64]) {
  parallel b in 0..B {
    t = exp(x[b, :, :])
    s[b, :%s] = %s
    y[b, :, :] = %s
  }
}
check {
  shapes = [{B: 2}]
}
"""
READS = {  # t read by: its pitch
    "a scan along the last axis, a thread a row": (", 64", ", :", "cumsum(t, axis=1)", "t * 2.0", 65),
    "a scan along the first axis, a thread a column": (", 64", ", :", "cumsum(t, axis=0)", "t * 2.0", 64),
    "sums over the first axis, a warp a column": ("", "", "sum(t, axis=0)", "cumsum(t, axis=0)", 65),
    "sums over the last axis, a warp a row": ("", "", "sum(t, axis=1)", "cumsum(t, axis=0)", 64),
}


@pytest.mark.parametrize("reads", READS)
def test_a_tile_read_down_its_columns_keeps_rows_a_word_past_the_banks(reads):
    # where a warp reads down a column of t, its rows of 64 words stay 65 apart (distinct
    # banks); read only along its rows by the warps, they are 64 apart
    *text, pitch = READS[reads]
    cu = compile_op(parse_kfc(COLUMNS % tuple(text), "columns.kfc"), parse_target("sm_90a"), EXACT).kernel.cu
    t = re.search(r"(kfc_s\d+)\[\(\(kfc_\w+\) \* \d+ \+ \(kfc_\w+\)\)\] = expf"  # an element at a time
                  r"|expf.*\n.*reinterpret_cast<uint4\*>\(&(kfc_s\d+)\[", cu)       # a group at a time
    t = t.group(1) or t.group(2)
    assert pitches(cu, t) == {pitch}


def test_early_loads_put_every_load_of_the_cta_in_its_first_phase_of_loads(monkeypatch):
    """TILE_EARLY_LOADS: v, g and beta, read from memory in later phases by default, join q and
    k in the first phase, so that all are in flight at once."""
    def phase_of(cu: str, ref: str) -> int:
        return next(i for i, p in enumerate(phases(cu)) if ref in p)

    late = prepare().kernel.cu
    early = built_without(monkeypatch, "TILE_EARLY_LOADS", True, prepare).kernel.cu
    refs = ("p_q +", "p_k +", "p_v +", "p_g +", "p_beta[")
    assert {phase_of(early, r) for r in refs} == {0}
    assert phase_of(late, "p_v +") > phase_of(late, "p_g +") > phase_of(late, "p_q +") == 0
    assert early.count("__syncthreads();") == late.count("__syncthreads();")


def test_products_sharing_their_a_are_written_in_one_phase_from_the_same_fragments(monkeypatch):
    """The prepare kernel's w = Ainv (beta k e^G) and u = Ainv (beta v), computed before either
    is stored: with TILE_SHARE_A one phase writes both, each step of the contraction loading
    Ainv's fragments once and each B's for its own products; the stores follow in one phase."""
    plain = prepare().kernel.cu
    shared = built_without(monkeypatch, "TILE_SHARE_A", True, prepare)
    cu = shared.kernel.cu
    assert plain.count("__syncthreads();") == 9 and cu.count("__syncthreads();") == 7
    assert not shared.kernel.report.spills
    products = [p for p in phases(cu) if "kfc_mma_tf32(kfc_c" in p]
    assert len(products) == 2  # Akk with Aqk (sharing their B), then w with u
    both = products[-1]
    calls = re.findall(r"kfc_mma_tf32\((\w+)\[(\d+)\], (\w+)\[0\].*?, (\w+)\[0\], \w+\[1\]\);", both)
    assert len(calls) == 4 and len({a for _, _, a, _ in calls}) == 1  # one A fragment, Ainv's
    assert len({b for *_, b in calls}) == 4 and len({(acc, i) for acc, i, _, _ in calls}) == 4
    assert len(re.findall(r"const unsigned kfc_a\w+\[4\]", both)) == 1
    stores = [p for p in phases(cu) if "&p_w[" in p or "&p_u[" in p]
    assert len(stores) == 1 and "&p_w[" in stores[0] and "&p_u[" in stores[0]


TRIO = """
op trio(a: f32[B, 16, 32], c: f32[B, 16, 32], x: f32[B, 32, 16]) -> (y: f32[B, 16, 16]) {
  parallel b in 0..B {
    X = x[b, :, :]
    P = a[b, :, :] * 2.0
    p = dot(P, X)
    q = dot(P, X)                   # the same product again (no cse in the pipeline below)
    r = dot(c[b, :, :], X)
    y[b, :, :] = p + q + r
  }
}
check {
  tolerance = {f32: 5e-3}
}
"""

CHAIN = """
op chain(a: f32[B, 16, 16], x: f32[B, 16, 32]) -> (w: f32[B, 16, 32], u: f32[B, 16, 32], v: f32[B, 16, 32]) {
  parallel b in 0..B {
    A = a[b, :, :]
    X = x[b, :, :]
    W = dot(A, X)
    V = dot(A, X * 2.0)             # reads stored tiles only: written beside W
    U = dot(A, X * W)               # reads W's product: not written beside it
    w[b, :, :] = W
    u[b, :, :] = U
    v[b, :, :] = V
  }
}
check {
  tolerance = {f32: 5e-3}
}
"""


def product_phases(cu: str) -> list[str]:
    return [p for p in phases(cu) if "kfc_mma_tf32(kfc_c" in p]


def test_products_sharing_their_b_each_load_their_own_a(monkeypatch):
    """Products found sharing B, two of them with the same A as well: each product's A
    fragments are its own A's (the sharing search says which operand is shared)."""
    monkeypatch.setattr(cuda, "TILE_SHARE_A", True)
    r = compile_op(parse_kfc(TRIO), parse_target("sm_90a"), "canonicalize,dce,tf32-dots", shape={"B": 4})
    (phase,) = product_phases(r.kernel.cu)
    frags = re.findall(r"const unsigned (kfc_a\w+)\[4\] = \{\w+\((kfc_s\d+)\[", phase)
    assert len(frags) == 3 and len({buf for _, buf in frags}) == 2  # P's twice, c's once
    assert len(re.findall(r"const unsigned kfc_b\w+\[2\]", phase)) == 1
    calls = re.findall(r"kfc_mma_tf32\(\w+\[\d+\], (\w+)\[0\]", phase)
    assert sorted(set(calls)) == sorted(name for name, _ in frags)


def test_a_product_whose_b_reads_the_product_it_would_share_with_waits_for_it(monkeypatch):
    monkeypatch.setattr(cuda, "TILE_SHARE_A", True)
    cu = compile_op(parse_kfc(CHAIN), parse_target("sm_90a"), shape={"B": 4}).kernel.cu
    shared, alone = product_phases(cu)
    # W and V from A's fragments, each from B's of its own; U after W is stored
    assert len(re.findall(r"const unsigned kfc_a\w+\[4\]", shared)) == 1
    assert len(re.findall(r"const unsigned kfc_b\w+\[2\]", shared)) == 2 and shared.count("kfc_mma_tf32(") == 2
    assert alone.count("kfc_mma_tf32(") == 1 and "* 2.0f" not in alone
