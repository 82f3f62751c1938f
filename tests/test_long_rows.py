"""Rows too long for one CTA in programs that keep a row in one CTA, on the CPU: scans, suffix
scans and an arg-reduction over a scan are read in chunks (chunk-rows), a branch that reduces
flattens into a select (flatten-branches). Each compiles for sm_90a and sm_100a without spills,
under --verify-each: the interpreter gives the same results before and after every pass. Shorter
rows keep their one-sweep form; what chunking does not fit is left whole, with a note."""

import pytest

from kfc.compile import compile_op
from kfc.frontend import parse_kfc
from kfc.ir.printer import print_ir
from kfc.ir.specialize import specialize
from kfc.model.target import parse_target
from kfc.passes import PASSES, PassContext, PassError, PassManager, parse_pipeline
from tests.example_ops import OPS

LONG = [32768, 262144, 262147]  # the first spills in one CTA's registers; the last is odd
# the interpreter's f32 scan adds 262147 terms one by one; chunks add them in another order
LOOSER = "check {\n  tolerance = {f32: 1e-4}\n"


def compile_example(tmp_path, name, target, n, text=None, verify_each=True):
    text = text or OPS[name]
    spec = parse_kfc(text, str(tmp_path / f"{name}.kfc"), {"T": "bf16"} if "<T:" in text else None)
    return compile_op(spec, parse_target(target), shape={"N": n}, verify_each=verify_each)


def notes(r, pass_name: str) -> list[str]:
    return [m.removeprefix(pass_name + ": ") for m in r.report["pass_notes"] if m.startswith(pass_name + ": ")]


# --verify-each at the shortest chunked row on Hopper, and at the odd longest for the reverse
# sweep (masked) and the arg-reduction (the forward scans' odd tail meets no result); the
# interpreter takes seconds a pass there. Blackwell's build of the same IR at every length.
CHUNKED = [(n, "sm_90a") for n in (LONG[0], LONG[-1])] + [(n, "sm_100a") for n in LONG]


@pytest.mark.parametrize("n,target", CHUNKED)
@pytest.mark.parametrize("name", ["scans", "suffix_scans", "first_crossing"])
def test_long_scanned_rows_compile_in_chunks(tmp_path, name, target, n):
    verify = target == "sm_90a" and (n == LONG[0] or name != "scans")
    r = compile_example(tmp_path, name, target, n, text=OPS[name].replace("check {\n", LOOSER, 1),
                        verify_each=verify)
    assert r.kernel.report.spills == 0 and r.plan.cluster == 1
    assert "tile.for" in r.ir and "+4096" in r.ir, "the row is read by a for loop over chunks of 4096"
    assert notes(r, "chunk-rows") == [f"row {n} in chunks of 4096: 1 sweep(s)"]
    assert any(a["pass"] == "chunk-rows" for a in r.report["approximations"])


def test_a_reverse_sweep_starts_at_the_last_chunk(tmp_path):
    r = compile_example(tmp_path, "suffix_scans", "sm_90a", 262147, verify_each=False)
    assert "{value = 262144}" in r.ir, "chunk j from the end starts at (N - 1) // C * C - j"
    assert "tile.sub" in r.ir


def test_a_mean_used_by_the_scan_takes_a_second_sweep(tmp_path):
    text = """
op centred_cumsum(x: f32[M, N]) -> (y: f32[M, N]) {
  parallel m in 0..M {
    xr = x[m, :]
    y[m, :] = cumsum(xr - mean(xr))
  }
}
check {
  reference = "torch.cumsum(x - x.mean(-1, keepdim=True), -1)"
  tolerance = {f32: 1e-4}
}
"""
    r = compile_example(tmp_path, "centred_cumsum", "sm_90a", 100003, text=text)
    assert r.ir.count("tile.for") == 2, "the mean in one sweep, the scan of the centred row in the next"
    assert notes(r, "chunk-rows") == ["row 100003 in chunks of 4096: 2 sweep(s)"]


@pytest.mark.parametrize("n", [4096, 16384])
def test_shorter_rows_keep_one_sweep(tmp_path, n):
    r = compile_example(tmp_path, "scans", "sm_90a", n, verify_each=False)
    assert "tile.for" not in r.ir and not notes(r, "chunk-rows")


def run_passes(tmp_path, text, n, pipeline):
    spec = parse_kfc(text, str(tmp_path / "op.kfc"))
    func = specialize(spec.func, {"N": n}, partial=True)
    ctx = PassContext(parse_target("sm_90a"))
    return PassManager(parse_pipeline(pipeline), ctx).run(func), ctx


LEFT_WHOLE = {
    "a tensor both read and written": """
op read_back(x: f32[M, N]) -> (y: f32[M, N], z: f32[M, N]) {
  parallel m in 0..M {
    y[m, :] = cumsum(x[m, :])
    z[m, :] = y[m, :] * 2.0
  }
}""",
    "a forward and a reverse scan": """
op both(x: f32[M, N]) -> (y: f32[M, N]) {
  parallel m in 0..M {
    xr = x[m, :]
    y[m, :] = cumsum(xr) + cumsum(xr, reverse=true)
  }
}""",
}


@pytest.mark.parametrize("why", sorted(LEFT_WHOLE))
def test_what_chunks_do_not_fit_is_left_whole_with_a_note(tmp_path, why):
    out, ctx = run_passes(tmp_path, LEFT_WHOLE[why], 65536, "canonicalize,cse,dce,chunk-rows")
    assert "tile.for" not in print_ir(out)
    (note,) = [m for p, m in ctx.notes if p == "chunk-rows"]
    assert note.startswith("row 65536 left whole:") and why.split()[-1] in note


def test_chunk_rows_options_are_ranged_powers_of_two():
    assert "chunk: 256|512|1024|2048|4096|8192|16384|32768|65536=4096" in PASSES["chunk-rows"].describe_options()
    with pytest.raises(PassError, match="chunk takes"):
        parse_pipeline("chunk-rows{chunk=3000}")


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", [65536, 131072, 262147])
def test_a_long_row_reducing_in_a_branch_flattens_and_takes_a_cluster(tmp_path, target, n):
    r = compile_example(tmp_path, "maybe_center", target, n, verify_each=target == "sm_90a")
    assert r.kernel.report.spills == 0 and r.plan.cluster > 1
    assert "tile.if" not in r.ir
    assert notes(r, "flatten-branches") == [f"row {n}: 1 reducing branch(es) compute both sides and select"]


def test_shorter_rows_keep_their_reducing_branch(tmp_path):
    r = compile_example(tmp_path, "maybe_center", "sm_90a", 32768, verify_each=False)
    assert "tile.if" in r.ir and r.plan.cluster == 1 and not notes(r, "flatten-branches")


def test_a_branch_that_loads_the_row_flattens_and_one_that_may_guard_its_load_does_not(tmp_path):
    """The side not taken must not read out of bounds: rows by the row index and whole vectors
    are read either way; a row picked by a loaded index may be what the branch guards."""
    text = """
op maybe_scaled(x: f32[M, N], w: f32[N], idx: i32[M], on: i32[M]) -> (y: f32[M, N]) {
  parallel m in 0..M {
    xr = x[m, :]
    if on[m] != 0 {
      xr = xr - mean(xr * w[:] * XROW)
    }
    y[m, :] = xr
  }
}"""
    for row, flattens in (("x[m, :]", True), ("x[idx[m], :]", False)):
        out, ctx = run_passes(tmp_path, text.replace("XROW", row), 131072, "canonicalize,cse,dce,flatten-branches")
        (note,) = [m for p, m in ctx.notes if p == "flatten-branches"]
        assert ("tile.if" not in print_ir(out)) == flattens, row
        assert note.startswith("row 131072: 1 reducing branch(es)" if flattens else
                               "row 131072: its reducing branches write memory or read where the branch may guard")


def test_integer_row_reductions_compile(tmp_path):
    """A chunked count carries an i32 sum: row reductions run in i32 (exact, through the warps'
    shuffles and the f32 slots bit for bit) as well as f32."""
    for n in (7, 4096, 262147):
        r = compile_example(tmp_path, "positives", "sm_90a", n)
        assert r.kernel.report.spills == 0
    assert "__shfl_xor_sync" in r.kernel.cu and "__float_as_int" in r.kernel.cu and r.plan.cluster > 1


def _compile_example_row(job):
    name, n = job
    text = OPS[name]
    spec = parse_kfc(text, f"examples/{name}.kfc", {"T": "bf16"} if "<T:" in text else None)
    dims = {k: v for k, v in spec.check.shapes[0].items() if k != "M"} | {"N": n}
    return job, compile_op(spec, parse_target("sm_90a"), shape=dims)


def test_every_example_over_rows_of_n_compiles_at_long_rows_without_spills():
    """Nothing the default pipeline takes at short rows is refused for lack of registers at
    long ones (rows up to 262144: the odd 262143, where every access is one element wide, and
    262144, where a staged row's share is largest)."""
    from concurrent.futures import ThreadPoolExecutor
    import os

    names = [name for name, text in OPS.items() if "N]" in text.split("{", 1)[0] and "T]" not in text.split(")", 1)[0]]
    assert {"scans", "suffix_scans", "first_crossing", "maybe_center", "cumsum"} <= set(names)
    assert {"router", "fp8_quant", "swiglu"} <= set(names)  # typed ones in bf16
    # the even length too: the router spilled there, not at 262143
    jobs = [(name, n) for name in names for n in (262143, 262144)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = dict(pool.map(_compile_example_row, jobs))
    for (name, n), r in results.items():
        assert r.kernel.report.spills == 0 and r.kernel.report.stack_bytes == 0, (name, n, r.kernel.report)


def test_a_default_tile_that_spills_is_built_over_twice_the_ctas():
    """The router at rows of 262144: staged in a cluster of 8, 64 elements a thread, its two
    reductions of one stretch spilled 80 bytes; the default pipeline builds it in a cluster of 16
    and says so. A pipeline the user gave is built as given, and its spills refused."""
    from kfc.diagnostics import KfcError

    spec = parse_kfc(OPS["router"], "examples/router.kfc", {"T": "bf16"})
    r = compile_op(spec, parse_target("sm_90a"), shape={"N": 262144})
    assert r.kernel.report.spills == 0 and r.report["kernels"][0]["cluster"][0] == 16
    assert any(n.startswith("compile: the default tile spilled") for n in r.report["pass_notes"])
    assert "tile{threads=512,cluster=16}" in r.pipeline
    given = r.pipeline.replace("cluster=16", "cluster=8")
    with pytest.raises(KfcError, match="spills registers"):
        compile_op(spec, parse_target("sm_90a"), given, shape={"N": 262144})
