"""The shared-memory tile emitter (kfc.codegen.tile_emitter): which programs it takes, which
tiles it stores and where, and KDA's kernels built by nvcc/ptxas for Hopper and Blackwell.
What the GPU computes is checked on the GPU machine (tests/gpu/test_kda_gpu.py,
tests/gpu/test_final_ir_gpu.py)."""

import re

import pytest
from hypothesis import given, settings, strategies as st

from kfc.codegen.backend import program_kind
from kfc.codegen.tile_emitter import TileKernelEmitter
from kfc.codegen.tile_plan import SharedArena, strided_loop
from kfc.compile import compile_op, linearize_loops, lower_op
from kfc.diagnostics import KfcError
from kfc.frontend import load_kfc, parse_kfc
from kfc.ir.specialize import specialize
from kfc.ir.tile_ops import DotOp, ParallelOp, ReduceOp, ScanOp
from kfc.model.target import parse_target
from kfc.passes import PassContext

KDA = ["kernels/kda_fwd.kfc", "kernels/kda_fwd_fla.kfc", "kernels/kda_fwd_flashkda.kfc"]


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("path", KDA)
def test_kda_compiles_to_one_cta_per_sequence_and_head(path, target):
    spec = load_kfc(path)
    r = compile_op(spec, parse_target(target))
    (kernel,) = r.report["kernels"]
    heads = "HV" if "HV" in spec.func.symbols else "H"
    assert kernel["grid"] == [f"(N * {heads})", "1", "1"] and kernel["block"] == [256, 1, 1]
    assert 0 < kernel["smem_dynamic_bytes"] <= parse_target(target).smem_per_block
    assert not r.kernel.report.spills
    assert "__syncthreads();" in r.kernel.cu and "kfc_smem" in r.kernel.cu


@pytest.mark.parametrize("chunk", ["16", "32", "64"])
def test_kda_at_head_dims_of_128_fits_a_cta_at_every_chunk(chunk):
    spec = load_kfc("kernels/kda_fwd.kfc", {"C": chunk})
    r = compile_op(spec, parse_target("sm_90a"), shape={"T": 4096, "K": 128, "V": 128})
    assert r.report["kernels"][0]["smem_dynamic_bytes"] <= 232448
    assert not r.kernel.report.spills


def test_tiles_too_large_for_shared_memory_are_refused_with_the_fix(capsys):
    from kfc.cli import main
    # a [256, 256] f32 state alone is 256 KB
    assert main(["compile", "kernels/kda_fwd.kfc", "--shape", "T=4096,K=256,V=256", "-o", "/tmp/kfc-never"]) == 2
    err = capsys.readouterr().err
    assert "its tiles need" in err and "bytes of shared memory at once" in err and "--dtype C=32" in err
    # and which tiles take it: the state first, the largest
    assert "at the busiest phase: S f32[256, 256] (263168 B)" in err and "k[...] bf16[64, 256]" in err
    # at its least chunk there is no smaller one to name
    assert main(["compile", "kernels/kda_fwd.kfc", "--dtype", "C=16", "--shape", "T=4096,K=256,V=256",
                 "-o", "/tmp/kfc-never"]) == 2
    err = capsys.readouterr().err
    assert "its tiles need" in err and "--dtype" not in err and "smaller dims (--shape)" in err


def test_a_program_of_two_parallel_loops_is_two_kernels_launched_in_order(tmp_path):
    """A kernel is one parallel loop: an op of two is two kernels, the second reading what the
    first stored, each taking every argument (kfc.codegen.tile_kernels)."""
    text = """
op two(x: f32[B, N]) -> (m: f32[B, 1], y: f32[B, N]) {
  parallel b in 0..B {
    m[b, :] = max(x[b:b+1, :], axis=1)
  }
  parallel b in 0..B {
    y[b:b+1, :] = x[b:b+1, :] - m[b:b+1, :]
  }
}
"""
    r = compile_op(parse_kfc(text, str(tmp_path / "two.kfc")), parse_target("sm_90a"), shape={"B": 4, "N": 8})
    first, second = r.report["kernels"]
    assert (first["name"], second["name"]) == ("kfc_kernel_two", "kfc_kernel_two_k1")
    assert first["grid"] == second["grid"] == ["B", "1", "1"] and r.dynamic_dims == ("B",)
    assert [p["name"] for p in first["params"]] == [p["name"] for p in second["params"]] == ["x", "m", "y", "B"]
    assert r.kernel.cu.count("__global__") == 2 and "then      kfc_kernel_two_k1" not in r.plan.describe()


def test_a_loop_reading_what_it_stores_is_refused_though_a_later_loop_may():
    """The order between kernels is the launch's; within one, a load after a store of the same
    tensor is refused as before."""
    text = """
op same(x: f32[B, N]) -> (y: f32[B, N]) {
  parallel b in 0..B {
    y[b:b+1, :] = x[b:b+1, :] * 2.0
    y[b:b+1, :] = y[b:b+1, :] + 1.0
  }
}
"""
    func = specialize(parse_kfc(text, "same.kfc").func, {"B": 4, "N": 8})
    kind, why = program_kind(func)
    assert kind == "other" and "one parallel loop both loads and stores y" in why.message


def _kda_body():
    spec = load_kfc("kernels/kda_fwd.kfc")
    func = specialize(spec.func, {"T": 200, "K": 32, "V": 32}, partial=True)
    func = linearize_loops(func, PassContext(parse_target("sm_90a")))
    return func, next(op for op in func.body.ops if isinstance(op, ParallelOp))


def test_kda_is_a_tile_program():
    func, _ = _kda_body()
    assert program_kind(func) == ("tile", None)


def test_the_plan_stores_what_is_reread_and_costly_and_inlines_the_rest():
    func, loop = _kda_body()
    emitter = TileKernelEmitter(func, "k")
    emitter.generate()
    ops = list(loop.walk())
    named = {r.name: r for op in ops for r in op.results if r.name}
    # kc = f32(k[...]) feeds products and the [C, C, K] decay sums: read many times, so its
    # bf16 load is stored (half the bytes of f32) and the cast written where kc is read
    load = emitter.plan.owner[named["kc"]].operands[0]
    assert named["kc"] in emitter.inline and emitter.buffers[load].ctype == "kfc_bf16"
    # the [C, C, K] decay is never a buffer (rank 3), however often it is read
    assert named["decay"] in emitter.inline and not emitter.plan.storable(named["decay"])
    # a product read once, by the subtraction that builds W, is written where it is read;
    # W, which the next product reads row by row, is stored
    first_dot = next(op for op in ops if isinstance(op, DotOp))
    assert first_dot.result in emitter.inline and named["W"] in emitter.buffers
    # a sum reads its operand once per element: the [C, C, K] products it sums stay inline
    decay_sum = next(op for op in ops if isinstance(op, ReduceOp) and op.operands[0].ttype.rank == 3)
    assert not emitter.plan.reread(decay_sum.operands[0])
    # the gate is read by both the cumulative sum and the total: stored once
    scan = next(op for op in ops if isinstance(op, ScanOp))
    assert scan.operands[0] in emitter.buffers and scan.result in emitter.buffers


def test_buffers_share_bytes_only_when_their_lives_do_not_overlap():
    arena = SharedArena()
    a = arena.new("a", "float", (64, 32), 1)
    b = arena.new("b", "float", (64, 32), 2)
    c = arena.new("c", "float", (64, 32), 4)
    arena.touch(a, 3)   # a lives 1..3, beside b (2..2); c (4..) may take a's place
    total = arena.place()
    assert a.offset != b.offset and {c.offset} & {a.offset, b.offset}
    assert total == 2 * a.nbytes


def test_rows_of_an_even_number_of_words_are_padded_by_one_word():
    arena = SharedArena()
    f32 = arena.new("f", "float", (64, 128), 1)
    bf16 = arena.new("h", "kfc_bf16", (64, 128), 1)
    odd = arena.new("o", "float", (64, 33), 1)
    vec = arena.new("v", "float", (128,), 1)
    assert (f32.pitch, bf16.pitch, odd.pitch, vec.pitch) == (129, 130, 33, 128)
    assert f32.nbytes == 64 * 129 * 4 and f32.at(("i", "j")) == "f[((i) * 129 + (j))]"


def test_a_buffer_read_inside_a_loop_lives_to_the_loop_s_end():
    arena = SharedArena()
    outer = arena.new("outer", "float", (16,), 1)
    arena.touch(outer, 3)            # read in the loop's first phase (3), the loop spans 3..6
    arena.close_loop(3, 6)
    inner = arena.new("inner", "float", (16,), 5)
    arena.place()
    assert outer.last == 6 and inner.offset != outer.offset


def test_a_program_the_tile_emitter_cannot_take_keeps_its_reason(tmp_path):
    spec = parse_kfc("""
op acc(x: f32[B, 8, 8]) -> (y: f32[8, 8]) {
  parallel b in 0..B {
    y[:, :] += x[b, :, :] * 2.0
  }
}
""", str(tmp_path / "acc.kfc"))
    with pytest.raises(KfcError, match="tile emitter take it: its parallel loop sums across iterations"):
        lower_op(spec, parse_target("sm_90a"), None, {"B": 2}, PassContext(parse_target("sm_90a")))


def test_a_branch_on_a_whole_tile_compiles_with_a_barrier_on_each_side(tmp_path):
    spec = parse_kfc("""
op cond(x: f32[B, 8, 8]) -> (y: f32[B, 8, 8]) {
  parallel b in 0..B {
    t = x[b, :, :]
    if sum(t) > 0.0 {
      t = t * 2.0
    }
    y[b, :, :] = t
  }
}
""", str(tmp_path / "cond.kfc"))
    cu = compile_op(spec, parse_target("sm_90a"), shape={"B": 4}).kernel.cu
    branch = cu.split("if (", 1)[1]
    then, other = branch.split("} else {", 1)
    assert "__syncthreads();" in then and "__syncthreads();" in other


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 12), st.integers(0, 6),
                          st.sampled_from(["float", "kfc_bf16", "bool"])), min_size=1, max_size=12))
def test_buffers_live_at_once_never_share_a_byte(specs):
    arena = SharedArena()
    bufs = []
    for i, (n, first, span, ctype) in enumerate(specs):
        b = arena.new(f"b{i}", ctype, (n, n % 7 + 1), first)
        arena.touch(b, first + span)
        bufs.append(b)
    total = arena.place()
    for b in bufs:
        assert b.offset % 128 == 0 and b.offset + b.nbytes <= total
    for x in bufs:
        for y in bufs:
            if x is not y and x.first <= y.last and y.first <= x.last:
                assert x.offset + x.nbytes <= y.offset or y.offset + y.nbytes <= x.offset


def test_a_carried_tile_read_elsewhere_than_where_it_is_written_goes_through_a_copy(tmp_path):
    """S = transpose(S) reads S[j, i] to write S[i, j]: written in place it would read elements
    already overwritten, so the new value is stored apart, then copied."""
    spec = parse_kfc("""
op flip(x: f32[B, 16, 16], n: i32[B]) -> (y: f32[B, 16, 16]) {
  parallel b in 0..B {
    S = x[b, :, :]
    for i in 0..n[b] carry (S) {
      S = transpose(S, [1, 0]) * 0.5
    }
    y[b, :, :] = S
  }
}
""", str(tmp_path / "flip.kfc"))
    cu = compile_op(spec, parse_target("sm_90a"), shape={"B": 2}).kernel.cu
    loop = cu.split("for (long long", 1)[1]
    # two phases in the loop: the new value into a buffer of its own, then the copy into S
    assert loop.count("__syncthreads();") >= 2 and loop.count("kfc_smem") == 0
    writes = [line.split("=", 1)[0].strip() for line in loop.splitlines() if line.strip().startswith("kfc_s")]
    assert len(set(w.split("[")[0] for w in writes)) == 2


def test_a_scalar_read_of_a_shared_tile_is_fenced_before_the_tile_is_rewritten(tmp_path):
    """tot reads all of acc between phases; acc is then updated in place: without a barrier
    between, a fast thread would overwrite elements a slow one still sums."""
    spec = parse_kfc("""
op fence(x: f32[B, 8, 12], n: i32[B]) -> (y: f32[B, 8, 12], s: f32[B]) {
  parallel b in 0..B {
    acc = x[b, :, :]
    tot = 0.0
    for i in 0..n[b] carry (acc, tot) {
      tot = tot + sum(acc)
      acc = acc * 0.5 + 1.0
    }
    y[b, :, :] = acc
    s[b] = tot
  }
}
""", str(tmp_path / "fence.kfc"))
    cu = compile_op(spec, parse_target("sm_90a"), shape={"B": 2}).kernel.cu
    lines = cu.split("for (long long", 1)[1].splitlines()
    read = next(i for i, line in enumerate(lines) if "[&]()" in line)             # the scalar's sum
    write = next(i for i, line in enumerate(lines) if "threadIdx.x" in line)      # the in-place phase
    assert read < write and any("__syncthreads();" in line for line in lines[read:write])


def test_a_reduction_of_few_long_lines_is_a_warp_a_line():
    from tests.gpu.test_final_ir_gpu import TILE_REDUCE

    r = compile_op(parse_kfc(TILE_REDUCE), parse_target("sm_90a"), shape={"B": 2})
    cu = r.kernel.cu
    # sum, max, mean over 96 and the integer sum over 40: a warp a line, shuffles to combine;
    # min over 4 (96 lines) stays a thread a line
    assert cu.count("__shfl_xor_sync(0xffffffffu") == 4
    assert cu.count("= threadIdx.x / 32") == 4 and "long long kfc_a" in cu  # a warp's line: a loop or an if


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_kda_split_pair_compiles_with_its_products_on_tensor_cores(target, shared_memory_form):
    """kernels/kda_prepare_flashkda.kfc: a CTA per (chunk, head), its decayed products and the
    solve's on tensor cores; kernels/kda_recurrence.kfc: a CTA per (sequence, head), its four
    products with the state on tensor cores, each step's six loads stored in one phase."""
    shape = {"T": 4096, "K": 128, "V": 128}
    prep = compile_op(load_kfc("kernels/kda_prepare_flashkda.kfc"), parse_target(target), shape=shape)
    rec = compile_op(load_kfc("kernels/kda_recurrence.kfc", {"SD": "bf16"}), parse_target(target), shape=shape)
    # a CTA per chunk: ceil(T / 16) + N covers every sequence's, T and N left to the run
    assert prep.report["kernels"][0]["grid"] == ["(((((T + 16) - 1) // 16) + N) * H)", "1", "1"]
    assert rec.report["kernels"][0]["grid"] == ["(N * H)", "1", "1"]
    # products: four each; Akk and Aqk share their B and are written in one phase (w S and qg S
    # too where qg is stored by then: at C = 16, tests/test_tf32_dots.py, not at this C = 64)
    assert prep.kernel.cu.count("][4] = {};") == 3 and rec.kernel.cu.count("][4] = {};") == 4
    for r in (prep, rec):
        assert not r.kernel.report.spills
    # from the loop on, at this C = 64: 5 barriers (7 with neither U = u - w S written from w S's
    # accumulators nor S's update in the phase of o's store: tests/test_tile_phases.py), none
    # after the last phase (the CTA's threads only exit after it)
    step = rec.kernel.cu.split("for (long long", 1)[1]
    assert step.count("__syncthreads();") == 5
    assert rec.kernel.cu.rstrip()[:-1].rstrip().splitlines()[-1].strip() != "__syncthreads();"


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_kda_prepare_kernel_in_flas_interface_compiles_a_cta_per_chunk_and_value_head(target):
    """kernels/kda_prepare_fla.kfc at C = 16, K = V = 128: a CTA per (chunk, value head), w and u on
    tensor cores. With DECAY = 1 its decays are taken pair by pair (fla's gates are unbounded below),
    so Akk and Aqk are sums over K in a thread's loop; with DECAY = 2 (bounded gates) they are a
    product phase of their own, and the sums' code is gone (canonicalize folds where(DECAY == 2, ..)).
    No spills."""
    shape = {"T": 4096, "K": 128, "V": 128}
    for d, phases in (("1", 2), ("2", 3)):
        spec = load_kfc("kernels/kda_prepare_fla.kfc", {"C": "16", "DECAY": d})
        r = compile_op(spec, parse_target(target), shape=shape)
        assert r.report["kernels"][0]["grid"] == ["(((((T + 16) - 1) // 16) + N) * HV)", "1", "1"]
        assert r.kernel.cu.count("][4] = {};") == phases and not r.kernel.report.spills
        # the pairwise decays: a sum over K with an exponential a term, for Akk and for Aqk
        pairwise = re.findall(r"< 128; \+\+\w+\) \w+ = \w+ \+ .*kfc_ex2_approx", r.kernel.cu)
        assert len(pairwise) == (2 if d == "1" else 0)


def test_a_loop_every_thread_runs_at_most_once_is_a_block_or_an_if():
    # first lies in [0, stride): count <= stride means one iteration or none a thread
    assert strided_loop("e", "threadIdx.x", 512, 256) == "for (int e = threadIdx.x; e < 512; e += 256) {"
    assert strided_loop("m", "threadIdx.x >> 5", 8, 8) == "{ const int m = threadIdx.x >> 5;"
    assert strided_loop("e", "threadIdx.x", 128, 256) == "if ((threadIdx.x) < 128) { const int e = threadIdx.x;"
    # KDA's prepare kernel: its cumulative sums, inverse and products each once a thread, no loop
    spec = load_kfc("kernels/kda_prepare_flashkda.kfc", {"C": "16"})
    cu = compile_op(spec, parse_target("sm_90a"), shape={"T": 4096, "K": 128, "V": 128}).kernel.cu
    assert "if ((threadIdx.x) < 128) {" in cu and "if ((threadIdx.x >> 5) < 2) {" in cu
    counts = re.findall(r"for \(int \w+ = threadIdx\.x; \w+ < (\d+); \w+ \+= 256\)", cu)
    assert all(int(n) > 256 for n in counts)


def test_the_first_index_of_the_grid_is_what_is_left_of_the_ctas_index():
    """The grid is the parallel loop's box, so the first index (after the later ones' remainders
    and quotients) is below its extent: no 64-bit remainder by it (the CTA's set-up in KDA's
    kernels, whose loops linearize to one index, was two such divisions)."""
    for path, bind in (("kernels/kda_prepare_flashkda.kfc", {"C": "16"}),
                       ("kernels/kda_recurrence.kfc", {"C": "16", "SD": "f32", "WD": "f32"})):
        cu = compile_op(load_kfc(path, bind), parse_target("sm_90a"), shape={"T": 4096, "K": 128, "V": 128}).kernel.cu
        assert re.search(r"const long long v\d+ = v\d+ \+ kfc_p;", cu) and "kfc_p %" not in cu and "kfc_p /=" not in cu


def test_a_flat_elements_indices_in_powers_of_two_are_shifts_and_masks():
    """A thread's flat element e of a tile is nonnegative, so its index along an axis of 2^k
    elements after a stride of 2^s is (e >> s) & (2^k - 1): the compiler, not seeing e's sign,
    writes a signed division and remainder otherwise. Other extents keep / and %."""
    em = TileKernelEmitter.__new__(TileKernelEmitter)
    em.lines, em.indent, em.counter = [], 1, 0
    assert em.unflatten("e", (16, 32)) == ("kfc_i2", "kfc_i1")
    assert em.lines == ["  const int kfc_i1 = (e >> 0) & 31;", "  const int kfc_i2 = (e >> 5) & 15;"]
    em.lines = []
    em.unflatten("e", (3, 24))
    assert em.lines == ["  const int kfc_i3 = e % 24;", "  const int kfc_i4 = (e / 24) % 3;"]


def test_a_scratch_tensor_is_a_workspace_of_every_kernel_the_runtime_allocates(tmp_path):
    """examples/chunked_cumsum.kfc: the totals the first kernel stores and the second reads are
    a scratch tensor, a workspace parameter of both kernels, its dtype and shape (the run-time dims by name) given."""
    r = compile_op(load_kfc("examples/chunked_cumsum.kfc"), parse_target("sm_90a"))
    first, second = r.report["kernels"]
    for kernel in (first, second):
        (ws,) = [p for p in kernel["params"] if p["kind"] == "workspace"]
        assert (ws["name"], ws["dtype"], ws["shape"]) == ("kfc_ws_totals", "f32", ["B", "NC", "8"])
    assert [p["name"] for p in first["params"] if p["kind"] == "tensor"] == ["x", "y"]
    assert "float* __restrict__ kfc_ws_totals" in r.kernel.cu


@pytest.mark.parametrize("where", ["parallel b in 0..B {\n    t = scratch([B, N])\n    y[b, :] = x[b, :]\n  }",
                                   "for j in 0..B {\n    t = scratch([B, N])\n  }"])
def test_a_scratch_tensor_is_made_at_the_top_level_only(tmp_path, where):
    text = f"op s(x: f32[B, N]) -> (y: f32[B, N]) {{\n  {where}\n}}\n"
    with pytest.raises(KfcError) as info:
        parse_kfc(text, str(tmp_path / "s.kfc"))
    assert "outside the parallel loops" in info.value.message and info.value.span.line == 3


@pytest.mark.parametrize("dtype, cast", [("bf16", "bf16"), ("i32", "i32"), ("f32", "f32")])
def test_a_scratch_tensor_of_each_dtype_checks_and_compiles(tmp_path, capsys, dtype, cast):
    """A scratch tensor in bf16 or i32 (the interpreter poisons it with NaN or the largest
    integer until stored; numpy has no NaN check for bf16 as a floating type)."""
    from kfc.cli import main

    path = tmp_path / "s.kfc"
    path.write_text(f"""op s(x: f32[B, NC, D]) -> (y: f32[B, NC, D]) {{
  t = scratch([B, NC, D], dtype={dtype})
  parallel b in 0..B, c in 0..NC {{
    t[b, c, :] = {cast}(x[b, c, :] * 4.0)
  }}
  parallel b in 0..B, c in 0..NC {{
    y[b, c, :] = f32(t[b, c, :]) + 1.0
  }}
}}
check {{
  reference = "(x * 4).to(torch.{ {'bf16': 'bfloat16', 'i32': 'int32', 'f32': 'float32'}[dtype] }).float() + 1"
  shapes = [{{B: 2, NC: 3, D: 8}}]
  tolerance = {{f32: 1e-5}}
}}
""")
    assert main(["check", str(path), "--seed", "0"]) == 0, capsys.readouterr().out
    assert main(["compile", str(path), "-o", str(tmp_path / "out")]) == 0, capsys.readouterr().err


def test_a_dim_that_bounds_one_loop_and_sizes_a_tile_in_another_is_fixed(tmp_path):
    """NC bounds the first loop's grid and is the extent of the second loop's [NC, D] tile: it is
    fixed at compile time (a run-time dim made that tile's shape symbolic, and it was refused)."""
    text = """
op slab(x: f32[B, NC, C, D]) -> (y: f32[B, NC, D]) {
  t = scratch([B, NC, D])
  parallel b in 0..B, c in 0..NC {
    t[b, c, :] = sum(x[b, c, :, :], axis=0)
  }
  parallel b in 0..B {
    y[b, :, :] = cumsum(t[b, :, :], axis=0)
  }
}
"""
    r = compile_op(parse_kfc(text, str(tmp_path / "slab.kfc")), parse_target("sm_90a"),
                   shape={"B": 2, "NC": 16, "C": 16, "D": 8})
    assert r.dynamic_dims == ("B",) and r.dims == {"NC": 16, "C": 16, "D": 8}
    assert [k["grid"][0] for k in r.report["kernels"]] == ["(B * 16)", "B"]


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_flashkdas_pair_as_one_op_is_two_kernels_sharing_six_scratch_tensors(target):
    """kernels/kda_fwd_flashkda_pair.kfc: the prepare loop over (chunk slot, head), then the
    recurrence over (sequence, head), the six per-chunk values between them scratch tensors."""
    r = compile_op(load_kfc("kernels/kda_fwd_flashkda_pair.kfc"), parse_target(target),
                   shape={"T": 8192, "K": 128, "V": 128})
    prepare, recurrence = r.report["kernels"]
    assert prepare["grid"][0] == "(((((T + 16) - 1) // 16) + N) * H)" and recurrence["grid"][0] == "(N * H)"
    for kernel in (prepare, recurrence):
        spaces = {p["name"]: p["shape"] for p in kernel["params"] if p["kind"] == "workspace"}
        assert spaces == {"kfc_ws_w": ["1", "T", "H", "128"], "kfc_ws_u": ["1", "T", "H", "128"],
                          "kfc_ws_qg": ["1", "T", "H", "128"], "kfc_ws_kg": ["1", "T", "H", "128"],
                          "kfc_ws_aqk": ["1", "T", "H", "16"], "kfc_ws_gend": ["1", "T", "H", "128"]}
    assert r.dynamic_dims == ("T", "N", "H") and not r.kernel.report.spills
